"""SNIPS slot extraction and GSM8K as generation tasks: loaders, the slot-F1 metric, the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dp_textgrad.tasks.base import Task
from dp_textgrad.tasks.benchmark_generation import (
    SLOT_CATEGORIES,
    SlotF1,
    build_gsm8k,
    build_snips,
    load_gsm8k,
    slot_f1,
)
from dp_textgrad.tasks.generation import GenerationTask
from dp_textgrad.tasks.registry import available_tasks, get_task

INTENTS = (
    "PlayMusic",
    "GetWeather",
    "BookRestaurant",
    "RateBook",
    "AddToPlaylist",
    "SearchCreativeWork",
    "SearchScreeningEvent",
)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_tiny_data(root: Path, per_intent: int = 4, gsm_train: int = 14) -> Path:
    """A made-up data folder in the layout of ../shared/data (snips/ and gsm8k/)."""
    snips = [
        {"text": f"request {i} for {intent}", "intent": intent, "slots": {"thing": f"value {i}"}}
        for intent in INTENTS
        for i in range(per_intent)
    ]
    write_jsonl(root / "snips" / "train.jsonl", snips)
    write_jsonl(root / "snips" / "dev.jsonl", snips[:5])
    write_jsonl(root / "snips" / "test.jsonl", snips[5:12])
    gsm = [
        {"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
        for i in range(gsm_train)
    ]
    write_jsonl(root / "gsm8k" / "train.jsonl", gsm)
    write_jsonl(root / "gsm8k" / "test.jsonl", gsm[:6])
    return root


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        ('{"artist": "Gloria Gaither", "track": "Tankmen"}', {"track": "Tankmen", "artist": "Gloria Gaither"}, 1.0),
        (' {"artist": "gloria gaither."} trailing', {"track": "Tankmen", "artist": "Gloria Gaither"}, 2 / 3),
        ('{"artist": "Gloria Gaither", "album": "x"}', {"artist": "Gloria Gaither"}, 2 / 3),  # extra slot: precision
        ('{"city": "Paris"}', {"city": "London"}, 0.0),
        ("no json here", {"city": "London"}, 0.0),
        ('{"city": ["Paris", "Rome"]}', {"city": "Paris | Rome"}, 1.0),  # a slot that occurs twice
        ("{}", {}, 1.0),
        ('{"city": "Paris"}', '{"city": "Paris"}', 1.0),  # a reference given as JSON text
    ],
)
def test_slot_f1_scores_name_value_pairs(output: str, reference: object, expected: float) -> None:
    assert slot_f1(output, reference) == pytest.approx(expected)


def test_slot_f1_categories_tell_failures_apart() -> None:
    metric = SlotF1()
    reference = {"city": "London", "timeRange": "tomorrow"}
    assert metric.name == "slot_f1" and not metric.binary and set(metric.categories) == set(SLOT_CATEGORIES)
    cases = {
        '{"city": "London", "timeRange": "tomorrow"}': "correct",
        "   ": "empty",
        "London tomorrow": "wrong_format",
        '{"city": "London"}': "partial",
        '{"city": "Paris"}': "wrong_values",
        '{"artist": "Paris"}': "wrong_answer",
    }
    for output, category in cases.items():
        assert metric.categorise(output, reference, False) == category, output
    assert metric.categorise('{"city": "London"}', reference, True) == "too_long"


def test_snips_task_reads_the_data_folder(tmp_path: Path) -> None:
    root = write_tiny_data(tmp_path / "data")
    task = build_snips(root, n_private=None)
    assert isinstance(task, GenerationTask) and isinstance(task, Task) and task.kind == "generate"
    assert task.metric_name == "slot_f1" and task.labels == [] and task.stop == ("\n",)
    # Two fixed public demonstrations per intent, never in the private pool.
    assert len(task.public_examples) == 2 * len(INTENTS)
    private = {r.unwrap().text for r in task.private_train}
    assert len(private) == 4 * len(INTENTS) - 2 * len(INTENTS)
    assert not private & {e.text for e in task.public_examples}
    assert task.test[0].reference == {"thing": "value 1"}  # line 6 of the file
    assert task.render_demo(task.public_examples[0]).startswith("Request: request ")
    assert '\nSlots: {"thing": "value ' in task.render_demo(task.public_examples[0])
    # The public set does not depend on the run's seed; the private draw and the test slice do.
    other = build_snips(root, n_private=5, n_test=3, seed=7, split="dev")
    assert [e.text for e in other.public_examples] == [e.text for e in task.public_examples]
    assert len(other.private_train) == 5 and len(other.test) == 3
    with pytest.raises(ValueError, match="split"):
        build_snips(root, split="train")


def test_snips_errors_name_the_file_and_line_not_the_record(tmp_path: Path) -> None:
    root = write_tiny_data(tmp_path / "data")
    (root / "snips" / "test.jsonl").write_text('{"text": "secret words"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"test.jsonl: line 1 lacks the field\(s\) \['slots'\]") as info:
        build_snips(root)
    assert "secret" not in str(info.value)
    with pytest.raises(FileNotFoundError, match="data_dir"):
        build_snips(tmp_path / "nowhere")


def test_gsm8k_task_keeps_worked_solutions_and_the_numeric_metric(tmp_path: Path) -> None:
    root = write_tiny_data(tmp_path / "data")
    examples = load_gsm8k(root / "gsm8k" / "test.jsonl")
    assert examples[3].reference == "3 + 3 = 6\n#### 6"  # calculator marks removed
    task = build_gsm8k(root, n_private=3)
    assert task.metric_name == "numeric" and len(task.private_train) == 3 and len(task.test) == 6
    assert len(task.public_examples) == 8
    assert not {r.unwrap().text for r in task.private_train} & {e.text for e in task.public_examples}
    assert task.metric.score("so the answer is\n#### 6", task.test[3].reference) == 1.0
    assert task.metric.score("#### 7", task.test[3].reference) == 0.0
    (root / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "no mark"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="record 1: 'answer' has no final"):
        build_gsm8k(root)


def test_registry_builds_the_generation_benchmarks(tmp_path: Path) -> None:
    root = write_tiny_data(tmp_path / "data")
    assert {"snips", "gsm8k"} <= set(available_tasks())
    assert get_task("snips", data_dir=root, n_private=4).metric_name == "slot_f1"
    assert get_task("gsm8k", data_dir=root, n_private=4, n_test=2).metric_name == "numeric"


def test_slot_f1_is_reachable_as_a_python_metric() -> None:
    from dp_textgrad.tasks.metrics import metric_from_name

    metric = metric_from_name("python:dp_textgrad.tasks.benchmark_generation:slot_f1")
    assert metric.score('{"city": "Rome"}', {"city": "Rome"}) == 1.0
