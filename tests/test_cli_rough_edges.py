"""The rough edges a newcomer hits on the command line (issue 36, item 7).

An empty run file is refused before anything is charged; ``budget`` plans for the engine the
user names (the default local engine included); ``budget`` with no options says what to give;
``ledger`` without a store creates nothing; ``--mlflow`` help names the extra to install.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.settings import EngineSection, TaskSection

runner = CliRunner()

SCHEDULE_FLAGS = ["--epsilon", "4", "--delta", "1e-5", "--generations", "2", "--population", "3",
                  "--parents", "2", "--sampling-rate", "0.5"]
PROMPTS = ["Label the message with one of: bill, tech, cancel, fraud, update.</PROMPT>",
           "Read the customer message carefully and name its main request.</PROMPT>"]
RULE = {"refund": "bill", "charge": "bill", "app": "tech", "cancel": "cancel",
        "stolen": "fraud", "address": "update"}


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


# -- 1. an empty run file ------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "# nothing yet\n", "dp:\n  epsilon: 2\n", "task:\n"])
def test_a_run_file_without_a_task_is_refused_before_any_charge(tmp_path, monkeypatch, text) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: pytest.fail("no engine for a run file without a task"))
    monkeypatch.setattr(TaskSection, "build", lambda section: pytest.fail("no task for a run file without a task"))
    run_file = tmp_path / "e.yaml"
    run_file.write_text(text, encoding="utf-8")
    runs_root = tmp_path / "runs"
    result = runner.invoke(cli.app, ["optimize", "--config", str(run_file), "--runs-root", str(runs_root)])
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    line = one_error_line(result)
    for words in ("task.name", "task.train", "dp-textgrad demo", "--task"):
        assert words in line
    assert not runs_root.exists()  # no run directory, no ledger, no lifetime store


def test_a_task_flag_completes_a_run_file_without_a_task(tmp_path, monkeypatch) -> None:
    seen = []

    def stop(section):
        seen.append(section)
        raise ValueError("task: stopped here by the test")

    monkeypatch.setattr(TaskSection, "build", stop)
    run_file = tmp_path / "e.yaml"
    run_file.write_text("dp:\n  epsilon: 2\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["optimize", "--config", str(run_file), "--task", "support",
                                     "--runs-root", str(tmp_path / "runs")])
    assert "stopped here by the test" in one_error_line(result)
    assert [section.name for section in seen] == ["support"]


# -- 2. budget plans for the engine optimize runs -------------------------------------------
def budget_z(*args: str) -> float:
    result = runner.invoke(cli.app, ["budget", *SCHEDULE_FLAGS, *args])
    assert result.exit_code == 0, result.output
    return float(re.search(r"noise multiplier z = ([0-9.]+)", result.output).group(1))


def optimize_z(tmp_path: Path, monkeypatch, *args: str) -> tuple[float, EngineSection]:
    """The z an optimize run calibrates, its engine standing in with the declared instruction following."""
    sections = []

    def factory(section):
        sections.append(section)
        engine = ScriptedEngine(responses=list(PROMPTS), choice_rule=RULE)
        engine.instruction_following = section.follows_instructions()
        return engine

    monkeypatch.setattr(EngineSection, "build", factory)
    runs_root = tmp_path / "runs"
    result = runner.invoke(cli.app, ["optimize", "--task", "support", *SCHEDULE_FLAGS, "--runs-root", str(runs_root),
                                     *args])
    assert result.exit_code in (0, cli.EXIT_STOPPED_EARLY), result.output
    (run_dir,) = runs_root.glob("run-*")
    return json.loads((run_dir / "config.json").read_text())["noise_multiplier"], sections[0]


def test_budget_on_the_default_engine_plans_what_optimize_calibrates(tmp_path, monkeypatch) -> None:
    z_run, section = optimize_z(tmp_path, monkeypatch)
    assert section.kind == "llama_cpp" and section.model is None
    # The default engine is the built-in base model: it declares no instruction following.
    assert section.follows_instructions() is False
    assert budget_z() == pytest.approx(z_run, abs=1e-4)


def test_budget_names_the_engine_and_plans_for_it(tmp_path, monkeypatch) -> None:
    z_run, section = optimize_z(tmp_path, monkeypatch, "--engine", "openai", "--model", "some-model")
    assert section.follows_instructions() is True  # a chat model rewrites prompts
    assert budget_z("--engine", "openai", "--model", "some-model") == pytest.approx(z_run, abs=1e-4)
    run_file = tmp_path / "run.yaml"
    run_file.write_text("engine:\n  kind: openai\n  model: some-model\n", encoding="utf-8")
    assert budget_z("--config", str(run_file)) == pytest.approx(z_run, abs=1e-4)
    # The plan differs with LLM operators off: the engine named is what decides it.
    assert budget_z() != pytest.approx(z_run, abs=1e-4)


def test_declared_instruction_following_matches_the_engine_classes() -> None:
    from dp_textgrad.engines.openai_engine import OpenAIEngine
    from dp_textgrad.engines.transformers_engine import TransformersEngine

    assert EngineSection(kind="openai", model="m").follows_instructions() \
        is OpenAIEngine.instruction_following
    assert EngineSection(kind="transformers").follows_instructions() \
        is TransformersEngine.instruction_following
    assert EngineSection(kind="llama_cpp", model="mine.gguf").follows_instructions() is True
    assert EngineSection(kind="llama_cpp", options={"instruction_following": True}).follows_instructions() is True


# -- 3. budget with no options ----------------------------------------------------------------
def test_budget_without_options_says_what_to_give() -> None:
    result = runner.invoke(cli.app, ["budget"])
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    line = one_error_line(result)
    assert "not both" not in line
    assert "--epsilon" in line and "--noise-multiplier" in line and "e.g." in line


# -- 4. ledger without a store ------------------------------------------------------------------
def test_ledger_without_a_store_creates_nothing(tmp_path) -> None:
    runs_root = tmp_path / "runs"
    result = runner.invoke(cli.app, ["ledger", "--all", "--runs-root", str(runs_root)])
    assert not runs_root.exists()  # no runs/operator/ made just to look
    assert result.exit_code == cli.EXIT_BAD_INPUT, result.output
    line = one_error_line(result)
    assert "no lifetime store yet" in line
    assert str(runs_root / "operator" / "lifetime_budget.sqlite") in line.replace("\n", "")


# -- 5. --mlflow help names the extra -------------------------------------------------------------
@pytest.mark.parametrize("command", ["optimize", "demo"])
def test_mlflow_help_names_the_extra_to_install(command) -> None:
    # The help is rendered as rich markup, where a bare "[mlflow]" is a style tag and vanishes.
    text = runner.invoke(cli.app, [command, "--help"], env={"COLUMNS": "400"}).output
    (line,) = [line for line in text.splitlines() if "--mlflow" in line]
    assert "pip install 'dp-textgrad[mlflow]'" in line
