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
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


# How long the CPUs are watched to see which are busy now (two reads of /proc/stat).
SAMPLE_SECONDS = 0.2
PROC_STAT = Path("/proc/stat")


def read_proc_stat() -> str | None:
    """The text of ``/proc/stat`` (per-CPU time counters), or ``None`` where there is none."""
    try:
        return PROC_STAT.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def cpu_times(stat: str) -> dict[int, tuple[int, int]]:
    """Per CPU number: (busy, total) clock ticks since boot, from the ``cpuN`` lines of ``/proc/stat``.

    Busy is everything but idle and iowait; total sums user, nice, system, idle, iowait, irq,
    softirq and steal (guest time is already inside user and nice).
    """
    times: dict[int, tuple[int, int]] = {}
    for line in stat.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
            continue
        try:
            values = [int(v) for v in fields[1:9]]
        except ValueError:
            continue
        if len(values) < 4:
            continue
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        total = sum(values)
        times[int(fields[0][3:])] = (total - idle, total)
    return times


def busy_now(
    read_stat: Callable[[], str | None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    cpus: Collection[int] | None = None,
) -> float | None:
    """CPUs' worth of work running now on the CPUs this process may use: the busy share of each
    CPU between two reads of ``/proc/stat`` ``SAMPLE_SECONDS`` apart, summed (``None`` where the
    counters cannot be read). ``cpus``: the CPU numbers to count (default: this process's
    affinity mask, or every CPU listed)."""
    reader = read_stat if read_stat is not None else read_proc_stat
    first = reader()
    if first is None:
        return None
    sleep(SAMPLE_SECONDS)
    second = reader()
    if second is None:
        return None
    before, after = cpu_times(first), cpu_times(second)
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else after.keys()
    busy, counted = 0.0, 0
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            continue
        ticks = after[cpu][1] - before[cpu][1]
        if ticks <= 0:
            continue
        busy += min(1.0, max(0.0, (after[cpu][0] - before[cpu][0]) / ticks))
        counted += 1
    return busy if counted else None


def busy_cpus(read_stat: Callable[[], str | None] | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """CPUs other work keeps busy now, rounded: a short sample of CPU usage (:func:`busy_now`).

    Where ``/proc/stat`` cannot be read (macOS, Windows), the 1-minute load average, rounded
    (0 where that is unknown too). The load average lags: right after another command it still
    counts CPUs that are idle now.
    """
    sampled = busy_now(read_stat, sleep)
    if sampled is not None:
        return max(0, round(sampled))
    try:
        return max(0, round(os.getloadavg()[0]))
    except (AttributeError, OSError):
        return 0


def default_threads() -> int:
    """The CPUs that are free when the engine starts: available minus busy now, at least one.

    llama.cpp's OpenMP threads spin while they wait, so a thread on a CPU that other work
    holds is far worse than no thread there (measured on 2 CPUs: 340 vs 14 tokens/s with
    one CPU busy elsewhere). Busy is measured when the engine starts (:func:`busy_cpus`, a
    0.2 s sample of CPU usage), not with the 1-minute load average, which still counts the
    command that ran just before. On an idle machine every CPU is used; under load (a test
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


class GreedyCompletion:
    """When one completion ends and the text it returns, decided token by token as
    llama-cpp-python's ``create_completion`` decides them, so batched greedy generation
    returns what one call per prompt would.

    ``detokenize(tokens)`` gives the bytes of the completion tokens (after the prompt);
    ``is_end(token)`` says whether a token ends generation (end of generation). A token that
    ends it is not part of the text; a stop string ends it and is cut off with what follows
    (the first string of ``stop``, in list order, that the text holds); ``max_tokens`` ends it
    otherwise, except while the text ends inside a UTF-8 character (as upstream, one more
    token per missing byte).
    """

    def __init__(
        self,
        max_tokens: int,
        stop: Sequence[str] | None,
        detokenize: Callable[[list[int]], bytes],
        is_end: Callable[[int], bool],
    ) -> None:
        self.max_tokens = max_tokens
        self._stops = [s.encode("utf-8") for s in stop or []]
        self._detokenize = detokenize
        self._is_end = is_end
        self.tokens: list[int] = []
        self.text: str | None = None  # set when the completion has ended
        self._multibyte_fix = 0

    def push(self, token: int) -> bool:
        """Take the next generated token; True when the completion has ended (``text`` is set)."""
        if self.text is not None:
            raise RuntimeError("internal: the completion has already ended")
        if self._is_end(token):
            return self._end(self._detokenize(self.tokens))
        self.tokens.append(token)
        all_text = self._detokenize(self.tokens)
        tail = all_text[-3:]
        for k, byte in enumerate(tail):
            missing_after = 3 - k
            for width, pattern in ((2, 192), (3, 224), (4, 240)):
                if width > missing_after and pattern & byte == pattern:
                    self._multibyte_fix = width - missing_after
        if self._multibyte_fix > 0:
            self._multibyte_fix -= 1
            return False
        found = [s for s in self._stops if s in all_text]
        if found:
            return self._end(all_text[: all_text.index(found[0])])
        if len(self.tokens) >= self.max_tokens:
            return self._end(all_text)
        return False

    def _end(self, text: bytes) -> bool:
        self.text = text.decode("utf-8", errors="ignore")
        return True


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
