"""What ``dp-textgrad optimize`` and ``demo`` show while a run goes, and after it.

Observers of the run's event stream (:mod:`dp_textgrad.run_events`): the rich display, the
``--quiet`` line and (``--json``) the release-safe event printer, chosen by :class:`Output`;
and :class:`GracefulStop`: Ctrl-C once finishes the current generation's checkpoint, then stops.
Release-safe values only: DP estimates, epsilon, public parameters and public-phase tokens.
No wall time and no private-phase usage (both are functions of the secret subsample).
"""

from __future__ import annotations

import json
import math
import signal
import threading
from typing import Any

import typer
from rich.console import Console


def epsilon_text(value: float, decimals: int = 4) -> str:
    """A printed epsilon bound, rounded up (``bounds.format_epsilon``; imported when first printed,
    so that ``dp-textgrad --help`` loads no accountant)."""
    from dp_textgrad.privacy.accounting.bounds import format_epsilon

    return format_epsilon(value, decimals)


class StopAfterCheckpoint(Exception):
    """Raised after a generation's checkpoint when the user pressed Ctrl-C."""


class GracefulStop:
    """First Ctrl-C: finish the current generation (its checkpoint), then stop. Second: stop now."""

    def __init__(self) -> None:
        self.requested = False
        self._generations = 0
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        typer.echo("\nstopping after this generation's checkpoint (Ctrl-C again to stop at once)", err=True)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    # An observer of the run: the checkpoint of a generation is on disk when its report comes.
    def on_start(self, event: Any) -> None:
        self._generations = event.config.generations

    def on_generation(self, report: Any) -> None:
        if self.requested and report.generation + 1 < self._generations:  # after the last one, just finish
            raise StopAfterCheckpoint


JSON_HELP = "print one release-safe JSON object per event on stdout (start, lifetime, generation, finished)"
QUIET_HELP = "print only the run directory at the end (errors still go to stderr)"
MLFLOW_HELP = (
    "log the run to MLflow at this tracking URI, e.g. file:./mlruns; 'default' uses MLFLOW_TRACKING_URI "
    "(release-safe fields only; needs pip install 'dp-textgrad\\[mlflow]')"
)  # \\[: not rich markup


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

    def __enter__(self) -> Output:
        self.console.quiet = self._was_quiet or self.mode != "rich"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.console.quiet = self._was_quiet

    def observer(self, *, scoring_actors: int | None = None) -> Any:
        """The observer that shows a run in this mode (``scoring_actors``: the Ray actors, if any)."""
        if self.mode == "rich":
            return ConsoleDisplay(self.console, scoring_actors=scoring_actors)
        if self.mode == "quiet":
            return QuietDisplay()
        from dp_textgrad.run_events import EventDicts

        return EventDicts(lambda event: typer.echo(json.dumps(_finite(event), allow_nan=False)))


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


class QuietDisplay:
    """``--quiet``: the run directory, once the run has finished."""

    def on_finish(self, event) -> None:
        typer.echo(str(event.run_dir))


