"""Tests of TransformersEngine on a tiny model built locally (no download, no network).

The model is a 2-layer Gemma 3 (one sliding-window layer with a window shorter than
the prompts, one full-attention layer) or Llama with random weights, and the
tokenizer is a word-level ``tokenizers`` model trained here on a few sentences.
Every score is checked against a plain reference computed in this file from one
unbatched, unpadded forward pass in float64.
"""

from __future__ import annotations

import copy
import os
import threading

# Before transformers / huggingface_hub are imported: they read these at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from dp_textgrad._textgrad import import_textgrad  # noqa: E402
from dp_textgrad.engines.base import Engine  # noqa: E402
from dp_textgrad.engines.transformers_engine import INSTALL_HINT, TransformersEngine  # noqa: E402
from tests.tiny_hf import make_model  # noqa: E402  (one tiny random model for every HF test)

SENTENCES = [
    "the movie was great and fun",
    "the food was bad and cold",
    "positive negative neutral",
    "i loved the plot and the actors",
    "i hated the service at the hotel",
    "label review answer user system model",
]
PREFIX = "review i loved the plot the movie was great and fun answer"
SUFFIXES = [" the food was bad", " i hated the service at the hotel and the food was cold", "", " fun"]
CHOICES = [" positive", " negative neutral", " the food was cold"]


# -- fixtures ------------------------------------------------------------------------
def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"]))
    raw.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", raw.token_to_id("[BOS]"))]
    )
    raw.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", unk_token="[UNK]"
    )


@pytest.fixture(scope="module", autouse=True)
def offline():
    """Offline even if another test module imported huggingface_hub before the
    environment variable above was set (it reads the variable once, at import)."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A tiny model gains nothing from threads, and on a busy 2-core machine torch's
    thread pool waits on the other processes (10x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def model(request, tokenizer):
    return make_model(tokenizer, request.param)


@pytest.fixture(scope="module")
def gemma(tokenizer):
    return make_model(tokenizer, "gemma3")


def engine_for(model, tokenizer, **options) -> TransformersEngine:
    return TransformersEngine(model=model, tokenizer=tokenizer, device="cpu", **options)


# -- references (plain, unbatched, float64) ------------------------------------------
def reference_logprobs(model, ids: list[int]) -> np.ndarray:
    """log p(next token) at every position of one unpadded sequence, shape (len, vocab)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


def piece(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def reference_scores(model, tokenizer, prefix, suffixes, choices) -> np.ndarray:
    out = np.empty((len(suffixes), len(choices)))
    for i, suffix in enumerate(suffixes):
        context = tokenizer(prefix)["input_ids"] + piece(tokenizer, suffix)
        for j, choice in enumerate(choices):
            c_ids = piece(tokenizer, choice)
            logprobs = reference_logprobs(model, context + c_ids)
            out[i, j] = sum(logprobs[len(context) + k - 1, t] for k, t in enumerate(c_ids))
    return out


def reference_greedy(model, tokenizer, ids: list[int], max_tokens: int) -> tuple[str, int]:
    """Greedy decoding by full forward passes (no key/value cache)."""
    ids, new, steps = list(ids), [], 0
    while steps < max_tokens:
        token = int(np.argmax(reference_logprobs(model, ids)[-1]))
        steps += 1
        if token == tokenizer.eos_token_id:
            break
        ids.append(token)
        new.append(token)
    return tokenizer.decode(new, skip_special_tokens=True), steps


# -- construction ----------------------------------------------------------------------
def test_is_a_textgrad_engine(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    assert isinstance(engine, Engine)
    assert isinstance(engine, import_textgrad().EngineLM)
    assert engine.model_string.startswith("transformers:")
    assert engine.device.type == "cpu"
    assert not engine.model.training


def test_missing_extra_names_the_install_command(monkeypatch, gemma, tokenizer):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ImportError, match=r"pip install 'dp-textgrad\[hf\]'"):
        engine_for(gemma, tokenizer)
    assert "dp-textgrad[hf]" in INSTALL_HINT


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": 2.5}, "max_batch_size"),
        ({"dtype": "float8"}, "dtype"),
        ({"dtype": torch.int64}, "dtype"),
        ({"cache_max_entries": 0}, "cache_max_entries"),
        ({"use_chat_template": True}, "use_chat_template"),  # the tiny tokenizer has none
    ],
)
def test_bad_options_name_the_field(gemma, tokenizer, options, field):
    with pytest.raises(ValueError, match=field):
        engine_for(gemma, tokenizer, **options)


