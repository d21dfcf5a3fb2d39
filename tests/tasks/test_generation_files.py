"""Generation tasks from files and from the run file's task section (``task.kind: generate``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.settings import OptimizeSettings, TaskSection
from dp_textgrad.tasks import GenerationTask
from dp_textgrad.tasks.generation_files import build_generation_task_from_files, load_generation_file
from dp_textgrad.tasks.metrics import JudgeMetric, metric_from_name

SECRET = "Jane Roe 07700 900123"  # stands for private text: no error message may quote it


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    import csv

    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


# -- reading files ---------------------------------------------------------------------------
def test_jsonl_with_a_nested_target_read_by_a_dotted_path(tmp_path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"input": " book a table in Oslo ", "answer": {"slots": {"city": "Oslo"}, "intent": "book"}},
        {"input": "weather in Lima", "answer": {"slots": {"city": "Lima"}, "intent": "weather"}},
    ])
    first, second = load_generation_file(path, target_column="answer.slots")
    assert first.text == "book a table in Oslo" and first.reference == {"city": "Oslo"}
    assert second.reference == {"city": "Lima"} and first.label == ""
    (one, _) = load_generation_file(path, target_column="answer.intent")
    assert one.reference == "book"


def test_numbers_and_lists_are_references_too(tmp_path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"input": "2 + 2", "target": 4}, {"input": "0.5 + 1", "target": 1.5},
        {"input": "capital", "target": ["a", "b"]},
    ])
    assert [e.reference for e in load_generation_file(path)] == ["4", "1.5", ["a", "b"]]


@pytest.mark.parametrize("suffix, delimiter", [(".csv", ","), (".tsv", "\t")])
def test_delimited_cells_that_hold_json_are_json(tmp_path, suffix, delimiter) -> None:
    path = write_csv(tmp_path / f"d{suffix}", ["question", "answer"], [
        ["where is the shop", '{"city": "Oslo", "street": {"name": "Main"}}'],
        ["plain text answer", "Oslo"],
        ["a list", '["x", "y"]'],
        ["not json", "{broken"],
    ], delimiter)
    rows = load_generation_file(path, input_column="question", target_column="answer")
    assert [r.reference for r in rows] == [{"city": "Oslo", "street": {"name": "Main"}}, "Oslo", ["x", "y"], "{broken"]
    nested = write_csv(tmp_path / f"n{suffix}", ["question", "answer"], [
        ["where is the shop", '{"city": "Oslo", "street": {"name": "Main"}}']], delimiter)
    (street,) = load_generation_file(nested, input_column="question", target_column="answer.street.name")
    assert street.reference == "Main"
    with pytest.raises(ValueError, match=r"task.target_column: 'answer.street.name' not found in d.* line\(s\) 3"):
        load_generation_file(path, input_column="question", target_column="answer.street.name")


@pytest.mark.parametrize("rows, field, lines", [
    ([{"text": SECRET, "target": "a"}], "task.input_column", "line(s) 1"),
    ([{"input": "x", "target": "a"}, {"input": SECRET}], "task.target_column", "line(s) 2"),
    ([{"input": "x", "target": "a"}, {"input": " ", "target": SECRET}], "task.input_column", "line(s) 2"),
    ([{"input": SECRET, "target": ""}], "task.target_column", "line(s) 1"),
    ([{"input": SECRET, "target": None}], "task.target_column", "line(s) 1"),
])
def test_bad_records_name_the_field_and_the_lines_never_the_text(tmp_path, rows, field, lines) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ValueError) as caught:
        load_generation_file(path)
    message = str(caught.value)
    assert field in message and lines in message and "train.jsonl" in message
    assert SECRET not in message and "Jane" not in message


def test_a_line_that_is_not_json_and_an_unknown_extension(tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"input": "x", "target": "y"}\n' + SECRET + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line\(s\) 2 are not JSON objects") as caught:
        load_generation_file(path)
    assert SECRET not in str(caught.value)
    other = tmp_path / "d.txt"
    other.write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match="format"):
        load_generation_file(other)
    with pytest.raises(FileNotFoundError):
        load_generation_file(tmp_path / "missing.jsonl")


def test_build_from_files_subsamples_by_seed(tmp_path) -> None:
    rows = [{"input": f"record {i}", "target": str(i)} for i in range(30)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", rows[:10])
    task = build_generation_task_from_files("t", train, test, metric_from_name("exact"), public=test,
                                            n_private=12, seed=3, max_new_tokens=8, stop=["\n"])
    assert isinstance(task, GenerationTask) and len(task.private_train) == 12 and len(task.test) == 10
    assert task.max_new_tokens == 8 and task.stop == ("\n",) and len(task.public_examples) == 10


# -- the run file's task section ----------------------------------------------------------------
@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    rows = [{"input": f"order {i} in {c}", "target": c} for i, c in enumerate(["Oslo", "Lima", "Rome", "Paris"] * 3)]
    return {"train": str(write_jsonl(tmp_path / "train.jsonl", rows)),
            "test": str(write_jsonl(tmp_path / "test.jsonl", rows[:4]))}


def test_classify_is_the_default_and_generate_builds_a_generation_task(files) -> None:
    assert TaskSection(**files).kind == "classify"
    section = TaskSection(kind="generate", metric="f1", max_new_tokens=16, stop=["\n"],
                          categories={"partial": "some words of the answer are right"}, **files)
    task = section.build()
    assert isinstance(task, GenerationTask) and task.metric_name == "f1" and not task.binary_scores
    assert task.max_new_tokens == 16 and task.stop == ("\n",)
    assert "some words of the answer are right" in task.feedback.descriptions
    assert task.seed_prompt  # a default seed prompt for generation files


@pytest.mark.parametrize("given, field", [
    ({"kind": "generate", "labels": ["a"]}, "labels"),
    ({"kind": "generate", "label_column": "y"}, "label_column"),
    ({"kind": "generate", "text_column": "body"}, "text_column"),
    ({"metric": "f1"}, "metric"),
    ({"target_column": "answer"}, "target_column"),
    ({"max_new_tokens": 8}, "max_new_tokens"),
    ({"kind": "generate", "metric": "bleu"}, "metric"),
    ({"kind": "generate", "max_new_tokens": 0}, "max_new_tokens"),
    ({"kind": "generate", "stop": [""]}, "stop"),
])
def test_a_field_of_the_other_family_or_a_bad_value_is_refused_by_name(files, given, field) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=re.escape(field)):
        TaskSection(**files, **given)


def test_a_saved_copy_of_the_settings_builds_again(files) -> None:
    # The CLI saves every field (defaults included) for --resume: that is not "giving" them.
    section = TaskSection(kind="generate", metric="numeric", **files)
    again = TaskSection.model_validate(section.model_dump(mode="json"))
    assert again == section
    classify = TaskSection(**files)
    assert TaskSection.model_validate(classify.model_dump(mode="json")) == classify


def test_metric_options_and_categories_are_checked_when_built(files) -> None:
    with pytest.raises(ValueError, match=r"task.metric_options: unknown options \['tolerence'\]"):
        TaskSection(kind="generate", metric="numeric", metric_options={"tolerence": 1}, **files).build()
    with pytest.raises(ValueError, match="task.categories: unknown categories"):
        TaskSection(kind="generate", metric="exact", categories={"typo": "x"}, **files).build()
    with pytest.raises(ValueError, match="task.metric: unknown metric|python"):
        TaskSection(kind="generate", metric="python:no_such_module_xyz:f", **files).build()


def test_a_judge_grades_with_the_runs_engine(files) -> None:
    section = TaskSection(kind="generate", metric="judge", metric_options={"rubric": "Same city?", "max_tokens": 8},
                          **files)
    assert section.needs_engine()
    with pytest.raises(ValueError, match="judge grades with the run's engine"):
        section.build()
    engine = ScriptedEngine(lambda prompt, system: "Grade: 10/10" if "Grade" in (system or "") + prompt else "x")
    task = section.build(engine)
    assert isinstance(task.metric, JudgeMetric) and task.metric.engine is engine and task.metric.max_tokens == 8
    with pytest.raises(ValueError, match="task.metric_options: unknown options"):
        TaskSection(kind="generate", metric="judge", metric_options={"rubrik": "x"}, **files).build(engine)


def test_judge_refused_on_ray_and_on_a_base_model(files) -> None:
    from pydantic import ValidationError

    task = dict(kind="generate", metric="judge", **files)
    with pytest.raises(ValidationError, match="judge cannot score on Ray actors"):
        OptimizeSettings(task=task, engine={"kind": "openai", "model": "m"}, distributed={"enabled": True})
    with pytest.raises(ValidationError, match="instruction-following"):
        OptimizeSettings(task=task)  # the default local model is a base model
    OptimizeSettings(task=task, engine={"kind": "llama_cpp", "options": {"instruction_following": True}})


def test_a_built_in_task_decides_its_kind(files) -> None:
    from pydantic import ValidationError

    assert TaskSection(name="support").kind == "classify"
    assert TaskSection(name="support_extract").kind == "generate"
    with pytest.raises(ValidationError, match="kind: the built-in task support is a classify task"):
        TaskSection(name="support", kind="generate")
    with pytest.raises(ValidationError, match=r"metric\n.*applies to your own files"):
        TaskSection(name="support", metric="f1")


def test_a_judge_tasks_private_records_are_read_without_an_engine(files) -> None:
    section = TaskSection(kind="generate", metric="judge", metric_options={"rubric": "Same city?"}, **files)
    exact = TaskSection(kind="generate", metric="exact", **files)
    records = [r.unwrap() for r in section.private_records()]
    assert records == [r.unwrap() for r in exact.build().private_train]
