"""Smoke run of benchmarks/startup.py: one repeat of each command, this tree and the baseline side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.subprocess_driver import run_script

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_startup_benchmark_smoke(tmp_path: Path) -> None:
    if shutil.which("tar") is None or subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", "ee4a9b8"],
                                                     capture_output=True).returncode != 0:
        pytest.skip("needs git history with the baseline commit ee4a9b8 and tar")
    output = tmp_path / "startup.json"
    completed = run_script(REPO_ROOT / "benchmarks" / "startup.py", "--repeats", "1", "--out", str(output),
                           timeout=300, cwd=tmp_path)
    result = json.loads(output.read_text(encoding="utf-8"))
    assert result["baseline"] == "ee4a9b8" and result["repeats"] == 1
    assert set(result["commands"]) == {"--help", "budget"}
    for row in result["commands"].values():
        assert len(row["current_runs_s"]) == len(row["baseline_runs_s"]) == 1
        assert row["current_s"] > 0 and row["baseline_s"] > 0
        assert row["ratio"] == pytest.approx(row["current_s"] / row["baseline_s"])
    assert "this tree (s)" in completed.stdout and "baseline (s)" in completed.stdout
    assert list(tmp_path.iterdir()) == [output]  # the baseline's files went with the temporary directory
