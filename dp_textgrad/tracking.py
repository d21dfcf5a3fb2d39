"""Experiment tracking: hand a run's release-safe events to MLflow (or any tracker).

A tracker is an observer of the run's event stream (:mod:`dp_textgrad.run_events`): it
logs exactly the dicts ``optimize --json`` prints (each event's ``as_dict()``, which passed
the release table), and after the run only the run directory's released files (report,
plots, result, released prompt). Nothing here reads the operator folder.

Its clock is public too: the wall clock read after the run has started would time the private
phase, so the run's start is the time the tracker was built (whole seconds), every timestamp
after it is the start plus the step in seconds, and the end is one second after the last step.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Protocol

from dp_textgrad import runs
from dp_textgrad.run_events import EventDicts, LifetimeChecked, RunFailed, RunFinished, RunStarted

# Released files logged as artifacts (never operator/, checkpoints or the ledger's details).
ARTIFACTS = (runs.REPORT_NAME, runs.REPORT_HTML_NAME, runs.RESULT_NAME, runs.PROMPT_NAME)
PLOTS = runs.PLOTS_DIR
_PARAM_LIMIT = 500  # MLflow's value limit is larger; long values (the mechanism text) are cut for the UI


class Tracker(Protocol):
    """An observer that logs a run (``dp_textgrad.optimize(..., observers=[tracker])``); write your
    own in a few lines, or subclass :class:`dp_textgrad.run_events.EventDicts`."""

    def on_lifetime(self, event: LifetimeChecked) -> None: ...

    def on_start(self, event: RunStarted) -> None: ...

    def on_generation(self, report: Any) -> None: ...

    def on_finish(self, event: RunFinished) -> None: ...

    def on_fail(self, event: RunFailed) -> None: ...


def trackers_for(output: Any) -> list[Tracker]:
    """The trackers an ``output`` settings section asks for (``output.mlflow``)."""
    if getattr(output, "mlflow", None) is None:
        return []
    uri = None if output.mlflow == "default" else output.mlflow
    return [MlflowTracker(uri, output.mlflow_experiment)]


def _numbers(prefix: str, payload: dict[str, Any]) -> dict[str, float]:
    """Finite numeric fields (nested dicts flattened as ``prefix.key``), booleans excluded."""
    out: dict[str, float] = {}
    for key, value in payload.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_numbers(f"{name}.", value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


class MlflowTracker(EventDicts):
    """Logs one dp-textgrad run to MLflow through a client (no global active run).

    ``tracking_uri``: e.g. ``file:./mlruns`` or ``http://127.0.0.1:5000`` (None: MLflow's
    own default, ``MLFLOW_TRACKING_URI``). Parameters come from the lifetime and start
    events, metrics per generation (step = generation), the final values from the finished
    event, and the released files as artifacts. Build it before the run starts: its start time
    (``started_ms``) is read then, and every later timestamp is ``started_ms`` plus the step in
    whole seconds (the end: the last step plus one), never the wall clock.
    """

    def __init__(self, tracking_uri: str | None, experiment: str = "dp-textgrad") -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:  # the optional extra
            raise ValueError(
                "output.mlflow: MLflow is not installed; pip install 'dp-textgrad[mlflow]' (or drop --mlflow)"
            ) from exc
        from mlflow.exceptions import MlflowException

        try:  # reach the store now: a bad URI fails before the run charges anything
            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        except MlflowException as exc:
            hint = (
                " MLflow 3 refuses file stores unless MLFLOW_ALLOW_FILE_STORE=true is set; set it, or use "
                "sqlite:///mlflow.db (full mlflow package) or a tracking server's http:// URI."
                if "MLFLOW_ALLOW_FILE_STORE" in str(exc)
                else ""
            )
            raise ValueError(
                f"output.mlflow: cannot use the tracking store {tracking_uri!r}: {str(exc).splitlines()[0][:200]}{hint}"
            ) from exc
        self.run_id: str | None = None
        # Read before the run starts, so public; later timestamps count steps from it (public_time).
        self.started_ms = int(time.time()) * 1000
        self.last_step = 0
        super().__init__(self)  # each event's release-safe dict goes to __call__

    def on_finish(self, event: RunFinished) -> None:
        super().on_finish(event)
        self.finish(event.run_dir)

    def on_fail(self, event: RunFailed) -> None:
        self.fail(event.error)

    def _run(self) -> str:
        if self.run_id is None:
            self.run_id = self.client.create_run(
                self.experiment_id, start_time=self.started_ms, tags={"dp_textgrad": "true"}
            ).info.run_id
        return self.run_id

    def public_time(self, step: int) -> int:
        """The timestamp (ms) of ``step``: the start plus ``step`` seconds (a function of public events only)."""
        return self.started_ms + 1000 * step

    def _params(self, payload: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [
            Param(key, str(value)[:_PARAM_LIMIT])
            for key, value in payload.items()
            if key != "event" and value is not None and not isinstance(value, (dict, list))
        ]
        self.client.log_batch(self._run(), params=params)

    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        self.last_step = max(self.last_step, step)
        stamp = self.public_time(step)
        self.client.log_batch(self._run(), metrics=[Metric(k, v, stamp, step) for k, v in sorted(values.items())])

    def __call__(self, event: dict[str, Any]) -> None:
        """Log one event's release-safe dict (as ``optimize --json`` prints it)."""
        kind = event.get("event")
        if kind == "lifetime":
            self._params({f"lifetime.{k}": v for k, v in event.items() if k not in ("event", "store")})
        elif kind == "start":
            if event.get("resumed"):
                self.client.set_tag(self._run(), "resumed_at_generation", str(event.get("generation")))
            start = {
                k: v
                for k, v in event.items()
                if k not in ("resumed", "generation", "epsilon_spent", "interrupted_charges")
            }
            self._params(start)
        elif kind == "generation":
            payload = {k: v for k, v in event.items() if k not in ("event", "generation", "best_candidate_id")}
            self._metrics(_numbers("", payload), int(event["generation"]))
        elif kind == "finished":
            final = {k: event.get(k) for k in ("epsilon", "estimate", "generations_run")}
            final.update({f"final_{k}": v for k, v in (event.get("epsilons") or {}).items()})
            final.update(
                {
                    f"test.{k}": v
                    for k, v in (event.get("evaluation") or {}).items()
                    if k in ("seed_accuracy", "released_accuracy", "difference", "mcnemar_p")
                }
            )
            self._metrics(_numbers("", final), int(event.get("generations_run") or 0))
            run = self._run()
            self.client.set_tag(run, "stopped_because", str(event.get("stopped_because"))[:_PARAM_LIMIT])
            self.client.set_tag(run, "run_dir", Path(str(event.get("run_dir", ""))).name)

    def finish(self, run_dir: Path) -> None:
        """Log the released files and close the MLflow run as finished.

        A local artifact store copies each file with its modification time (the public
        ``runs.RELEASED_FILE_TIME``); the store's own folders and records, and a remote server,
        note when they got them (the operator's view, docs/privacy.md)."""
        run = self._run()
        for name in ARTIFACTS:
            if (Path(run_dir) / name).is_file():
                self.client.log_artifact(run, str(Path(run_dir) / name))
        if (Path(run_dir) / PLOTS).is_dir():
            self.client.log_artifacts(run, str(Path(run_dir) / PLOTS), PLOTS)
        self.client.set_terminated(run, "FINISHED", end_time=self.public_time(self.last_step + 1))

    def fail(self, reason: str) -> None:
        """Close the MLflow run as failed; ``reason`` is the class of the error only."""
        if self.run_id is not None:
            self.client.set_tag(self.run_id, "failed_with", reason)
            stopped = reason in ("StopAfterCheckpoint", "KeyboardInterrupt")  # resumable: not a failure
            status = "KILLED" if stopped else "FAILED"
            self.client.set_terminated(self.run_id, status, end_time=self.public_time(self.last_step + 1))
