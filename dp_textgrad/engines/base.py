"""The engine interface: a TextGrad ``EngineLM`` that can also score.

Every engine generates text (for mutation and TextGrad's own optimizers) and scores
continuations (for DP scoring of classification records and for audits). Engines
count their usage and never write prompts to disk unless a cache directory is given
explicitly.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad._textgrad import import_textgrad

if TYPE_CHECKING:
    from textgrad.engine.base import EngineLM
else:
    EngineLM = import_textgrad().EngineLM


BYTES_PER_TOKEN = 4


def estimated_tokens(text: str) -> int:
    """Token count estimated from UTF-8 bytes, for engines that cannot tokenize locally."""
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def truncate_estimated(text: str, max_tokens: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= BYTES_PER_TOKEN * max_tokens:
        return text
    return data[: BYTES_PER_TOKEN * max_tokens].decode("utf-8", errors="ignore")


class EngineError(RuntimeError):
    """An engine failed after its retries. The message never quotes prompt text."""


@dataclass
class Usage:
    """Counters of what an engine did. Thread-safe through ``Engine._usage_lock``."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float = 0.0
    retries: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-token log-probabilities of a text given a context.

    ``vocab_mean`` / ``vocab_std`` are the mean and standard deviation of log p over
    the vocabulary at each position (for Min-K%++), when the engine can give them.
    ``top_alternatives`` holds, per position, the engine's top (token, logprob) pairs.
    """

    tokens: list[str]
    logprobs: np.ndarray
    top_alternatives: list[list[tuple[str, float]]] = field(default_factory=list)
    vocab_mean: np.ndarray | None = None
    vocab_std: np.ndarray | None = None


class ResultCache:
    """A bounded in-memory LRU map of engine results, safe across threads.

    Keys and values hold private text, so it lives in memory only. ``hits`` counts
    lookups that found an entry; ``clear`` keeps it (it is a usage counter).
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.hits = 0
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple[bool, Any]:
        with self._lock:
            if key not in self._items:
                return False, None
            self._items.move_to_end(key)
            self.hits += 1
            return True, self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class CachesResults:
    """Mixin for engines with an opt-in result cache (``_results``, ``None`` when off).

    A ``None`` key marks a result that must not be cached (e.g. a sampled generation).
    """

    _results: ResultCache | None = None

    @property
    def cache_hits(self) -> int:
        return self._results.hits if self._results is not None else 0

    @property
    def cache_size(self) -> int:
        return len(self._results) if self._results is not None else 0

    def clear_cache(self) -> None:
        """Forget every cached result (the cache holds private text in memory)."""
        if self._results is not None:
            self._results.clear()

    def _cache_get(self, key: Hashable | None) -> tuple[bool, Any]:
        if self._results is None or key is None:
            return False, None
        return self._results.get(key)

    def _cache_put(self, key: Hashable | None, value: Any) -> None:
        if self._results is not None and key is not None:
            self._results.put(key, value)


