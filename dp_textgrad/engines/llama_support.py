"""Support for the llama.cpp engine: thread count, the generation cache, logit helpers.

Kept apart from the engine so that ``engines/llama_cpp.py`` holds only the model and
its KV-prefix cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def busy_cpus() -> int:
    """CPUs other work keeps busy: the 1-minute load average, rounded (0 where it is unknown)."""
    try:
        return max(0, round(os.getloadavg()[0]))
    except (AttributeError, OSError):
        return 0


def default_threads() -> int:
    """The CPUs that are free when the engine starts: available minus busy, at least one.

    llama.cpp's OpenMP threads spin while they wait, so a thread on a CPU that other work
    holds is far worse than no thread there (measured on 2 CPUs: 340 vs 14 tokens/s with
    one CPU busy elsewhere). On an idle machine every CPU is used; under load (a test
    suite, another run) fewer. ``DP_TEXTGRAD_THREADS`` overrides the rule.
    """
    configured = os.environ.get("DP_TEXTGRAD_THREADS")
    if configured:
        try:
            value = int(configured)
        except ValueError:
            raise ValueError(f"DP_TEXTGRAD_THREADS: must be a positive integer, got {configured!r}") from None
        if value < 1:
            raise ValueError(f"DP_TEXTGRAD_THREADS: must be a positive integer, got {configured!r}")
        return value
    return max(1, available_cpus() - busy_cpus())


class GenerationCache:
    """Opt-in cache of deterministic generations, in memory or in an explicit directory.

    Keys are sha256 hashes of (model, prompt, system prompt, temperature, seed,
    max tokens, stop), so prompts are never stored as keys; the cached outputs are
    stored as they are, which is why a directory is never chosen by default.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, str] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(**fields: object) -> str:
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        with self._lock:
            value = self._memory.get(key)
            if value is None and self.directory is not None:
                path = self.directory / f"{key}.json"
                if path.is_file():
                    value = json.loads(path.read_text(encoding="utf-8"))["text"]
                    self._memory[key] = value
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
            return value

    def put(self, key: str, text: str) -> None:
        with self._lock:
            self._memory[key] = text
            if self.directory is None:
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, scratch = tempfile.mkstemp(prefix=".entry-", dir=self.directory)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"text": text}, out)
            os.replace(scratch, self.directory / f"{key}.json")


def as_cache(cache: GenerationCache | str | Path | bool | None) -> GenerationCache | None:
    if cache is None or cache is False:
        return None
    if cache is True or cache == "memory":
        return GenerationCache()
    if isinstance(cache, GenerationCache):
        return cache
    if isinstance(cache, (str, Path)):
        return GenerationCache(cache)
    raise TypeError("cache: use None, 'memory', a directory path or a GenerationCache")


@dataclass
class KvStats:
    """How much work the KV-cache reuse saved (tokens decoded vs. tokens reused)."""

    tokens_decoded: int = 0
    tokens_reused: int = 0


def logsumexp(row: np.ndarray) -> float:
    top = float(row.max())
    return top + float(np.log(np.exp(row - top, dtype=np.float64).sum()))


def pick_logprobs(row: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """log-softmax(row)[token_ids] without materialising the whole log-softmax."""
    return row[token_ids].astype(np.float64) - logsumexp(row)


def quiet_native_output(lib: object) -> AbstractContextManager[object]:
    """Silence llama.cpp's native log lines during model load (as verbose=False intends)."""
    utils = getattr(lib, "_utils", None)
    quiet = getattr(utils, "suppress_stdout_stderr", None)
    return quiet(disable=False) if quiet is not None else nullcontext()
