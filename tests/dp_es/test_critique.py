"""CritiquePipeline: prompts from public + DP inputs only, sanitised answers, graceful failures."""

from __future__ import annotations

import numpy as np
import pytest

from dp_textgrad.dp_es.mutation import (
    DEFAULT_WEIGHTS,
    PROMPT_CLOSE,
    CritiquePipeline,
    FeedbackSanitiser,
    MutationEngine,
    extract_critique,
    render_confusion,
)
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.privacy.data import Private, PrivateDataError, PublicText
from dp_textgrad.engines.base import EngineError
from dp_textgrad.tasks.base import Example
from tests.fake_llm import FakeLLM

LABELS = ["billing", "refund", "technical"]
DESCRIPTION = PublicText("Sort customer support messages into billing, refund or technical.", "user")
CANARY = "canary-7731 Zebulon Quistgaard"
DP = [PublicText("About 18% of 'refund' messages are labelled 'billing'.", "dp")]


def pipeline(llm, mode="public", **kw) -> CritiquePipeline:
    return CritiquePipeline(llm, FeedbackSanitiser(mode=mode, keep_terms=LABELS), kw.pop("max_critiques", 3),
                            task_description=DESCRIPTION, rng=np.random.default_rng(0), **kw)


def parent(text="Classify the support message.", **kw) -> Candidate:
    return Candidate.new(text, generation=1, operator="seed", **kw)


def test_critique_prompt_holds_task_parent_and_dp_feedback_and_answer_is_public_llm_text():
    llm = FakeLLM(["Advice: Say that requests for money back are refund.\nTask: next example"])
    p = parent()
    out = pipeline(llm).critiques([p], DP)
    assert out == ["Say that requests for money back are refund."]
    assert out[0].source == "llm"
    prompt = llm.prompts[0]
    assert str(DESCRIPTION) in prompt and p.text in prompt and DP[0] in prompt
    assert prompt.endswith("Advice:")


def test_critique_without_feedback_says_so():
    llm = FakeLLM(["Name the three labels in the instruction."])
    pipeline(llm).critiques([parent()])
    assert "Statistics: none available." in llm.prompts[0]


def test_critique_answers_are_sanitised():
    llm = FakeLLM(["Tell agents to email help@shop.example or call 555-123-4567 for refunds."])
    out = pipeline(llm).critiques([parent()], DP)
    assert out and "[email]" in out[0] and "[phone]" in out[0] and "help@" not in out[0]


@pytest.mark.parametrize("bad", [Private("secret statistic"), "plain text statistic",
                                 PublicText(CANARY, "unsafe")])
def test_non_public_feedback_is_refused_before_the_llm_is_called(bad):
    llm = FakeLLM(["Some advice that is long enough."])
    with pytest.raises(PrivateDataError):
        pipeline(llm).critiques([parent()], [bad])
    with pytest.raises(PrivateDataError):
        pipeline(llm).critiques([parent()], {parent().id: [bad]})
    assert llm.prompts == []


def test_task_description_must_be_public():
    with pytest.raises(PrivateDataError):
        CritiquePipeline(FakeLLM(), FeedbackSanitiser(), task_description="plain description")


def test_unsafe_parents_refused_in_public_mode_and_tainted_in_unsafe_mode():
    tainted = parent("Classify. " + CANARY, unsafe=True)
    with pytest.raises(PrivateDataError, match="unsafe"):
        pipeline(FakeLLM(["Long enough advice here."])).critiques([tainted], DP)
    llm = FakeLLM(["Long enough advice here."])
    out = pipeline(llm, mode="unsafe").critiques([tainted], DP)
    assert out and out[0].source == "unsafe"
    assert CANARY in llm.prompts[0]


@pytest.mark.parametrize("raw", ["", "\n\n", "ok", "the the the the the the the the the the",
                                 "Classify the support message.",
                                 "Say that polite wording does not make a review positive."])
def test_malformed_answers_give_no_critique(raw):
    assert pipeline(FakeLLM([raw])).critiques([parent()], DP) == []


@pytest.mark.parametrize("error", [EngineError("down"), RuntimeError("boom")])
def test_engine_errors_give_no_critique(error):
    assert pipeline(FakeLLM(fail_with=error)).critiques([parent()], DP) == []


def test_max_critiques_and_per_parent_mapping():
    parents = [parent(f"Instruction number {i} for messages.") for i in range(4)]
    llm = FakeLLM(lambda prompt: f"Advice about prompt of length {len(prompt)} chars.")
    pipe = pipeline(llm, max_critiques=2)
    fb = {parents[0].id: [PublicText("Only for the first parent.", "dp")]}
    by_parent = pipe.critiques_by_parent(parents, fb)
    assert list(by_parent) == [parents[0].id, parents[1].id]
    assert len(llm.prompts) == 2
    assert "Only for the first parent." in llm.prompts[0] and "Only for the first parent." not in llm.prompts[1]
    assert "Statistics: none available." in llm.prompts[1]


def test_extract_critique():
    assert extract_critique("\n  Advice: \"Be specific.\"\nmore") == "Be specific."
    assert extract_critique("") == ""


def test_dp_confusion_to_critique_to_child_end_to_end():
    """render_confusion -> critiques -> MutationEngine.children: the critique reaches the rewrite prompt."""
    confusion = np.array([[40, 2, 1], [18, 80, 2], [0, 1, 50]], dtype=float)
    dp_sentences = render_confusion(confusion, LABELS, expected_batch_size=200, noise_std=1.0)
    p = parent()
    critic = FakeLLM(["Explain that money-back requests are refund."])
    critiques = pipeline(critic).critiques_by_parent([p], {p.id: dp_sentences})
    assert critiques[p.id][0] == "Explain that money-back requests are refund."

    writer = FakeLLM([f"Classify the support message; money-back requests are refund.{PROMPT_CLOSE}"])
    weights = {name: 0.0 for name in DEFAULT_WEIGHTS}
    weights.update(llm_rewrite=1.0, insert_phrase=1e-12)
    mutator = MutationEngine(writer, DESCRIPTION, LABELS, [Example("Refund me please.", "refund")],
                     np.random.default_rng(0), weights=weights)
    feedback = {p.id: critiques[p.id] + dp_sentences}
    child = mutator.children([p], 1, 2, feedback=feedback)[0]
    assert "Explain that money-back requests are refund." in writer.prompts[0]
    assert child.operator == "llm_rewrite" and child.parent_ids == (p.id,)


@pytest.mark.slow
def test_base_model_writes_usable_critiques(llama_engine):
    pipe = CritiquePipeline(llama_engine, FeedbackSanitiser(keep_terms=LABELS), 2, task_description=DESCRIPTION,
                            rng=np.random.default_rng(0), max_tokens=40)
    parents = [parent(), parent("Decide the topic of the message. Answer with the label only.")]
    out = pipe.critiques(parents, DP)
    assert all(isinstance(c, PublicText) and c.source == "llm" and len(c) <= 300 for c in out)
    assert out, "the base model gave no usable critique for either parent"
