"""Privacy of the generation paths (issue 34): what a generation run charges, what one record can
move, what leaves the error boundary, and where a judge's costs go.

The twin-run test of generation (D versus D plus one record whose output is long and slow) is in
``tests/dp_es/test_release_twin.py``; the failure histogram's mechanism audit is the ``failures``
row of ``benchmarks/audit_mutants.py`` (``tests/audit/mechanism_audits/test_dp_scorer_mutants.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dp_textgrad
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.accounting.events import group_events
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
from dp_textgrad.tasks.metrics import CallableMetric, JudgeMetric, metric_from_name
from tests.twin import GEN_CITIES, LengthTimedGenerator, generation_records

SETTINGS = dict(
    epsilon=3.0,
    generations=3,
    population=4,
    parents=2,
    sampling_rate=0.4,
    insecure_noise_seed=7,
    seed=1,
    evaluate=False,
)


def city_task(engine=None, *, metric: str = "exact", n: int = 30, **overrides) -> GenerationTask:
    settings = dict(
        name="cities",
        description="Messages about orders; the answer is the city the order went to.",
        private_train=PrivateDataset(generation_records(n)),
        test=generation_records(6, 100),
        metric=JudgeMetric(engine) if metric == "judge" else metric_from_name(metric),
        public_examples=generation_records(4, 200),
        seed_prompt="Read the message.",
    )
    settings.update(overrides)
    return GenerationTask(**settings)


class PlainGenerator(LengthTimedGenerator):
    """The twin engine, as a base model that does not follow instructions (no LLM operators)."""

    instruction_following = False


def charges(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()[1:]]


def planned_atoms(run_dir: Path) -> list[dict]:
    """The plan's events, one per charge in order, rebuilt from the released config and checkpoint."""
    config = DPESConfig(**json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["config"])
    plan = RunPlan.with_value(config, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    return [event_to_dict(event) for event in plan.charges()]


# -- 1. the ledger is the plan, atom for atom ----------------------------------------------------
CASES = {
    # the failure histogram is released and read (an instruction-following engine: LLM operators on)
    "histogram read": (LengthTimedGenerator, dict(feedback="dp_confusion", dataset_size=30), True),
    "histogram read, N counted": (LengthTimedGenerator, dict(feedback="dp_confusion", dataset_size=None), True),
    "feedback none": (LengthTimedGenerator, dict(feedback="none", dataset_size=30), False),
    # feedback asked for, but no LLM operator reads it: never computed, never charged
    "engine without instructions": (PlainGenerator, dict(feedback="dp_confusion", dataset_size=30), False),
    "llm_operators off": (
        LengthTimedGenerator,
        dict(feedback="dp_confusion", llm_operators=False, dataset_size=30),
        False,
    ),
    "final selection": (
        LengthTimedGenerator,
        dict(feedback="dp_confusion", final_selection="exponential", final_epsilon=0.2, dataset_size=30),
        True,
    ),
    # both charged after the search: the selection, then the fresh estimate of the prompt it chose
    "final selection and estimate": (
        LengthTimedGenerator,
        dict(feedback="dp_confusion", final_selection="exponential", final_epsilon=0.2, dataset_size=30,
             final_estimate={"epsilon_share": 0.15, "sampling_rate": 0.6}),
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_generation_run_charges_exactly_its_plan(case, tmp_path) -> None:
    engine_class, overrides, histogram = CASES[case]
    engine = engine_class()
    outcome = dp_textgrad.optimize(city_task(), engine, runs_root=tmp_path, **SETTINGS, **overrides)
    optimizer = outcome.optimizer
    # Same atoms with the same counts (the DP count of N first when N is not declared).
    assert group_events(optimizer.ledger.events) == group_events([optimizer.plan.event])
    # The released ledger, in order, is the plan rebuilt from the released config and checkpoint.
    search = [c for c in charges(outcome.run_dir) if c["label"].startswith(("generation ", "final "))]
    assert [c["event"] for c in search] == planned_atoms(outcome.run_dir)
    # The histogram is charged exactly where an LLM operator reads it: every generation but the last.
    with_histogram = [c["label"] for c in search if c["metadata"].get("feedback_candidates")]
    generations = SETTINGS["generations"]
    assert with_histogram == ([c["label"] for c in search[: generations - 1]] if histogram else [])
    assert optimizer.config.llm_operators is (case not in ("engine without instructions", "llm_operators off"))


def test_the_failure_histogram_is_one_gaussian_of_sensitivity_sqrt_m() -> None:
    # m released histograms: each record adds one unit to one category of each, so the L2
    # sensitivity is sqrt(m) and the noise std z_fb * sqrt(m); the histogram has the task's shape.
    task = city_task()
    engine = LengthTimedGenerator()
    ledger = PrivacyLedger(epsilon_budget=100.0, delta=1e-5)
    scorer = DPScorer(task, engine, ledger, sampling_rate=0.5, dataset_size=30, noise=NoiseSource(insecure_seed=3))

    class Candidate:
        def __init__(self, i: int, text: str) -> None:
            self.id, self.text = f"c{i}", text

    pool = [Candidate(0, "Give the city."), Candidate(1, "Read the message."), Candidate(2, "Name the city.")]
    mechanism = GaussianScoreMechanism(2.0, 1.0, 3, feedback_noise_multiplier=1.5)
    released = scorer.score(pool, mechanism, "gen", feedback_candidates=[0, 2])
    assert released.confusion is not None and released.confusion.shape == (2, len(task.feedback.names))
    assert released.confusion_noise_std == pytest.approx(1.5 * math.sqrt(2))
    assert mechanism.confusion_noise_std(2) == pytest.approx(1.5 * math.sqrt(2))
    (entry,) = ledger.entries
    assert entry.metadata["feedback_candidates"] == 2
    assert entry.event == mechanism.event(0.5)


# -- 2. one record moves the released statistics by one unit / by at most C ------------------------
def scripted_outputs(outputs: dict[str, str]) -> ScriptedEngine:
    """Each record's output chosen by the test (by the record's text): any output at all."""

    def answer(prompt: str, system: str | None) -> str:
        return outputs[prompt.rsplit("Input: ", 1)[-1].rsplit("\nOutput:", 1)[0]]

    return ScriptedEngine(answer)


METRICS = ["exact", "f1", "numeric", "regex", "json_fields", "rouge_l"]
METRIC_OPTIONS = {"regex": {"pattern": r"\d+"}, "json_fields": {"fields": ["city"]}}
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
REFERENCE = st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3), st.dictionaries(st.just("city"), TEXT))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    metric=st.sampled_from(METRICS),
    outputs=st.lists(TEXT, min_size=1, max_size=6),
    references=st.lists(REFERENCE, min_size=7, max_size=7),
    extra_output=TEXT,
    cap=st.integers(min_value=1, max_value=8),
)
def test_each_record_adds_exactly_one_unit_to_the_failure_histogram(
    metric, outputs, references, extra_output, cap
) -> None:
    if metric == "rouge_l":
        pytest.importorskip("rouge_score")
    texts = [f"record {i}" for i in range(len(outputs) + 1)]
    engine = scripted_outputs(dict(zip(texts, [*outputs, extra_output], strict=True)))
    records = [GenerationExample(text, reference=references[i]) for i, text in enumerate(texts)]
    task = GenerationTask(
        "t",
        "",
        PrivateDataset(records[:1]),
        [],
        metric_from_name(metric, METRIC_OPTIONS.get(metric)),
        max_new_tokens=cap,
        stop=("\x00",),
    )
    before = task.feedback_counts(task.public_outcomes(engine, "p", records[:-1]))
    after_outcomes = task.public_outcomes(engine, "p", records)
    after = task.feedback_counts(after_outcomes)
    assert before.shape == after.shape == task.feedback.shape
    assert before.sum() == len(records) - 1 and np.all(before >= 0)
    added = after - before
    assert sorted(added.tolist()) == [0.0] * (len(added) - 1) + [1.0]  # one unit, in one category
    assert np.all((after_outcomes.scores >= 0) & (after_outcomes.scores <= task.clip_bound))


