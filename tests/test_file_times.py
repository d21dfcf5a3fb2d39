"""Released files carry a public modification time (issue 47: file times timed the private phase).

Every file and folder of a run directory outside ``operator/``, and the run log, has
``runs.RELEASED_FILE_TIME`` after every write, so a kill at any point leaves no released time
that times a charge or a generation; ``operator/`` keeps real times. The twin-run tests compare
the times of whole runs (``tests/twin.py``); these check the writers, a kill in the middle, and a
report rebuilt later.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import dp_accounting
import pytest
from typer.testing import CliRunner

import dp_textgrad as dpt
from dp_textgrad import cli, runs
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.mechanisms import LaplaceCountMechanism
from dp_textgrad.tasks.synthetic import make_support_task

PUBLIC = runs.RELEASED_FILE_TIME


def released_times(run_dir: Path) -> dict[str, float]:
    """The modification time of the run directory and of everything in it outside operator/."""
    times = {".": run_dir.stat().st_mtime}
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if relative != runs.OPERATOR_DIR and not relative.startswith(runs.OPERATOR_DIR + "/"):
            times[relative] = path.stat().st_mtime
    return times


def real_times(times: dict[str, float]) -> dict[str, float]:
    return {name: t for name, t in times.items() if t != PUBLIC}


def test_a_kill_after_any_write_leaves_no_released_file_with_a_real_time(tmp_path) -> None:
    """A run's writes in their order (config, ledger charges, the journal under operator/, a metrics line
    with an operator-only field, the checkpoint, the run log): after each, as a kill would leave it."""
    root = tmp_path / "runs"
    run_dir = runs.new_run_dir(root)
    layout = runs.RunDir(run_dir)
    checked = []

    def killed_here(step: str) -> None:
        checked.append(step)
        assert real_times(released_times(run_dir)) == {}, step
        log = root / runs.RUN_LOG_NAME
        assert not log.exists() or log.stat().st_mtime == PUBLIC, step

    runs.write_released_json(run_dir, runs.CONFIG_NAME, "config", {"task": "t", "config": {}, "seed_prompt": "p"})
    killed_here("config")
    runs.append_run_log(root, {"event": "started", "run_dir": run_dir.name, "started": runs.utc_now()}, run_dir)
    killed_here("run log")
    ledger = PrivacyLedger(4.0, 1e-5)
    ledger.persist_to(layout.ledger, PUBLIC)
    count = LaplaceCountMechanism(0.1)
    ledger.spend(count.event(), "dataset size: DP count", count.metadata())
    ledger.complete_stage()  # re-persists through persist_to(path) without a time: the time is kept
    killed_here("count charged")
    layout.read_or_create_secret()  # creates operator/ in the run directory
    killed_here("secret")
    ledger.spend(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(2.0)), "generation 0")
    killed_here("generation charged")
    runs.write_operator_json(run_dir, "journal.json", {"sums": [1.0]})
    runs.append_released_jsonl(run_dir, runs.METRICS_NAME, "metrics", {"generation": 0, "seconds": 3.5},
                               key={"generation": 0})
    killed_here("metrics")
    layout.trim_metrics(1)
    killed_here("metrics trimmed on resume")
    assert (run_dir / runs.OPERATOR_DIR / runs.METRICS_NAME).stat().st_mtime != PUBLIC  # operator-only: real time
    assert len(checked) == 7


def test_stamping_heals_a_forgotten_write_and_leaves_operator_alone(tmp_path) -> None:
    run_dir = runs.new_run_dir(tmp_path / "runs")
    runs.write_operator_json(run_dir, "usage.json", {"seconds": 1.0})
    (run_dir / "stray.txt").write_text("written without the public time\n", encoding="utf-8")
    (run_dir / runs.PLOTS_DIR).mkdir()
    (run_dir / runs.PLOTS_DIR / "a.png").write_bytes(b"png")
    assert real_times(released_times(run_dir))  # the plain writes keep the wall clock
    operator = run_dir / runs.OPERATOR_DIR
    before = {p: p.stat().st_mtime_ns for p in [operator, *operator.rglob("*")]}
    runs.stamp_released(run_dir)
    assert real_times(released_times(run_dir)) == {}
    assert {p: p.stat().st_mtime_ns for p in [operator, *operator.rglob("*")]} == before


def test_the_public_times_survive_tar(tmp_path) -> None:
    run_dir = runs.new_run_dir(tmp_path / "runs")
    runs.write_json(run_dir / runs.CLI_SETTINGS_NAME, {"dp": {}})
    runs.stamp_released(run_dir)
    with tarfile.open(tmp_path / "run.tar", "w") as archive:
        archive.add(run_dir, arcname="run")
    with tarfile.open(tmp_path / "run.tar") as archive:
        times = {m.name: m.mtime for m in archive.getmembers()}
    assert times == {"run": PUBLIC, f"run/{runs.CLI_SETTINGS_NAME}": PUBLIC}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    task = make_support_task(n_private=60, n_test=10)
    config = DPESConfig(epsilon=4.0, generations=2, population=3, parents=2, sampling_rate=0.4, insecure_noise_seed=3)
    engine = ScriptedEngine(responses=["Label the message.</PROMPT>", "Name the request.</PROMPT>"])
    outcome = dpt.optimize(task, engine, config, task_name="support", engine_name="scripted", runs_root=tmp / "runs")
    return outcome.run_dir


def test_a_finished_run_releases_public_times_only(finished_run) -> None:
    times = released_times(finished_run)
    assert {".", runs.LEDGER_NAME, runs.METRICS_NAME, runs.RESULT_NAME, runs.PLOTS_DIR} <= set(times)
    assert real_times(times) == {}
    assert (finished_run.parent / runs.RUN_LOG_NAME).stat().st_mtime == PUBLIC  # appended at the run's end
    operator = finished_run / runs.OPERATOR_DIR
    assert any(p.stat().st_mtime != PUBLIC for p in operator.rglob("*"))  # operator-only: real times


def test_dp_textgrad_report_keeps_the_times_public(finished_run) -> None:
    for path in (finished_run / runs.PLOTS_DIR).iterdir():
        path.unlink()
    (finished_run / runs.PLOTS_DIR).rmdir()
    (finished_run / runs.REPORT_NAME).unlink()
    result = CliRunner().invoke(cli.app, ["report", str(finished_run)])
    assert result.exit_code == 0, result.output
    assert (finished_run / runs.REPORT_NAME).is_file() and any((finished_run / runs.PLOTS_DIR).iterdir())
    assert real_times(released_times(finished_run)) == {}
