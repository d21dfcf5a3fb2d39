"""Local CPU engine: llama.cpp (``llama-cpp-python``) with Gemma 3 270M by default.

Scoring is what the optimiser spends its time on: every candidate prompt is scored
on a batch of records, all sharing the candidate as a prefix. ``score_choices_batch``
therefore keeps the prefix's key/value cache and, per record, evaluates only the
record's own tokens:

1. tokenize the prefix once (with BOS) and decode it once; if the cache already holds
   exactly this prefix (the previous call used the same candidate), reuse it and its
   saved last-position logits; a recent prefix of 64 tokens or more is restored from
   its saved KV state (in memory, up to 256 MB, least recently used first out), so
   alternating between a few candidates (every in-process silo scoring every
   candidate) decodes each one once;
2. per suffix: truncate the KV cache back to the prefix (``llama_memory_seq_rm``),
   decode only the suffix tokens, and read the logits of the LAST position only;
3. first token of every choice: log-softmax of that one row; multi-token choices: each
   gets a KV sequence of its own that shares the cells of prefix + suffix, and all
   their tokens (all but each choice's last) go through together in one decode (more
   when there are over 15 such choices or 32 tokens), asking logits for every position;
   the log-probs of the remaining tokens are added.

Scoring has a llama.cpp context of its own (with the generation context's settings,
room for 16 sequences sharing its cells): generation does not disturb its cache.
``generate_many`` (greedy) borrows it to decode up to 16 generations together, one
sequence each, and empties it before and after (the next score decodes its prefix again,
with the same numbers). ``generate_after_prefix`` (the private path of generation tasks)
generates in the scoring context too, one record at a time after the cached prefix, so a
record's text never depends on another record's. ``generate_for_prefixes`` (one record under
several candidate prompts) keeps each prompt in a sequence of its own there and decodes the
record's continuations under all of them together: a decode holds public prompts and one record.

A prefix is always decoded from position 0 in the same chunks, a suffix always in one
decode after it and the choices' continuations in the same groups, so results do not
depend on earlier calls: llama.cpp's float results depend on how tokens are split into
decodes (up to ~0.3 nats on a label log-prob for Gemma 3 270M Q4_K_M, against one
decode of the whole text or one decode per choice), while the reused, truncated cache
gives the same numbers as a fresh cache with the same split.

Tokenization at the boundaries (documented choice): the prefix is tokenized with
BOS, each suffix and each choice without BOS, separately. Segment boundaries are
therefore always token boundaries, so the result equals scoring the concatenated
text when the concatenation tokenizes the same way (true for the usual
"...Label:" + " positive" templates; not if a boundary splits a word).

Gemma 3 uses sliding-window attention; the contexts are created with a full-size SWA
cache so that truncating the cache back to the prefix never loses entries the next
suffix needs.

Base model: a system prompt is prepended as plain text. Nothing is written to disk
unless a cache directory is given explicitly.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dp_textgrad.engines.base import Engine, EngineError, TokenLogprobs
from dp_textgrad.engines.llama_kv import SAVED_PREFIX_BYTES, SCORING_SEQUENCES, LlamaPlumbing, SavedPrefixes
from dp_textgrad.engines.llama_support import (
    GenerationCache,
    GreedyCompletion,
    KvStats,
    as_cache,
    available_cpus,
    busy_cpus,
    default_threads,
    logsumexp,
    pick_logprobs,
    quiet_native_output,
)
from dp_textgrad.engines.model_files import default_model_path, import_local_module

_TOP_ALTERNATIVES = 5
# generate_for_prefixes groups prefixes so that each keeps room for a record of this many
# tokens (a public allowance: a longer record is generated one prefix at a time).
_GROUP_RECORD_TOKENS = 64


def _free_context(lib: Any, ctx: Any, llm: Any) -> None:
    """Free the scoring context; holding ``llm`` keeps its model alive until then."""
    del llm
    lib.llama_free(ctx)


class LlamaCppEngine(LlamaPlumbing, Engine):
    """llama.cpp engine (CPU). The default model is Gemma 3 270M Q4_K_M from PyPI.

    ``model_path``: a GGUF file; ``None`` assembles the default model into the user
    cache (see ``dp_textgrad.engines.model_files``). ``n_threads``: defaults to the
    free CPUs (see :func:`default_threads`; llama.cpp's threads spin, so more
    threads than free cores is much slower). ``seed``: seeds sampling (temperature > 0) when a call gives no seed.
    ``cache``: ``None`` (default, nothing cached), ``"memory"``, a directory, or a
    ``GenerationCache``; sampling calls without a seed are never served from it.
    ``saved_prefix_bytes``: memory for the KV states of recent long prefixes (default
    256 MB; 0 keeps none); :meth:`hold_prefixes` keeps more for a while.

    Generation: temperature 0 is greedy (deterministic); temperature > 0 samples with
    the call's ``seed``, or else with a seed drawn from the engine's seed sequence.
    All methods are thread-safe: calls on one engine are serialised by one lock.
    ``kv_stats`` counts tokens decoded and prefix tokens reused; ``load_seconds``
    is the model load time.
    """

    # Label scoring reads logits only (no sampling): the same log-probs whatever the engine
    # scored before (saved prefix states, batch order) and with 1 or 2 threads, bit for bit
    # (tests/engines/test_engine_llama.py). So a resumed run may replay an interrupted charge
    # on the same subsample instead of charging it again (dp_textgrad.dp_es.replay).
    deterministic_scores = True
    # generate_for_prefixes decodes the prompts' sequences together (see its docstring).
    batches_prefixes = True

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        cache: GenerationCache | str | Path | bool | None = None,
        n_batch: int = 512,
        instruction_following: bool | None = None,
        saved_prefix_bytes: int = SAVED_PREFIX_BYTES,
    ) -> None:
        super().__init__()
        # The default Gemma 3 270M is a base model: it continues patterns, it does not follow
        # rewrite instructions. A user's GGUF is assumed to be instruction-tuned unless told.
        self.instruction_following = (
            (model_path is not None) if instruction_following is None else bool(instruction_following)
        )
        if n_ctx < 16:
            raise ValueError(f"n_ctx: must be >= 16 tokens, got {n_ctx}")
        if n_threads is not None and n_threads < 1:
            raise ValueError(f"n_threads: must be >= 1 or None (the free CPUs), got {n_threads}")
        if n_batch < 1:
            raise ValueError(f"n_batch: must be >= 1, got {n_batch}")
        if saved_prefix_bytes < 0:
            raise ValueError(f"saved_prefix_bytes: must be >= 0 (0 keeps no saved prefix), got {saved_prefix_bytes}")
        self._lib = import_local_module("llama_cpp", "llama-cpp-python")
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            raise FileNotFoundError(f"model_path: no GGUF file at {path}")
        self.model_path = path
        self.model_string = f"llama.cpp/{path.name}"
        self.n_threads = n_threads or default_threads()
        self.seed = seed
        self.cache = as_cache(cache)
        self.kv_stats = KvStats()
        # One lock per model: the context, its KV cache and the batch are shared state.
        self._lock = threading.RLock()
        self._closed = False
        with self._timed() as timer, quiet_native_output(self._lib):
            try:
                self._llm = self._lib.Llama(
                    model_path=str(path),
                    n_ctx=n_ctx,
                    n_batch=n_batch,
                    n_ubatch=n_batch,
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,
                    seed=seed,
                    logits_all=False,
                    swa_full=True,
                    verbose=False,
                )
            except (RuntimeError, ValueError, OSError) as exc:
                raise EngineError(f"llama.cpp could not load {path.name}: {type(exc).__name__}") from exc
        self.load_seconds = timer["seconds"]
        self._n_ctx = self._llm.n_ctx()
        self._n_vocab = self._llm.n_vocab()
        self._n_batch = n_batch
        self._batch = self._lib.llama_batch_init(n_batch, 0, 1)
        self._free_batch = weakref.finalize(self, self._lib.llama_batch_free, self._batch)
        # Scoring runs in a context of its own, with room for one sequence per choice
        # (see _continuations); generation keeps llama-cpp-python's context.
        self._ctx = self._open_scoring_context(n_ctx=self._n_ctx, n_batch=n_batch, n_threads=self.n_threads)
        self._free_ctx = weakref.finalize(self, _free_context, self._lib, self._ctx, self._llm)
        # Tokens whose keys/values sit in sequence 0 of the KV cache, in position order,
        # and which canonical prefix / suffix they start with (see _enter_prefix).
        self._saved_prefixes = SavedPrefixes(saved_prefix_bytes)
        self._forget_kv()
        stat = path.stat()
        self._model_id = f"{path.name}:{stat.st_size}"

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Free the model and its context (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._saved_prefixes.clear()
                self._free_batch()
                self._free_ctx()  # before the model it belongs to
                self._llm.close()

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def context_tokens(self) -> int | None:
        return self._n_ctx

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text, bos=False))

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        ids = self.tokenize(text, bos=False)
        if len(ids) <= max_tokens:
            return text
        with self._lock:
            cut = self._llm.detokenize(ids[:max_tokens]).decode("utf-8", errors="ignore")
        # Detokenising can merge differently; cut further until it fits.
        while cut and len(self.tokenize(cut, bos=False)) > max_tokens:
            cut = cut[:-1]
        return cut

    def tokenize(self, text: str, *, bos: bool) -> list[int]:
        """Token ids of ``text``; special-token markup in the text is treated as plain text."""
        with self._lock:
            return self._tokenize(text, bos)

    # -- generation -----------------------------------------------------------------
    def _generate(
        self,
        prompt: str,
        *,
        system_prompt: str | None,
        temperature: float,
        max_tokens: int,
        seed: int | None,
        stop: list[str] | None,
    ) -> str:
        if not np.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature: must be a finite number >= 0, got {temperature}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
        text = f"{system_prompt}\n\n{prompt}" if system_prompt else prompt
        cache = self.cache if temperature == 0 or seed is not None else None  # sampling is never cached
        key = ""
        if cache is not None:
            key = GenerationCache.key(
                model=self._model_id,
                prompt=prompt,
                system_prompt=system_prompt,
                temperature=temperature,
                seed=seed,
                max_tokens=max_tokens,
                stop=stop,
            )
            hit = cache.get(key)
            if hit is not None:
                self._count(calls=1)
                return hit
        with self._lock, self._timed() as timer:
            ids = self._tokenize(text, True)
            if len(ids) >= self._n_ctx:
                raise EngineError(
                    f"prompt has {len(ids)} tokens but the context holds {self._n_ctx}; "
                    "raise n_ctx or shorten the prompt"
                )
            budget = min(max_tokens, self._n_ctx - len(ids))
            # Generation has llama-cpp-python's context to itself; scoring's is untouched.
            self._llm.reset()
            try:
                result = self._llm.create_completion(
                    ids,
                    max_tokens=budget,
                    temperature=float(temperature),
                    seed=seed,
                    stop=stop or None,
                )
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"llama.cpp generation failed: {type(exc).__name__}") from exc
            output = result["choices"][0]["text"]
            completion_tokens = int(result["usage"]["completion_tokens"])
        self._count(prompt_tokens=len(ids), completion_tokens=completion_tokens, seconds=timer["seconds"])
        if cache is not None:
            cache.put(key, output)
        return output

    def generate_many(
        self,
        prompts: Sequence[str],
        system_prompt: str | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Greedy generations (temperature 0) for several prompts, decoded together; in input order.

        Up to 16 prompts run at once in the scoring context, each in a sequence of its own: the
        prompts are prefilled in shared decodes and each step decodes the next token of every
        running sequence in one ``llama_decode`` (a finished one makes room for the next
        prompt), which is faster than one ``generate`` after another on a CPU (1.83x for 8 prompts on 2 idle cores).
        Stop strings, end of generation, ``max_tokens`` and the returned text follow
        ``generate``. The tokens are those of ``generate`` up to float rounding: llama.cpp's
        results depend slightly on which tokens share a decode, so where two candidate tokens
        are within rounding of each other the choice can differ, and it can depend on the
        other prompts of the call. With ``temperature > 0`` the prompts are generated one by
        one (``Engine.generate_many``). Cached like ``generate`` when a cache is set.

        Public prompts only: since a text can depend on the other prompts of the call, one private
        record's output would depend on other records, and the per-record sensitivity the DP scorer
        relies on would not hold. Nothing on the private path calls it.
        """
        if temperature != 0:
            return super().generate_many(
                prompts, system_prompt, temperature=temperature, max_tokens=max_tokens, seed=seed, stop=stop
            )
        prompts = list(prompts)
        if not all(isinstance(prompt, str) for prompt in prompts):
            raise TypeError("prompts: must be texts")
        if max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
        stops = list(stop) if stop else None
        outputs: list[str | None] = [None] * len(prompts)
        keys = [""] * len(prompts)
        if self.cache is not None:
            for i, prompt in enumerate(prompts):
                keys[i] = GenerationCache.key(
                    model=self._model_id,
                    prompt=prompt,
                    system_prompt=system_prompt,
                    temperature=temperature,
                    seed=seed,
                    max_tokens=max_tokens,
                    stop=stops,
                )
                outputs[i] = self.cache.get(keys[i])
        todo = [i for i, output in enumerate(outputs) if output is None]
        self._count(calls=len(prompts) - len(todo))
        if not todo:
            return [output or "" for output in outputs]
        with self._lock, self._timed() as timer:
            ids = [
                self._tokenize(f"{system_prompt}\n\n{prompts[i]}" if system_prompt else prompts[i], True) for i in todo
            ]
            if any(len(one) >= self._n_ctx for one in ids):  # no length in the message: prompts may be private
                raise EngineError(
                    f"a prompt has at least as many tokens as the context holds ({self._n_ctx}); "
                    "raise n_ctx or shorten the prompts"
                )
            completions = [
                GreedyCompletion(
                    min(max_tokens, self._n_ctx - len(one)),
                    stops,
                    partial(self._detokenize_after, one),
                    self._is_end_of_generation,
                )
                for one in ids
            ]
            self._greedy_batched(ids, completions)
        self._count(
            calls=len(todo),
            prompt_tokens=sum(len(one) for one in ids),
            completion_tokens=sum(len(c.tokens) for c in completions),
            seconds=timer["seconds"],
        )
        for i, completion in zip(todo, completions, strict=True):
            outputs[i] = completion.text or ""
            if self.cache is not None:
                self.cache.put(keys[i], outputs[i] or "")
        return [output or "" for output in outputs]

    def _private_cache(self) -> GenerationCache | None:
        """The cache the private generation paths may use: in memory only. Their outputs are
        private records' generations; a cache directory would keep them on disk."""
        cache = self.cache
        return cache if cache is not None and cache.directory is None else None

    def generate_after_prefix(
        self,
        prefix: str,
        suffixes: Sequence[str],
        *,
        max_tokens: int,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> list[str]:
        """Greedy continuations of ``prefix + suffix`` for each suffix, in input order: the
        private path of generation tasks.

        The prefix is decoded once per call (or reused from the scoring cache, where it is
        kept), then each record is decoded with its greedy continuation on a copy of the
        prefix's keys and values, one record after another: no record shares a decode with
        another, so an output depends on the prefix and its own suffix only, never on the other
        suffixes of the call or their order (``generate_many`` does not promise that). Stop
        strings, end of generation, ``max_tokens`` and the returned text follow ``generate``; a
        record that does not leave room for one token raises :class:`EngineError` (naming the
        context size only). The prefix is tokenized with BOS and each suffix without, so the
        text equals ``generate(prefix + suffix)`` where the concatenation tokenizes the same way,
        up to float rounding (see the module docstring). ``temperature > 0`` generates one by
        one through ``generate``. Cached when a cache is set.
        """
        private_cache = self._private_cache()
        if temperature != 0:
            return super().generate_after_prefix(
                prefix, suffixes, max_tokens=max_tokens, stop=stop, temperature=temperature
            )
        suffixes = list(suffixes)
        if not isinstance(prefix, str) or not all(isinstance(s, str) for s in suffixes):
            raise TypeError("prefix and suffixes: must be texts")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        stops = list(stop) if stop else None
        outputs: list[str | None] = [None] * len(suffixes)
        keys = [""] * len(suffixes)
        if private_cache is not None:
            for i, suffix in enumerate(suffixes):
                keys[i] = GenerationCache.key(
                    model=self._model_id,
                    after_prefix=prefix,
                    suffix=suffix,
                    max_tokens=max_tokens,
                    stop=stops,
                )
                outputs[i] = private_cache.get(keys[i])
        todo = [i for i, output in enumerate(outputs) if output is None]
        self._count(calls=len(suffixes) - len(todo))
        if not todo:
            return [output or "" for output in outputs]
        with self._lock, self._timed() as timer:
            prefix_ids = tuple(self._tokenize(prefix, True))
            prompt_tokens = generated = 0
            for i in todo:
                suffix_ids = tuple(self._tokenize(suffixes[i], False))
                room = self._n_ctx - len(prefix_ids) - len(suffix_ids)
                if room < 1:  # no length in the message: a record is private
                    raise EngineError(
                        f"the prefix and a record leave no room to generate in the context ({self._n_ctx} tokens); "
                        "raise n_ctx or shorten the prompt or the records"
                    )
                completion = GreedyCompletion(
                    min(max_tokens, room),
                    stops,
                    partial(self._detokenize_after, [*prefix_ids, *suffix_ids]),
                    self._is_end_of_generation,
                )
                self._greedy_after_prefix(prefix_ids, suffix_ids, completion)
                outputs[i] = completion.text or ""
                prompt_tokens += len(prefix_ids) + len(suffix_ids)  # as generate counts them (KV reuse aside)
                generated += len(completion.tokens)
        self._count(calls=len(todo), prompt_tokens=prompt_tokens, completion_tokens=generated, seconds=timer["seconds"])
        if private_cache is not None:
            for i in todo:
                private_cache.put(keys[i], outputs[i] or "")
        return [output or "" for output in outputs]

    def generate_for_prefixes(
        self,
        prefixes: Sequence[str],
        suffix: str,
        *,
        max_tokens: int,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> list[str]:
        """Greedy continuations of ``prefix + suffix`` for each prefix, in input order: ONE record
        under several candidate prompts, generated together (the private path of generation
        tasks when the scorer scores several candidates on the same records).

        Each prefix has a sequence of its own in the scoring context and stays there between calls
        (decoded once, canonically); the record is decoded after every prefix in shared decodes,
        then each greedy step decodes the next token of every unfinished sequence in one
        ``llama_decode``; at the end every sequence is truncated back to its prefix. A decode
        therefore holds the public prefixes and this record only: an output depends on the
        prefixes and this suffix, never on another record, the order of the records or earlier
        calls (so one record still moves each candidate's sum by at most the clip bound).
        Prefixes that do not fit the context (or the 16 sequences) together are split into groups
        computed from the prefixes and ``max_tokens`` only; a record too long for its group's free
        cells is generated one prefix at a time (``generate_after_prefix``'s path, a choice made
        from this record alone). Stop strings, end of generation, ``max_tokens`` and the returned
        text follow ``generate_after_prefix``, whose outputs these equal up to float rounding
        (llama.cpp's floats depend on which rows share a decode; where two next tokens are within
        rounding, greedy decoding may take the other). A record that leaves no room to generate
        after some prefix raises :class:`EngineError` naming the context size only;
        ``temperature > 0`` generates one prefix after another (``Engine.generate_for_prefixes``).
        Cached when a cache is set (all of the call's outputs, or none, come from the cache).
        """
        private_cache = self._private_cache()
        if temperature != 0:
            return super().generate_for_prefixes(
                prefixes, suffix, max_tokens=max_tokens, stop=stop, temperature=temperature
            )
        prefixes = list(prefixes)
        if not isinstance(suffix, str) or not all(isinstance(p, str) for p in prefixes):
            raise TypeError("prefixes and suffix: must be texts")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        if not prefixes:
            return []
        stops = list(stop) if stop else None
        unique = list(dict.fromkeys(prefixes))  # a repeated prompt is generated once
        keys: list[str] = []
        if private_cache is not None:
            keys = [
                GenerationCache.key(
                    model=self._model_id, for_prefixes=unique, index=k, suffix=suffix, max_tokens=max_tokens, stop=stops
                )
                for k in range(len(unique))
            ]
            hits = [private_cache.get(key) for key in keys]
            if all(hit is not None for hit in hits):
                self._count(calls=len(prefixes))
                found = dict(zip(unique, hits, strict=True))
                return [found[p] or "" for p in prefixes]
        with self._lock, self._timed() as timer:
            prefix_ids = [tuple(self._tokenize(p, True)) for p in unique]
            suffix_ids = tuple(self._tokenize(suffix, False))
            rooms = [self._n_ctx - len(ids) - len(suffix_ids) for ids in prefix_ids]
            if min(rooms) < 1:  # no length in the message: a record is private
                raise EngineError(
                    f"a prefix and the record leave no room to generate in the context ({self._n_ctx} tokens); "
                    "raise n_ctx or shorten the prompts or the records"
                )
            completions = [
                GreedyCompletion(
                    min(max_tokens, room),
                    stops,
                    partial(self._detokenize_after, [*ids, *suffix_ids]),
                    self._is_end_of_generation,
                )
                for ids, room in zip(prefix_ids, rooms, strict=True)
            ]
            for group in self._prefix_groups(prefix_ids, max_tokens):
                ids = tuple(prefix_ids[k] for k in group)
                cells = sum(len(one) + len(suffix_ids) + completions[k].max_tokens + 3 for one, k in zip(ids, group))
                if cells <= self._n_ctx:
                    self._greedy_for_prefixes(ids, suffix_ids, [completions[k] for k in group])
                else:  # this record is too long for the group's free cells: one prefix at a time
                    for one, k in zip(ids, group, strict=True):
                        self._greedy_after_prefix(one, suffix_ids, completions[k])
        generated = sum(len(c.tokens) for c in completions)
        prompt_tokens = sum(len(ids) + len(suffix_ids) for ids in prefix_ids)  # as generate counts them
        self._count(
            calls=len(prefixes), prompt_tokens=prompt_tokens, completion_tokens=generated, seconds=timer["seconds"]
        )
        texts = [c.text or "" for c in completions]
        if private_cache is not None:
            for key, text in zip(keys, texts, strict=True):
                private_cache.put(key, text)
        by_prefix = dict(zip(unique, texts, strict=True))
        return [by_prefix[p] for p in prefixes]

    def _prefix_groups(self, prefix_ids: Sequence[tuple[int, ...]], max_tokens: int) -> list[list[int]]:
        """Prefixes (indices), in order, grouped to share the scoring context: at most 16 each,
        and each with room for its prefix, a record of up to 64 tokens and ``max_tokens`` (+3).
        A function of the public prefixes and settings only, never of a record."""
        groups: list[list[int]] = []
        used = 0
        for k, ids in enumerate(prefix_ids):
            need = len(ids) + _GROUP_RECORD_TOKENS + max_tokens + 3
            if groups and len(groups[-1]) < SCORING_SEQUENCES and used + need <= self._n_ctx:
                groups[-1].append(k)
                used += need
            else:
                groups.append([k])
                used = need
        return groups

    def _detokenize_after(self, prompt_ids: list[int], tokens: list[int]) -> bytes:
        return bytes(self._llm.detokenize(tokens, prev_tokens=prompt_ids))

    def _is_end_of_generation(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._lib.llama_model_get_vocab(self._llm.model), token))

    # -- scoring --------------------------------------------------------------------
    @contextlib.contextmanager
    def hold_prefixes(self, count: int) -> Iterator[None]:
        """Within the block, keep the saved states of at least the ``count`` most recent long
        prefixes, over ``saved_prefix_bytes`` if need be; after it, evict back to that limit.

        For a caller that asks the same ``count`` prefixes in turn, as the token vote asks every
        teacher at every step: a least-recently-used memory holding fewer than ``count`` evicts
        each prefix just before it is asked again, and every call decodes its prefix anew. The
        memory held is ``count`` states: with Gemma 3 270M a prefix of 130 tokens saves 3.3 MB (its
        keys and values, and 1 MB of last-position logits), so the default 256 MB holds about 75.
        Nothing is held when ``saved_prefix_bytes`` is 0."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count: must be an integer >= 1, got {count!r}")
        with self._lock:
            previous = self._saved_prefixes.min_entries
            self._saved_prefixes.min_entries = max(previous, count)
        try:
            yield
        finally:
            with self._lock:
                self._saved_prefixes.min_entries = previous
                self._saved_prefixes.trim()

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        if not choices:
            raise ValueError("choices: need at least one choice")
        if any(not choice for choice in choices):
            raise ValueError("choices: every choice must be a non-empty string")
        with self._lock, self._timed() as timer:
            decoded_before = self.kv_stats.tokens_decoded
            prefix_ids = tuple(self._tokenize(prefix, True))
            choice_ids = [self._tokenize(choice, False) for choice in choices]
            first_ids = np.array([ids[0] for ids in choice_ids])
            groups = self._choice_groups(choice_ids)
            scores = np.empty((len(suffixes), len(choices)))
            done: dict[str, np.ndarray] = {}
            for i, suffix in enumerate(suffixes):
                if suffix in done:  # identical record text: identical scores
                    scores[i] = done[suffix]
                    continue
                suffix_ids = tuple(self._tokenize(suffix, False))
                row_scores = pick_logprobs(self._position_at(prefix_ids, suffix_ids), first_ids)
                row_scores += self._continuations(choice_ids, groups)
                scores[i] = done[suffix] = row_scores
            decoded = self.kv_stats.tokens_decoded - decoded_before
        self._count(prompt_tokens=decoded, seconds=timer["seconds"])
        return scores

    def top_next_pieces(self, prefix: str, suffix: str, k: int) -> list[str]:
        """The ``k`` most likely next tokens' texts after ``prefix`` (BOS) + ``suffix``, most likely
        first (ties by token id); end-of-generation and empty pieces are left out."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: must be an integer >= 1, got {k!r}")
        with self._lock, self._timed() as timer:
            decoded_before = self.kv_stats.tokens_decoded
            prefix_ids = tuple(self._tokenize(prefix, True))
            suffix_ids = tuple(self._tokenize(suffix, False))
            row = self._position_at(prefix_ids, suffix_ids).astype(np.float64)
            # The best few by logit (then by id: deterministic), with room for skipped tokens.
            top = np.argpartition(-row, min(row.size - 1, 4 * k + 16))[: 4 * k + 17]
            order = top[np.lexsort((top, -row[top]))]
            before = [*prefix_ids, *suffix_ids]
            pieces: list[str] = []
            for token in order:
                if len(pieces) == k:
                    break
                if self._is_end_of_generation(int(token)):
                    continue
                piece = self._piece(int(token), before)
                if piece and piece not in pieces:
                    pieces.append(piece)
            decoded = self.kv_stats.tokens_decoded - decoded_before
        self._count(prompt_tokens=decoded, seconds=timer["seconds"])
        return pieces

    def text_pieces(self, text: str) -> list[str]:
        with self._lock:
            ids = self._tokenize(text, False)
            return [self._piece(token, ids[:i]) for i, token in enumerate(ids)]

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        with self._lock, self._timed() as timer:
            decoded_before = self.kv_stats.tokens_decoded
            context_ids = tuple(self._tokenize(context, True))
            text_ids = self._tokenize(text, False)
            n = len(text_ids)
            logprobs = np.empty(n)
            means = np.empty(n)
            stds = np.empty(n)
            alternatives: list[list[tuple[str, float]]] = [[] for _ in range(n)]
            previous = list(context_ids)

            def record(k: int, row: np.ndarray) -> None:
                # Position k's row predicts text_ids[k]; statistics over the full vocabulary.
                logp = row.astype(np.float64) - logsumexp(row)
                logprobs[k] = logp[text_ids[k]]
                means[k] = logp.mean()
                stds[k] = logp.std()
                top = np.argpartition(logp, -_TOP_ALTERNATIVES)[-_TOP_ALTERNATIVES:]
                top = top[np.argsort(logp[top])[::-1]]
                alternatives[k] = [(self._piece(int(t), previous[: len(context_ids) + k]), float(logp[t])) for t in top]

            if n:
                previous.extend(text_ids)
                record(0, self._enter_prefix(context_ids))
                if n > 1:
                    self._decode(text_ids[:-1], on_row=lambda k, row: record(k + 1, row))
            pieces = [self._piece(t, previous[: len(context_ids) + k]) for k, t in enumerate(text_ids)]
            decoded = self.kv_stats.tokens_decoded - decoded_before
        self._count(prompt_tokens=decoded, seconds=timer["seconds"])
        return TokenLogprobs(
            tokens=pieces, logprobs=logprobs, top_alternatives=alternatives, vocab_mean=means, vocab_std=stds
        )


__all__ = [
    "GenerationCache",
    "KvStats",
    "LlamaCppEngine",
    "available_cpus",
    "busy_cpus",
    "default_threads",
    "quiet_native_output",
]
