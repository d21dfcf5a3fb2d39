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


# -- issue 46: a newcomer's edges ------------------------------------------------------------------
def test_task_help_lists_every_built_in_task() -> None:
    from dp_textgrad.cli._run_file import BUILTIN_TASKS
    from dp_textgrad.tasks.registry import available_tasks

    assert sorted(BUILTIN_TASKS) == available_tasks()
    for command in ("optimize", "ledger"):
        text = " ".join(CliRunner().invoke(cli.app, [command, "--help"], terminal_width=200).output.split())
        assert all(name in text for name in available_tasks()), (command, text)


def test_plain_output_never_wraps_the_released_prompt_or_the_run_directory(tmp_path, monkeypatch) -> None:
    from tests.test_cli import scripted, write_csv

    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "train.csv", 60)
    write_csv(tmp_path / "data" / "test.csv", 6)
    seed = "Read the customer's message carefully and answer with the one category it belongs to, in lower case."
    monkeypatch.setattr(EngineSection, "build", lambda section: scripted())
    deep = tmp_path / "a-rather-long-folder-name-for-the-runs" / "and-another-level-below-it" / "runs"
    config = tmp_path / "run.toml"
    config.write_text(f'[task]\nseed_prompt = "{seed}"\n', encoding="utf-8")
    result = CliRunner().invoke(cli.app, [
        "optimize", "--config", str(config), "--train", str(tmp_path / "data" / "train.csv"), "--test",
        str(tmp_path / "data" / "test.csv"), "--runs-root", str(deep), "--generations", "1", "--population", "2",
        "--parents", "1", "--sampling-rate", "0.5"], terminal_width=80)  # a pipe: not a terminal
    assert result.exit_code == 0, result.output
    (run_dir,) = deep.glob("run-*")
    prompt = json.loads((run_dir / "result.json").read_text())["prompt"]
    lines = result.output.splitlines()
    assert all(line in lines for line in prompt.splitlines()), result.output
    assert any(str(run_dir) in line for line in lines), result.output


def test_a_privacy_off_banner_does_not_say_n_was_declared(tmp_path, monkeypatch) -> None:
    from tests.test_cli import scripted, write_csv

    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "train.csv", 60)
    write_csv(tmp_path / "data" / "test.csv", 6)
    monkeypatch.setattr(EngineSection, "build", lambda section: scripted())
    config = tmp_path / "run.toml"
    config.write_text('[dp]\nprivacy = "off"\n', encoding="utf-8")
    result = CliRunner().invoke(cli.app, [
        "optimize", "--config", str(config), "--train", str(tmp_path / "data" / "train.csv"), "--test",
        str(tmp_path / "data" / "test.csv"), "--runs-root", str(tmp_path / "runs"), "--generations", "1"],
        terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "N declared public" not in text and "N the real count: privacy off" in text


def test_the_population_mean_is_over_every_candidate_scored(tmp_path) -> None:
    # The report's "population mean" was the mean over the candidates kept for the next generation.
    import numpy as np

    import dp_textgrad
    from dp_textgrad.tasks.synthetic import make_support_task
    from tests.helpers import support_engine

    task = make_support_task(seed=0, n_private=80, n_test=4)
    outcome = dp_textgrad.optimize(task, support_engine(), runs_root=tmp_path, epsilon=4.0, generations=2,
                                   population=4, parents=1, sampling_rate=0.5, dataset_size=80, evaluate=False,
                                   insecure_noise_seed=1)
    ledger = [json.loads(line) for line in (outcome.run_dir / "ledger.jsonl").read_text().splitlines()[1:]]
    for report in outcome.result.history:
        (entry,) = [e for e in ledger if e["label"].startswith(f"generation {report.generation}:")]
        scored = entry["metadata"]["candidate_ids"]
        estimates = [next(s.estimate for s in outcome.optimizer.population.get(cid).evaluations
                          if s.generation == report.generation) for cid in scored]
        assert len(scored) == 4 and report.mean_estimate == pytest.approx(float(np.mean(estimates)))


# -- issue 46: budget --config plans exactly what optimize --config runs ----------------------------
RUN_FILES = sorted((Path(__file__).resolve().parents[1] / "examples" / "run_files").glob("*.yaml"))


@pytest.mark.parametrize("run_file", RUN_FILES, ids=[p.stem for p in RUN_FILES])
def test_budget_config_plans_what_optimize_config_runs(run_file, tmp_path, monkeypatch) -> None:
    planned = runner.invoke(cli.app, ["budget", "--config", str(run_file)])
    assert planned.exit_code == 0, planned.output
    z_plan = float(re.search(r"noise multiplier z = ([0-9.]+)", planned.output).group(1))
    q_plan = float(re.search(r"; q = ([0-9.]+)", planned.output).group(1))

    def factory(section):
        engine = ScriptedEngine(responses=list(PROMPTS), choice_rule=RULE)
        engine.instruction_following = section.follows_instructions()
        return engine

    monkeypatch.setattr(EngineSection, "build", factory)
    runs_root = tmp_path / "runs"
    ran = runner.invoke(cli.app, ["optimize", "--config", str(run_file), "--runs-root", str(runs_root)])
    assert ran.exit_code in (0, cli.EXIT_STOPPED_EARLY), ran.output
    (run_dir,) = runs_root.glob("run-*")
    saved = json.loads((run_dir / "config.json").read_text())
    assert z_plan == pytest.approx(saved["noise_multiplier"], abs=1e-4)
    assert q_plan == pytest.approx(saved["config"]["sampling_rate"], rel=1e-3)
    assert saved["config"]["generations"] == int(re.search(r"generations: (\d+)", run_file.read_text()).group(1))
    fresh = re.search(r"noise std ([0-9.]+) on its mean", planned.output)
    released = json.loads((run_dir / "result.json").read_text()).get("final_estimate")
    assert (fresh is None) == (released is None) == ("final_estimate" not in run_file.read_text())
    if fresh is not None:  # the final estimate's noise, as planned
        assert float(fresh.group(1)) == pytest.approx(released["noise_std"], abs=1e-4)


def test_budget_config_refuses_a_rate_only_the_run_can_know(tmp_path) -> None:
    run_file = tmp_path / "run.yaml"
    run_file.write_text("task:\n  name: support\ndp:\n  epsilon: 2\n  sampling_rate: auto\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["budget", "--config", str(run_file)])
    assert result.exit_code == cli.EXIT_BAD_INPUT
    line = one_error_line(result)
    assert line.startswith("error: sampling_rate:") and "dp.dataset_size" in line
    declared = runner.invoke(cli.app, ["budget", "--config", str(run_file), "--dataset-size", "900"])
    assert declared.exit_code == cli.EXIT_BAD_INPUT and "--dataset-size" in one_error_line(declared)