class Weird:
    """A metric answer that is no number."""


ANSWERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.just(float("nan")),
    st.just(float("inf")),
    st.just(-float("inf")),
    st.sampled_from([-1e-9, 1.0000001, 2, -3]),
    TEXT,
    st.none(),
    st.just(Weird()),
    st.lists(st.floats(), max_size=2),
    st.just("raise"),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(answers=st.lists(ANSWERS, min_size=1, max_size=8), clip=st.floats(min_value=0.01, max_value=50.0))
def test_every_clipped_score_is_in_0_C_whatever_the_metric_answers(answers, clip) -> None:
    def metric_function(output: str, reference: object) -> object:
        answer = answers[int(output.split()[-1])]
        if isinstance(answer, str) and answer == "raise":
            raise RuntimeError(f"metric failed on {output!r}")  # quotes the private output
        return answer

    texts = [f"record {i}" for i in range(len(answers))]
    engine = scripted_outputs({t: f" out {i}" for i, t in enumerate(texts)})
    records = [GenerationExample(text, reference="x") for text in texts]
    task = GenerationTask("t", "", PrivateDataset(records), [], CallableMetric(metric_function), clip_bound=clip)
    outcomes = task.private_outcomes(engine, "p", task.private_train.poisson_subsample(1.0, np.random.default_rng(0)))
    scores = np.asarray(outcomes.scores)
    assert scores.shape == (len(answers),)
    assert np.all(np.isfinite(scores)) and np.all((scores >= 0) & (scores <= clip))
    for answer, score in zip(answers, scores):
        valid = (
            isinstance(answer, (int, float))
            and not isinstance(answer, bool)
            and math.isfinite(answer)
            and 0 <= answer <= 1
        )
        if not valid and not isinstance(answer, bool):
            assert score == 0.0  # raised, not a number, nan, inf or out of [0, 1]: 0 (a data-independent rule)
        elif valid:
            assert score == pytest.approx(float(answer) * clip)
    assert task.feedback_counts(outcomes).sum() == len(answers)