def test_needs_exactly_one_model_source(gemma, tokenizer):
    with pytest.raises(ValueError, match="model_name_or_path"):
        TransformersEngine()
    with pytest.raises(ValueError, match="model_name_or_path"):
        TransformersEngine("some/model", model=gemma, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        TransformersEngine(model=gemma)


def test_loads_a_local_directory_offline(tmp_path, gemma, tokenizer):
    gemma.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    loaded = TransformersEngine(str(tmp_path / "tiny"), device="cpu", dtype="float32")
    assert loaded.model_string == "transformers:tiny"
    in_memory = engine_for(gemma, tokenizer)
    np.testing.assert_allclose(
        loaded.score_choices_batch(PREFIX, SUFFIXES, CHOICES),
        in_memory.score_choices_batch(PREFIX, SUFFIXES, CHOICES),
        atol=1e-5,
    )


def test_a_hub_name_is_not_fetched_while_offline():
    with pytest.raises(OSError):
        TransformersEngine("dp-textgrad-tests/no-such-model", device="cpu")


def test_convert_gguf_reuses_an_existing_directory(tmp_path):
    from dp_textgrad.engines.transformers_engine import convert_gguf

    with pytest.raises(FileNotFoundError, match="gguf_path"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf")  # never parsed: the converted directory exists
    (tmp_path / "out").mkdir()
    assert convert_gguf(fake, tmp_path / "out") == tmp_path / "out"


# -- generation ------------------------------------------------------------------------
def test_greedy_generation_matches_uncached_reference(model, tokenizer):
    engine = engine_for(model, tokenizer, system_prompt="system")
    text = engine.generate("the movie was", max_tokens=7)
    ids = tokenizer("system\n\nthe movie was")["input_ids"]  # plain-text system prompt
    expected, steps = reference_greedy(model, tokenizer, ids, 7)
    assert text == expected and text
    assert engine.usage.completion_tokens == steps
    assert text == engine.generate("the movie was", max_tokens=7)  # deterministic
    assert engine.usage.prompt_tokens == 2 * len(ids)


def test_max_tokens_and_empty_system_prompt(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    ids = tokenizer("i loved")["input_ids"]
    expected, steps = reference_greedy(gemma, tokenizer, ids, 3)
    assert engine.generate("i loved", system_prompt="", max_tokens=3) == expected
    assert engine.usage.completion_tokens == steps <= 3
    assert engine.usage.prompt_tokens == len(ids)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate("i loved", max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("i loved", temperature=-1.0)


def test_stop_strings_cut_the_text(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    full = engine.generate("the food", max_tokens=10)
    words = full.split()
    assert len(words) >= 3, "the tiny model should produce a few words"
    stop = " " + words[2]
    expected = full[: full.find(stop)]
    assert engine.generate("the food", max_tokens=10, stop=[stop, "zzz-never"]) == expected
    assert len(expected) < len(full)


def test_seeded_sampling_is_reproducible_and_varies_with_the_seed(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    first = engine.generate("the movie", temperature=1.0, seed=7, max_tokens=8)
    assert engine.generate("the movie", temperature=1.0, seed=7, max_tokens=8) == first
    texts = {engine.generate("the movie", temperature=1.0, seed=s, max_tokens=8) for s in range(6)}
    assert len(texts) >= 3


def test_chat_template_renders_the_prompt(gemma):
    tokenizer = make_tokenizer()
    tokenizer.chat_template = (
        "[BOS]{% for m in messages %} {{ m['role'] }} {{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %} model{% endif %}"
    )
    engine = engine_for(gemma, tokenizer, use_chat_template=True)
    text = engine.generate("the movie was", system_prompt="answer", max_tokens=4)
    ids = tokenizer("system answer user the movie was model", add_special_tokens=True)["input_ids"]
    assert engine.usage.prompt_tokens == len(ids)
    assert text == reference_greedy(gemma, tokenizer, ids, 4)[0]


# -- scoring ---------------------------------------------------------------------------
@pytest.mark.parametrize("reuse_prefix", [True, False])
@pytest.mark.parametrize("max_batch_size", [16, 2])
def test_batched_scores_match_unbatched_reference(model, tokenizer, reuse_prefix, max_batch_size):
    engine = engine_for(model, tokenizer, reuse_prefix=reuse_prefix, max_batch_size=max_batch_size)
    scores = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    assert scores.shape == (len(SUFFIXES), len(CHOICES))
    np.testing.assert_allclose(scores, reference_scores(model, tokenizer, PREFIX, SUFFIXES, CHOICES), atol=1e-4)
    # Padding invariance: each row alone equals its row inside the padded batch.
    for i, suffix in enumerate(SUFFIXES):
        np.testing.assert_allclose(engine.score_choices_batch(PREFIX, [suffix], CHOICES)[0], scores[i], atol=1e-4)
    assert np.all(scores < 0)


def test_scores_depend_on_the_suffix(gemma, tokenizer):
    scores = engine_for(gemma, tokenizer).score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    assert np.ptp(scores[:, 0]) > 1e-3  # a padding or caching bug that ignores the suffix shows here


def test_multi_token_choices_sum_token_logprobs(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    batch = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    for i, suffix in enumerate(SUFFIXES):
        for j, choice in enumerate(CHOICES):
            per_token = engine.token_logprobs(choice, context=PREFIX + suffix)
            assert len(per_token.tokens) == len(choice.split())
            assert batch[i, j] == pytest.approx(per_token.logprobs.sum(), abs=1e-4)
    single = engine.score_choices(PREFIX, CHOICES)
    np.testing.assert_allclose(single, batch[2], atol=1e-4)  # SUFFIXES[2] is empty


def test_scoring_input_errors(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    assert engine.score_choices_batch(PREFIX, [], CHOICES).shape == (0, 3)
    with pytest.raises(ValueError, match=r"choices\[1\]"):
        engine.score_choices_batch(PREFIX, SUFFIXES, [" positive", ""])
    with pytest.raises(ValueError, match="choices"):
        engine.score_choices_batch(PREFIX, SUFFIXES, [])
    with pytest.raises(TypeError, match="suffixes"):
        engine.score_choices_batch(PREFIX, "the food", CHOICES)


# -- token log-probs ---------------------------------------------------------------------
@pytest.mark.parametrize("context", ["i loved the plot", ""])
def test_token_logprobs_and_vocabulary_statistics(model, tokenizer, context):
    engine = engine_for(model, tokenizer)
    text = " the movie was great and fun"
    result = engine.token_logprobs(text, context=context)
    context_ids = tokenizer(context)["input_ids"]
    text_ids = piece(tokenizer, text)
    reference = reference_logprobs(model, context_ids + text_ids)[len(context_ids) - 1 : -1]
    assert result.tokens == ["the", "movie", "was", "great", "and", "fun"]
    np.testing.assert_allclose(result.logprobs, reference[np.arange(len(text_ids)), text_ids], atol=1e-4)
    probs = np.exp(reference)
    mean = (probs * reference).sum(-1)
    std = np.sqrt((probs * (reference - mean[:, None]) ** 2).sum(-1))
    np.testing.assert_allclose(result.vocab_mean, mean, atol=1e-4)
    np.testing.assert_allclose(result.vocab_std, std, atol=1e-4)
    assert np.all(result.vocab_std > 0)
    assert len(result.top_alternatives) == len(text_ids)
    for position, alternatives in enumerate(result.top_alternatives):
        values = [v for _, v in alternatives]
        assert len(alternatives) == 5 and values == sorted(values, reverse=True)
        best = np.sort(reference[position])[::-1][:5]
        np.testing.assert_allclose(values, best, atol=1e-4)
        assert alternatives[0][0] == tokenizer.decode([int(np.argmax(reference[position]))])


def test_token_logprobs_of_empty_text(gemma, tokenizer):
    result = engine_for(gemma, tokenizer).token_logprobs("", context="i loved")
    assert result.tokens == [] and result.logprobs.shape == (0,)


# -- GradNorm ------------------------------------------------------------------------------
def test_grad_norm_matches_reference_and_leaves_no_gradients(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer)
    frozen = next(gemma.parameters())
    frozen.requires_grad_(False)  # the engine must restore caller's flags
    try:
        value = engine.grad_norm(" the movie was great", context="i loved")
        assert np.isfinite(value) and value > 0
        assert engine.grad_norm(" the movie was great", context="i loved") == value  # deterministic
        assert all(p.grad is None for p in gemma.parameters())
        assert frozen.requires_grad is False
        assert not gemma.training
        # Reference: mean NLL of the text tokens, gradient w.r.t. every parameter.
        reference_model = copy.deepcopy(gemma)
        for p in reference_model.parameters():
            p.requires_grad_(True)
        ids = tokenizer("i loved")["input_ids"] + piece(tokenizer, " the movie was great")
        logits = reference_model(input_ids=torch.tensor([ids])).logits[0, 2:-1]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[3:]))
        loss.backward()
        expected = torch.sqrt(sum((p.grad**2).sum() for p in reference_model.parameters())).item()
        assert value == pytest.approx(expected, rel=1e-4)
        assert engine.grad_norm(" the food was cold", context="i loved") != pytest.approx(value, rel=1e-3)
    finally:
        frozen.requires_grad_(True)
    with pytest.raises(ValueError, match="text"):
        engine.grad_norm("")


# -- usage, cache, threads -----------------------------------------------------------------
def test_usage_counts_calls_tokens_and_seconds(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer, reuse_prefix=True)
    engine.score_choices_batch(PREFIX, [" the food", " i hated the service"], [" positive", " negative"])
    # The prefix runs once; each suffix once (single-token choices share its row).
    expected = len(tokenizer(PREFIX)["input_ids"]) + 2 + 4
    assert (engine.usage.calls, engine.usage.prompt_tokens) == (1, expected)
    engine.token_logprobs(" the movie", context="i loved")
    assert (engine.usage.calls, engine.usage.prompt_tokens) == (2, expected + 3 + 2)
    engine.generate("the movie", system_prompt="", max_tokens=2)
    assert engine.usage.calls == 3 and 1 <= engine.usage.completion_tokens <= 2
    engine.grad_norm(" the movie")
    assert engine.usage.calls == 4
    assert engine.usage.seconds > 0 and engine.usage.cost_usd == 0


def test_cache_is_opt_in_and_keyed_on_every_input(gemma, tokenizer):
    plain = engine_for(gemma, tokenizer)
    plain.generate("the movie", max_tokens=3)
    plain.generate("the movie", max_tokens=3)
    assert plain.usage.calls == 2 and plain.cache_hits == 0

    engine = engine_for(gemma, tokenizer, cache=True)
    first = engine.generate("the movie", max_tokens=3)
    assert engine.generate("the movie", max_tokens=3) == first
    assert (engine.usage.calls, engine.cache_hits) == (1, 1)
    engine.generate("the movie", max_tokens=4)
    engine.generate("the movie", max_tokens=3, system_prompt="")
    engine.generate("the movie", max_tokens=3, stop=["was"])
    assert engine.usage.calls == 4
    # Sampling is never served from the cache, even with a repeated seed.
    engine.generate("the movie", temperature=1.0, seed=3, max_tokens=3)
    engine.generate("the movie", temperature=1.0, seed=3, max_tokens=3)
    assert engine.usage.calls == 6
    scores = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    scores[:] = 0.0  # callers may modify what they get back
    again = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    assert engine.usage.calls == 7 and np.all(again < 0)
    engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES[:2])
    assert engine.usage.calls == 8
    engine.clear_cache()
    engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    assert engine.usage.calls == 9


def test_concurrent_calls_are_serialised_correctly(gemma, tokenizer):
    engine = engine_for(gemma, tokenizer, max_batch_size=2)
    expected = [engine.score_choices_batch(PREFIX, [s], CHOICES) for s in SUFFIXES]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        results[i] = engine.score_choices_batch(PREFIX, [SUFFIXES[i % len(SUFFIXES)]], CHOICES)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, value in results.items():
        np.testing.assert_allclose(value, expected[i % len(SUFFIXES)], atol=1e-6)
    assert len(results) == 8 and engine.usage.calls == len(SUFFIXES) + 8


# -- TextGrad and side effects ---------------------------------------------------------------
def test_works_inside_textgrad_blackbox_llm(gemma, tokenizer):
    tg = import_textgrad()
    engine = engine_for(gemma, tokenizer, system_prompt="answer")
    llm = tg.BlackboxLLM(engine=engine)
    answer = llm(tg.Variable("the movie was", role_description="a prompt", requires_grad=False))
    assert answer.value == engine.generate("the movie was")
    assert engine.usage.calls == 2


def test_writes_no_files(tmp_path, monkeypatch, gemma, tokenizer):
    monkeypatch.chdir(tmp_path)
    engine = engine_for(gemma, tokenizer, cache=True)
    engine.generate("the movie", max_tokens=3)
    engine.generate("the movie", max_tokens=3, temperature=0.7, seed=1)
    engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    engine.token_logprobs(" the movie", context="i loved")
    engine.grad_norm(" the movie")
    tg = import_textgrad()
    tg.BlackboxLLM(engine=engine)(tg.Variable("the food", role_description="a prompt", requires_grad=False))
    assert list(tmp_path.iterdir()) == []


# -- the real model (slow) -----------------------------------------------------------------
GEMMA_SENTENCE = " The capital of France is Paris, and the capital of Italy is Rome."


@pytest.fixture(scope="module")
def gemma_270m():
    """The Gemma 3 270M GGUF of the [local] extra, dequantized once into the dp-textgrad
    cache (minutes the first time on 2 cores, about a second afterwards)."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from dp_textgrad.engines.model_files import LocalModelUnavailable, default_model_path, models_dir
    from dp_textgrad.engines.transformers_engine import convert_gguf

    try:
        gguf_path = default_model_path()
    except LocalModelUnavailable as exc:
        pytest.skip(str(exc))
    directory = convert_gguf(gguf_path, models_dir() / "gemma-3-270m-q4_k_m-hf")
    return gguf_path, TransformersEngine(directory, device="cpu", system_prompt="")


@pytest.mark.slow
def test_gemma_270m_from_gguf_scores_and_generates(gemma_270m):
    _, engine = gemma_270m
    calls = engine.usage.calls
    assert engine.generate("Once upon a time", max_tokens=4).strip()
    assert engine.usage.calls == calls + 1 and engine.usage.completion_tokens >= 4
    prefix = "Decide whether each movie review is positive or negative.\n"
    suffixes = [
        "Review: I loved this film, the acting was wonderful.\nSentiment:",
        "Review: A boring, terrible waste of two hours.\nSentiment:",
    ]
    scores = engine.score_choices_batch(prefix, suffixes, [" positive", " negative"])
    assert scores[0, 0] > scores[0, 1] and scores[1, 1] > scores[1, 0]
    reference = np.array([engine.score_choices(prefix + s, [" positive", " negative"]) for s in suffixes])
    np.testing.assert_allclose(scores, reference, atol=1e-3)
    result = engine.token_logprobs(GEMMA_SENTENCE)
    assert result.vocab_mean.shape == result.logprobs.shape and np.all(result.vocab_std > 0)
    value = engine.grad_norm(GEMMA_SENTENCE)
    assert np.isfinite(value) and value > 0
    assert all(p.grad is None for p in engine.model.parameters())


@pytest.mark.slow
def test_gemma_270m_conversion_agrees_with_llama_cpp(gemma_270m):
    """Same GGUF, two runtimes: the tokenization must match exactly and the per-token
    log-probabilities closely (llama.cpp multiplies in quantized form)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf_path, engine = gemma_270m
    ids = engine.tokenizer(GEMMA_SENTENCE.strip())["input_ids"]
    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=128, logits_all=True, verbose=False, n_threads=1)
    assert llm.tokenize(GEMMA_SENTENCE.strip().encode("utf-8"), add_bos=True) == ids
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    theirs = logprobs[np.arange(len(ids) - 1), ids[1:]]
    ours = engine.token_logprobs(GEMMA_SENTENCE.strip())  # after BOS, as llama.cpp saw it
    assert len(ours.logprobs) == len(theirs)
    assert np.mean(np.abs(ours.logprobs - theirs)) < 0.25
    assert np.corrcoef(ours.logprobs, theirs)[0, 1] > 0.99
    llm.close()
