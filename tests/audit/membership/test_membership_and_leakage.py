"""Membership-inference scores and canary leakage measures, on deterministic engines.

``MemorisingEngine`` is a positive control: a word the context contains is likely
(log p = -0.5), any other word is unlikely (log p = -6). A prompt that copies member
records therefore makes members score higher under every attack, and a prompt
that copies a canary makes its secret extractable.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_textgrad.audit import (
    ATTACKS,
    Canary,
    exposure,
    generate_canaries,
    greedy_extraction,
    leakage_report,
    longest_common_substring,
    loss_score,
    membership_scores,
    min_k_pp_score,
    min_k_score,
    prompt_leakage,
    recall_score,
    record_context,
    roc_auc,
    split_by_membership,
    topk_hit_rates,
    zlib_score,
)
from dp_textgrad.engines.base import Engine, TokenLogprobs
from dp_textgrad.engines.scripted import ScriptedEngine, scripted_tokens
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example

LABELS = ["billing", "technical", "account"]
SEEN, UNSEEN = -0.5, -6.0


class MemorisingEngine(Engine):
    """Deterministic fake: words present in the context are likely, others are not."""

    model_string = "memorising"

    def __init__(self, n_alternatives: int = 5, vocab_stats: bool = True) -> None:
        super().__init__()
        self.n_alternatives = n_alternatives
        self.vocab_stats = vocab_stats

    def _generate(self, prompt, *, system_prompt, temperature, max_tokens, seed, stop) -> str:
        return " nothing"

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        known = set(context.split())
        tokens = scripted_tokens(text)
        logprobs, alternatives = [], []
        for token in tokens:
            seen = token.strip() in known
            lp = SEEN if seen else UNSEEN
            logprobs.append(lp)
            if seen:  # the true token leads the list
                alts = [(token, lp)] + [(f"<a{i}>", lp - 1 - i) for i in range(self.n_alternatives - 1)]
            else:  # the true token is below every listed alternative
                alts = [(f"<a{i}>", -0.1 - 0.1 * i) for i in range(self.n_alternatives)]
            alternatives.append(alts)
            known.add(token.strip())
        n = len(tokens)
        return TokenLogprobs(
            tokens=tokens, logprobs=np.array(logprobs), top_alternatives=alternatives,
            vocab_mean=np.full(n, -8.0) if self.vocab_stats else None,
            vocab_std=np.full(n, 2.0) if self.vocab_stats else None,
        )

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        return np.array([[self.token_logprobs(c, prefix + s).logprobs.sum() for c in choices] for s in suffixes])


class GradientEngine(MemorisingEngine):
    """Adds GradNorm: memorised texts have small gradients."""

    def grad_norm(self, text: str, context: str = "") -> float:
        return float(-self.token_logprobs(text, context).logprobs.mean())


def make_task(public: list[Example] | None = None) -> ClassificationTask:
    return ClassificationTask(
        name="t", description="route tickets", labels=list(LABELS),
        private_train=PrivateDataset([Example("my bill is wrong", "billing"), Example("wifi down", "technical")]),
        test=[], public_examples=public if public is not None else [Example("reset my password", "account")],
        record_template="Message: {text}\nCategory:", seed_prompt="Classify the message.",
    )


def word_records(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return [" ".join("".join(rng.choice(letters, 7)) for _ in range(6)) for _ in range(n)]


# -- per-text scores ------------------------------------------------------------------------


def test_score_functions_by_hand():
    lp = np.array([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0, -10.0])
    assert loss_score(lp) == -5.5
    assert min_k_score(lp, 0.2) == -9.5  # the 2 lowest of 10
    assert min_k_score(lp[:3], 0.2) == -3.0  # at least one token
    mu, sigma = np.full(10, -6.0), np.full(10, 2.0)
    assert min_k_pp_score(lp, mu, sigma, 0.2) == pytest.approx(np.mean([(-9 + 6) / 2, (-10 + 6) / 2]))
    text = "some text to compress"
    assert zlib_score(lp, text) == pytest.approx(-5.5 / len(zlib.compress(text.encode())))
    assert recall_score([-4.0, -4.0], [-2.0, -2.0]) == 2.0
    with pytest.raises(ValueError, match="k: must be in"):
        min_k_score(lp, 0.0)
    with pytest.raises(ValueError, match="no tokens"):
        loss_score([])


@settings(max_examples=40, deadline=None)
@given(lp=st.lists(st.floats(-20, 0), min_size=1, max_size=50), shift=st.floats(0.01, 5))
def test_scores_rise_when_the_text_becomes_more_likely(lp, shift):
    lp = np.array(lp)
    higher = lp + shift  # every token more likely: a "more member-like" text
    assert loss_score(higher) > loss_score(lp)
    assert min_k_score(higher) > min_k_score(lp)
    mu, sigma = np.full(lp.size, -10.0), np.full(lp.size, 3.0)
    assert min_k_pp_score(higher, mu, sigma) > min_k_pp_score(lp, mu, sigma)
    assert zlib_score(higher, "abc") > zlib_score(lp, "abc")


# -- membership through an engine -----------------------------------------------------------


def test_positive_control_members_score_higher_under_every_attack():
    task = make_task()
    members, nonmembers = word_records(8, 1), word_records(8, 2)
    leaked_prompt = "Classify the message. Examples:\n" + "\n".join(members)  # unsafe-mode leak
    texts = members + nonmembers
    is_member = [True] * 8 + [False] * 8
    results = membership_scores(GradientEngine(), task, leaked_prompt, texts)
    assert set(results) == set(ATTACKS)
    for attack in ("loss", "zlib", "min_k", "min_k_pp", "reference", "grad_norm"):
        m, n = split_by_membership(results[attack], is_member)
        assert roc_auc(m, n) == 1.0, attack
    # and a prompt that copies nothing gives members no edge
    clean = membership_scores(GradientEngine(), task, "Classify the message.", texts)
    for attack in ("loss", "min_k", "min_k_pp", "reference", "grad_norm"):  # zlib also sees compressibility
        m, n = split_by_membership(clean[attack], is_member)
        assert roc_auc(m, n) == 0.5, attack


def test_reference_and_recall_follow_their_definitions():
    engine = ScriptedEngine()
    task = make_task(public=[Example("reset my password", "account"), Example("card stolen", "billing")])
    texts = ["my invoice shows 45 pounds", "router light blinks orange"]
    prompt = "Route the message to a team."
    results = membership_scores(engine, task, prompt, texts, reference_prompt="Other prompt.",
                                attacks=["reference", "recall"])
    assert set(results) == {"reference", "recall"}
    context = task.render_prefix(prompt) + "Message: "
    with_prefix = (task.render_prefix(prompt) + "Message: reset my password\nCategory: account\n\n"
                   "Message: card stolen\nCategory: billing\n\nMessage: ")
    reference_context = task.render_prefix("Other prompt.") + "Message: "
    for text, ref, rec in zip(texts, results["reference"].scores, results["recall"].scores):
        base = engine.token_logprobs(text, context).logprobs
        assert ref == pytest.approx(base.sum() - engine.token_logprobs(text, reference_context).logprobs.sum())
        assert rec == pytest.approx(engine.token_logprobs(text, with_prefix).logprobs.mean() / base.mean())
    # the default reference prompt is the task's seed prompt
    default = membership_scores(engine, task, prompt, texts, attacks=["reference"])["reference"].scores
    seed_context = task.render_prefix(task.seed_prompt) + "Message: "
    expected = [engine.token_logprobs(t, context).logprobs.sum() - engine.token_logprobs(t, seed_context).logprobs.sum()
                for t in texts]
    assert np.allclose(default, expected)


def test_scripted_engine_scores_are_deterministic_and_complete():
    task = make_task()
    texts = [c.text for c in generate_canaries(6, seed=0, labels=LABELS, n_references=5)]
    first = membership_scores(ScriptedEngine(), task, "Classify.", texts)
    again = membership_scores(ScriptedEngine(), task, "Classify.", texts)
    for attack in ATTACKS:
        if first[attack].available:
            assert np.array_equal(first[attack].scores, again[attack].scores)
            assert first[attack].scores.shape == (6,) and np.all(np.isfinite(first[attack].scores))
    assert not first["grad_norm"].available and "grad_norm" in first["grad_norm"].note
    assert first["min_k_pp"].available  # the scripted engine reports vocabulary statistics


def test_unavailable_attacks_are_skipped_with_a_reason():
    task = make_task(public=[])
    results = membership_scores(MemorisingEngine(vocab_stats=False), task, "Classify.", ["alpha beta"])
    assert results["min_k_pp"].scores is None and "vocabulary" in results["min_k_pp"].note
    assert results["recall"].scores is None and "non-member prefix" in results["recall"].note
    assert results["grad_norm"].scores is None
    with pytest.raises(ValueError, match="not available"):
        split_by_membership(results["min_k_pp"], [True])
    with pytest.raises(ValueError, match="attacks: unknown"):
        membership_scores(MemorisingEngine(), task, "Classify.", ["x"], attacks=["loss", "magic"])


# -- leakage through the prompt text ------------------------------------------------------------


def _brute_lcs(a: str, b: str) -> int:
    return max((k for i in range(len(a)) for k in range(1, len(a) - i + 1) if a[i:i + k] in b), default=0)


@settings(max_examples=60, deadline=None)
@given(a=st.text("ab c1", max_size=12), b=st.text("ab c1", max_size=30))
def test_longest_common_substring_matches_brute_force(a, b):
    assert longest_common_substring(a, b) == _brute_lcs(a, b) == longest_common_substring(b, a)


def test_prompt_leakage_verbatim_and_fuzzy():
    canary_set = generate_canaries(4, seed=3, labels=LABELS, n_references=5)
    first, second = canary_set[0], canary_set[1]
    digits = second.secret.split()[0]
    prompt = f"Classify. Example: ref {first.secret} is billing. Also {digits} appears."
    result = prompt_leakage(prompt, canary_set)
    by_id = {m.canary_id: m for m in result.matches}
    assert by_id[first.canary_id].verbatim and by_id[first.canary_id].lcs_fraction == 1.0
    assert not by_id[second.canary_id].verbatim
    assert by_id[second.canary_id].lcs_chars >= 6  # its 6-digit number leaked, not the words
    assert result.verbatim_rate == 0.25 and result.max_lcs_fraction == 1.0
    # case and whitespace changes are caught by the normalised match
    shouted = prompt_leakage("ref " + first.secret.upper().replace(" ", "  "), [first]).matches[0]
    assert not shouted.verbatim and shouted.verbatim_normalised


# -- leakage through the model ----------------------------------------------------------------


def _extraction_engine(canaries: Sequence[Canary]) -> ScriptedEngine:
    """Completes a canary prefix with its secret only when the prompt contains that secret."""

    def respond(prompt: str, system_prompt: str | None) -> str:
        for c in canaries:
            if prompt.endswith(c.prefix):
                return f" {c.secret}. Thanks" if c.secret in prompt else " 000000 nothing"
        return " unknown"

    return ScriptedEngine(respond)


def test_greedy_extraction_positive_control():
    task = make_task()
    canary_set = generate_canaries(10, seed=4, labels=LABELS, n_references=5)
    leaked = [c for c in canary_set if c.included]
    prompt = "Classify. Notes: " + " ".join(c.secret for c in leaked)
    engine = _extraction_engine(list(canary_set))
    result = greedy_extraction(engine, task, prompt, canary_set)
    assert [o.extracted for o in result.outcomes] == [c.included for c in canary_set]
    assert result.rate == len(leaked) / 10
    assert all(call.temperature == 0.0 and call.system_prompt == "" for call in engine.history)
    assert engine.history[0].prompt == record_context(task, prompt, canary_set[0].prefix)
    assert engine.history[0].prompt.endswith("Message: " + canary_set[0].prefix)
    clean = greedy_extraction(_extraction_engine(list(canary_set)), task, "Classify.", canary_set)
    assert clean.rate == 0.0 and clean.mean_matched_fraction < 0.5


def test_topk_hit_rates_report_what_the_engine_cannot_decide():
    task = make_task()
    canary_set = generate_canaries(6, seed=5, labels=LABELS, n_references=5)
    leaked = canary_set[0]
    prompt = "Classify. " + leaked.secret
    rates = {r.k: r for r in topk_hit_rates(MemorisingEngine(n_alternatives=5), task, prompt, canary_set)}
    tokens = 3  # "dddddd", "word", "word"
    assert rates[5].token_rate == pytest.approx(tokens / (6 * tokens))  # only the leaked canary's tokens hit
    assert rates[5].sequence_rate == pytest.approx(1 / 6)
    assert rates[5].note == ""
    for k in (10, 50):  # unseen tokens sit below 5 listed alternatives: their rank at 10 or 50 is unknown
        assert rates[k].token_rate is None and rates[k].sequence_rate is None
        assert rates[k].undecided_positions == 5 * tokens
        assert rates[k].token_rate_lower_bound == rates[5].token_rate
        assert "at most 5 alternatives" in rates[k].note
    # when every token is in the list, a larger k is decided (exactly, not invented)
    everything = "Classify. " + " ".join(c.secret for c in canary_set)
    full = {r.k: r for r in topk_hit_rates(MemorisingEngine(n_alternatives=5), task, everything, canary_set)}
    assert full[50].token_rate == 1.0 and full[50].sequence_rate == 1.0


def test_topk_hit_rates_with_more_alternatives_than_k():
    task = make_task()
    canary_set = generate_canaries(3, seed=6, labels=LABELS, n_references=5)
    rates = topk_hit_rates(MemorisingEngine(n_alternatives=60), task, "Classify.", canary_set)
    assert all(r.token_rate == 0.0 and r.undecided_positions == 0 and r.note == "" for r in rates)


def test_exposure_positive_control_and_bounds():
    task = make_task()
    canary_set = generate_canaries(4, seed=7, labels=LABELS, n_references=63)
    leaked = canary_set[0]
    results = exposure(MemorisingEngine(), task, "Classify. " + leaked.secret, canary_set)
    assert [r.universe_size for r in results] == [64] * 4
    assert results[0].rank == 1 and results[0].exposure == 6.0 == results[0].max_exposure  # log2(64)
    # the others tie with every reference: ties count against the canary
    assert all(r.rank == 64 and r.exposure == 0.0 for r in results[1:])
    fewer = exposure(MemorisingEngine(), task, "Classify. " + leaked.secret, canary_set, n_references=7)
    assert fewer[0].exposure == 3.0
    scripted = exposure(ScriptedEngine(), task, "Classify.", canary_set)
    assert all(0.0 <= r.exposure <= r.max_exposure for r in scripted)


def test_leakage_report_without_and_with_an_engine():
    task = make_task()
    canary_set = generate_canaries(5, seed=8, labels=LABELS, n_references=15)
    prompt = "Classify. " + canary_set[2].secret
    text_only = leakage_report(None, task, prompt, canary_set)
    assert text_only.extraction is None and text_only.notes
    report = leakage_report(MemorisingEngine(), task, prompt, canary_set)
    assert report.prompt.verbatim_rate == 0.2
    assert report.exposures[2].exposure == math.log2(16)
    assert report.mean_exposure(included=canary_set[2].included) is not None
    assert "prompt" in report.to_dict()


def test_transformers_engine_gives_grad_norm_and_min_k_pp():
    """Integration with the engine that has gradients (a tiny random Llama, built offline)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from dp_textgrad.engines.transformers_engine import TransformersEngine

    words = "message category billing technical account classify the my bill is wrong wifi down reset password"
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    raw.train_from_iterator([words], tokenizers.trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[BOS]"]))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="[BOS]", pad_token="[PAD]",
                                                     unk_token="[UNK]")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    engine = TransformersEngine(model=transformers.LlamaForCausalLM(config).eval(), tokenizer=tokenizer, device="cpu")
    task = make_task()
    texts = ["my bill is wrong", "wifi down reset password"]
    results = membership_scores(engine, task, "classify the message", texts, attacks=["grad_norm", "min_k_pp"])
    assert results["grad_norm"].available and results["min_k_pp"].available
    context = record_context(task, "classify the message")
    for text, score in zip(texts, results["grad_norm"].scores):
        assert score == pytest.approx(-engine.grad_norm(text, context)) and score < 0