@settings(max_examples=100, deadline=None)
@given(reply=TEXT)
def test_a_judge_grade_that_does_not_parse_scores_zero(reply) -> None:
    judge = JudgeMetric(ScriptedEngine(lambda prompt, system: reply))
    from dp_textgrad.tasks.metrics import parse_grade, safe_score

    value = safe_score(judge, "an answer", "Paris")
    assert 0.0 <= value <= 1.0
    if parse_grade(reply) is None:
        assert value == 0.0


def test_a_metric_that_raises_and_a_judge_that_fails_never_stop_the_run(tmp_path) -> None:
    def flaky(output: str, reference: object) -> float:
        if "Oslo" in output:
            raise ValueError(f"cannot score {output!r}")
        return float(output.strip() == reference)

    task = dataclasses.replace(city_task(), metric=CallableMetric(flaky))
    outcome = dp_textgrad.optimize(task, LengthTimedGenerator(), runs_root=tmp_path, **SETTINGS, dataset_size=30)
    assert outcome.result.generations_run == SETTINGS["generations"]

    class BrokenJudge(ScriptedEngine):
        def _generate(self, prompt, **kwargs):
            if "Answer to grade:" in prompt:
                raise RuntimeError("judge down: " + prompt)
            return super()._generate(prompt, **kwargs)

    engine = BrokenJudge(LengthTimedGenerator()._answer)
    judged = city_task(engine, metric="judge")
    outcome = dp_textgrad.optimize(judged, engine, runs_root=tmp_path / "judge", **SETTINGS, dataset_size=30)
    assert outcome.result.generations_run == SETTINGS["generations"]


class OwnMetric:
    """A user's own metric (the Metric protocol, not the built-in base): its categorise may raise,
    name no category, or answer something that is not a name."""

    name, binary = "own", False
    categories = {"correct": "full marks", "wrong_answer": "anything else"}

    def score(self, output: str, reference: object) -> float:
        return float(output.strip() == reference)

    def categorise(self, output, reference, max_new_tokens_hit, *, score=None):
        if "Oslo" in output:
            raise KeyError(f"no rule for {output!r}")  # quotes the private output
        return ["unhashable"] if "Lima" in output else ("correct" if score == 1.0 else "no such category")


def test_a_categorise_rule_that_raises_puts_the_record_in_the_catch_all(tmp_path) -> None:
    task = dataclasses.replace(city_task(), metric=OwnMetric())
    engine = LengthTimedGenerator()
    outcomes = task.public_outcomes(engine, "Name the city.", generation_records(8))
    names = list(task.feedback.names)
    assert [names[c] for c in outcomes.categories] == ["correct", "wrong_answer", "wrong_answer", "correct"] * 2
    assert task.feedback_counts(outcomes).sum() == 8
    outcome = dp_textgrad.optimize(task, engine, runs_root=tmp_path, **SETTINGS, dataset_size=30)
    assert outcome.result.generations_run == SETTINGS["generations"]


