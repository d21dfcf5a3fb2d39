"""``dp-textgrad evaluate``: prompts scored on the public test split, without a search.

The scripted engine reads the label off the test record for one prompt (an oracle) and always
answers ``bill`` for the other, so every accuracy, interval and paired test is known exactly.
The task's private split raises when touched, and every request the engine sees is checked to
be a prompt over a test record.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from dp_textgrad import cli, workflow
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.settings import EngineSection, TaskSection
from dp_textgrad.tasks.base import ClassificationTask
from dp_textgrad.tasks.synthetic import make_support_task
from tests.test_cli import one_error_line

runner = CliRunner()

ORACLE = "Read the message carefully and name its category."
ALWAYS_BILL = "Label the message."


class UntouchablePrivateDataset(PrivateDataset):
    """A private split that fails the test when anything reads it."""

    def __len__(self) -> int:
        raise AssertionError("evaluate read the size of the private split")

    def __iter__(self):
        raise AssertionError("evaluate iterated the private split")

    def __getitem__(self, index: int):
        raise AssertionError("evaluate read a private record")


@pytest.fixture(scope="module")
def support() -> ClassificationTask:
    task = make_support_task(n_private=20, n_test=60)
    task.private_train = UntouchablePrivateDataset(["never read"])  # after __post_init__'s checks
    return task


@pytest.fixture
def contexts(monkeypatch, support) -> list[str]:
    """Builds the task and the scripted engine the commands get; returns every context the engine scores."""
    seen: list[str] = []

    def rule(context: str, choices) -> list[float]:
        seen.append(context)
        if ORACLE in context:
            (gold,) = [ex.label for ex in support.test if context.endswith(support.render_record(ex.text))]
        else:
            gold = "bill"
        return [4.0 if choice.strip() == gold else 0.0 for choice in choices]

    monkeypatch.setattr(TaskSection, "build", lambda section: support)
    monkeypatch.setattr(EngineSection, "build", lambda section: ScriptedEngine(choice_rule=rule))
    return seen


def prompt_files(tmp_path: Path) -> tuple[Path, Path]:
    bill, oracle = tmp_path / "bill.txt", tmp_path / "oracle.txt"
    bill.write_text(ALWAYS_BILL + "\n", encoding="utf-8")
    oracle.write_text(ORACLE + "\n", encoding="utf-8")
    return bill, oracle


def wilson(successes: int, n: int) -> tuple[float, float]:
    ci = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    return ci.low, ci.high


# -- scores --------------------------------------------------------------------------------
def test_json_lines_give_each_accuracy_and_the_paired_test_against_the_first(tmp_path, support, contexts) -> None:
    bill, oracle = prompt_files(tmp_path)
    result = runner.invoke(cli.app, ["evaluate", "--task", "support", "--prompt", str(bill), "--prompt", str(oracle),
                                     "--json"])
    assert result.exit_code == 0, result.output
    first, second = [json.loads(line) for line in result.stdout.splitlines()]
    n = len(support.test)
    bills = sum(ex.label == "bill" for ex in support.test)
    assert 0 < bills < n  # the two prompts differ on some records
    assert (first["prompt"], second["prompt"]) == (str(bill), str(oracle))
    assert first["score"] == pytest.approx(bills / n) and second["score"] == 1.0
    assert (first["low"], first["high"]) == pytest.approx(wilson(bills, n))
    assert (second["low"], second["high"]) == pytest.approx(wilson(n, n))
    assert first["interval"] == second["interval"] == "wilson" and first["n_test"] == n
    assert first["metric"] == "accuracy" and first["split"] == "test" and first["covered_by_dp"] is False
    assert first["difference"] is None and first["mcnemar_p"] is None  # the first is the reference
    assert second["difference"] == pytest.approx(1 - bills / n)
    assert second["discordant"] == [n - bills, 0]
    assert second["mcnemar_p"] == pytest.approx(binomtest(n - bills, n - bills, 0.5).pvalue)
    assert second["difference_low"] < second["difference"] < second["difference_high"]
    # Only the test records were sent, under the two prompts: no private text reached the engine.
    allowed = {support.render_prefix(p) + support.render_record(ex.text) for p in (ALWAYS_BILL, ORACLE)
               for ex in support.test}
    assert contexts and set(contexts) <= allowed


def test_the_table_and_the_out_file_from_a_run_file_with_the_seed_prompt(monkeypatch, tmp_path, support,
                                                                         contexts) -> None:
    monkeypatch.chdir(tmp_path)
    bill, oracle = (path.relative_to(tmp_path) for path in prompt_files(tmp_path))
    config = tmp_path / "run.yaml"
    config.write_text("task:\n  name: support\nengine:\n  kind: llama_cpp\ndp:\n  epsilon: 2\n", encoding="utf-8")
    out = tmp_path / "scores.json"
    result = runner.invoke(cli.app, ["evaluate", "--config", str(config), "--seed-prompt", "-p", str(bill),
                                     "-p", str(oracle), "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text(encoding="utf-8"))
    rows = written["prompts"]
    assert [row["prompt"] for row in rows] == ["seed prompt", str(bill), str(oracle)]
    assert "outside the DP guarantee" in written["note"] and written["task"] == "support"
    assert rows[2]["difference"] == pytest.approx(1.0 - rows[0]["score"])  # against the seed prompt, first
    for row in rows:
        assert f"{row['score']:.3f}" in result.stdout
    assert "bill.txt" in result.stdout and "oracle.txt" in result.stdout and "McNemar p" in result.stdout
    assert "public test split" in result.stdout and "outside the DP guarantee" in result.stdout


def test_a_task_scoring_its_own_records_plugs_in_with_a_bootstrap_interval() -> None:
    # What a generation task gives: per-record scores in [0, 1] from its metric, not 0/1 labels.
    class Graded:
        test = ["a", "b", "c", "d", "e", "f"]

        def public_scores(self, engine, prompt: str, records) -> np.ndarray:
            return np.array([0.5, 0.25, 1.0, 0.0, 0.75, 0.5]) if prompt == "one" else np.full(len(records), 0.5)

    first, second = workflow.evaluate_prompts(Graded(), engine=None, prompts=["one", "two"])
    assert first.score == pytest.approx(0.5) and first.interval == "bootstrap"
    assert 0.0 <= first.low < 0.5 < first.high <= 1.0
    assert second.against_first is not None and second.against_first.mcnemar_p is None  # not 0/1 scores
    assert second.against_first.difference == pytest.approx(0.0)


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("case, needle", [
    ("missing", "--prompt: no file at"),
    ("empty", "is empty; write the prompt in it"),
    ("none", "--prompt: give at least one prompt file"),
    ("no test split", "test: the task has no test records"),
], ids=["missing", "empty", "none", "no-test-split"])
def test_bad_input_is_one_line_naming_the_option_and_exit_2(monkeypatch, tmp_path, support, case, needle) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    bill, _ = prompt_files(tmp_path)
    args = {"missing": ["--prompt", str(tmp_path / "nope.txt")], "empty": ["--prompt", str(empty)],
            "none": [], "no test split": ["--prompt", str(bill)]}[case]
    if case == "no test split":
        monkeypatch.setattr(TaskSection, "build", lambda section: replace(make_support_task(n_private=5, n_test=5),
                                                                          test=[]))
    monkeypatch.setattr(EngineSection, "build", lambda section: pytest.fail("no engine for bad input"))
    result = runner.invoke(cli.app, ["evaluate", "--task", "support", *args])
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    assert needle in one_error_line(result)


def test_help_lists_evaluate_and_its_options() -> None:
    assert "evaluate" in runner.invoke(cli.app, ["--help"]).output
    text = runner.invoke(cli.app, ["evaluate", "--help"], terminal_width=200).output
    for flag in ("--config", "--prompt", "--seed-prompt", "--task", "--train", "--test", "--engine", "--base-url",
                 "--model", "--json", "--out"):
        assert flag in text
