"""The front door, ``dp_textgrad.optimize`` / ``dp_textgrad.resume``, with the tests-only scripted engine.

One small DP run (its calibration takes a few seconds) serves the checks of what a run
writes; the error checks need no run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import dp_textgrad as dpt
from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
from tests.helpers import support_engine
from tests.subprocess_driver import run_driver

SCHEDULE = dict(epsilon=4.0, generations=2, population=3, parents=2, sampling_rate=0.5)


@pytest.fixture(scope="module")
def front_run(tmp_path_factory):
    """optimize() with a config and keywords over it, and two observers."""
    task = dpt.make_support_task(n_private=150, n_test=20)
    seen: list = []
    also: list[int] = []
    root = tmp_path_factory.mktemp("runs")
    outcome = dpt.optimize(task, support_engine(), dpt.DPESConfig(**SCHEDULE), runs_root=root,
                           observers=[seen.append, lambda report: also.append(report.generation)],
                           insecure_noise_seed=5)
    return outcome, seen, also, root, task


def test_optimize_writes_the_run_directory_the_cli_writes(front_run) -> None:
    outcome, _, _, root, _ = front_run
    run_dir = outcome.run_dir
    assert run_dir.parent == root
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert result["prompt"] == outcome.result.prompt
    assert (run_dir / "released_prompt.txt").read_text(encoding="utf-8") == outcome.result.prompt + "\n"
    assert (run_dir / "report.md").is_file() and (run_dir / "report.html").is_file()
    saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    # The keyword was merged over the config; the names default to the task's and the engine's.
    assert saved["config"]["generations"] == 2 and saved["config"]["insecure_noise_seed"] == 5
    assert (saved["task"], saved["engine"]) == ("support", "scripted")
    # The ledger on disk composes to the plan's bound (the DP count of N, then 2 generations).
    ledger = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    planned = outcome.optimizer.plan.epsilons(ledger.delta)
    assert ledger.epsilons() == pytest.approx(planned, rel=1e-6)
    assert result["epsilon"] == pytest.approx(ledger.epsilon()) and result["epsilon"] <= 4.0 + 1e-6
    log = [json.loads(line) for line in (root / "run_metadata.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [line["event"] for line in log if line.get("run_dir") == run_dir.name] == ["started", "finished"]
    assert (root / "operator" / "lifetime_budget.sqlite").is_file()  # the lifetime record


def test_observers_get_each_generation_report_once(front_run) -> None:
    outcome, seen, also, _, _ = front_run
    assert all(isinstance(report, dpt.GenerationReport) for report in seen)
    assert [report.generation for report in seen] == [0, 1] == also
    assert seen == outcome.result.history  # the released per-generation reports, nothing else


def test_resume_of_a_finished_run_says_it_has_finished(front_run) -> None:
    outcome, _, _, _, task = front_run
    with pytest.raises(dpt.ConfigError, match="has finished"):
        dpt.resume(outcome.run_dir, task, support_engine())
    with pytest.raises(dpt.ConfigError, match="holds a run already"):
        dpt.optimize(task, support_engine(), run_dir=outcome.run_dir, **SCHEDULE)


class StopAfterFirst(Exception):
    pass


def test_an_observer_that_raises_stops_the_run_and_resume_finishes_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dp_textgrad import cli

    task = dpt.make_support_task(n_private=150, n_test=20)

    def stop(report) -> None:
        raise StopAfterFirst

    with pytest.raises(StopAfterFirst):
        dpt.optimize(task, support_engine(), runs_root=tmp_path, observers=[stop], insecure_noise_seed=5, **SCHEDULE)
    (run_dir,) = tmp_path.glob("run-*")
    assert (run_dir / "checkpoint.json").is_file() and not (run_dir / "result.json").exists()
    # The command line cannot rebuild a task it did not make: it names the Python call that can.
    refused = CliRunner().invoke(cli.app, ["optimize", "--resume", str(run_dir)])
    assert refused.exit_code != 0 and "dp_textgrad.resume(RUN_DIR, task, engine)" in refused.stderr
    seen: list = []
    outcome = dpt.resume(run_dir, task, support_engine(), observers=[seen.append])
    assert [report.generation for report in seen] == [1]  # generation 0 is not run (nor charged) again
    assert outcome.run_dir == run_dir and (run_dir / "result.json").is_file()
    ledger = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    assert ledger.epsilons() == pytest.approx(outcome.optimizer.plan.epsilons(ledger.delta), rel=1e-6)


def test_resume_of_a_directory_without_a_run_refuses(tmp_path: Path) -> None:
    with pytest.raises(dpt.ConfigError, match="no checkpoint.json"):
        dpt.resume(tmp_path, dpt.make_support_task(n_private=20, n_test=5), support_engine())


@pytest.mark.parametrize("settings, field", [
    (dict(epsilon=-1.0), "epsilon"),
    (dict(generatons=3), "generatons"),
    (dict(population=1), "population"),
], ids=["bad-value", "unknown-field", "bad-schedule"])
def test_a_bad_setting_is_named_before_anything_is_written(tmp_path: Path, settings: dict, field: str) -> None:
    task = dpt.make_support_task(n_private=20, n_test=5)
    with pytest.raises(dpt.ConfigError) as caught:
        dpt.optimize(task, support_engine(), runs_root=tmp_path / "runs", **settings)
    assert str(caught.value).startswith(field) or f"{field}:" in str(caught.value), str(caught.value)
    assert not (tmp_path / "runs").exists()


def test_an_observer_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(dpt.ConfigError, match=r"observers\[0\]"):
        dpt.optimize(dpt.make_support_task(n_private=20, n_test=5), support_engine(), runs_root=tmp_path,
                     observers=[object()], **SCHEDULE)


def test_help_shows_the_front_door_without_loading_textgrad() -> None:
    body = ("help(dpt.optimize)\nhelp(dpt.resume)\n"
            "print('TEXTGRAD_LOADED', 'textgrad' in sys.modules)\n")
    out = run_driver("import sys\nimport dp_textgrad as dpt", body, env={**os.environ, "PAGER": "cat"}).stdout
    assert "optimize(task" in out and "observers" in out and "run_dir" in out, out
    assert "Guarantee" in out and "OPERATOR-ONLY" in out and "resume(run_dir" in out, out
    assert "TEXTGRAD_LOADED False" in out, out


def test_import_is_lazy_and_lists_its_exports(tmp_path: Path) -> None:
    body = ("print('LOADED', sorted(m for m in sys.modules if m.startswith('dp_textgrad.')))\n"
            "print('DIR', dir(dpt) == sorted(dpt.__all__))\n"
            "missing = [n for n in dpt.__all__ if not hasattr(dpt, n)]\n"
            "print('MISSING', missing)\n"
            "tg = dpt.textgrad()\n"
            "print('TEXTGRAD', tg.__name__, hasattr(tg, 'Variable'), tg is sys.modules['textgrad'])\n")
    out = run_driver("import sys\nimport dp_textgrad as dpt", body, cwd=tmp_path).stdout
    assert "LOADED []" in out and "DIR True" in out and "MISSING []" in out, out
    assert "TEXTGRAD textgrad True True" in out, out
    for name in ("optimize", "resume", "RunOutcome", "DPEvolutionStrategy", "DPESConfig", "LlamaCppEngine",
                 "OpenAIEngine", "ScriptedEngine", "make_support_task", "build_task_from_files",
                 "ClassificationTask", "textgrad"):
        assert name in dpt.__all__
    assert not (tmp_path / "logs").exists()  # textgrad's import-time log directory


class Recorder:
    """An observer object: every event of the run, in order, as the method that received it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def on_lifetime(self, event) -> None:
        self.seen.append(("lifetime", event))

    def on_start(self, event) -> None:
        self.seen.append(("start", event))

    def on_generation(self, report) -> None:
        self.seen.append(("generation", report))

    def on_finish(self, event) -> None:
        self.seen.append(("finish", event))

    def on_fail(self, event) -> None:
        self.seen.append(("fail", event))


