"""The built-in generation task ``support_extract`` and ``dp-textgrad demo --task``.

The CLI tests patch in the tests-only ScriptedEngine: it answers a record with the account
number (found by a pattern) when the prompt before the record mentions an account number,
and "none" otherwise; asked to rewrite a prompt, it writes one that does. So the seed prompt
scores 0 and a rewritten prompt 1.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from dp_textgrad import cli, runs
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.settings import EngineSection, TaskSection
from dp_textgrad.tasks.base import Task
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
from dp_textgrad.tasks.registry import available_tasks, get_task
from dp_textgrad.tasks.support_extract import (
    SUPPORT_EXTRACT_SEED_PROMPT,
    account_number,
    make_support_extract_task,
)
from dp_textgrad.tasks.synthetic import FIRST_NAMES, LAST_NAMES
from tests.test_cli import one_error_line

runner = CliRunner()
ACCOUNT = re.compile(r"(?<![\w-])(AC-\d{7}|\d{4}-\d{4}-\d{2}|\d{12}|\d{10}|\d{8})(?![\w-])")
NAME = re.compile(r"\b(" + "|".join(FIRST_NAMES + LAST_NAMES) + r")\b")
REWRITE = "Write the account number exactly as it appears in the message."


def answer(prompt: str, system: str | None) -> str:
    if prompt.rstrip().endswith("Answer:"):  # a record to answer
        head, _, record = prompt.rpartition("Message:")
        found = ACCOUNT.search(record)
        return " " + (found.group(1) if found and "account number" in head.lower() else "none")
    return REWRITE + "</PROMPT>"  # a rewrite


def private_records(task: GenerationTask) -> list[GenerationExample]:
    return [record.unwrap() for record in task.private_train]


# -- the records ------------------------------------------------------------------------------------
def test_every_record_holds_its_answer_exactly_once_among_other_numbers() -> None:
    task = make_support_extract_task(seed=3, n_private=200, n_public=40, n_test=100)
    records = private_records(task) + task.test + task.public_examples
    for record in records:
        assert record.text.count(record.reference) == 1
        assert ACCOUNT.findall(record.text) == [record.reference]
    with_other_digits = sum(bool(re.search(r"\d", record.text.replace(record.reference, ""))) for record in records)
    assert with_other_digits > len(records) // 3  # distractors: amounts, dates, phones, card digits


def test_the_formats_are_the_three_public_ones() -> None:
    import random

    rng = random.Random(0)
    numbers = [account_number(rng) for _ in range(300)]
    assert all(ACCOUNT.fullmatch(n) for n in numbers)
    assert {n[:3] == "AC-" for n in numbers} == {True, False}
    assert any(n.count("-") == 2 for n in numbers)


def test_a_seed_fixes_the_splits_and_the_splits_are_disjoint() -> None:
    first = make_support_extract_task(seed=1, n_private=80, n_test=30)
    again = make_support_extract_task(seed=1, n_private=80, n_test=60)
    other = make_support_extract_task(seed=2, n_private=80, n_test=30)
    assert private_records(first) == private_records(again)  # n_test leaves the private split alone
    assert first.public_examples == again.public_examples
    assert private_records(first) != private_records(other)
    texts = [{r.text for r in split} for split in (private_records(first), first.public_examples, first.test)]
    assert sum(map(len, texts)) == len(set().union(*texts)) == 80 + 40 + 30


def test_public_examples_hold_no_personal_data_but_private_ones_fake_it() -> None:
    task = make_support_extract_task(seed=0, n_private=200, n_public=60)
    for example in task.public_examples:
        without_answer = example.text.replace(str(example.reference), "")
        assert not NAME.search(example.text) and "@" not in example.text
        assert not re.search(r"\d{3}", without_answer), example.text  # phones, amounts: placeholders
    assert sum(bool(NAME.search(r.text)) for r in private_records(task)) > 20


def test_the_registry_builds_it_as_a_generation_task() -> None:
    assert "support_extract" in available_tasks()
    task = get_task("support_extract", seed=0, n_private=30, n_test=10)
    assert isinstance(task, GenerationTask) and isinstance(task, Task)
    assert task.kind == "generate" and task.labels == []
    assert task.metric_name == "exact" and task.binary_scores
    assert task.seed_prompt == SUPPORT_EXTRACT_SEED_PROMPT
    assert len(task.private_train) == 30 and len(task.test) == 10 and len(task.public_examples) == 40
    section = TaskSection(name="support_extract", options=dict(n_private=30, n_test=10))
    assert section.kind == "generate" and section.build().name == "support_extract"


@pytest.mark.parametrize(("field", "value"), [("n_private", 0), ("n_test", 0), ("n_public", -1), ("seed", 1.5)])
def test_bad_sizes_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be an integer"):
        make_support_extract_task(**{field: value})


def test_demonstrations_and_scores_follow_the_template_and_the_metric() -> None:
    task = make_support_extract_task(seed=0, n_private=10, n_test=20)
    demo = task.render_demo(task.public_examples[0])
    assert demo.startswith("Message: ") and demo.endswith(f"\nAnswer: {task.public_examples[0].reference}")
    engine = ScriptedEngine(responses=answer)
    assert task.mean_score(engine, task.seed_prompt) == 0.0
    scores = task.public_scores(engine, REWRITE, task.test)
    assert np.array_equal(scores, np.ones(20))  # the answer with a leading space and any case matches


# -- dp-textgrad demo --task --------------------------------------------------------------------------
@pytest.fixture
def scripted_engines(monkeypatch) -> list[ScriptedEngine]:
    built: list[ScriptedEngine] = []

    def build(section):
        built.append(ScriptedEngine(responses=answer, choice_rule={"refund": "bill", "stolen": "fraud"}))
        return built[-1]

    monkeypatch.setattr(EngineSection, "build", build)
    return built


def test_demo_task_support_extract_runs_the_search_and_the_paired_evaluation(tmp_path, scripted_engines) -> None:
    result = runner.invoke(cli.app, ["demo", "--task", "support_extract", "--runs-root", str(tmp_path)],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.glob("run-*") if p.is_dir()]
    settings = runs.read_json(runs.RunDir(run_dir).cli_settings)
    assert settings["task"]["name"] == "support_extract" and settings["task"]["kind"] == "generate"
    assert settings["task"]["options"] == dict(seed=0, n_private=600, n_test=200)  # the demo's defaults
    assert settings["dp"]["generations"] == 2 and settings["dp"]["population"] == 4
    written = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    ev = written["evaluation"]
    assert ev["metric"] == "exact" and ev["interval"] == "wilson" and ev["n_test"] == 200
    assert ev["seed_accuracy"] == 0.0 and ev["released_accuracy"] == 1.0  # the scripted engine's rule
    assert "Test exact match" in result.output
    assert "task `support_extract (built-in, generation)`" in (run_dir / "report.md").read_text(encoding="utf-8")
    assert 0 < written["epsilon"] <= 4.0 + 1e-9


def test_demo_without_task_is_still_the_classification_demo(tmp_path, scripted_engines) -> None:
    result = runner.invoke(cli.app, ["demo", "--n-private", "100", "--n-test", "20", "--generations", "1",
                                     "--population", "2", "--runs-root", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.glob("run-*") if p.is_dir()]
    settings = runs.read_json(runs.RunDir(run_dir).cli_settings)
    assert settings["task"]["name"] == "support" and settings["task"]["kind"] == "classify"
    assert settings["task"]["options"] == dict(seed=0, n_private=100, n_test=20)
    assert "Test accuracy" in result.output
    assert "task `support (built-in)`" in (run_dir / "report.md").read_text(encoding="utf-8")


def test_demo_unknown_task_lists_the_known_ones_before_loading_a_model(tmp_path, scripted_engines) -> None:
    result = runner.invoke(cli.app, ["demo", "--task", "sst3", "--runs-root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "--task" in line and "'sst3'" in line and "support, support_extract" in line
    assert scripted_engines == [] and not list(tmp_path.iterdir())


# -- on the local model ----------------------------------------------------------------------------
@pytest.mark.slow
def test_seed_prompt_leaves_headroom_on_local_model(llama_engine) -> None:
    # docs/tasks.md, "Built-in generation task": 0.025 vs 0.775 on these 40 records (2 threads); the
    # test scores the first 20 (0.0 vs 0.7 on 2026-12-07, 1 thread), half the time.
    task = make_support_extract_task(seed=0, n_private=1)
    records = make_support_extract_task(seed=7, n_private=1, n_test=40).test[:20]
    three_demos = "\n\n".join(task.render_demo(example) for example in task.public_examples[:3])
    seed = task.mean_score(llama_engine, task.seed_prompt, records)
    good = task.mean_score(llama_engine, three_demos, records)
    assert seed <= 0.1 and good >= seed + 0.5, (seed, good)
