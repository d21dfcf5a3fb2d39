"""Run Python in a child process so that a test cannot pass because the child died early.

A test that runs a driver in a subprocess and checks only "it failed" or "no secret in the
output" passes just as well when the driver cannot even import what it needs. Every such
test goes through :func:`run_driver` (source code) or :func:`run_script` (a file), which
fail the test, with the child's output, when:

- the child did not get past its imports (a driver prints :data:`IMPORTS_DONE` right after
  them; the helper adds that line between ``imports`` and ``body`` itself);
- the child's output names ``ModuleNotFoundError`` or ``ImportError``;
- the child ended with an exception other than the one the test expects (``raises``: the
  last exception printed, so a chained traceback ends with it), or with any exception when
  it expects none;
- the exit code is not the one the test expects.

The marker line is removed from the stdout handed back, so tests compare stdout as before.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
IMPORTS_DONE = "<<subprocess driver: imports done>>"
_IMPORT_FAILURES = ("ModuleNotFoundError", "ImportError")
# The last line of a plain traceback ("ValueError: ..."), or typer/rich's boxed one.
_EXCEPTION_LINE = re.compile(r"^\s*(?:│\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))\b(?::|$)",
                             re.MULTILINE)


@dataclass(frozen=True)
class DriverRun:
    """What the child did: its exit code and its output (stdout without the marker line)."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_driver(imports: str, body: str, *args: str, expect_exit: int = 0, raises: str | None = None,
               cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
               timeout: float = 300) -> DriverRun:
    """Run ``python -c`` on ``imports``, the marker line, then ``body``; ``args`` reach it as sys.argv[1:].

    ``env`` replaces the child's environment (default: this one); the repository root is put
    first on its PYTHONPATH either way, so ``from tests.... import`` works from any ``cwd``.
    """
    code = f"{imports.rstrip()}\nprint({IMPORTS_DONE!r}, flush=True)\n{body}"
    done = _run([sys.executable, "-c", code, *args], cwd, env, timeout, repo_on_path=True)
    return check_run(done, expect_exit=expect_exit, raises=raises, marker=True)


def run_script(script: Path | str, *args: str, expect_exit: int = 0, raises: str | None = None,
               cwd: Path | str | None = None, env: Mapping[str, str] | None = None,
               timeout: float = 300) -> DriverRun:
    """Run a Python file (an example, a benchmark) as a user runs it (the repository is not put on
    its path), with the same checks less the marker."""
    done = _run([sys.executable, str(script), *args], cwd, env, timeout, repo_on_path=False)
    return check_run(done, expect_exit=expect_exit, raises=raises, marker=False)


def _run(command: Sequence[str], cwd, env, timeout: float, *, repo_on_path: bool) -> subprocess.CompletedProcess[str]:
    child_env = dict(os.environ if env is None else env)
    # Something in the test process (Ray, xdist) may have put the repository on PYTHONPATH: a
    # script runs as a user runs it, without it; a driver gets it first.
    inherited = [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep)
                 if p and Path(p).resolve() != REPO_ROOT]
    child_env["PYTHONPATH"] = os.pathsep.join(([str(REPO_ROOT)] if repo_on_path else []) + inherited)
    return subprocess.run(list(command), cwd=cwd, env=child_env, capture_output=True, text=True, timeout=timeout)


def check_run(done: subprocess.CompletedProcess[str], *, expect_exit: int, raises: str | None,
              marker: bool) -> DriverRun:
    """Fail the calling test unless the child ran past its imports and ended as expected."""
    stdout, stderr = done.stdout, done.stderr
    shown = f"\n--- child stdout (tail) ---\n{stdout[-3000:]}\n--- child stderr (tail) ---\n{stderr[-3000:]}"
    if marker:
        if IMPORTS_DONE not in stdout:
            pytest.fail(f"the driver died before the end of its imports (exit {done.returncode}){shown}")
        stdout = "".join(line for line in stdout.splitlines(keepends=True) if line.rstrip("\r\n") != IMPORTS_DONE)
    for name in _IMPORT_FAILURES:
        if name in done.stdout or name in stderr:
            pytest.fail(f"the child hit {name} (exit {done.returncode}){shown}")
    # The exception that ended the child is the last one printed (a chained traceback prints
    # its causes first).
    raised = _EXCEPTION_LINE.findall(stderr)
    ended_with = raised[-1] if raised else None
    if raises is None:
        if ended_with or "Traceback (most recent call last)" in stderr:
            pytest.fail(f"the child raised {ended_with or 'an exception'}, none was expected{shown}")
    elif ended_with is None or not (ended_with == raises or ended_with.endswith("." + raises)):
        pytest.fail(f"the child did not end with {raises} (it ended with {ended_with or 'no exception'}){shown}")
    if done.returncode != expect_exit:
        pytest.fail(f"the child exited {done.returncode}, expected {expect_exit}{shown}")
    return DriverRun(done.returncode, stdout, stderr)
