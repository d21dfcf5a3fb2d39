"""MutationEngine: the structural barrier, rule edits, LLM operators and their fallbacks."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dp_textgrad.dp_es.mutation as mutation_package
from dp_textgrad.dp_es.mutation import (
    DEFAULT_WEIGHTS,
    OPERATORS,
    PROMPT_CLOSE,
    PROMPT_OPEN,
    Edit,
    FailedLLMEdit,
    MutationEngine,
    PromptLayout,
    Scaffold,
    build_llm_prompt,
    candidate_text,
    extract_prompt,
    is_degenerate,
    parse_layout,
    phrase_bank,
    split_sentences,
)
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.engines.base import EngineError
from dp_textgrad.privacy.data import Private, PrivateDataError, PrivateDataset, PublicText
from dp_textgrad.tasks.base import Example
from tests.fake_llm import FakeLLM

LABELS = ["billing", "refund", "technical"]
PUBLIC = [
    Example("I was charged twice this month.", "billing"),
    Example("Please send my money back for the broken kettle.", "refund"),
    Example("The app crashes when I log in.", "technical"),
    Example("Why is my invoice higher than last time?", "billing"),
]
CANARY = "canary-7731 Zebulon Quistgaard wrote from the lighthouse"
PRIVATE = [Example(CANARY, "refund"), Example("private record two", "billing")]
DESCRIPTION = PublicText("Sort customer support messages into billing, refund or technical.", "user")
SEED_TEXT = "Classify the support message. Read it carefully. Pick the best topic."


def render_demo(ex: Example) -> str:
    return f"Message: {ex.text}\nTopic: {ex.label}"


def make_mutator(llm=None, seed=0, mode="public", **kw) -> MutationEngine:
    return MutationEngine(llm, DESCRIPTION, LABELS, PUBLIC, np.random.default_rng(seed), mode=mode,
                   render_demo=render_demo, **kw)


def only(op: str, fallback: str = "insert_phrase") -> dict[str, float]:
    """Weights that (practically) always pick ``op``; a tiny rule weight keeps fallbacks possible."""
    weights = {name: 0.0 for name in DEFAULT_WEIGHTS}
    weights[fallback] = 1e-12
    weights[op] = 1.0
    return weights


def seed_candidate(text: str = SEED_TEXT) -> Candidate:
    return Candidate.new(text, generation=0, operator="seed")


# -- the barrier ------------------------------------------------------------------------
def test_builder_accepts_only_scaffold_and_public_text():
    ok = build_llm_prompt([Scaffold("Task: "), PublicText("sort tickets", "user")], mode="public")
    assert ok == "Task: sort tickets"
    with pytest.raises(PrivateDataError, match="not declared public"):
        build_llm_prompt([Scaffold("Task: "), "a plain string"], mode="public")
    with pytest.raises(PrivateDataError, match="private"):
        build_llm_prompt([Private("secret record")], mode="unsafe")
    with pytest.raises(PrivateDataError):
        build_llm_prompt([PrivateDataset(PRIVATE)], mode="unsafe")
    with pytest.raises(PrivateDataError, match="unsafe"):
        build_llm_prompt([PublicText(CANARY, "unsafe")], mode="public")
    assert CANARY in build_llm_prompt([PublicText(CANARY, "unsafe")], mode="unsafe")
    with pytest.raises(PrivateDataError):
        Scaffold(Private("secret"))
    with pytest.raises(ValueError, match="mode"):
        build_llm_prompt([], mode="dp-ensemble")


def test_mutator_constructor_refuses_private_or_undeclared_inputs():
    rng = np.random.default_rng(0)
    with pytest.raises(PrivateDataError, match="task_description"):
        MutationEngine(None, "plain description", LABELS, PUBLIC, rng)
    with pytest.raises(PrivateDataError, match="public_examples"):
        MutationEngine(None, DESCRIPTION, LABELS, [Private(PRIVATE[0])], rng)
    with pytest.raises(PrivateDataError, match="unsafe_examples"):
        MutationEngine(None, DESCRIPTION, LABELS, PUBLIC, rng, unsafe_examples=PRIVATE)
    with pytest.raises(PrivateDataError):
        MutationEngine(None, DESCRIPTION, [Private("billing"), "refund"], PUBLIC, rng)


@pytest.mark.parametrize("bad", [Private("secret feedback"), "plain feedback", PublicText(CANARY, "unsafe")])
def test_children_refuse_non_public_feedback_before_any_llm_call(bad):
    llm = FakeLLM([f"A better instruction for the support message.{PROMPT_CLOSE}"])
    mutator = make_mutator(llm)
    with pytest.raises(PrivateDataError):
        mutator.children([seed_candidate()], 3, 1, feedback=[PublicText("About 5% wrong.", "dp"), bad])
    with pytest.raises(PrivateDataError):
        mutator.children([seed_candidate()], 3, 1, feedback={"any": [bad]})
    assert llm.prompts == []


def test_private_dataset_records_cannot_reach_any_prompt():
    data = PrivateDataset(PRIVATE)
    llm = FakeLLM(lambda p: f"Rewritten instruction for support messages.{PROMPT_CLOSE}")
    mutator = make_mutator(llm)
    for record in data:
        with pytest.raises(PrivateDataError):
            mutator.children([seed_candidate()], 2, 1, feedback=[record])
        with pytest.raises(PrivateDataError):
            mutator.children([seed_candidate()], 2, 1, feedback=[PublicText(record, "dp")])
    # a normal public run never sees the canary
    parents = [seed_candidate()]
    for generation in range(1, 6):
        parents = mutator.children(parents, 4, generation, feedback=[PublicText("About 9% wrong.", "dp")]) or parents
    assert llm.prompts and not any(CANARY in p for p in llm.prompts)


def test_unsafe_parent_is_refused_in_public_mode():
    tainted = Candidate.new("Classify. " + CANARY, generation=1, operator="demo_insert", unsafe=True)
    assert candidate_text(tainted).source == "unsafe"
    with pytest.raises(PrivateDataError, match="unsafe"):
        make_mutator(FakeLLM()).children([tainted], 2, 2)


def test_unsafe_mode_accepts_raw_examples_and_marks_children_unsafe():
    llm = FakeLLM([f"Classify the message; money-back requests are refund.{PROMPT_CLOSE}"])
    mutator = make_mutator(llm, mode="unsafe", unsafe_examples=PRIVATE, weights=only("llm_rewrite"))
    child = mutator.children([seed_candidate()], 1, 1, feedback=[PublicText(CANARY, "unsafe")])[0]
    assert child.unsafe
    assert CANARY in llm.prompts[0]
    assert child.operator_meta["unsafe_examples_in_prompt"] >= 1
    # raw demos can enter the released prompt in unsafe mode (audit positive control)
    demo_mutator = make_mutator(None, mode="unsafe", unsafe_examples=PRIVATE, weights=only("demo_insert"))
    kids = demo_mutator.children([seed_candidate()], 6, 1)
    leaked = [k for k in kids if CANARY in k.text]
    assert leaked and all(k.unsafe for k in leaked)
    # ... and the taint is inherited by grandchildren
    grandkids = demo_mutator.children(leaked, 3, 2)
    assert grandkids and all(g.unsafe for g in grandkids)


# -- rule edits -------------------------------------------------------------------------
def _allowed_sentences() -> set[str]:
    allowed = set(split_sentences(SEED_TEXT)) | set(phrase_bank.INSTRUCTION_PHRASES)
    allowed |= set(phrase_bank.FORMAT_INSTRUCTIONS)
    return allowed


def _is_hint(sentence: str) -> bool:
    for template in phrase_bank.VERBALISER_HINTS:
        head = template.split("{labels}")[0]
        if sentence.startswith(head):
            listed = sentence[len(head):].rstrip(".").split(", ")
            return sorted(listed) == sorted(LABELS)
    return False


def test_rule_edits_use_only_public_content():
    mutator = make_mutator(None, seed=3)
    demos = {render_demo(e) for e in PUBLIC}
    parents = [seed_candidate()]
    made = []
    for generation in range(1, 8):
        kids = mutator.children(parents, 5, generation)
        made += kids
        parents = kids or parents
    assert len({k.operator for k in made}) >= 6
    allowed = _allowed_sentences()
    for kid in made:
        layout = parse_layout(kid.text, list(demos))
        assert all(d in demos for d in layout.demos)
        for sentence in split_sentences(layout.instruction):
            assert sentence in allowed or _is_hint(sentence), sentence
        assert not kid.unsafe
        json.dumps(kid.to_dict())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_chars=st.integers(60, 400), n=st.integers(1, 6))
def test_rule_edit_children_are_bounded_distinct_and_public_for_any_seed(seed, max_chars, n):
    mutator = make_mutator(None, seed=seed, max_prompt_chars=max_chars)
    parent = seed_candidate()
    kids = mutator.children([parent], n, 1)
    allowed = _allowed_sentences()
    demos = [render_demo(e) for e in PUBLIC]
    assert len({k.key for k in kids} | {parent.key}) == len(kids) + 1
    for kid in kids:
        assert len(kid.text) <= max_chars
        layout = parse_layout(kid.text, demos)
        assert all(s in allowed or _is_hint(s) for s in split_sentences(layout.instruction))


def test_rule_edits_are_reproducible_under_a_fixed_seed():
    def run(seed):
        mutator = make_mutator(None, seed=seed)
        kids = mutator.children([seed_candidate()], 8, 1)
        return [(k.text, k.operator, k.operator_meta, k.parent_ids) for k in kids]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_llm_runs_are_reproducible_including_seeds_sent_to_the_engine():
    def run(seed):
        llm = FakeLLM(lambda p: f"Instruction variant {len(p) % 7}: classify each support message.{PROMPT_CLOSE}")
        mutator = make_mutator(llm, seed=seed)
        kids = mutator.children([seed_candidate(), seed_candidate("Sort the message by topic.")], 6, 1)
        return [(k.text, k.operator) for k in kids], llm.seeds

    assert run(5) == run(5)


def test_children_differ_from_parents_and_each_other():
    mutator = make_mutator(None, seed=1)
    parent = seed_candidate()
    kids = mutator.children([parent], 10, 1)
    keys = [k.key for k in kids]
    assert len(set(keys)) == len(keys) and parent.key not in keys
    assert all(k.parent_ids == (parent.id,) and k.generation == 1 for k in kids)


def test_demo_operators_insert_swap_and_remove_public_demos():
    mutator = make_mutator(None, seed=0, weights=only("demo_insert"))
    with_demo = mutator.children([seed_candidate()], 1, 1)[0]
    layout = parse_layout(with_demo.text, mutator.context.demo_pool)
    assert layout.instruction == SEED_TEXT and len(layout.demos) == 1
    assert with_demo.operator_meta["demo_source"] == "public_example"
    swap = make_mutator(None, seed=0, weights=only("demo_swap")).children([with_demo], 1, 2)[0]
    swapped = parse_layout(swap.text, mutator.context.demo_pool)
    assert len(swapped.demos) == 1 and swapped.demos != layout.demos
    removed = make_mutator(None, seed=0, weights=only("demo_remove")).children([with_demo], 1, 2)[0]
    assert removed.text == SEED_TEXT


def test_demo_insert_respects_max_demos():
    mutator = make_mutator(None, seed=0, weights=only("demo_insert", fallback="drop_sentence"), max_demos=2)
    parent = seed_candidate()
    for generation in range(1, 5):
        parent = mutator.children([parent], 1, generation)[0]
    assert len(parse_layout(parent.text, mutator.context.demo_pool).demos) <= 2


def test_verbaliser_hint_and_format_are_replaced_not_stacked():
    hint_mutator = make_mutator(None, seed=0, weights=only("verbaliser_hint"))
    fmt_mutator = make_mutator(None, seed=0, weights=only("format_change"))
    parent = seed_candidate()
    for generation in range(1, 6):
        parent = hint_mutator.children([parent], 1, generation)[0]
        parent = fmt_mutator.children([parent], 1, generation)[0]
    sentences = split_sentences(parent.text)
    assert sum(_is_hint(s) for s in sentences) == 1
    assert sum(s in phrase_bank.FORMAT_INSTRUCTIONS for s in sentences) == 1


def test_length_limit_is_enforced():
    llm = FakeLLM(["Classify the message. " * 40 + PROMPT_CLOSE])
    mutator = make_mutator(llm, seed=0, max_prompt_chars=120)
    kids = mutator.children([seed_candidate()], 10, 1)
    assert kids and all(len(k.text) <= 120 for k in kids)


def test_weights_are_validated():
    with pytest.raises(ValueError, match="unknown operator"):
        make_mutator(None, weights={"teleport": 1.0})
    with pytest.raises(ValueError, match="weights"):
        make_mutator(None, weights={"insert_phrase": -1.0})
    with pytest.raises(ValueError, match="rule operator"):
        make_mutator(None, weights={name: 0.0 for name in DEFAULT_WEIGHTS})


# -- LLM operators ----------------------------------------------------------------------
def test_llm_rewrite_prompt_pattern_and_parsing():
    answer = "Classify the message by the customer's main request. Answer with one label."
    llm = FakeLLM([answer + PROMPT_CLOSE + "\nFeedback: junk"])
    mutator = make_mutator(llm, weights=only("llm_rewrite"))
    parent = Candidate.new(SEED_TEXT + "\n\n" + render_demo(PUBLIC[0]), generation=0, operator="seed")
    fb = [PublicText("About 18% of 'refund' messages are labelled 'billing'.", "dp")]
    child = mutator.children([parent], 1, 1, feedback=fb)[0]
    assert child.operator == "llm_rewrite" and "fallback_from" not in child.operator_meta
    assert child.text == answer + "\n\n" + render_demo(PUBLIC[0])  # demos kept, instruction replaced
    prompt = llm.prompts[0]
    assert prompt.endswith(f"Improved instruction: {PROMPT_OPEN}")
    assert fb[0] in prompt and str(DESCRIPTION) in prompt and SEED_TEXT in prompt
    assert render_demo(PUBLIC[0]).split("\n")[0] not in prompt  # demos are not sent for rewriting
    assert child.operator_meta["feedback_sources"] == ["dp"]


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Pick one topic.</PROMPT>", "Pick one topic."),
        ("Sure! <PROMPT>Pick one topic.</PROMPT> Hope it helps", "Pick one topic."),
        ("Pick one topic.\nTask: something else", "Pick one topic."),
        ("Improved instruction: \"Pick one topic.\"", "Pick one topic."),
        ("  Pick\n one   topic. <PROMPT>", "Pick one topic."),
        ("", ""),
    ],
)
def test_extract_prompt(raw, expected):
    assert extract_prompt(raw) == expected


def test_looping_output_is_deduplicated():
    mutator = make_mutator(FakeLLM(["Pick the main topic. " * 30 + "Answer with one label."]),
                         weights=only("llm_rewrite"))
    child = mutator.children([seed_candidate()], 1, 1)[0]
    assert child.operator == "llm_rewrite"
    assert child.text == "Pick the main topic. Answer with one label."


def test_worked_example_phrases_are_allowed_when_they_come_from_the_inputs():
    # "Answer with the label only." also appears in a worked example; it comes from the parent here
    parent = seed_candidate("Classify the message. Answer with the label only.")
    answer = "Classify the support message by its main request. Answer with the label only."
    child = make_mutator(FakeLLM([answer]), weights=only("llm_rewrite")).children([parent], 1, 1)[0]
    assert child.operator == "llm_rewrite" and child.text == answer


def test_is_degenerate():
    assert is_degenerate("the the the the the the the the the the")
    assert is_degenerate("!!!!!!!!!!!!!!!!!!!!!!!!!!")
    assert is_degenerate("1234 5678 9012 ## ##")
    assert not is_degenerate("Classify the message by its main request and answer with one label.")


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("", "too_short"),
        ("   \n  ", "too_short"),
        (PROMPT_OPEN + PROMPT_CLOSE, "too_short"),
        ("ok.", "too_short"),
        ("the the the the the the the the the the the the", "degenerate"),
        ("%%%% #### 1234 5678 @@@@ ****", "degenerate"),
        (SEED_TEXT.upper(), "unchanged"),
        # a small model copying the few-shot worked example instead of doing the task
        (phrase_bank.REWRITE_EXAMPLES[1][3], "copied_example"),
    ],
)
def test_malformed_llm_output_falls_back_to_a_rule_edit(raw, reason):
    llm = FakeLLM([raw])
    mutator = make_mutator(llm, weights=only("llm_rewrite"))
    child = mutator.children([seed_candidate()], 1, 1)[0]
    assert child.operator == "insert_phrase"
    assert child.operator_meta["fallback_from"] == "llm_rewrite"
    assert child.operator_meta["fallback_reason"] == reason
    assert child.text != SEED_TEXT


@pytest.mark.parametrize("error", [EngineError("server down"), ValueError("context window exceeded"),
                                   TimeoutError()])
def test_engine_errors_fall_back_without_crashing(error):
    mutator = make_mutator(FakeLLM(fail_with=error), weights=only("llm_rewrite"))
    child = mutator.children([seed_candidate()], 1, 1)[0]
    assert child.operator_meta["fallback_reason"] == f"engine_error:{type(error).__name__}"


def test_overlong_llm_output_is_cut_at_a_sentence():
    long_answer = "Classify the support message. " + " ".join(f"Consider detail number {i}." for i in range(60))
    mutator = make_mutator(FakeLLM([long_answer]), weights=only("llm_rewrite"), max_prompt_chars=200)
    child = mutator.children([seed_candidate()], 1, 1)[0]
    assert child.operator == "llm_rewrite"
    assert len(child.text) <= 200 and child.text.endswith(".")


def test_llm_crossover_uses_both_parents_and_falls_back_to_sentence_crossover():
    a = seed_candidate("Classify the message. Answer with the label only.")
    b = seed_candidate("Money-back requests are refund. Ignore greetings and signatures.")
    merged = "Classify the message. Money-back requests are refund. Answer with the label only."
    llm = FakeLLM([merged + PROMPT_CLOSE])
    child = make_mutator(llm, weights=only("llm_crossover")).children([a, b], 1, 1)[0]
    assert child.operator == "llm_crossover" and child.text == merged
    assert set(child.parent_ids) == {a.id, b.id}
    prompt = llm.prompts[0]
    assert prompt.endswith(f"Combined instruction: {PROMPT_OPEN}") and a.text in prompt and b.text in prompt

    broken = make_mutator(FakeLLM([""]), weights=only("llm_crossover")).children([a, b], 1, 1)[0]
    assert broken.operator == "sentence_crossover"
    assert broken.operator_meta["fallback_from"] == "llm_crossover"
    assert set(broken.parent_ids) == {a.id, b.id}
    assert set(split_sentences(broken.text)) <= set(split_sentences(a.text)) | set(split_sentences(b.text))


def test_per_parent_feedback_reaches_only_its_parent():
    a = seed_candidate("Classify the message. Answer with the label only.")
    b = seed_candidate("Sort the message into a topic.")
    llm = FakeLLM(lambda p: f"A new instruction number {len(p)} for messages.{PROMPT_CLOSE}")
    mutator = make_mutator(llm, weights=only("llm_rewrite"))
    fb = {a.id: [PublicText("Advice for A only.", "llm")], b.id: [PublicText("Advice for B only.", "llm")]}
    mutator.children([a, b], 2, 1, feedback=fb)
    assert len(llm.prompts) == 2
    assert "Advice for A only." in llm.prompts[0] and "Advice for B only." not in llm.prompts[0]
    assert "Advice for B only." in llm.prompts[1] and "Advice for A only." not in llm.prompts[1]


def test_feedback_is_capped():
    llm = FakeLLM([f"A better instruction for support messages.{PROMPT_CLOSE}"])
    mutator = make_mutator(llm, weights=only("llm_rewrite"), max_feedback_items=2)
    fb = [PublicText(f"Hint number {i}.", "dp") for i in range(6)]
    mutator.children([seed_candidate()], 1, 1, feedback=fb)
    assert sum(f in llm.prompts[0] for f in fb) == 2


def test_stop_sequences_and_seed_are_passed():
    captured = {}

    class Recorder(FakeLLM):
        def _generate(self, prompt, **kw):
            captured.update(kw)
            return super()._generate(prompt, **kw)

    mutator = make_mutator(Recorder([f"A better instruction for support messages.{PROMPT_CLOSE}"]),
                         weights=only("llm_rewrite"))
    mutator.children([seed_candidate()], 1, 1)
    assert PROMPT_CLOSE in captured["stop"] and isinstance(captured["seed"], int)


def test_variants_are_distinct_and_built_without_crossover():
    mutator = make_mutator(FakeLLM([""]), seed=2)
    seed = seed_candidate()
    variants = mutator.variants(seed, 5)
    assert len(variants) == 5 and len({v.key for v in variants}) == 5
    assert all(v.generation == 0 and v.parent_ids == (seed.id,) for v in variants)
    assert not any("crossover" in v.operator for v in variants)


def test_initial_variants_start_from_balanced_demonstration_sets():
    """Structured start: the seed's variants hold every label's demos, equally many; off, they need not."""
    seed = seed_candidate()
    mutator = make_mutator(None, seed=4)
    variants = mutator.variants(seed, 3)
    assert len(variants) == 3 and len({v.key for v in variants}) == 3
    set_variants = [v for v in variants if v.operator == "demo_set"]
    assert len(set_variants) >= 2  # the 4-example pool holds only a few distinct balanced sets
    for variant in set_variants:
        layout = mutator.context.layout(variant)
        assert layout.instruction == SEED_TEXT
        labels = [line.split("Topic: ")[1] for demo in layout.demos for line in demo.splitlines() if "Topic: " in line]
        per_label = variant.operator_meta["per_label"]
        available = {label: sum(ex.label == label for ex in PUBLIC) for label in LABELS}
        assert {label: labels.count(label) for label in LABELS} == {
            label: min(per_label, available[label]) for label in LABELS}
    plain = make_mutator(None, seed=4, structured_start=False).variants(seed, 3)
    assert not all(v.operator == "demo_set" for v in plain)
    assert len({v.key for v in plain}) == 3


@pytest.mark.slow
def test_base_model_follows_the_rewrite_and_crossover_patterns(llama_engine):
    """Gemma 3 270M (base) can continue the few-shot patterns; whatever it writes, nothing crashes."""
    mutator = MutationEngine(llama_engine, DESCRIPTION, LABELS, PUBLIC, np.random.default_rng(0),
                     weights=only("llm_rewrite"), max_prompt_chars=400, max_tokens=60)
    fb = [PublicText("About 18% of 'refund' messages are labelled 'billing'.", "dp")]
    kids = mutator.children([seed_candidate()], 3, 1, feedback=fb)
    assert kids and all(len(k.text) <= 400 for k in kids)
    assert any(k.operator == "llm_rewrite" for k in kids), [k.operator_meta for k in kids]
    partner = seed_candidate("Decide the topic of the message. Answer with the label only.")
    crossover = MutationEngine(llama_engine, DESCRIPTION, LABELS, PUBLIC, np.random.default_rng(1),
                        weights=only("llm_crossover"), max_tokens=60)
    kids = crossover.children([seed_candidate(), partner], 2, 1)
    assert kids and all("crossover" in k.operator for k in kids)


@pytest.mark.parametrize("seed", range(6))
def test_demo_set_is_balanced_public_and_keeps_the_instruction(seed):
    mutator = make_mutator(None, seed=seed, weights=only("demo_set"))
    child = mutator.children([seed_candidate()], 1, 1)[0]
    layout = parse_layout(child.text, mutator.context.demo_pool)
    assert child.operator == "demo_set" and layout.instruction == SEED_TEXT
    per_label = child.operator_meta["per_label"]
    labels = [mutator.context.demo_labels[i] for i in child.operator_meta["demo_pool_indices"]]
    # every label as often as the pool allows: billing has 2 public examples, the others 1
    for label in LABELS:
        available = sum(ex.label == label for ex in PUBLIC)
        assert labels.count(label) == min(per_label, available)
    pool = mutator.context.demo_pool
    assert all(pool[i].source == "public_example" for i in child.operator_meta["demo_pool_indices"])
    assert not child.unsafe


def test_demo_set_shrinks_to_fit_the_length_limit():
    mutator = make_mutator(None, seed=1, weights=only("demo_set"), max_prompt_chars=len(SEED_TEXT) + 200)
    child = mutator.children([seed_candidate()], 1, 1)[0]
    assert len(child.text) <= len(SEED_TEXT) + 200 and child.operator_meta["per_label"] == 1


def test_no_llm_weights_keep_the_llm_out_of_mutation():
    from dp_textgrad.dp_es.mutation import NO_LLM_WEIGHTS

    llm = FakeLLM()
    mutator = make_mutator(llm, seed=0, weights=NO_LLM_WEIGHTS)
    children = mutator.children([seed_candidate()], 4, 1)
    assert children and llm.usage.calls == 0
    assert all(child.operator not in NO_LLM_WEIGHTS for child in children)


# -- operators: a frozen context in, an edit out ----------------------------------------
def test_operators_see_a_frozen_context_and_propose_edits_the_engine_accepts():
    mutator = make_mutator()
    context, seed = mutator.context, seed_candidate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.max_prompt_chars = 10_000  # type: ignore[misc]
    edit = OPERATORS["insert_phrase"].run(context, seed, [], ())
    assert isinstance(edit, Edit) and edit.operator == "insert_phrase"
    assert edit.text != seed.text and mutator.accept(edit, seed) is edit
    # The engine, not the operator, enforces the limits: an edit past them is refused there.
    too_long = Edit(PromptLayout(seed.text + " Read it." * 200), "insert_phrase", {})
    assert mutator.accept(too_long, seed) is None


def test_a_failed_llm_operator_says_why_and_the_engine_makes_the_rule_edit():
    mutator = make_mutator(FakeLLM(fail_with=EngineError("down")), weights=only("llm_rewrite"))
    failed = OPERATORS["llm_rewrite"].run(mutator.context, seed_candidate(), [], ())
    assert isinstance(failed, FailedLLMEdit) and failed.reason == "engine_error:EngineError"
    child = mutator.children([seed_candidate()], 1, 1)[0]
    assert child.operator == "insert_phrase" and child.operator_meta["fallback_from"] == "llm_rewrite"


def test_no_mutation_module_imports_the_mutation_engine_but_the_package():
    """The operators, the context and the helpers sit below the MutationEngine: none of them
    imports it (at the top, inside a function or for type checking), so there is no circle. The
    ComponentMutationEngine (components.py) sits above it: it holds one MutationEngine per part."""
    package = pathlib.Path(mutation_package.__file__).parent
    for path in sorted(package.glob("*.py")):
        if path.name in ("__init__.py", "mutation_engine.py", "components.py"):
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        assert not imported & {"dp_textgrad.dp_es.mutation.mutation_engine", "dp_textgrad.dp_es.mutation"}, path.name