class ConsoleDisplay:
    """The rich display, an observer of the run's events (:mod:`dp_textgrad.run_events`).

    Release-safe fields only: no wall time and no private-phase tokens (both time the secret
    subsample); the public-phase tokens are shown instead.
    """

    def __init__(self, console: Console, *, scoring_actors: int | None = None) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = console
        self.scoring_actors = scoring_actors
        self.progress = Progress(
            TextColumn("[bold]generation {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn(
                "best {task.fields[metric]} {task.fields[best]}  eps {task.fields[eps]}  "
                "public tokens {task.fields[tokens]}"
            ),
            console=console,
            transient=False,
        )
        self.generations = 0
        self.epsilon = 0.0
        self.public_tokens = 0
        self.metric = "accuracy"  # the name the progress line gives the estimates (the task's metric)
        self.bar: Any = None

    def on_lifetime(self, event) -> None:
        # Shown to the data's owner before any charge of this run (see docs/privacy.md, lifetime budget).
        self.console.print(f"[bold]Lifetime budget[/]: {event.describe()}", soft_wrap=True, highlight=False)

    def on_start(self, event) -> None:
        from dp_textgrad.report.fmt import metric_label

        cfg, console = event.config, self.console
        self.generations, self.epsilon = cfg.generations, cfg.epsilon
        self.metric = metric_label(event.metric)
        resumed = ""
        if event.resumed:
            lost = (
                f"; {event.interrupted_charges} of its {event.charges} charge(s) belong to an "
                "interrupted generation: they stay spent; that generation runs again and takes them over where "
                "that is sound (docs/privacy.md, Interruptions), else charges again"
                if event.interrupted_charges
                else ""
            )
            resumed = (
                f" Resuming at generation {event.generation + 1} of {cfg.generations}: epsilon "
                f"{epsilon_text(event.epsilon_spent)} of {cfg.epsilon} already spent{lost}."
            )
        console.print(
            f"[bold]Budget[/]: epsilon = {cfg.epsilon}, delta = {cfg.delta:.2e} for the whole run "
            f"({cfg.generations} generations x {cfg.population} candidates, q = {cfg.sampling_rate:.4f}, "
            f"about {cfg.sampling_rate * event.dataset_size:.0f} of N = {event.dataset_size} "
            + (
                "private records (N the real count: privacy off) "
                if cfg.privacy == "off"
                else "private records (N declared public) "
                if cfg.dataset_size is not None
                else f"private records (N a DP count, epsilon {cfg.size_epsilon:.3g} of the budget) "
            )
            + f"per generation).{resumed}\n[bold]Mechanism[/]: {event.mechanism}."
        )
        family = "generation (the prompt writes an answer)" if event.task_kind == "generate" else "classification"
        console.print(f"[bold]Task[/]: {family}, scored by {self.metric}; the estimates below are its DP estimates.")
        console.print(
            f"[bold]Records[/]: private records longer than {cfg.max_record_tokens} engine tokens are "
            + (
                "truncated to that public cap (a per-record map, applied before any charge)."
                if cfg.long_records == "truncate"
                else "rejected before any charge."
            )
        )
        if cfg.labelling is not None:  # public settings (teachers: given, or from the declared or counted N)
            lab = cfg.labelling
            if lab.answers:
                from dp_textgrad.dp_es.labelling_phase import describe_answers

                console.print(
                    f"[bold]Labelling[/]: first, {describe_answers(lab)}; calibrated to {lab.epsilon_share:g} of "
                    "epsilon, composed with the search (labels.json)."
                )
            else:
                kind = "confident GNMax" if lab.threshold is not None else "GNMax"
                console.print(
                    f"[bold]Labelling[/]: {lab.queries} public inputs labelled first by a noisy vote ({kind}) of "
                    f"{lab.teachers} teachers, each showing up to {lab.max_demos} of its own private records; "
                    f"calibrated to {lab.epsilon_share:g} of epsilon, composed with the search (labels.json)."
                )
            from dp_textgrad.dp_es.labelling_phase import noise_warning
            from dp_textgrad.dp_es.plan import RunPlan

            warning = noise_warning(RunPlan(cfg, None).labelling_sigma, lab.teachers)
            if warning is not None:
                console.print(f"[yellow]Warning[/]: {warning}.")
        if self.scoring_actors is not None:  # public settings only: the actor count, never what each one scored
            console.print(
                f"[bold]Scoring[/]: private records partitioned over {self.scoring_actors} Ray actors; "
                "noise and accounting on this process."
            )
        if not event.noise_secure:
            console.print(f"[bold red]{event.noise_sampler}.[/]", markup=True, highlight=False)
        if cfg.privacy == "off":
            console.print("[bold red]privacy off: a non-private baseline. NOT differentially private.[/]")
        if cfg.mode == "unsafe":
            console.print(
                "[bold red]UNSAFE mode: raw private examples reach the mutator. NOT differentially private.[/]"
            )
        self.bar = self.progress.add_task(
            "dp-es",
            total=cfg.generations,
            completed=event.generation,
            metric=self.metric,
            best="-",
            eps=f"{epsilon_text(event.epsilon_spent, 3)}/{cfg.epsilon:g}",
            tokens=0,
        )
        if console.is_terminal:  # a live bar; elsewhere (logs, nohup) one plain line per generation
            self.progress.start()

    def on_generation(self, report) -> None:
        self.public_tokens += report.public_prompt_tokens + report.public_completion_tokens
        self.progress.update(
            self.bar,
            completed=report.generation + 1,
            best=best_estimate_text(report),
            eps=f"{epsilon_text(report.epsilon_spent, 3)}/{self.epsilon:g}",
            tokens=self.public_tokens,
        )
        if not self.console.is_terminal:
            self.console.print(
                f"generation {report.generation + 1}/{self.generations}: best estimate of {self.metric} "
                f"{best_estimate_text(report)}, epsilon spent {epsilon_text(report.epsilon_spent, 3)} of "
                f"{self.epsilon:g}, public tokens {self.public_tokens}",
                markup=False,
                highlight=False,
            )

    def on_fail(self, event) -> None:
        self.progress.stop()

    def on_finish(self, event) -> None:
        self.progress.stop()
        print_outcome(self.console, event)


