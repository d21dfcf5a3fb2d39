"""The benchmarks' run records: one JSON line per finished run in a work file, read back to resume
an interrupted grid and to summarise it, plus the small statistics every summary uses.

Every grid benchmark (privacy_utility, generation_utility, labelling_utility, federated,
dp_es_protocol) appends its runs here and reads them from here, so a record written by one
version of a script is read the same way by the next.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

import numpy as np


def read_runs(path: Path) -> list[dict[str, Any]]:
    """Every well-formed run of a work file (a torn last line, from a kill, is skipped)."""
    from dp_textgrad._io import read_jsonl

    return list(read_jsonl(path)) if Path(path).is_file() else []


def append_run(path: Path, row: dict[str, Any]) -> None:
    """Append one finished run (one O_APPEND write: a kill never leaves half a record before another)."""
    from dp_textgrad._io import append_jsonl

    append_jsonl(path, row)


def restore_runs(results: Path, work_file: Path, key: Callable[[dict[str, Any]], Hashable]) -> int:
    """Append the runs of a results file (``{"runs": [...]}``) that the work file lacks; returns how many."""
    done = {key(row) for row in read_runs(work_file)}
    stored = json.loads(Path(results).read_text(encoding="utf-8")).get("runs", [])
    rows = [row for row in stored if key(row) not in done]
    for row in rows:
        append_run(work_file, row)
    return len(rows)


def pending(jobs: Iterable[Any], work_file: Path, key: Callable[[dict[str, Any]], Hashable]) -> list[Any]:
    """The jobs whose run is not in the work file yet (a job's ``key`` attribute against ``key(row)``)."""
    done = {key(row) for row in read_runs(work_file)}
    return [job for job in jobs if job.key not in done]


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of a mean over seeds (None for fewer than two values)."""
    from scipy import stats

    if len(values) < 2:
        return None
    mean, sem = float(np.mean(values)), float(stats.sem(values))
    if sem == 0.0:
        return (mean, mean)
    low, high = stats.t.interval(level, len(values) - 1, loc=mean, scale=sem)
    return (float(low), float(high))


def usage(engine: Any) -> dict[str, float]:
    """An engine's cumulative usage (calls, tokens, seconds)."""
    return dict(engine.usage.as_dict())


def usage_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in ("calls", "prompt_tokens", "completion_tokens", "seconds")}


def prompt_fingerprint(row: dict[str, Any]) -> dict[str, Any]:
    """A run's row as a results file keeps it: the released prompt as a fingerprint and its length."""
    kept = {k: v for k, v in row.items() if k != "released_prompt"}
    if "released_prompt" in row:
        kept["released_prompt_sha256"] = hashlib.sha256(row["released_prompt"].encode("utf-8")).hexdigest()[:16]
        kept["released_prompt_chars"] = len(row["released_prompt"])
    return kept


def command_line(script: str, argv: list[str]) -> str:
    """The command that produced a results file, without machine paths: a ``--data-dir`` value
    (where this machine keeps ../shared/data) is dropped, the data being named by the script."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--data-dir":
            skip = True
        elif not arg.startswith("--data-dir="):
            kept.append(arg)
    return " ".join([f"python {script}", *kept])


def write_results(output: Path, document: dict[str, Any], script: str, argv: list[str]) -> None:
    """A benchmark's results file: ``document`` with the command that made it (no machine paths) and
    the date, written as indented JSON."""
    document = {
        **document,
        "command": command_line(script, argv),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")
