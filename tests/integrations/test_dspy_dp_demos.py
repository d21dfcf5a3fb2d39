"""DP demonstrations in DSPy (issue 48): ``DPES(public_inputs=[...], labelling={...})`` has teachers
answer public inputs for a predictor, token by token, in the same ledger as the instruction search;
the answers become that predictor's demonstrations (``predictor.demos``) as public examples do."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install 'dp-textgrad[dspy]'")

from dp_textgrad.dp_es.config import ConfigError, DPESConfig  # noqa: E402
from dp_textgrad.dp_es.plan import RunPlan  # noqa: E402
from dp_textgrad.engines.scripted import ScriptedEngine  # noqa: E402
from dp_textgrad.integrations.dspy import DPES  # noqa: E402
from dp_textgrad.privacy.accounting.serialize import event_to_dict  # noqa: E402
from tests.dp_es.test_generation_privacy import charges, planned_atoms  # noqa: E402
from tests.integrations.test_dspy_optimizer import RUN, Classifier, bool_metric, mood_lm, records  # noqa: E402
from tests.integrations.test_dspy_programs import Pipeline  # noqa: E402

INPUTS = [dspy.Example(text=text).with_inputs("text")
          for text in ("a good film today", "a bad meal", "a good walk", "a bad cold")]
LABELLING = {"queries": 4, "teachers": 40, "max_demos": 4, "sampling_rate": 0.9, "max_answer_tokens": 3}


class TeacherEngine(ScriptedEngine):
    """DP-ES's engine: a public model that proposes the two labels and the end of line; a teacher
    that answers the mood of the input's text, then ends. Mutations get a fixed instruction."""

    instruction_following = False

    def __init__(self) -> None:
        super().__init__(responses=lambda prompt, system: "Say the mood.")

    def top_next_pieces(self, prefix, suffix, k):
        return [" positive", " negative", "\n"][:k]

    def score_choices_batch(self, prefix, suffixes, choices):
        text = re.findall(r"text: (.*)\nlabel:$", prefix)
        if not text:
            return super().score_choices_batch(prefix, suffixes, choices)
        wanted = " positive" if "good" in text[-1] else " negative"
        rows = [[5.0 if choice == ("\n" if answer else wanted) else 0.0 for choice in choices] for answer in suffixes]
        return np.asarray(rows)


def dp_demos_optimizer(tmp_path: Path, **overrides: Any) -> DPES:
    settings: dict[str, Any] = dict(lm=mood_lm(), engine=TeacherEngine(), runs_root=tmp_path, public_inputs=INPUTS,
                                    labelling=LABELLING, **{**RUN, "epsilon": 4.0, "dataset_size": 200})
    settings.update(overrides)
    return DPES(bool_metric, **settings)


def test_dp_demonstrations_are_voted_then_searched_in_one_ledger(tmp_path) -> None:
    dpes = dp_demos_optimizer(tmp_path)
    compiled = dpes.compile(Classifier(), trainset=records(200))
    outcome = dpes.outcome
    assert outcome is not None
    run_dir = Path(outcome.run_dir)
    lines = charges(run_dir)
    assert lines[0]["label"] == "labelling" and lines[0]["metadata"]["mechanism"] == "token_gnmax"
    config = DPESConfig(**json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["config"])
    plan = RunPlan.with_value(config, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    answering = plan.labelling(0)
    assert answering is not None
    assert [c["event"] for c in lines] == [event_to_dict(e) for e in answering.events()] + planned_atoms(run_dir)
    assert outcome.result.epsilon <= 4.0 + 1e-9
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["inputs"] == [f"text: {e.text}" for e in INPUTS]
    right = [e for e in labels["examples"] if e["reference"] == ("positive" if "good" in e["text"] else "negative")]
    assert len(right) >= 3, labels["examples"]
    # The answers joined the search's demonstrations: each renders as a demonstration of the predictor.
    shown = {e.payload.text: e.payload.label for e in outcome.optimizer.task.public_examples}
    for example in labels["examples"]:
        assert shown[example["text"].removeprefix("text: ")] == example["reference"]
    # The compiled predictor's demos are public or DP examples only, dspy.Examples with both fields.
    for demo in compiled.classify.demos:
        assert shown.get(demo.text) == demo.label


def test_dp_demonstrations_need_public_inputs_a_labelling_phase_and_a_token_engine(tmp_path) -> None:
    with pytest.raises(ConfigError, match="labelling: DP demonstrations are the teachers' answers to public inputs"):
        dp_demos_optimizer(tmp_path, public_inputs=None)
    with pytest.raises(ConfigError, match="public_inputs: they are answered by a labelling phase"):
        dp_demos_optimizer(tmp_path, labelling=None)
    with pytest.raises(ConfigError, match=r"DSPyLMEngine does not declare.*DPES\(engine=LlamaCppEngine\(\)\)"):
        dp_demos_optimizer(tmp_path, engine=None).compile(Classifier(), trainset=records(40))
    with pytest.raises(ConfigError, match="answer_predictor: name the optimized predictor"):
        dp_demos_optimizer(tmp_path).compile(Pipeline(), trainset=records(40))
    assert not any(tmp_path.rglob("ledger.jsonl"))  # every refusal came before any charge


def test_the_plan_plans_the_answers_with_the_search(tmp_path) -> None:
    dpes = dp_demos_optimizer(tmp_path)
    planned = dpes.plan(Classifier(), records(200), show=False)
    without = DPES(bool_metric, lm=mood_lm(), engine=TeacherEngine(), runs_root=tmp_path,
                   **{**RUN, "epsilon": 4.0, "dataset_size": 200}).plan(Classifier(), records(200), show=False)
    assert planned.epsilon <= 4.0 + 1e-9 and without.epsilon <= 4.0 + 1e-9
    assert planned.noise > without.noise  # the answers take a share: the search gets more noise
    dpes.compile(Classifier(), trainset=records(200))
    assert dpes.outcome is not None
    assert abs(dpes.outcome.result.epsilon - planned.epsilon) < 1e-6


class SpanTeacherEngine(TeacherEngine):
    """As a teacher, writes the mood word its input names (each input names one): the span vote."""

    def generate_after_prefix(self, prefix, suffixes, *, max_tokens, stop=None, temperature=0.0):
        if len(suffixes) == 1 and suffixes[0].rstrip().endswith("label:"):
            text = suffixes[0]
            return [" positive\n" if "positive" in text.split("label:")[0] else " negative\n"]
        return super().generate_after_prefix(prefix, suffixes, max_tokens=max_tokens, stop=stop,
                                             temperature=temperature)


def test_a_span_vote_fills_the_demonstrations_from_the_inputs_spans(tmp_path) -> None:
    inputs = [dspy.Example(text=text).with_inputs("text") for text in
              ("a good film, positive", "a bad meal, negative", "a good walk, positive", "a bad cold, negative")]
    dpes = dp_demos_optimizer(tmp_path, engine=SpanTeacherEngine(), public_inputs=inputs,
                              labelling={**LABELLING, "vote": "span"})
    dpes.compile(Classifier(), trainset=records(200))
    assert dpes.outcome is not None
    run_dir = Path(dpes.outcome.run_dir)
    lines = charges(run_dir)
    assert lines[0]["metadata"]["max_tokens"] == 1  # one vote per answer
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["vote"] == "span"
    right = [e for e in labels["examples"] if e["text"].endswith(", " + e["reference"])]
    assert len(right) >= 3, labels["examples"]
