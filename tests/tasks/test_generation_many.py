"""GenerationTask.private_outcomes_many: each record under every candidate prompt in one engine
call (``generate_for_prefixes``), never with another record (scripted engine; no model)."""

from __future__ import annotations

import re

import numpy as np

from dp_textgrad.dp_es.scoring_backends import batch_totals
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.privacy.mechanisms import clipped_utility_sums
from dp_textgrad.tasks import GenerationExample, GenerationTask
from dp_textgrad.tasks.metrics import metric_from_name

CITIES = ["Paris", "Oslo", "Lima", "Rome"]
PROMPTS = ["Name the city.", "Read the message.", "Which city? Answer with the city.", "Name the city."]


def answer(prompt: str, system: str | None) -> str:
    """The city of the last input when the prompt asks for the city; a few words otherwise."""
    last = prompt.rsplit("Input:", 1)[-1]
    match = re.search(r"in (\w+)", last)
    if match and "city" in prompt.lower():
        return " " + match.group(1)
    return " it went somewhere far away"


class PerRecordEngine(ScriptedEngine):
    """Batches prompts (as LlamaCppEngine does) and records every ``generate_for_prefixes`` call."""

    batches_prefixes = True

    def __init__(self) -> None:
        super().__init__(answer)
        self.for_prefixes_calls: list[tuple[list[str], str]] = []

    def generate_for_prefixes(self, prefixes, suffix, **kwargs):  # type: ignore[no-untyped-def]
        self.for_prefixes_calls.append((list(prefixes), suffix))
        return super().generate_for_prefixes(prefixes, suffix, **kwargs)


def make_task(n: int = 10) -> GenerationTask:
    rows = [
        GenerationExample(f"Order {i} went to a shop in {CITIES[i % 4]}", reference=CITIES[i % 4]) for i in range(n)
    ]
    return GenerationTask(
        name="cities",
        description="Extract the city a message names.",
        private_train=PrivateDataset(rows),
        test=rows[:3],
        metric=metric_from_name("exact"),
        max_new_tokens=3,
        clip_bound=2.0,
    )


def test_outcomes_many_equal_the_per_prompt_outcomes_and_call_once_per_record() -> None:
    task = make_task()
    batch = task.private_train.poisson_subsample(1.0, np.random.default_rng(0))
    engine = PerRecordEngine()
    many = task.private_outcomes_many(engine, PROMPTS, batch)
    assert len(engine.for_prefixes_calls) == len(batch)  # one call per record, all prompts in it
    assert all(len(prefixes) == len(PROMPTS) for prefixes, _ in engine.for_prefixes_calls)
    assert all(suffix.startswith("Input: Order") for _, suffix in engine.for_prefixes_calls)
    for prompt, outcome in zip(PROMPTS, many, strict=True):
        alone = task.private_outcomes(ScriptedEngine(answer), prompt, batch)
        assert np.array_equal(outcome.scores, alone.scores)
        assert np.array_equal(outcome.categories, alone.categories)
    # The max-tokens category shows up for the wordy prompt: categorising is shared too.
    assert task.feedback_counts(many[1]).sum() == len(batch)
    public = task.public_outcomes_many(ScriptedEngine(answer), PROMPTS, task.test)
    assert [list(o.scores) for o in public] == [
        list(task.public_outcomes(ScriptedEngine(answer), p, task.test).scores) for p in PROMPTS
    ]
    assert task.private_outcomes_many(engine, [], batch) == []


def test_a_records_outputs_do_not_depend_on_the_other_records() -> None:
    task = make_task(3)
    records = [rec for rec in task.private_train.poisson_subsample(1.0, np.random.default_rng(0))]
    assert len(records) == 3
    x, r, y = (rec.unwrap() for rec in records)
    alone = task.public_outcomes_many(PerRecordEngine(), PROMPTS, [r])
    mixed = task.public_outcomes_many(PerRecordEngine(), PROMPTS, [x, r, y])
    assert [o.scores[0] for o in alone] == [o.scores[1] for o in mixed]
    assert [o.categories[0] for o in alone] == [o.categories[1] for o in mixed]


def test_batch_totals_use_the_many_path_and_give_the_per_prompt_totals() -> None:
    task = make_task()
    batch = task.private_train.poisson_subsample(0.7, np.random.default_rng(3))
    engine = PerRecordEngine()
    totals = batch_totals(task, engine, PROMPTS, batch, task.clip_bound, with_confusion=True)
    assert len(engine.for_prefixes_calls) == len(batch)
    per_prompt = [task.private_outcomes(ScriptedEngine(answer), p, batch) for p in PROMPTS]
    expected = clipped_utility_sums(np.stack([o.scores for o in per_prompt]), task.clip_bound)
    assert np.array_equal(totals.sums, expected)
    assert totals.confusion is not None
    assert np.array_equal(totals.confusion, np.stack([task.feedback_counts(o) for o in per_prompt]))


def test_an_engine_that_does_not_batch_prompts_is_asked_prompt_by_prompt() -> None:
    # The OpenAI engine spreads a prompt's records over concurrent requests: keep that order.
    task = make_task()
    batch = task.private_train.poisson_subsample(1.0, np.random.default_rng(0))
    engine = PerRecordEngine()
    engine.batches_prefixes = False
    many = task.private_outcomes_many(engine, PROMPTS, batch)
    assert engine.for_prefixes_calls == []
    assert [h.prompt.startswith(task.render_prefix(PROMPTS[0])) for h in engine.history[: len(batch)]] == [True] * len(
        batch
    )
    assert np.array_equal(many[0].scores, task.private_outcomes(ScriptedEngine(answer), PROMPTS[0], batch).scores)
