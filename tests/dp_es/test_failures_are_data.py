"""Failures on private records are data (issue 47, item 5; docs/privacy.md, "Failures on private records").

A record whose engine call, pipeline or metric fails scores 0 under every candidate and adds one
unit to the public ``error`` category of a failure histogram; the run goes on. Whether it stops
is decided only by a public probe before any charge, or by a DP release (``dp.max_error_share``:
the noisy count of failed records rides on the scores' Gaussian). The twin runs below put a record
that makes the engine raise into D+x: every released byte, the exit code included, must equal D's.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dp_textgrad.dp_es import scoring_backends
from dp_textgrad.dp_es.config import ConfigError, DPESConfig, config_with
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.dp_es.scoring_backends import batch_totals, failure_unit
from dp_textgrad.dp_es.selector import ERROR_NOISE_RATIO, error_stop
from dp_textgrad.engines.base import EngineError
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.tasks.base import ClassificationTask, Example
from dp_textgrad.tasks.generation import GenerationTask
from dp_textgrad.tasks.metrics import metric_from_name
from tests.twin import (
    GEN_MARKER,
    GEN_TEMPLATE,
    LengthTimedEngine,
    LengthTimedGenerator,
    base_rows,
    differences,
    generation_long_record,
    generation_records,
    json_differences,
    long_record,
    run_generation_twin,
    run_twin,
)

RARE_MARKER = "zqxj"  # the long classification record's words (tests/twin.py RARE)


class FailsOnTheLongRecord(LengthTimedEngine):
    """Raises, quoting the record, whenever a batch holds the long record (as a context overflow would)."""

    def score_choices_batch(self, prefix, suffixes, choices):
        for suffix in suffixes:
            if RARE_MARKER in suffix:
                raise EngineError(f"context overflow: {len(suffix)} chars in {suffix[:40]!r}")
        return super().score_choices_batch(prefix, suffixes, choices)


class GeneratorFailsOnTheMarker(LengthTimedGenerator):
    """Raises on the record holding the marker, in both of the engine's generation paths."""

    failures = 0  # over all instances: the power check of the twin test

    def _fail(self, text: str) -> None:
        GeneratorFailsOnTheMarker.failures += 1
        raise EngineError(f"context overflow in {text[:40]!r}")

    def generate_after_prefix(self, prefix, suffixes, **settings):
        if any(GEN_MARKER in s for s in suffixes):
            self._fail(suffixes[-1])
        return super().generate_after_prefix(prefix, suffixes, **settings)

    def generate_for_prefixes(self, prefixes, suffix, **settings):
        if GEN_MARKER in suffix:
            self._fail(suffix)
        return super().generate_for_prefixes(prefixes, suffix, **settings)


def classification_task(rows) -> ClassificationTask:
    return ClassificationTask(
        name="twin", description="bills, tech, fraud", labels=["bill", "tech", "fraud"],
        private_train=PrivateDataset([Example(t, label) for t, label in rows]), test=[], record_template="Text: {text}\nLabel:",
    )


# -- 1. the scoring routine: the failing record scores 0, the others as without it ------------------
def test_a_record_whose_engine_call_fails_scores_zero_and_the_rest_are_unchanged() -> None:
    rows = base_rows(12)
    task = classification_task(rows + [long_record(rows)])
    prompts = ["Label the message.", "Name the request."]
    engine = FailsOnTheLongRecord()
    full = batch_totals(task, engine, prompts, PrivateBatch(list(task.private_train)), 1.0, True)
    without = batch_totals(task, engine, prompts, PrivateBatch(list(task.private_train)[:-1]), 1.0, True)
    assert full.sums.tolist() == without.sums.tolist()
    # A confusion matrix has no cell for a failure: the record adds nothing (at most one unit).
    assert np.array_equal(full.confusion, without.confusion)
    assert full.errors == 1.0 and without.errors == 0.0
    assert "context overflow" in full.error_detail  # operator-only text, kept for the errors log


def test_a_generation_failure_adds_one_unit_to_the_error_category() -> None:
    records = generation_records(6)
    task = GenerationTask(name="cities", description="cities", private_train=PrivateDataset(records + [
        generation_long_record(records)]), test=[], metric=metric_from_name("exact"), record_template=GEN_TEMPLATE)
    prompts = ["Name the city the message mentions.", "Give the city."]
    totals = batch_totals(task, GeneratorFailsOnTheMarker(), prompts, PrivateBatch(list(task.private_train)), 1.0, True)
    names = list(task.feedback.names)
    assert totals.errors == 1.0 and totals.confusion[:, names.index("error")].tolist() == [1.0, 1.0]
    assert totals.confusion.sum(axis=1).tolist() == [7.0, 7.0]  # still one unit per record per candidate
    assert failure_unit(task).sum() == 1.0 and failure_unit(classification_task(base_rows(3))).sum() == 0.0


# -- 2. twins: D versus D plus a record on which the engine fails ----------------------------------
SCHEDULE = ("epsilon = 4\ngenerations = 3\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n"
            "feedback = \"none\"\ninsecure_noise_seed = 11\n")