def test_an_observer_object_gets_every_event_in_order_released_values_only(tmp_path: Path) -> None:
    from dp_textgrad.privacy import release
    from dp_textgrad.run_events import LifetimeChecked, RunFinished, RunStarted, finished_event

    recorder, plain = Recorder(), []
    outcome = dpt.optimize(dpt.make_support_task(n_private=150, n_test=20), support_engine(), runs_root=tmp_path,
                           observers=[recorder, plain.append], insecure_noise_seed=5, **SCHEDULE)
    kinds = [kind for kind, _ in recorder.seen]
    assert kinds == ["lifetime", "start", "generation", "generation", "finish"]
    lifetime, start, finish = recorder.seen[0][1], recorder.seen[1][1], recorder.seen[-1][1]
    assert isinstance(lifetime, LifetimeChecked) and isinstance(start, RunStarted) and isinstance(finish, RunFinished)
    assert [report for kind, report in recorder.seen if kind == "generation"] == plain == outcome.result.history
    assert (start.resumed, start.generation, start.config.generations) == (False, 0, 2)
    assert finish.run_dir == outcome.run_dir and finish.result is outcome.result
    assert not hasattr(finish, "optimizer") and not hasattr(finish, "seconds")  # operator-only parts stay out
    # Each event's dict passed the release table (the store's path is operator-only).
    for channel, payload in (("events", lifetime.as_dict()), ("events", start.as_dict())):
        assert all(release.classify(channel, key) != release.OPERATOR_ONLY for key in payload), payload
    assert "store" not in lifetime.as_dict() and "store" in lifetime.describe()
    assert finish.as_dict() == finished_event(outcome)


def test_a_failed_run_tells_observers_the_error_class_only(tmp_path: Path) -> None:
    recorder = Recorder()

    def stop(report) -> None:
        raise StopAfterFirst("a message that must not reach observers")

    with pytest.raises(StopAfterFirst):
        dpt.optimize(dpt.make_support_task(n_private=150, n_test=20), support_engine(), runs_root=tmp_path,
                     observers=[recorder, stop], insecure_noise_seed=5, **SCHEDULE)
    assert [kind for kind, _ in recorder.seen] == ["lifetime", "start", "generation", "fail"]
    assert recorder.seen[-1][1].error == "StopAfterFirst"

