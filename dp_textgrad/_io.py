"""Small file helpers: atomic writes and crash-safe JSON-lines appends.

Writers of released files pass ``mtime``: the file gets that modification time before it is
visible, and its folder is stamped again after (creating or renaming an entry changes a folder's
time), so no released file or folder carries the wall clock of a private phase.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def set_mtime(path: str | os.PathLike[str], mtime: float) -> None:
    """Give ``path`` (a file or a folder) the access and modification time ``mtime`` (seconds since the epoch)."""
    os.utime(path, (mtime, mtime))


def atomic_write_text(path: str | os.PathLike[str], text: str, mtime: float | None = None) -> None:
    """Write ``text`` so that readers see the old file or the new one, never a torn one.

    ``mtime``: the file's modification time, set on the temporary file before the rename (the
    visible file never has another), and set again on the folder after it.
    """
    _atomic_write(path, text, "w", mtime)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mtime: float | None = None) -> None:
    """Write ``data`` atomically, as :func:`atomic_write_text`."""
    _atomic_write(path, data, "wb", mtime)


def _atomic_write(path: str | os.PathLike[str], data: str | bytes, mode: str, mtime: float | None) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mtime is not None:
            set_mtime(tmp, mtime)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if mtime is not None:  # the temporary file and the rename changed the folder's time
        set_mtime(target.parent, mtime)


def atomic_write_json(path: str | os.PathLike[str], payload: Any, mtime: float | None = None) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=_json_default) + "\n", mtime)


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any], mtime: float | None = None) -> None:
    """Append one JSON line with a single O_APPEND write, so concurrent writers lose no line.

    ``mtime``: the file's modification time after the write (and its folder's, when the file is new).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True, default=_json_default) + "\n").encode("utf-8")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        new = os.fstat(fd).st_size == 0  # created now (or empty): the folder's time changed
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    if mtime is not None:
        set_mtime(target, mtime)
        if new:
            set_mtime(target.parent, mtime)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield each well-formed JSON object; skip corrupted or partial lines."""
    target = Path(path)
    if not target.exists():
        return
    with target.open("r", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float):
        return value
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
