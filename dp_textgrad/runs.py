"""Run directories: what a run saves, and the run log every run appends to.

``runs/<id>/`` holds the configuration, the ledger, checkpoints, per-generation noisy
metrics, the released prompt and the report (plus ``audit.json`` after an end-to-end
canary audit, see :mod:`dp_textgrad.audit.end_to_end`). Nothing in it holds raw private
text unless the run was in unsafe mode (and then the report says so at the top).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dp_textgrad import __version__, _io

RUN_LOG_NAME = "run_metadata.jsonl"


def new_run_dir(root: str | Path = "runs", prefix: str = "run") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{prefix}-{stamp}-{secrets.token_hex(2)}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def code_version() -> str:
    """The package version plus the git commit (``-dirty`` with local edits) when run from a checkout."""
    here = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def machine_summary() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def append_run_log(root: str | Path, record: dict[str, Any]) -> Path:
    """Append one JSON line to ``<root>/run_metadata.jsonl`` (safe under concurrent runs)."""
    path = Path(root) / RUN_LOG_NAME
    entry = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(), "code_version": code_version(), **record}
    _io.append_jsonl(path, entry)
    return path


def read_run_log(root: str | Path) -> Iterator[dict[str, Any]]:
    """Every well-formed line of the run log; corrupted lines are skipped."""
    return _io.read_jsonl(Path(root) / RUN_LOG_NAME)


def write_json(path: str | Path, payload: Any) -> None:
    _io.atomic_write_json(path, payload)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
