"""A generation prompt's own record format (issue 46): the paragraph holding {text} says how the
model reads a record, its demonstrations are written in it, and the search may move a prompt
to another public format (``record_format_change``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dp_textgrad.dp_es.mutation import MutationEngine
from dp_textgrad.dp_es.mutation.operators import NO_LLM_WEIGHTS, OPERATORS
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.dp_es.preflight import PreflightError, preflight
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.data import PrivateDataset, PublicText
from dp_textgrad.settings import TaskSection
from dp_textgrad.tasks import GenerationExample, GenerationTask
from dp_textgrad.tasks.metrics import metric_from_name
from dp_textgrad.tasks.record_format import (
    check_record_format,
    format_stops,
    split_record_format,
    with_record_format,
)
from dp_textgrad.tasks.support_extract import make_support_extract_task

CITIES = ["Paris", "Oslo", "Lima", "Rome"]


def test_the_format_is_the_paragraph_holding_the_slot_to_the_end() -> None:
    assert split_record_format("Name the city.") == ("Name the city.", None)
    prompt = "Name the city.\n\nQ: a trip to Oslo\nA: Oslo\n\nQ: {text}\nA:"
    assert split_record_format(prompt) == ("Name the city.\n\nQ: a trip to Oslo\nA: Oslo", "Q: {text}\nA:")
    assert split_record_format("{text}\n=>") == ("", "{text}\n=>")
    assert with_record_format(*split_record_format(prompt)) == prompt
    with pytest.raises(ValueError, match=r"prompt: .*exactly once"):
        split_record_format("Intro.\n\nA: {text} and again {text}\nB:")


def test_a_format_is_refused_naming_the_field_and_the_fix() -> None:
    assert check_record_format(" Q: {text}\nA: ", "record_formats[0]") == "Q: {text}\nA:"
    with pytest.raises(ValueError, match=r"record_formats\[1\]: .*\{text\} exactly once"):
        check_record_format("Q: text\nA:", "record_formats[1]")
    with pytest.raises(ValueError, match=r"record_formats\[2\]: .*blank line"):
        check_record_format("Q: {text}\n\nA:", "record_formats[2]")


def test_a_prompts_own_format_adds_its_next_record_label_to_the_stops() -> None:
    assert format_stops(None, ("\n\n", "\nInput:")) == ("\n\n", "\nInput:")
    assert format_stops("Q: {text}\nA:", ("\n\n", "\nInput:")) == ("\n\n", "\nInput:", "\nQ:")
    assert format_stops("Input: {text}\nOutput:", ("\n\n", "\nInput:")) == ("\n\n", "\nInput:")
    assert format_stops("Q: {text}\nA:", ("\n",)) == ("\n",)  # a newline already ends the answer
    assert format_stops("{text}\nAnswer:", ("\n\n",)) == ("\n\n",)


class RecordingEngine(ScriptedEngine):
    """Batches prompts (as LlamaCppEngine does) and records what each call was given."""

    batches_prefixes = True

    def __init__(self) -> None:
        super().__init__(lambda prompt, system: " " + (re.findall(r"in (\w+)", prompt) or ["none"])[-1])
        self.after_prefix: list[tuple[str, list[str], tuple[str, ...]]] = []
        self.for_prefixes: list[tuple[list[str], str, tuple[str, ...]]] = []

    def generate_after_prefix(self, prefix, suffixes, **kwargs):  # type: ignore[no-untyped-def]
        self.after_prefix.append((prefix, list(suffixes), tuple(kwargs["stop"])))
        return super().generate_after_prefix(prefix, suffixes, **kwargs)

    def generate_for_prefixes(self, prefixes, suffix, **kwargs):  # type: ignore[no-untyped-def]
        self.for_prefixes.append((list(prefixes), suffix, tuple(kwargs["stop"])))
        return super().generate_for_prefixes(prefixes, suffix, **kwargs)


def city_task(**options: object) -> GenerationTask:
    rows = [GenerationExample(f"a parcel in {CITIES[i % 4]}", reference=CITIES[i % 4]) for i in range(6)]
    return GenerationTask(
        name="cities",
        description="Extract the city a message names.",
        private_train=PrivateDataset(rows),
        test=rows[:4],
        metric=metric_from_name("exact"),
        public_examples=rows[:3],
        max_new_tokens=3,
        **options,  # type: ignore[arg-type]
    )


def test_a_task_reads_each_record_in_the_prompts_own_format() -> None:
    task, engine = city_task(), RecordingEngine()
    prompt = "Name the city.\n\nQ: {text}\nA:"
    assert task.render_prefix(prompt) == "Name the city.\n\n"
    assert task.render_record("a parcel in Oslo", prompt) == "Q: a parcel in Oslo\nA:"
    assert task.render_record("a parcel in Oslo") == "Input: a parcel in Oslo\nOutput:"
    assert task.render_demo(task.public_examples[0], "Q: {text}\nA:") == "Q: a parcel in Paris\nA: Paris"
    assert task.mean_score(engine, prompt) == 1.0
    prefix, suffixes, stop = engine.after_prefix[-1]
    assert prefix == "Name the city.\n\n" and suffixes[1] == "Q: a parcel in Oslo\nA:" and stop[-1] == "\nQ:"
    task.mean_score(engine, "Name the city.")  # without a format: the task's template, as before
    assert engine.after_prefix[-1][1][1] == "Input: a parcel in Oslo\nOutput:"
    assert engine.after_prefix[-1][2] == task.stop


def test_one_record_under_prompts_of_two_formats_goes_in_one_call_per_format() -> None:
    task, engine = city_task(), RecordingEngine()
    prompts = ["Name the city.", "City?\n\nQ: {text}\nA:", "Which city?", "Q: {text}\nA:"]
    outcomes = task.public_outcomes_many(engine, prompts, task.test)
    assert [o.scores.tolist() for o in outcomes] == [[1.0] * 4] * 4
    assert len(engine.for_prefixes) == 2 * len(task.test)  # one call per record and format
    for _, suffix, _ in engine.for_prefixes:
        assert suffix.count("a parcel in") == 1  # never two records in one call
    first, second = engine.for_prefixes[:2]
    assert first[0] == ["Name the city.\n\n", "Which city?\n\n"] and first[1].startswith("Input: ")
    assert second[0] == ["City?\n\n", ""] and second[1].startswith("Q: ") and second[2][-1] == "\nQ:"


def test_preflight_refuses_a_seed_whose_format_holds_the_slot_twice_before_any_charge() -> None:
    with pytest.raises(PreflightError, match=r"preflight: the seed prompt: .*exactly once"):
        preflight(RecordingEngine(), city_task(), "Intro.\n\nQ: {text} {text}\nA:", 64)
    preflight(RecordingEngine(), city_task(), "Intro.\n\nQ: {text}\nA:", 64)  # a well-formed one passes


def test_the_task_keeps_its_own_template_out_of_its_alternatives_and_checks_them() -> None:
    assert city_task().record_formats == ()  # none unless the task names them: the operator is off
    task = city_task(record_formats=("Input: {text}\nOutput:", "Q: {text}\nA:", "Q: {text}\nA:"))
    assert task.record_formats == ("Q: {text}\nA:",)
    with pytest.raises(ValueError, match=r"record_formats\[0\]"):
        city_task(record_formats=("no slot",))
    assert make_support_extract_task(seed=0, n_private=4, n_public=2, n_test=2).record_formats[0] == (
        "Message: {text}\nAccount number:"
    )


def test_a_run_file_sets_the_formats_of_a_generation_task_and_refuses_them_elsewhere(tmp_path) -> None:
    rows = "".join(f'{{"input": "a parcel in {c}", "target": "{c}"}}\n' for c in CITIES)
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "test.jsonl").write_text(rows)
    files = {"train": str(tmp_path / "train.jsonl"), "test": str(tmp_path / "test.jsonl"), "kind": "generate"}
    task = TaskSection(**files, record_formats=["Q: {text}\nA:"]).build(None)
    assert task.record_formats == ("Q: {text}\nA:",)
    assert TaskSection(**files, record_formats=[]).build(None).record_formats == ()
    with pytest.raises(ValueError, match=r"record_formats"):
        TaskSection(**files, record_formats=["Q: {text}\n\nA:"])
    with pytest.raises(ValueError, match=r"(?s)record_formats.*task.kind: generate"):
        TaskSection(train=files["train"], test=files["test"], record_formats=["Q: {text}\nA:"])


def _engine(task: GenerationTask, formats: object = "task") -> MutationEngine:
    record_formats = task.record_formats if formats == "task" else formats
    return MutationEngine(
        None,
        PublicText(task.description, "user"),
        task.labels,
        task.public_examples,
        np.random.default_rng(0),
        render_demo=task.render_demo,
        weights=NO_LLM_WEIGHTS,
        record_formats=record_formats,  # type: ignore[arg-type]
        render_demo_as=task.render_demo,
    )


def test_changing_the_format_rewrites_the_same_demonstrations_in_it() -> None:
    task = make_support_extract_task(seed=0, n_private=8, n_public=6, n_test=2)
    mutation = _engine(task)
    demos = [task.render_demo(example) for example in task.public_examples[:3]]
    parent = Candidate.new("\n\n".join(["Read the message.", *demos]), generation=0, operator="seed")
    seen = set()
    for _ in range(30):
        edit = OPERATORS["record_format_change"].run(mutation.context, parent, [], ())
        assert edit is not None
        body, record_format = split_record_format(edit.text)
        seen.add(record_format)
        assert record_format in task.record_formats
        expected = [task.render_demo(example, record_format) for example in task.public_examples[:3]]
        assert body == "\n\n".join(["Read the message.", *expected])
        back = Candidate.new(edit.text, generation=1, operator="record_format_change")
        assert OPERATORS["record_format_change"].run(mutation.context, back, [], ()) is not None
    assert seen == set(task.record_formats)  # both of the task's field-name formats were tried


def test_a_crossover_writes_the_partners_demonstrations_in_the_primarys_format() -> None:
    task = make_support_extract_task(seed=0, n_private=8, n_public=6, n_test=2)
    mutation = _engine(task)
    own = [task.render_demo(example) for example in task.public_examples[:2]]
    fmt = task.record_formats[0]
    other = [task.render_demo(example, fmt) for example in task.public_examples[2:4]]
    primary = Candidate.new("\n\n".join(["Read the message.", *own]), generation=0, operator="seed")
    partner = Candidate.new("\n\n".join(["Find the number.", *other, fmt]), generation=0, operator="x")
    edit = OPERATORS["sentence_crossover"].run(mutation.context, primary, [partner], ())
    assert edit is not None
    body, record_format = split_record_format(edit.text)
    assert record_format is None
    expected = {task.render_demo(example) for example in task.public_examples[:4]}
    assert set(body.split("\n\n")[1:]) <= expected and len(body.split("\n\n")[1:]) == 4


def test_no_formats_turn_the_operator_off_and_a_classification_engine_never_splits_a_slot() -> None:
    task = make_support_extract_task(seed=0, n_private=8, n_public=6, n_test=2)
    off = _engine(task, formats=())
    seed = Candidate.new("Read the message.", generation=0, operator="seed")
    assert not off._applicable("record_format_change", seed, [])
    assert _engine(task)._applicable("record_format_change", seed, [])
    without = _engine(task, formats=None)  # a task whose prompts have no record format
    layout = without.context.layout(Candidate.new("Say {text}.", generation=0, operator="seed"))
    assert layout.record_format is None and layout.instruction == "Say {text}."
    assert len(without.context.demo_pool) == len(task.public_examples)


def test_the_leakage_audit_reads_a_record_where_the_prompt_puts_it() -> None:
    from dp_textgrad.audit.membership.leakage import record_context

    task = city_task()
    assert record_context(task, "Name the city.\n\nQ: {text}\nA:", "a parcel") == "Name the city.\n\nQ: a parcel"
    assert record_context(task, "Name the city.", "a parcel") == "Name the city.\n\nInput: a parcel"