def print_outcome(console: Console, outcome) -> None:
    """The release, as the console shows it (``outcome``: a ``run_events.RunFinished``)."""
    result, config = outcome.result, outcome.config
    console.print("\n[bold]Released prompt[/]:")
    console.print(result.prompt, markup=False, highlight=False)
    if result.unsafe and config.privacy == "off":
        console.print("[bold]Privacy: none (a non-private baseline, privacy off).[/]")
    elif result.unsafe:
        console.print("[bold red]Privacy: NOT differentially private (unsafe mode).[/]")
    else:
        by = ", ".join(f"{k} {epsilon_text(v, 3)}" for k, v in sorted(result.epsilons.items()) if math.isfinite(v))
        console.print(
            f"[bold]Privacy spent[/]: epsilon = {epsilon_text(result.epsilon)}, delta = {result.delta:.2e} "
            f"(smallest valid bound; {by})"
        )
    labelling = getattr(result, "labelling", None)
    if labelling:  # DP outputs and public parameters only (labels.json)
        what = "DP answers" if labelling.get("mechanism") == "token_gnmax" else "DP labels"
        console.print(
            f"[bold]{what}[/]: {labelling['answered']} of {labelling['queries']} public inputs answered by "
            f"the teachers' vote (epsilon {epsilon_text(labelling['epsilon'], 3)} alone); they were the "
            "search's demonstrations."
        )
    fresh = getattr(result, "final_estimate", None)
    if fresh is not None:  # dp.final_estimate: a DP output with public stds
        low, high = fresh.interval
        console.print(
            f"[bold]Fresh DP estimate[/] of the released prompt's score on the private set: {fresh.estimate:.3f} "
            f"[95% {low:.3f}, {high:.3f}; noise std {fresh.noise_std:.3f}, subsampling at most "
            f"{fresh.sampling_std_bound:.3f}] (a fresh subsample and fresh noise: no winner's curse)",
            soft_wrap=True,
            highlight=False,
        )
    if outcome.evaluation is not None:
        from dp_textgrad.report.fmt import INTERVAL_LABELS, metric_label

        ev = outcome.evaluation
        method = INTERVAL_LABELS.get(ev.interval, ev.interval)
        paired = ""
        if ev.difference is not None:
            paired = (
                f"; difference {ev.difference:+.3f} "
                f"[95% {'CI' if ev.interval == 'wilson' else 'paired ' + method} "
                f"{ev.difference_low:+.3f}, {ev.difference_high:+.3f}]"
            )
            if ev.mcnemar_p is not None:
                paired += f", McNemar p = {ev.mcnemar_p:.2g}"

        def scored(value: float, low: float | None, high: float | None) -> str:
            return f"{value:.3f}" if low is None or high is None else f"{value:.3f} [{low:.3f}, {high:.3f}]"

        console.print(
            f"[bold]Test {metric_label(ev.metric)}[/] (n={ev.n_test}, 95% {method} intervals, not covered by DP): "
            f"seed {scored(ev.seed_accuracy, ev.seed_low, ev.seed_high)} -> "
            f"released {scored(ev.released_accuracy, ev.released_low, ev.released_high)}{paired}",
            soft_wrap=True,
        )
    if outcome.stopped_early:
        console.print(
            f"[bold yellow]Stopped early[/] after {result.generations_run} of "
            f"{config.generations} generations: {result.stopped_because}. The prompt "
            f"released is the best one the DP estimates saw so far; epsilon spent {epsilon_text(result.epsilon)} of "
            f"{config.epsilon:g}.",
            soft_wrap=True,
            highlight=False,
        )
    usage = result.public_usage
    console.print(
        f"[bold]Cost[/] (public figures): {result.generations_run} generations x about "
        f"{result.planned_private_evaluations:.0f} planned private record evaluations; public phase "
        f"(mutation, critiques, preflight) {usage.get('calls', 0)} calls, "
        f"{usage.get('prompt_tokens', 0) + usage.get('completion_tokens', 0)} tokens. The real private-phase "
        "usage and time are operator-only (operator/ in the run directory: do not share).",
        soft_wrap=True,
    )
    from dp_textgrad.runs import REPORT_HTML_NAME, REPORT_NAME

    console.print(
        f"[bold]Run directory[/]: {outcome.run_dir}\n[bold]Report[/]: {outcome.run_dir / REPORT_HTML_NAME} "
        f"(and {REPORT_NAME})",
        soft_wrap=True,
    )