class Engine(EngineLM):
    """Base class of dp-textgrad engines.

    Subclasses implement ``_generate``, ``score_choices_batch`` and ``token_logprobs``.
    """

    model_string: str = "engine"
    system_prompt: str = "You are a helpful, concise assistant."
    # Whether the model follows instructions (LLM rewrites and critiques are worth asking for).
    instruction_following: bool = True
    # Whether generate_for_prefixes does the prompts' work together (one record under several
    # prompts): callers holding several prompts then call it record by record; otherwise they
    # call generate_after_prefix prompt by prompt, which a concurrent engine spreads over records.
    batches_prefixes: bool = False

    def __init__(self) -> None:
        self.usage = Usage()
        self._usage_lock = threading.Lock()

    # -- generation -----------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        system_prompt: str | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> str:
        if not isinstance(prompt, str):
            raise TypeError("prompt must be text")  # multimodal content is not supported
        return self._generate(
            prompt,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            stop=list(stop) if stop else None,
        )

    def generate_many(self, prompts: Sequence[str], system_prompt: str | None = None, **kwargs: Any) -> list[str]:
        """``generate`` for each prompt (the same keyword arguments), results in input order.

        This default calls ``generate`` once per prompt; engines that can do better override it
        (llama.cpp decodes greedy generations together, the OpenAI-compatible engine overlaps
        requests)."""
        return [self.generate(prompt, system_prompt, **kwargs) for prompt in prompts]

    def generate_after_prefix(
        self,
        prefix: str,
        suffixes: Sequence[str],
        *,
        max_tokens: int,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> list[str]:
        """The continuation of ``prefix + suffix`` for each suffix, in input order.

        The private path of generation tasks calls this: each output must depend on
        ``prefix`` and its own suffix only, never on the other suffixes of the call (so one
        private record cannot change another's output). This default generates one after
        another; an engine may reuse the prefix's work where that keeps the guarantee.
        """
        return [
            self.generate(prefix + suffix, temperature=temperature, max_tokens=max_tokens, stop=stop)
            for suffix in suffixes
        ]

    def generate_for_prefixes(
        self,
        prefixes: Sequence[str],
        suffix: str,
        *,
        max_tokens: int,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> list[str]:
        """The continuation of ``prefix + suffix`` for each prefix, in input order: one record
        (``suffix``) under several candidate prompts.

        The private path of generation tasks may call this once per record: every output must
        depend on the prefixes and this one suffix only (never on another record, nor on what
        the engine generated before), so adding or removing one record changes only that
        record's outputs, one per prefix. An engine may generate the prefixes' continuations
        together where that keeps the guarantee; each should equal
        ``generate_after_prefix(prefix, [suffix])[0]`` up to the engine's float rounding. This
        default does exactly that, one prefix after another.
        """
        return [
            self.generate_after_prefix(prefix, [suffix], max_tokens=max_tokens, stop=stop, temperature=temperature)[0]
            for prefix in prefixes
        ]

    def __call__(self, prompt: str, **kwargs: Any) -> str:
        return self.generate(prompt, **kwargs)

    # -- lifecycle: ``with engine:`` frees what the engine holds --------------------
    def close(self) -> None:
        """Free the engine's resources (idempotent); nothing to free by default."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abstractmethod
    def _generate(
        self,
        prompt: str,
        *,
        system_prompt: str | None,
        temperature: float,
        max_tokens: int,
        seed: int | None,
        stop: list[str] | None,
    ) -> str: ...

    # -- scoring --------------------------------------------------------------------
    @abstractmethod
    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        """Log-probabilities, shape (len(suffixes), len(choices)).

        Entry [i, j] = log p(choices[j] | prefix + suffixes[i]), multi-token choices
        summed over their tokens. The shared ``prefix`` is evaluated once where the
        engine can reuse it.
        """

    def score_choices(self, context: str, choices: Sequence[str]) -> np.ndarray:
        """Log-probability of each continuation of ``context``."""
        return self.score_choices_batch(context, [""], choices)[0]

    @abstractmethod
    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        """Per-token log-probabilities of ``text`` after ``context``."""

    # -- next-token views (the token vote of generated DP answers asks for these) -----
    def top_next_pieces(self, prefix: str, suffix: str, k: int) -> list[str]:
        """The texts of the ``k`` most likely next tokens after ``prefix + suffix``, most likely
        first (``prefix`` and ``suffix`` split as ``score_choices_batch`` splits them). Engines
        that can read their next-token distribution override this."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot list its most likely next tokens; the token vote of DP answers "
            "(dp.labelling on a generation task) needs the local llama.cpp engine"
        )

    def text_pieces(self, text: str) -> list[str]:
        """The texts of the tokens of ``text``, in order (each as it reads after the ones before)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot split text into its tokens; the token vote of DP answers "
            "(dp.labelling on a generation task) needs the local llama.cpp engine"
        )

    # -- lengths (records are bounded with these before any privacy budget is spent) ---
    @property
    def context_tokens(self) -> int | None:
        """The engine's context window in tokens, or ``None`` when it cannot tell (an API)."""
        return None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` (no special tokens). Without a tokenizer (an API): an estimate,
        4 UTF-8 bytes per token, rounded up (typical of BPE on English text)."""
        return estimated_tokens(text)

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        """``text`` cut to at most ``max_tokens`` tokens (a per-record, data-independent map)."""
        return truncate_estimated(text, max_tokens)

    # -- usage ----------------------------------------------------------------------
    def _count(
        self,
        *,
        calls: int = 1,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        seconds: float = 0.0,
        cost_usd: float = 0.0,
        retries: int = 0,
    ) -> None:
        with self._usage_lock:
            self.usage.calls += calls
            self.usage.prompt_tokens += prompt_tokens
            self.usage.completion_tokens += completion_tokens
            self.usage.seconds += seconds
            self.usage.cost_usd += cost_usd
            self.usage.retries += retries

    @contextmanager
    def _timed(self) -> Iterator[dict[str, float]]:
        """Yield a dict; on exit, its 'seconds' holds the wall time of the block."""
        box: dict[str, float] = {}
        start = time.perf_counter()
        try:
            yield box
        finally:
            box["seconds"] = time.perf_counter() - start
