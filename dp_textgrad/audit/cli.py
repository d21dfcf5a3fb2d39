"""``dp-textgrad audit``: empirical privacy audits from the command line.

``dp-textgrad audit mechanisms --runs 5000`` runs the L1 mechanism audits (see
:mod:`dp_textgrad.audit.mechanism`), prints claimed epsilon vs empirical lower bound
vs the noise-off positive control, appends one JSON line per audit to
``<runs-dir>/run_metadata.jsonl`` and exits 1 when a lower bound exceeds its claim
(or, with ``--min-control``, when a positive control is too weak to have seen one).
Also runnable as ``python -m dp_textgrad.audit.cli mechanisms``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

audit_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Empirical privacy audits (lower bounds on epsilon; they never prove privacy).")

EXIT_VIOLATION = 1
EXIT_BAD_INPUT = 2


@audit_app.callback()
def _audit_callback() -> None:
    """Empirical privacy audits (lower bounds on epsilon; they never prove privacy)."""


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.3f}"


@audit_app.command("mechanisms")
def mechanisms(
    runs: int = typer.Option(5000, "--runs", help="runs per arm for the Gaussian, exponential and top-k audits"),
    controller_runs: int = typer.Option(300, "--controller-runs",
                                        help="runs per arm for the whole controller loops (a few ms per run)"),
    delta: float = typer.Option(1e-5, "--delta", help="delta at which claims and lower bounds are compared"),
    alpha: float = typer.Option(0.05, "--alpha", help="1 - confidence level of each lower bound"),
    seed: int = typer.Option(0, "--seed", help="seed of the audit's (reproducible, insecure) noise"),
    only: Optional[list[str]] = typer.Option(None, "--only",
                                             help="run only these audits (repeatable): gaussian_scores, "
                                                  "exponential, gumbel_top_k, controller_loop, "
                                                  "controller_loop_exponential"),
    min_control: float = typer.Option(0.0, "--min-control",
                                      help="also fail when a positive control's lower bound is below this "
                                           "(3.0 is reached at 1000 runs per arm)"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where run_metadata.jsonl is appended"),
    log: bool = typer.Option(True, "--log/--no-log", help="append one JSON line per audit to the run log"),
) -> None:
    """L1 audits: claimed epsilon vs empirical lower bound vs noise-off positive control."""
    from dp_textgrad.audit.mechanism import run_mechanism_audits
    from dp_textgrad.runs import append_run_log

    console = Console(width=max(Console().width, 110))  # the table needs ~100 columns
    started = time.perf_counter()
    try:
        results = run_mechanism_audits(runs, controller_runs, delta=delta, alpha=alpha, seed=seed, only=only)
    except ValueError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    table = Table(title=f"L1 mechanism audits (delta={delta:g}, alpha={alpha:g})")
    for column in ("audit", "q", "runs/arm", "claimed eps", "eps_lb", "noise-off eps_lb", "seconds", "verdict"):
        table.add_column(column)
    failed = False
    for result in results:
        weak = result.positive_control_eps_lb is not None and result.positive_control_eps_lb < min_control
        verdict = "VIOLATION" if result.violation else ("CONTROL TOO WEAK" if weak else "ok")
        failed = failed or result.violation or weak
        table.add_row(result.name, f"{result.sampling_rate:g}", str(result.runs_per_arm),
                      _fmt(result.claimed_epsilon), _fmt(result.eps_lb), _fmt(result.positive_control_eps_lb),
                      f"{result.seconds:.2f}", verdict)
        if log:
            append_run_log(runs_dir, {"kind": "audit_l1", "audit": result.name, "verdict": verdict,
                                      "command": "audit mechanisms", **result.to_dict()})
    console.print(table)
    console.print(f"total {time.perf_counter() - started:.1f} s; an eps_lb above the claim is a bug, "
                  "an eps_lb below it proves nothing.")
    if failed:
        raise typer.Exit(EXIT_VIOLATION)


if __name__ == "__main__":
    audit_app()
