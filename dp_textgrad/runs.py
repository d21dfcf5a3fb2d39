"""Run directories: what a run saves, and the run log every run appends to.

``runs/<id>/`` holds the configuration, the ledger, checkpoints, per-generation noisy
metrics, the released prompt and the report (plus ``audit.json`` after an end-to-end
canary audit, see :mod:`dp_textgrad.audit.end_to_end`). Nothing in it holds raw private
text unless the run was in unsafe mode (and then the report says so at the top).

Every structured file goes through :mod:`dp_textgrad.privacy.release`: its released part is
written here, its operator-only part under ``operator/`` (real private-phase usage and
time, raw engine error text), which nothing that is shared reads.
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

from dp_textgrad.privacy import release

RUN_LOG_NAME = "run_metadata.jsonl"
CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.json"
LEDGER_NAME = "ledger.jsonl"
METRICS_NAME = "metrics.jsonl"
RESULT_NAME = "result.json"
PROMPT_NAME = "released_prompt.txt"
OPERATOR_DIR = "operator"
OPERATOR_README = (
    "Operator-only values: derived from private data WITHOUT noise (real usage, tokens and wall time of\n"
    "the private scoring phase; raw engine error text). They are not covered by the run's (epsilon, delta)\n"
    "guarantee. Do not share this folder; reports, result.json, metrics.jsonl and the run log never read it.\n"
)


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


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def operator_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/operator/``, created with its do-not-share README."""
    path = Path(run_dir) / OPERATOR_DIR
    path.mkdir(parents=True, exist_ok=True)
    readme = path / "README.txt"
    if not readme.exists():
        _io.atomic_write_text(readme, OPERATOR_README)
    return path


def write_released_json(run_dir: str | Path, name: str, channel: str, payload: dict[str, Any]) -> None:
    """Write ``payload``'s released part to ``<run_dir>/<name>``, its operator-only part under operator/."""
    public, private = release.split(channel, payload)
    if private:
        _io.atomic_write_json(operator_dir(run_dir) / name, private)
    _io.atomic_write_json(Path(run_dir) / name, public)


def append_released_jsonl(run_dir: str | Path, name: str, channel: str, record: dict[str, Any],
                          key: dict[str, Any] | None = None) -> None:
    """Append ``record``'s released part to ``<run_dir>/<name>``; the operator-only part, with ``key``
    (public identifiers such as the generation), to ``operator/<name>``."""
    public, private = release.split(channel, record)
    if private:
        _io.append_jsonl(operator_dir(run_dir) / name, {**(key or {}), **private})
    _io.append_jsonl(Path(run_dir) / name, public)


def write_operator_json(run_dir: str | Path, name: str, payload: Any) -> None:
    _io.atomic_write_json(operator_dir(run_dir) / name, payload)


def append_operator_text(run_dir: str | Path, name: str, text: str) -> Path:
    path = operator_dir(run_dir) / name
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text.rstrip("\n") + "\n")
    return path


def append_run_log(root: str | Path, record: dict[str, Any], run_dir: str | Path | None = None,
                   channel: str = "run_log") -> Path:
    """Append one JSON line to ``<root>/run_metadata.jsonl`` (safe under concurrent runs).

    Its operator-only fields go to ``<run_dir>/operator/run_metadata.jsonl`` instead (and
    nowhere when no run directory is given).
    """
    path = Path(root) / RUN_LOG_NAME
    entry = {"code_version": code_version(), **record}
    public, private = release.split(channel, entry)
    if private and run_dir is not None:
        _io.append_jsonl(operator_dir(run_dir) / RUN_LOG_NAME, private)
    _io.append_jsonl(path, public)
    return path


def read_run_log(root: str | Path) -> Iterator[dict[str, Any]]:
    """Every well-formed line of the run log; corrupted lines are skipped."""
    return _io.read_jsonl(Path(root) / RUN_LOG_NAME)


def write_json(path: str | Path, payload: Any) -> None:
    _io.atomic_write_json(path, payload)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
