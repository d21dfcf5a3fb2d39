"""Command line: ``dp-textgrad demo | optimize | evaluate | budget | ledger | report | federated... | audit ...``.

A package that no library module imports: one module per command group (``run``: demo and
optimize; ``evaluate``; ``budget``: budget and ledger; ``report``; ``federated``; ``audit``), the shared
console, exit codes and error handling in ``_console``, the run display in ``progress``. Each
command imports what it uses when it runs, so ``dp-textgrad --help`` loads no engine, no
TextGrad and no audit.

Errors are one clear line (``dp-textgrad --debug ...`` shows the traceback). Exit codes: 0 success,
3 a prompt was released after an early stop (budget exhausted or a callback; the console and
``result.json`` say why), 1 run failure (engine errors, nothing could be released), 2 bad input or
configuration (nothing charged), 130 interrupted (clean checkpoint; ``dp-textgrad optimize --resume RUN_DIR``).
"""

from __future__ import annotations

import typer

from dp_textgrad.cli._console import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_STOPPED_EARLY, state
from dp_textgrad.cli.audit import audit_app
from dp_textgrad.cli.budget import budget, ledger
from dp_textgrad.cli.evaluate import evaluate
from dp_textgrad.cli.federated import federated, federated_app, federated_split
from dp_textgrad.cli.report import report
from dp_textgrad.cli.run import demo, optimize

# Tracebacks (--debug) never show local variables: they would print raw private records.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Differentially private prompt optimization (DP-ES on TextGrad).",
)


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="show full tracebacks on errors")) -> None:
    state["debug"] = debug


# In the order `dp-textgrad --help` lists them.
app.add_typer(audit_app, name="audit")
app.command()(ledger)
app.command()(report)
app.command()(federated)
app.command("federated-split")(federated_split)
app.command("federated-app")(federated_app)
app.command()(demo)
app.command()(optimize)
app.command()(evaluate)
app.command()(budget)

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_STOPPED_EARLY", "app"]
