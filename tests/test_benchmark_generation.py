"""Smoke runs of the generation benchmarks (SNIPS grid, GSM8K schedule) on made-up data with a scripted engine."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tests.tasks.test_benchmark_generation import write_tiny_data

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def answer(prompt: str, system: str | None) -> str:
    """Right slots when the prompt shows a demonstration, a non-answer otherwise; TGD's tags when asked."""
    text = (system or "") + prompt
    if "<IMPROVED_VARIABLE>" in text or "IMPROVED_VARIABLE" in text:
        return "<IMPROVED_VARIABLE>Extract the slots as one JSON object.</IMPROVED_VARIABLE>"
    numbers = re.findall(r"(?:request|What is) (\d+)", prompt)
    if prompt.rstrip().endswith("Slots:") and numbers:
        return f'{{"thing": "value {numbers[-1]}"}}' if "Slots: {" in prompt else "I do not know"
    if prompt.rstrip().endswith("Answer:") and numbers:
        return f"#### {2 * int(numbers[-1])}" if "\n#### " in prompt else "no idea"  # a worked demo
    return "Add one worked example."


@pytest.fixture
def engine():
    from dp_textgrad.engines.scripted import ScriptedEngine

    return ScriptedEngine(answer)


def test_generation_grid_runs_every_method_and_pairs_per_record_scores(tmp_path: Path, engine) -> None:
    bench = load_benchmark("generation_utility")
    root = write_tiny_data(tmp_path / "data", per_intent=12)
    output, work = tmp_path / "out.json", tmp_path / "work"
    argv = [
        "--data-dir",
        str(root),
        "--work-dir",
        str(work),
        "--output",
        str(output),
        "--seeds",
        "1",
        "--test-records",
        "5",
        "--n-private",
        "40",
        "--records",
        "6",
        "--generations",
        "1",
        "--population",
        "2",
        "--parents",
        "1",
    ]
    assert bench.main(argv, engine=engine) == 0
    result = json.loads(output.read_text())
    methods = result["summary"]["methods"]
    assert set(methods) == set(bench.METHODS)
    assert methods["seed"]["score_mean"] == 0.0 and methods["kshot"]["score_mean"] == 1.0
    assert methods["dp_gaussian_eps4"]["epsilon_spent_mean"] <= 4.0 + 1e-9
    assert methods["dp_gaussian_eps1"]["epsilon_spent_mean"] <= 1.0 + 1e-9
    assert all(len(r["test_scores"]) == 5 for r in result["runs"])
    assert all("released_prompt" not in r and len(r["released_prompt_sha256"]) == 16 for r in result["runs"])
    assert result["summary"]["paired"]["kshot"]["vs_seed"] == pytest.approx(1.0)
    assert "| kshot | 1 | 1.000" in bench.markdown_table(result["summary"])
    # Resumable: a second call finds every run done.
    lines = (work / "runs.jsonl").read_text().splitlines()
    assert bench.main(argv, engine=engine) == 0
    assert (work / "runs.jsonl").read_text().splitlines() == lines


def test_generation_headroom_compares_hand_written_prompts_with_the_seed(tmp_path: Path, engine) -> None:
    bench = load_benchmark("generation_utility")
    root = write_tiny_data(tmp_path / "data")
    output = tmp_path / "headroom.json"
    assert (
        bench.main(
            ["--headroom", "--dev-records", "4", "--data-dir", str(root), "--output", str(output)], engine=engine
        )
        == 0
    )
    result = json.loads(output.read_text())
    assert result["records"] == 4 and set(result["prompts"]) == {"seed", *bench.HAND_WRITTEN}
    assert result["prompts"]["seed"]["mean"] == 0.0 and result["best_minus_seed"] == pytest.approx(1.0)


def test_gsm8k_schedule_runs_end_to_end_and_reports_the_ledger(tmp_path: Path, engine) -> None:
    bench = load_benchmark("gsm8k_schedule")
    root = write_tiny_data(tmp_path / "data", gsm_train=40)
    output = tmp_path / "gsm.json"
    assert (
        bench.main(
            [
                "--data-dir",
                str(root),
                "--records",
                "20",
                "--test-records",
                "4",
                "--max-new-tokens",
                "16",
                "--output",
                str(output),
            ],
            engine=engine,
        )
        == 0
    )
    result = json.loads(output.read_text())
    schedule = result["schedule"]
    assert (schedule["population"], schedule["parents"], schedule["generations"]) == (6, 2, 3)
    assert schedule["private_records"] == 20 and result["test_records"] == 4
    assert result["epsilon_spent"] <= 0.71 + 1e-9 and result["delta"] == pytest.approx(1e-5)
    assert result["seed_accuracy"] == 0.0 and 0.0 <= result["released_accuracy"] <= 1.0


def test_gsm8k_schedule_needs_one_engine(tmp_path: Path, capsys) -> None:
    bench = load_benchmark("gsm8k_schedule")
    with pytest.raises(SystemExit):
        bench.main(["--data-dir", str(tmp_path)])
    assert "give either --local or --model" in capsys.readouterr().err


def test_generation_grid_records_the_private_set_the_extraction_task_ran_with(tmp_path: Path) -> None:
    """The built-in task's runs used 600 private records once while the results file said SNIPS's 2,000."""
    from dp_textgrad.engines.scripted import ScriptedEngine

    bench = load_benchmark("generation_utility")
    assert bench.default_n_private("support_extract") == 600 and bench.default_n_private("snips") == 2000
    output = tmp_path / "out.json"
    argv = ["--task", "support_extract", "--work-dir", str(tmp_path / "work"), "--output", str(output)]
    argv += ["--methods", "dp_gaussian_eps1", "--seeds", "1", "--test-records", "3", "--n-private", "30"]
    argv += ["--records", "6", "--generations", "1", "--population", "2", "--parents", "1"]
    assert bench.main(argv, engine=ScriptedEngine(lambda prompt, system: "12345")) == 0
    result = json.loads(output.read_text())
    assert result["schedule"]["n_private"] == 30
    assert [r["dataset_size"] for r in result["runs"]] == [30]
