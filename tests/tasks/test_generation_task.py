"""GenerationTask: the second family of the task protocol (scripted engine; no model)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dp_textgrad.dp_es.mutation import MutationEngine, render_failures
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.dp_es.preflight import PreflightError, preflight
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.data import PrivateDataset, PublicText
from dp_textgrad.tasks import ClassificationTask, Example, GenerationExample, GenerationTask, Task
from dp_textgrad.tasks.generation import reference_text
from dp_textgrad.tasks.metrics import metric_from_name

CITIES = ["Paris", "Oslo", "Lima", "Rome"]


def city_answer(prompt: str, system: str | None) -> str:
    """Answers the city of the last input when the prompt asks for the city, else 'none'."""
    last = prompt.rsplit("Input:", 1)[-1]
    match = re.search(r"in (\w+)", last)
    return " " + (match.group(1) if match and "city" in prompt.lower() else "none")


def records(n: int, start: int = 0) -> list[GenerationExample]:
    return [
        GenerationExample(f"Order {i} went to a shop in {CITIES[i % 4]}", reference=CITIES[i % 4])
        for i in range(start, start + n)
    ]


def make_task(**overrides) -> GenerationTask:
    settings = dict(
        name="cities",
        description="Extract the city a message names.",
        private_train=PrivateDataset(records(12)),
        test=records(8, 100),
        metric=metric_from_name("exact"),
        public_examples=records(4, 200),
        seed_prompt="Read the message.",
    )
    settings.update(overrides)
    return GenerationTask(**settings)


def test_both_families_follow_the_task_protocol():
    task = make_task()
    assert isinstance(task, Task)
    classify = ClassificationTask(
        "t", "d", ["a", "b"], PrivateDataset([Example("x", "a")]), test=[], record_template="Text: {text}\nLabel:"
    )
    assert isinstance(classify, Task)
    assert (task.kind, classify.kind) == ("generate", "classify")
    assert task.feedback.kind == "failures" and task.feedback.shape == (len(task.metric.categories),)
    assert classify.feedback.shape == (2, 2) and classify.metric_name == "accuracy"
    assert task.metric_name == "exact" and task.binary_scores


def test_scores_follow_the_metric_and_the_prompt():
    engine = ScriptedEngine(city_answer)
    task = make_task()
    assert task.mean_score(engine, "Read the message.") == 0.0
    assert task.mean_score(engine, "Name the city.") == 1.0
    scores = task.public_scores(engine, "Name the city.", task.test)
    assert scores.shape == (8,) and set(scores) == {1.0}


def test_private_outcomes_feed_a_failure_histogram_one_unit_per_record():
    engine = ScriptedEngine(city_answer)
    task = make_task(clip_bound=2.0)
    batch = task.private_train.poisson_subsample(1.0, np.random.default_rng(0))
    outcomes = task.private_outcomes(engine, "Name the city.", batch)
    assert np.all(outcomes.scores == 2.0)  # clipped to [0, C] with C = 2
    counts = task.feedback_counts(outcomes)
    assert counts.shape == task.feedback.shape and counts.sum() == len(batch)
    assert counts[task.feedback.names.index("correct")] == len(batch)
    wrong = task.feedback_counts(task.private_outcomes(engine, "Read the message.", batch))
    assert wrong.sum() == len(batch) and wrong[task.feedback.names.index("correct")] == 0


def test_a_metric_that_raises_scores_zero_and_the_run_goes_on():
    def broken(output, reference):
        raise RuntimeError(f"cannot score {output}")

    from dp_textgrad.tasks.metrics import CallableMetric

    task = make_task(metric=CallableMetric(broken, name="broken"))
    out = task.public_outcomes(ScriptedEngine(city_answer), "Name the city.", task.test)
    assert np.all(out.scores == 0.0) and out.categories.shape == (8,)


def test_generation_settings_reach_the_engine():
    engine = ScriptedEngine(lambda prompt, system: " Paris and many more words after it")
    task = make_task(max_new_tokens=3, stop=("\nInput:",), temperature=0.0)
    task.public_scores(engine, "Name the city.", task.test[:1])
    call = engine.history[-1]
    assert call.max_tokens == 3 and call.stop == ("\nInput:",) and call.temperature == 0.0
    assert call.prompt.startswith("Name the city.\n\nInput: Order 100")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"record_template": "no placeholder"}, "record_template"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"stop": ("",)}, "stop"),
        ({"test": [GenerationExample("x")]}, "test[0]"),
        ({"private_train": PrivateDataset([GenerationExample(" ", reference="a")])}, "private_train"),
        ({"private_train": PrivateDataset([GenerationExample("x")])}, "private_train"),
        ({"metric": object()}, "metric"),
    ],
)
def test_bad_settings_name_the_field(overrides, field):
    with pytest.raises((ValueError, TypeError), match=re.escape(field)):
        make_task(**overrides)


def test_private_validation_counts_rows_without_quoting_them():
    secret = "Patient Jane Roe, 4 Elm Street"
    with pytest.raises(ValueError) as info:
        make_task(private_train=PrivateDataset([GenerationExample(secret)]))
    assert "Jane" not in str(info.value) and "1 record(s)" in str(info.value)


def test_demos_show_the_reference_and_nested_references_as_json():
    task = make_task()
    assert task.render_demo(GenerationExample("in Rome", reference="Rome")) == "Input: in Rome\nOutput: Rome"
    assert reference_text(["Rome", "Roma"]) == "Rome"
    assert reference_text({"city": "Rome", "n": 2}) == '{"city": "Rome", "n": 2}'


def test_bounded_records_cut_inputs_only():
    task = make_task(private_train=PrivateDataset([GenerationExample("one two three four five", reference="five")]))
    bounded = task.with_bounded_records(lambda t: len(t.split()), lambda t, n: " ".join(t.split()[:n]), 2)
    record = next(iter(bounded.private_train)).unwrap()
    assert record.text == "one two" and record.reference == "five"
    with pytest.raises(ValueError, match="dp.max_record_tokens"):
        task.with_bounded_records(lambda t: len(t.split()), lambda t, n: t, 2, policy="reject")


def test_preflight_checks_the_output_cap_fits_the_context():
    task = make_task(max_new_tokens=50)
    preflight(ScriptedEngine(city_answer, max_context_tokens=200), task, "Name the city.", 20)
    small = ScriptedEngine(city_answer, max_context_tokens=60)
    with pytest.raises(PreflightError, match="max_new_tokens"):
        preflight(small, task, "Name the city.", 20)


def test_preflight_fails_fast_when_the_engine_cannot_generate():
    def broken(prompt, system):
        raise ConnectionError("server at http://127.0.0.1:9 refused")

    with pytest.raises(PreflightError, match="failed to generate"):
        preflight(ScriptedEngine(broken), make_task(), "Name the city.", 20)


def test_render_failures_states_shares_of_public_categories_above_the_noise():
    spec = make_task().feedback
    counts = np.zeros(len(spec.names))
    counts[spec.names.index("correct")] = 10
    counts[spec.names.index("wrong_answer")] = 6
    counts[spec.names.index("empty")] = 0.4  # under the noise floor: not stated
    sentences = render_failures(counts, spec.names, spec.descriptions, 20.0, noise_std=0.5)
    text = [str(s) for s in sentences]
    assert text[0] == "Overall, about 50% of outputs get full marks."
    assert any("30%" in s and "shares no word" in s for s in text)
    assert not any("empty" in s for s in text)
    assert all(isinstance(s, PublicText) and s.source == "dp" for s in sentences)
    with pytest.raises(ValueError, match="noisy_histogram"):
        render_failures(counts[:2], spec.names, spec.descriptions)


def test_mutation_works_without_labels_and_sets_demos_from_one_group():
    task = make_task()
    engine = MutationEngine(
        None,
        PublicText(task.description, "user"),
        task.labels,
        task.public_examples,
        np.random.default_rng(0),
        render_demo=task.render_demo,
    )
    seed = Candidate(
        id="g0-seed", text=task.seed_prompt, parent_ids=(), operator="seed", operator_meta={}, generation=0
    )
    variants = engine.variants(seed, 4)
    assert variants and any(v.operator == "demo_set" for v in variants)
    # one group, two to six demonstrations a set (the pool holds four)
    assert all(2 <= v.text.count("Output:") <= 4 for v in variants if v.operator == "demo_set")
    assert not any(v.operator == "verbaliser_hint" for v in engine.children([seed], 12, 1))
    with pytest.raises(ValueError, match="labels"):
        MutationEngine(None, PublicText("d", "user"), ["only"], [], np.random.default_rng(0))
