"""Command line: ``dp-textgrad demo | budget | optimize | report``.

Errors are one clear line (``--debug`` shows the traceback). Exit codes: 0 success,
1 run failure, 2 bad input or configuration, 130 interrupted.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Differentially private prompt optimization (DP-ES on TextGrad).")
console = Console(stderr=False)
err = Console(stderr=True)

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

_state: dict[str, bool] = {"debug": False}


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="show full tracebacks on errors")) -> None:
    _state["debug"] = debug


def _fail(exc: BaseException, code: int) -> None:
    if _state["debug"]:
        raise exc
    err.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(code)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from dp_textgrad.dp_es.private import PrivateDataError

    return (ValueError, FileNotFoundError, ValidationError, PrivateDataError)


def _config_from(settings: dict[str, Any]):
    from pydantic import ValidationError

    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.controller import ConfigError, format_validation_error

    try:
        return DPESConfig(**{k: v for k, v in settings.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def _run_with_progress(task, engine, config, *, task_name: str, engine_name: str, runs_root: Path,
                       run_dir: Optional[Path] = None, resume: bool = False):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dp_textgrad import workflow

    progress = Progress(
        TextColumn("[bold]generation {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("best {task.fields[best]}  eps {task.fields[eps]}  tokens {task.fields[tokens]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    holder: dict[str, Any] = {}

    def on_start(optimizer) -> None:
        cfg = optimizer.config
        mech = (f"Gaussian noisy scores, noise multiplier z = {optimizer.noise_multiplier:.3f}"
                if cfg.selection == "gaussian" else
                f"exponential top-{cfg.parents}, epsilon0 = {optimizer.selection_epsilon:.4f} per selection")
        console.print(
            f"[bold]Budget[/]: epsilon = {cfg.epsilon}, delta = {cfg.delta:.2e} for the whole run "
            f"({cfg.generations} generations x {cfg.population} candidates, q = {cfg.sampling_rate:.4f}, "
            f"about {cfg.sampling_rate * len(task.private_train):.0f} of {len(task.private_train)} private records "
            f"per generation).\n[bold]Mechanism[/]: {mech}."
        )
        if cfg.mode == "unsafe":
            console.print("[bold red]UNSAFE mode: raw private examples reach the mutator. NOT differentially private.[/]")
        holder["task"] = progress.add_task("dp-es", total=cfg.generations, completed=optimizer.generation,
                                           best="-", eps="0", tokens=0)
        progress.start()

    def on_generation(report) -> None:
        progress.update(holder["task"], completed=report.generation + 1, best=f"{report.best_estimate:.3f}",
                        eps=f"{report.epsilon_spent:.3g}/{config.epsilon:g}",
                        tokens=report.prompt_tokens + report.completion_tokens)

    try:
        return workflow.run(task, engine, config, runs_root=runs_root, run_dir=run_dir, resume=resume,
                            on_start=on_start, on_generation=on_generation, task_name=task_name,
                            engine_name=engine_name)
    finally:
        progress.stop()


def _print_outcome(outcome) -> None:
    result = outcome.result
    console.print("\n[bold]Released prompt[/]:")
    console.print(result.prompt, markup=False, highlight=False)
    if result.unsafe:
        console.print("[bold red]Privacy: NOT differentially private (unsafe mode).[/]")
    else:
        by = ", ".join(f"{k} {v:.3g}" for k, v in sorted(result.epsilons.items()) if math.isfinite(v))
        console.print(f"[bold]Privacy spent[/]: epsilon = {result.epsilon:.4g}, delta = {result.delta:.2e} "
                      f"(smallest valid bound; {by})")
    if outcome.evaluation is not None:
        ev = outcome.evaluation
        console.print(f"[bold]Test accuracy[/] (n={ev.n_test}, not covered by DP): seed {ev.seed_accuracy:.3f} -> "
                      f"released {ev.released_accuracy:.3f}")
    console.print(f"[bold]Run directory[/]: {outcome.run_dir}\n[bold]Report[/]: {outcome.run_dir / 'report.html'} "
                  f"(and report.md); took {outcome.seconds:.0f} s")


@app.command()
def demo(
    epsilon: float = typer.Option(4.0, help="total privacy budget epsilon"),
    delta: Optional[float] = typer.Option(None, help="total delta (default min(1e-5, 1/(10N)))"),
    generations: int = typer.Option(4, help="DP generations"),
    population: int = typer.Option(5, help="candidates per generation"),
    parents: int = typer.Option(2, help="parents per generation"),
    n_private: int = typer.Option(1500, help="size of the built-in private training set"),
    n_test: int = typer.Option(150, help="size of the built-in test split"),
    sampling_rate: Optional[float] = typer.Option(None, help="Poisson sampling rate q (default about 100 records)"),
    seed: int = typer.Option(0, help="seed of the task generator and of non-private choices"),
    runs_root: Path = typer.Option(Path("runs"), help="where run directories are created"),
) -> None:
    """Run DP-ES end to end on the built-in private task with the embedded local model."""
    from dp_textgrad.engines.base import EngineError

    try:
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
        from dp_textgrad.tasks.synthetic import make_support_task

        task = make_support_task(seed=seed, n_private=n_private, n_test=n_test)
        q = sampling_rate if sampling_rate is not None else min(1.0, 100 / len(task.private_train))
        config = _config_from(dict(epsilon=epsilon, delta=delta, generations=generations, population=population,
                                   parents=parents, sampling_rate=q, seed=seed))
        console.print("Loading the local model (Gemma 3 270M via llama.cpp; first use assembles the GGUF)...")
        engine = LlamaCppEngine()
        outcome = _run_with_progress(task, engine, config, task_name="support (built-in)",
                                     engine_name=engine.model_string, runs_root=runs_root)
    except KeyboardInterrupt:
        err.print("interrupted: the last checkpoint is in the run directory; resume with `dp-textgrad optimize --resume`")
        raise typer.Exit(EXIT_INTERRUPTED)
    except typer.Exit:
        raise
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)
    except (EngineError, RuntimeError, OSError) as exc:
        _fail(exc, EXIT_FAILURE)
    _print_outcome(outcome)


@app.command()
def budget(
    epsilon: Optional[float] = typer.Option(None, help="target epsilon: prints the calibrated noise"),
    delta: float = typer.Option(1e-5, help="delta"),
    generations: int = typer.Option(6, help="DP generations T"),
    population: int = typer.Option(6, help="candidates per generation K"),
    parents: int = typer.Option(2, help="parents per generation k"),
    sampling_rate: float = typer.Option(0.1, help="Poisson sampling rate q"),
    selection: str = typer.Option("gaussian", help="gaussian | exponential"),
    feedback: str = typer.Option("dp_confusion", help="dp_confusion | none"),
    noise_multiplier: Optional[float] = typer.Option(None, help="given noise: prints epsilon under every accountant"),
    selection_epsilon: Optional[float] = typer.Option(None, help="given epsilon0 (exponential): prints epsilon"),
) -> None:
    """Calibration calculator: the noise for a budget, or the epsilon of a given noise. Reads no data."""
    try:
        from dp_textgrad.dp_es.accountant import default_accountants
        from dp_textgrad.dp_es.controller import RunPlan

        if (epsilon is None) == (noise_multiplier is None and selection_epsilon is None):
            raise ValueError("give either --epsilon (to calibrate) or --noise-multiplier/--selection-epsilon "
                             "(to account), not both")
        if selection == "exponential":
            feedback = "none"
        config = _config_from(dict(epsilon=epsilon if epsilon is not None else 1.0, delta=delta,
                                   generations=generations, population=population, parents=parents,
                                   sampling_rate=sampling_rate, selection=selection, feedback=feedback))
        if epsilon is not None:
            plan = RunPlan.from_config(config)
            z, e0 = plan.noise_multiplier, plan.selection_epsilon
            what = f"noise multiplier z = {z:.4f}" if z is not None else f"epsilon0 = {e0:.5f} per selection"
            console.print(f"For epsilon = {epsilon}, delta = {delta:g}: {what}")
        else:
            z, e0 = noise_multiplier, selection_epsilon
        event = RunPlan.whole_run_event(config, noise_multiplier=z, selection_epsilon=e0)
        console.print("epsilon of the whole run under each accountant:")
        values = {}
        for accountant in default_accountants():
            values[accountant.name] = accountant.epsilon([event], delta)
        for name, value in values.items():
            console.print(f"  {name:>10}: {value:.4f}")
        console.print(f"  {'used':>10}: {min(values.values()):.4f} (smallest valid bound)")
    except typer.Exit:
        raise
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run directory under runs/")) -> None:
    """Rebuild report.md and report.html of a finished run."""
    try:
        from dp_textgrad.report import write_report

        path = write_report(run_dir)
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)
    console.print(f"Report: {path} and {path.with_suffix('.html')}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