# -- 3. the error boundary -----------------------------------------------------------------------
SECRET = generation_records(30)[6].text  # a private record's text


class FailingGenerator(LengthTimedGenerator):
    """Fails on a private record, quoting it, as a real engine's error might."""

    def generate_after_prefix(self, prefix, suffixes, **settings):
        for suffix in suffixes:
            if SECRET in suffix:
                raise RuntimeError(f"context overflow while generating for {suffix!r} ({len(suffix)} chars)")
        return super().generate_after_prefix(prefix, suffixes, **settings)


def _mentions_secret(text: str) -> bool:
    return SECRET in text or "Order 6" in text


def test_an_engine_that_fails_on_a_private_record_scores_it_zero_and_quotes_nothing(tmp_path) -> None:
    task = city_task()
    outcome = dp_textgrad.optimize(
        task, FailingGenerator(), runs_root=tmp_path, **{**SETTINGS, "sampling_rate": 1.0}, dataset_size=30
    )
    # The failure is data: the run ends as planned (its stop never depends on one record).
    assert outcome.result.generations_run == SETTINGS["generations"]
    # Nothing released quotes it; the operator's error log does (operator-only).
    for path in tmp_path.rglob("*"):
        if path.is_file() and "operator" not in path.relative_to(tmp_path).parts:
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not _mentions_secret(text) and not re.search(r"\d+ chars", text), path
    assert _mentions_secret((outcome.run_dir / "operator" / "errors.log").read_text())


# -- 4. a judge's calls on private outputs are private usage ---------------------------------------
def test_judge_calls_on_private_outputs_are_private_usage(tmp_path) -> None:
    # The judge grades exactly as exact match does, so both runs release the same DP scores and
    # make the same public calls (no feedback: the two metrics' public categories differ, and so
    # would the critique prompts): the judge's calls may only show in the private-phase usage.
    runs = {}
    for metric in ("exact", "judge"):
        engine = LengthTimedGenerator()
        outcome = dp_textgrad.optimize(
            city_task(engine, metric=metric),
            engine,
            runs_root=tmp_path / metric,
            **SETTINGS,
            feedback="none",
            dataset_size=30,
        )
        result = json.loads((outcome.run_dir / "result.json").read_text(encoding="utf-8"))
        private = [
            json.loads(line) for line in (outcome.run_dir / "operator" / "metrics.jsonl").read_text().splitlines()
        ]
        runs[metric] = (result, private, outcome)
    (exact, exact_private, _), (judged, judged_private, outcome) = runs["exact"], runs["judge"]
    assert judged["public_usage"] == exact["public_usage"]
    assert [h["public_calls"] for h in judged["history"]] == [h["public_calls"] for h in exact["history"]]
    assert "engine_usage" not in judged and "seconds" not in judged
    # One judge call per private output, on the run's engine, inside the private phase.
    extra = [j["private_calls"] - e["private_calls"] for j, e in zip(judged_private, exact_private)]
    generated = [e["private_calls"] for e in exact_private]
    assert extra == generated and all(n > 0 for n in extra)
    assert judged["prompt"] == exact["prompt"]


def test_a_judge_on_its_own_engine_never_reaches_released_usage(tmp_path) -> None:
    engine, judge_engine = LengthTimedGenerator(), LengthTimedGenerator()
    outcome = dp_textgrad.optimize(
        city_task(judge_engine, metric="judge"), engine, runs_root=tmp_path, **SETTINGS, dataset_size=30
    )
    assert judge_engine.usage.calls > 0  # it graded the private outputs
    released = (outcome.run_dir / "result.json").read_text(encoding="utf-8")
    metrics = (outcome.run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    assert str(judge_engine.usage.prompt_tokens) not in released + metrics
    result = json.loads(released)
    assert result["public_usage"]["calls"] == sum(h["public_calls"] for h in result["history"])


def test_cities_are_the_answers() -> None:
    # The scripted engine answers each city right once the prompt asks for the city (a sanity check
    # of the fixture the tests above run on).
    engine = LengthTimedGenerator()
    task = city_task()
    assert task.mean_score(engine, "Name the city.") == 1.0
    assert task.mean_score(engine, "Read the message.") == 0.0
    assert set(GEN_CITIES) == {e.reference for e in task.test}
