"""What ``dp-textgrad optimize`` and ``demo`` show while a run goes, and after it.

Release-safe values only: DP estimates, epsilon, public parameters and public-phase
tokens. No wall time and no private-phase usage (both are functions of the secret
subsample). Ctrl-C once finishes the current generation's checkpoint, then stops.
"""

from __future__ import annotations

import json
import math
import signal
import threading
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console


class StopAfterCheckpoint(Exception):
    """Raised after a generation's checkpoint when the user pressed Ctrl-C."""


class GracefulStop:
    """First Ctrl-C: finish the current generation (its checkpoint), then stop. Second: stop now."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        typer.echo("\nstopping after this generation's checkpoint (Ctrl-C again to stop at once)", err=True)

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


JSON_HELP = "print one release-safe JSON object per event on stdout (start, lifetime, generation, finished)"
QUIET_HELP = "print only the run directory at the end (errors still go to stderr)"
MLFLOW_HELP = ("log the run to MLflow at this tracking URI, e.g. file:./mlruns; 'default' uses MLFLOW_TRACKING_URI "
               "(release-safe fields only; needs pip install 'dp-textgrad\\[mlflow]')")  # \\[: not rich markup


class Output:
    """How a command shows a run: ``rich`` (a live bar on a terminal, one plain line per
    generation elsewhere), ``json`` (one release-safe event object per line on stdout) or
    ``quiet`` (only the run directory at the end). Errors go to stderr in every mode.

    A context manager: inside it the console is silent unless the mode is ``rich``.
    """

    def __init__(self, console: Console, *, json_lines: bool = False, quiet: bool = False) -> None:
        if json_lines and quiet:
            raise typer.BadParameter("give --json or --quiet, not both", param_hint="--json / --quiet")
        self.console = console
        self.mode = "json" if json_lines else "quiet" if quiet else "rich"
        self._was_quiet = console.quiet

    def __enter__(self) -> "Output":
        self.console.quiet = self._was_quiet or self.mode != "rich"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.console.quiet = self._was_quiet

    @property
    def events(self):
        """The event sink of this mode (None: the rich display)."""
        if self.mode == "rich":
            return None
        if self.mode == "quiet":
            return lambda event: None
        return lambda event: typer.echo(json.dumps(_finite(event), allow_nan=False))

    def finish(self, outcome) -> None:
        if self.mode == "rich":
            print_outcome(self.console, outcome)
        elif self.mode == "quiet":
            typer.echo(str(outcome.run_dir))
        else:
            from dp_textgrad.run_events import finished_event

            self.events(finished_event(outcome))


def _finite(value: Any) -> Any:
    """JSON has no infinity: a non-finite number (an unsafe run's epsilon) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def best_estimate_text(report) -> str:
    """The generation's best DP estimate, or why there is none (a selection releases no scores)."""
    value = report.best_estimate
    return "none released (selection only)" if value is None or math.isnan(value) else f"{value:.3f}"


def run_with_progress(console: Console, task, engine, config, *, task_name: str, engine_name: str, runs_root: Path,
                       run_dir: Optional[Path] = None, resume: bool = False, evaluate: bool = True,
                       stop: Optional[GracefulStop] = None, lifetime=None, events=None, trackers=(), scoring=None):
    """Run with the rich display, or (``events``: a sink) hand each release-safe event to it.

    ``trackers`` (:class:`dp_textgrad.tracking.Tracker`) receive every event as well, then the
    finished event and the run directory once the report is written.
    """
    from rich.progress import BarColumn, Progress, TextColumn

    from dp_textgrad import run_events
    from dp_textgrad import workflow

    # Release-safe fields only: no wall time and no private-phase tokens (both time the secret
    # subsample); the public-phase tokens are shown instead.
    progress = Progress(
        TextColumn("[bold]generation {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("best {task.fields[best]}  eps {task.fields[eps]}  public tokens {task.fields[tokens]}"),
        console=console,
        transient=False,
    )
    holder: dict[str, Any] = {}

    def emit(build) -> bool:
        """Send the event to the trackers and the sink; True when the sink replaces the display."""
        if events is None and not trackers:
            return False
        event = build()
        for tracker in trackers:
            tracker(event)
        if events is not None:
            events(event)
        return events is not None

    def on_start(optimizer) -> None:
        cfg = optimizer.config
        holder["generations"] = cfg.generations
        holder["epsilon"] = cfg.epsilon
        if emit(lambda: run_events.start_event(optimizer, resumed=resume)):
            return
        mech = optimizer.plan.describe()
        spent = optimizer.ledger.epsilon()
        resumed = ""
        if resume:
            lost = (f"; {optimizer.interrupted_charges} of its {len(optimizer.ledger.entries)} charge(s) belong to an "
                    "interrupted generation: they stay spent; that generation runs again and takes them over where "
                    "that is sound (docs/privacy.md, Interruptions), else charges again"
                    if optimizer.interrupted_charges else "")
            resumed = (f" Resuming at generation {optimizer.generation + 1} of {cfg.generations}: epsilon "
                       f"{spent:.4g} of {cfg.epsilon} already spent{lost}.")
        console.print(
            f"[bold]Budget[/]: epsilon = {cfg.epsilon}, delta = {cfg.delta:.2e} for the whole run "
            f"({cfg.generations} generations x {cfg.population} candidates, q = {cfg.sampling_rate:.4f}, "
            f"about {cfg.sampling_rate * optimizer.public_dataset_size:.0f} of N = {optimizer.public_dataset_size} "
            + ("private records (N declared public) " if cfg.dataset_size is not None else
               f"private records (N a DP count, epsilon {cfg.size_epsilon:.3g} of the budget) ") +
            f"per generation).{resumed}\n[bold]Mechanism[/]: {mech}."
        )
        console.print(f"[bold]Records[/]: private records longer than {cfg.max_record_tokens} engine tokens are "
                      + ("truncated to that public cap (a per-record map, applied before any charge)."
                         if cfg.long_records == "truncate" else "rejected before any charge."))
        if scoring is not None:  # public settings only: the actor count, never what each one scored
            console.print(f"[bold]Scoring[/]: private records partitioned over {scoring.actors} Ray actors; "
                          "noise and accounting on this process.")
        if not optimizer.noise.secure:
            console.print(f"[bold red]{optimizer.noise.sampler}.[/]", markup=True, highlight=False)
        if cfg.privacy == "off":
            console.print("[bold red]privacy off: a non-private baseline. NOT differentially private.[/]")
        if cfg.mode == "unsafe":
            console.print("[bold red]UNSAFE mode: raw private examples reach the mutator. NOT differentially private.[/]")
        holder["task"] = progress.add_task("dp-es", total=cfg.generations, completed=optimizer.generation,
                                           best="-", eps=f"{spent:.3g}/{cfg.epsilon:g}", tokens=0)
        if console.is_terminal:  # a live bar; elsewhere (logs, nohup) one plain line per generation
            progress.start()

    def on_generation(report) -> None:
        if not emit(lambda: run_events.generation_event(report)):
            holder["public_tokens"] = (holder.get("public_tokens", 0) + report.public_prompt_tokens
                                       + report.public_completion_tokens)
            progress.update(holder["task"], completed=report.generation + 1, best=best_estimate_text(report),
                            eps=f"{report.epsilon_spent:.3g}/{holder['epsilon']:g}", tokens=holder["public_tokens"])
            if not console.is_terminal:
                console.print(f"generation {report.generation + 1}/{holder['generations']}: best estimate "
                              f"{best_estimate_text(report)}, epsilon spent {report.epsilon_spent:.3g} of "
                              f"{holder['epsilon']:g}, public tokens {holder['public_tokens']}",
                              markup=False, highlight=False)
        # The checkpoint of this generation is on disk now; after the last one, just finish.
        if stop is not None and stop.requested and report.generation + 1 < holder["generations"]:
            raise StopAfterCheckpoint

    def on_lifetime(status) -> None:
        # Shown to the data's owner before any charge of this run (see docs/privacy.md, lifetime budget).
        if emit(lambda: run_events.lifetime_event(status)):
            return
        console.print(f"[bold]Lifetime budget[/]: {status.describe()}", soft_wrap=True, highlight=False)

    try:
        outcome = workflow.run(task, engine, config, runs_root=runs_root, run_dir=run_dir, resume=resume,
                               evaluate=evaluate, on_start=on_start, on_generation=on_generation,
                               task_name=task_name, engine_name=engine_name, lifetime=lifetime,
                               on_lifetime=on_lifetime, scoring=scoring)
    except BaseException as exc:
        for tracker in trackers:
            tracker.fail(type(exc).__name__)  # the class only: an error's text may describe private data
        raise
    finally:
        progress.stop()
    if trackers:
        finished = run_events.finished_event(outcome)
        for tracker in trackers:
            tracker(finished)
            tracker.finish(outcome.run_dir)
    return outcome


def print_outcome(console: Console, outcome) -> None:
    result = outcome.result
    console.print("\n[bold]Released prompt[/]:")
    console.print(result.prompt, markup=False, highlight=False)
    if result.unsafe and outcome.optimizer.config.privacy == "off":
        console.print("[bold]Privacy: none (a non-private baseline, privacy off).[/]")
    elif result.unsafe:
        console.print("[bold red]Privacy: NOT differentially private (unsafe mode).[/]")
    else:
        by = ", ".join(f"{k} {v:.3g}" for k, v in sorted(result.epsilons.items()) if math.isfinite(v))
        console.print(f"[bold]Privacy spent[/]: epsilon = {result.epsilon:.4g}, delta = {result.delta:.2e} "
                      f"(smallest valid bound; {by})")
    if outcome.evaluation is not None:
        ev = outcome.evaluation
        paired = ""
        if ev.difference is not None:
            paired = (f"; difference {ev.difference:+.3f} [95% CI {ev.difference_low:+.3f}, {ev.difference_high:+.3f}], "
                      f"McNemar p = {ev.mcnemar_p:.2g}")
        console.print(f"[bold]Test accuracy[/] (n={ev.n_test}, not covered by DP): seed {ev.seed_accuracy:.3f} -> "
                      f"released {ev.released_accuracy:.3f}{paired}", soft_wrap=True)
    from dp_textgrad.workflow import stopped_early

    if stopped_early(result.stopped_because):
        console.print(f"[bold yellow]Stopped early[/] after {result.generations_run} of "
                      f"{outcome.optimizer.config.generations} generations: {result.stopped_because}. The prompt "
                      f"released is the best one the DP estimates saw so far; epsilon spent {result.epsilon:.4g} of "
                      f"{outcome.optimizer.config.epsilon:g}.", soft_wrap=True, highlight=False)
    usage = result.public_usage
    console.print(f"[bold]Cost[/] (public figures): {result.generations_run} generations x about "
                  f"{result.planned_private_evaluations:.0f} planned private record evaluations; public phase "
                  f"(mutation, critiques, preflight) {usage.get('calls', 0)} calls, "
                  f"{usage.get('prompt_tokens', 0) + usage.get('completion_tokens', 0)} tokens. The real private-phase "
                  "usage and time are operator-only (operator/ in the run directory: do not share).", soft_wrap=True)
    console.print(f"[bold]Run directory[/]: {outcome.run_dir}\n[bold]Report[/]: {outcome.run_dir / 'report.html'} "
                  "(and report.md)", soft_wrap=True)
