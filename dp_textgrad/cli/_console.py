"""What every ``dp-textgrad`` command shares: the console, the exit codes and the error handling.

A private module of the command line: the command modules of ``dp_textgrad.cli`` import from
here (and never from each other), so the commands form no import cycle. Errors are one clear
line; ``--debug`` (kept in ``state``) shows the traceback instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console

from dp_textgrad import runs
from dp_textgrad.cli.progress import StopAfterCheckpoint


class PlainWhenPiped(Console):
    """The console: rich on a terminal; in a pipe or a log, text is never wrapped at a width, so a
    released prompt, a path or a JSON value reaches the file as one unbroken line (rich would
    break it at its default 80 columns)."""

    @property
    def soft_wrap(self) -> bool:  # rich reads this as every print's default
        return not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:  # rich's __init__ assigns it: the property decides
        pass


console = PlainWhenPiped(stderr=False)

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_STOPPED_EARLY = 3
EXIT_INTERRUPTED = 130

state: dict[str, bool] = {"debug": False}


# -- errors ------------------------------------------------------------------------------
def fail(exc: BaseException, code: int) -> None:
    if state["debug"]:
        raise exc
    # One line, no markup interpretation (messages may contain brackets).
    message = " ".join(str(exc).split()) or type(exc).__name__
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def bad_input_types() -> tuple[type[BaseException], ...]:
    from dp_textgrad.privacy.accounting.lifetime import LifetimeCapExceeded
    from dp_textgrad.privacy.data import PrivateDataError

    return (ValueError, FileNotFoundError, ValidationError, PrivateDataError, LifetimeCapExceeded)


def guarded(action: Callable[[], Any], run_dir: Callable[[], Path | None], command: str = "optimize") -> Any:
    """Run ``action`` and turn its failures into one line and an exit code (``command`` resumes a run)."""
    from dp_textgrad.engines.base import EngineError
    from dp_textgrad.privacy.data import PrivateScoringError

    try:
        return action()
    except (KeyboardInterrupt, StopAfterCheckpoint):
        directory = run_dir()
        if directory is not None and runs.RunDir(directory).checkpoint.exists():
            typer.echo(
                f"interrupted: checkpoint saved; resume with `dp-textgrad {command} --resume {directory}`", err=True
            )
        else:
            typer.echo("interrupted before the first checkpoint; nothing to resume", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except typer.Exit:
        raise
    except bad_input_types() as exc:
        fail(exc, EXIT_BAD_INPUT)
    except PrivateScoringError as exc:
        directory = run_dir()
        hint = f"; resume with `dp-textgrad {command} --resume {directory}`" if directory is not None else ""
        fail(RuntimeError(f"{exc}{hint}"), EXIT_FAILURE)
    except (EngineError, RuntimeError, OSError) as exc:
        fail(exc, EXIT_FAILURE)
    except Exception as exc:  # a bug: name its type only (its message might quote data)
        if state["debug"]:
            raise
        fail(RuntimeError(f"unexpected {type(exc).__name__}; rerun with --debug for the traceback"), EXIT_FAILURE)


def config_from(settings: dict[str, Any]):
    """A ``DPESConfig`` from the given fields (None: the default), or a ``ConfigError`` naming the bad one."""
    from dp_textgrad.dp_es.config import ConfigError, DPESConfig, format_validation_error

    try:
        return DPESConfig(**{k: v for k, v in settings.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
