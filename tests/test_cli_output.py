"""`optimize --json` and `--quiet`: output for scripts, release-safe like every channel.

The JSON stream carries one object per event; every field comes through the release
table, and a twin run (D vs D plus one long record) prints the same bytes.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.settings import EngineSection
from tests.test_cli import scripted, write_csv
from tests.twin import base_rows, long_record, run_twin

runner = CliRunner()
FLAGS = ["--epsilon", "4", "--generations", "2", "--population", "3", "--parents", "2", "--sampling-rate", "0.5",
         "--seed", "1"]
OPERATOR_FIELDS = ("seconds", "private_prompt_tokens", "private_completion_tokens", "private_calls", "store",
                   "engine_usage")


def optimize(tmp_path, monkeypatch, *extra: str):
    write_csv(tmp_path / "train.csv", 120)
    write_csv(tmp_path / "test.csv", 15)
    monkeypatch.setattr(EngineSection, "build", lambda section: scripted())
    return runner.invoke(cli.app, ["optimize", "--train", str(tmp_path / "train.csv"), "--test",
                                   str(tmp_path / "test.csv"), "--runs-root", str(tmp_path / "runs"), *FLAGS,
                                   *extra])


def keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | set().union(*(keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys(v) for v in value)) if value else set()
    return set()


def test_json_prints_one_release_safe_event_per_line(tmp_path, monkeypatch) -> None:
    result = optimize(tmp_path, monkeypatch, "--json")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]  # every line is one JSON object
    assert [e["event"] for e in events] == ["lifetime", "start", "generation", "generation", "finished"]
    start, finished = events[1], events[-1]
    assert start["epsilon"] == 4 and start["generations"] == 2 and start["noise_multiplier"] > 0
    assert [e["generation"] for e in events if e["event"] == "generation"] == [0, 1]
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    assert finished["run_dir"] == str(run_dir) and not finished["stopped_early"]
    assert finished["prompt"] == (run_dir / "released_prompt.txt").read_text().strip()
    assert finished["epsilon"] == json.loads((run_dir / "result.json").read_text())["epsilon"]
    assert not keys(events) & set(OPERATOR_FIELDS)


def test_quiet_prints_only_the_run_directory(tmp_path, monkeypatch) -> None:
    result = optimize(tmp_path, monkeypatch, "--quiet")
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    assert result.stdout == f"{run_dir}\n"


def test_json_and_quiet_together_is_a_usage_error(tmp_path, monkeypatch) -> None:
    result = optimize(tmp_path, monkeypatch, "--json", "--quiet")
    assert result.exit_code == 2 and "--json or --quiet" in result.output
    assert not (tmp_path / "runs").exists()


def test_the_json_stream_is_identical_for_twin_datasets(tmp_path, monkeypatch) -> None:
    schedule = ("epsilon = 4\ndataset_size = 40\ngenerations = 2\npopulation = 3\nparents = 2\n"
                "sampling_rate = 0.5\nfeedback = \"none\"\ninsecure_noise_seed = 11\n")
    rows = base_rows(40)
    d = run_twin(tmp_path / "d", rows, monkeypatch, schedule, extra_args=["--json"])
    dx = run_twin(tmp_path / "dx", rows + [long_record(rows)], monkeypatch, schedule, extra_args=["--json"])
    assert d.exit_code == dx.exit_code == 0, d.stdout + d.stderr
    assert d.normalised("<stdout>") == dx.normalised("<stdout>")
    assert all(json.loads(line) for line in d.stdout.splitlines())