@pytest.fixture(scope="module")
def failing_twins(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        rows = base_rows(40)
        d = run_twin(tmp_path_factory.mktemp("d"), rows, monkeypatch, SCHEDULE, engine_factory=FailsOnTheLongRecord)
        dx = run_twin(tmp_path_factory.mktemp("dx"), rows + [long_record(rows)], monkeypatch, SCHEDULE,
                      engine_factory=FailsOnTheLongRecord, coupled_extra_records=1)
    finally:
        monkeypatch.undo()
    return d, dx


def test_a_failure_on_one_record_decides_no_released_byte(failing_twins) -> None:
    d, dx = failing_twins
    assert d.exit_code == dx.exit_code == 0, dx.stdout + dx.stderr
    diff = differences(d, dx)
    details = {name: json_differences(d, dx, name) for name in diff if name.endswith((".json", ".jsonl"))}
    assert not diff, f"released channels differ between D and D+x: {diff}; fields: {json.dumps(details)}"


def test_the_failure_is_seen_by_the_operator_only(failing_twins) -> None:
    # Power: x was sampled and failed, and the operator's errors log says so.
    d, dx = failing_twins
    assert "operator/errors.log" not in d.operator
    assert b"context overflow" in dx.operator["operator/errors.log"]


def couple_failures(patch) -> None:
    """The Gaussian proof's coupling for the count of failed records and x's unit in the failure
    histogram's ``error`` category, made explicit (tests only): the D+x run's totals are taken as if
    x's failure were not there; the noise draws are unchanged."""
    totals = scoring_backends.batch_totals

    def coupled(task, engine, prompts, batch, clip_bound, with_confusion):
        found = totals(task, engine, prompts, batch, clip_bound, with_confusion)
        if not any(GEN_MARKER in record.unwrap().text for record in batch):
            return found
        confusion = None if found.confusion is None else found.confusion - failure_unit(task)
        return scoring_backends.SubsampleTotals(found.sums, confusion, found.errors - 1, found.error_detail)

    patch.setattr(scoring_backends, "batch_totals", coupled)


def test_generation_twins_with_the_error_share_released_are_identical(tmp_path) -> None:
    settings = dict(epsilon=4, generations=3, population=3, parents=2, sampling_rate=0.5, insecure_noise_seed=7,
                    feedback="dp_confusion", llm_operators=True, max_error_share=0.5)
    records = generation_records(40)
    GeneratorFailsOnTheMarker.failures = 0
    d = run_generation_twin(tmp_path / "d", records, settings, engine_factory=GeneratorFailsOnTheMarker)
    assert GeneratorFailsOnTheMarker.failures == 0
    with pytest.MonkeyPatch.context() as patch:
        couple_failures(patch)
        dx = run_generation_twin(tmp_path / "dx", records + [generation_long_record(records)], settings,
                                 engine_factory=GeneratorFailsOnTheMarker, coupled_extra_records=1)
    assert d.exit_code == dx.exit_code == 0, dx.stderr
    assert GeneratorFailsOnTheMarker.failures > 0  # x was sampled and failed
    metrics = [json.loads(line) for line in d.released["metrics.jsonl"].decode().splitlines()]
    assert all(m["error_share_estimate"] is not None for m in metrics)  # the count was released
    diff = differences(d, dx)
    details = {name: json_differences(d, dx, name) for name in diff if name.endswith((".json", ".jsonl"))}
    assert not diff, f"released channels differ between D and D+x: {diff}; fields: {json.dumps(details)}"


# -- 3. the stop decision: a DP release, planned and charged like the scores ----------------------
def test_the_count_of_failures_rides_on_the_scores_gaussian() -> None:
    plain = GaussianScoreMechanism(1.2, 1.0, 4)
    checked = GaussianScoreMechanism(1.2, 1.0, 4, error_noise_multiplier=ERROR_NOISE_RATIO * 1.2)
    assert checked.effective_noise_multiplier == pytest.approx(1.2 / math.sqrt(1 + 1 / ERROR_NOISE_RATIO**2))
    assert checked.effective_noise_multiplier < plain.effective_noise_multiplier
    assert checked.metadata()["error_noise_multiplier"] == pytest.approx(3.6)
    assert "error_noise_multiplier" not in plain.metadata()
    noise = NoiseSource(insecure_seed=0)
    draws = [checked.release_errors(5, noise) for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(5, abs=0.3) and np.std(draws) == pytest.approx(3.6, rel=0.05)
    with pytest.raises(ValueError, match="error_noise_multiplier"):
        plain.release_errors(5, noise)


def test_the_plan_calibrates_with_the_count_inside_the_budget() -> None:
    base = dict(epsilon=2.0, generations=3, population=4, parents=2, sampling_rate=0.2, dataset_size=500,
                llm_operators=False)
    plain = RunPlan.calibrated(DPESConfig(**base).resolved())
    checked = RunPlan.calibrated(DPESConfig(**base, max_error_share=0.5).resolved())
    # More noise on the scores for the same budget (about 5%), and both plans fit it.
    assert checked.value > plain.value
    assert checked.value / plain.value == pytest.approx(math.sqrt(1 + 1 / ERROR_NOISE_RATIO**2), rel=0.02)
    for plan in (plain, checked):
        assert min(plan.epsilons(plan.config.resolved_delta).values()) <= 2.0 + 1e-9
    scores = checked.generation_mechanisms(0).scores
    assert scores is not None and scores.error_noise_multiplier == pytest.approx(ERROR_NOISE_RATIO * checked.value)


def test_the_stop_rule_is_two_noise_deviations_above_the_threshold() -> None:
    assert error_stop(0.9, 0.1, 0.5) and not error_stop(0.65, 0.1, 0.5)
    assert not error_stop(0.9, 0.1, None) and not error_stop(None, None, 0.5)


def test_the_error_share_needs_the_gaussian_scores() -> None:
    with pytest.raises(ConfigError, match="max_error_share"):
        config_with(None, {"selection": "exponential", "feedback": "none", "max_error_share": 0.5})
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ConfigError, match="max_error_share"):
            config_with(None, {"max_error_share": bad})
