"""The llama.cpp plumbing of :class:`~dp_textgrad.engines.llama_cpp.LlamaCppEngine`:
tokens, the KV cache of the current prefix, batched decodes and logit rows.

A mixin: every method is called with the engine's ``_lock`` held. A prefix is always
decoded from position 0 in the same chunks, a suffix in one decode after it and the
choices' continuations in groups fixed by the choices, so a result never depends on
earlier calls (see the engine's module docstring).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.llama_support import GreedyCompletion, KvStats, pick_logprobs, quiet_native_output

# Rows of full-vocabulary logits requested per decode when every position is needed
# (audits, multi-token choices): Gemma's 262k vocabulary makes each row ~1 MB.
_ALL_LOGITS_CHUNK = 32

# Sequences of the scoring context: 0 holds prefix + record, 1.. one multi-token choice each.
SCORING_SEQUENCES = 16

# Saved KV states of recent prefixes, in memory only. The in-process federated simulation
# asks every silo for every candidate, so one shared engine alternates between a few
# candidate prompts; restoring a saved state is a copy (about 18 KB per token for Gemma 3
# 270M) instead of a decode. Shorter prefixes decode about as fast as they copy.
SAVED_PREFIX_BYTES = 256 * 2**20
_MIN_SAVED_PREFIX_TOKENS = 64


class SavedPrefixes:
    """Least-recently-used map of prefix token ids -> (KV state bytes, last-position logits)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # A caller that asks the same prefixes in turn (a token vote asks every teacher at every
        # step) needs them all kept: an LRU map smaller than the cycle evicts each prefix just
        # before its next use. At least this many stay, over max_bytes if need be
        # (LlamaCppEngine.hold_prefixes sets it for the length of a block).
        self.min_entries = 0
        # Keys: a prefix's token ids, or ("group", the group's prefixes, sequence) for generate_for_prefixes.
        self._states: OrderedDict[Hashable, tuple[ctypes.Array, np.ndarray]] = OrderedDict()
        self._bytes = 0

    def get(self, prefix_ids: Hashable) -> tuple[ctypes.Array, np.ndarray] | None:
        saved = self._states.get(prefix_ids)
        if saved is not None:
            self._states.move_to_end(prefix_ids)
        return saved

    def put(self, prefix_ids: Hashable, state: ctypes.Array, row: np.ndarray) -> None:
        size = len(state) + row.nbytes
        if size > self.max_bytes or prefix_ids in self._states:
            return
        self._evict(size)
        self._states[prefix_ids] = (state, row)
        self._bytes += size

    def trim(self) -> None:
        """Evict the least recently used down to ``max_bytes`` (after ``min_entries`` was lowered)."""
        self._evict(0)

    def _evict(self, incoming: int) -> None:
        while self._states and len(self._states) >= self.min_entries and self._bytes + incoming > self.max_bytes:
            _, (old_state, old_row) = self._states.popitem(last=False)
            self._bytes -= len(old_state) + old_row.nbytes

    def clear(self) -> None:
        self._states.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._states)


class LlamaPlumbing:
    """Tokenization, KV-prefix reuse and decoding (mixin; call with the engine's lock held)."""

    if TYPE_CHECKING:  # what LlamaCppEngine, which mixes this in, provides
        kv_stats: KvStats
        _lib: Any  # the llama_cpp module (its low-level C API)
        _llm: Any  # llama_cpp.Llama: generation's context
        _ctx: Any  # scoring's own llama context
        _batch: Any
        _closed: bool
        _n_ctx: int
        _n_batch: int
        _n_vocab: int
        _saved_prefixes: SavedPrefixes

    def _tokenize(self, text: str, bos: bool) -> list[int]:
        if self._closed:
            raise EngineError("this engine has been closed; create a new LlamaCppEngine")
        ids = list(self._llm.tokenize(text.encode("utf-8"), add_bos=bos, special=False)) if text else []
        if bos and not ids:
            # Scoring needs at least one position to read logits from.
            if self._llm.token_bos() < 0:
                raise ValueError("context: empty, and this model has no BOS token to condition on")
            ids = [self._llm.token_bos()]
        return ids

    def _piece(self, token: int, before: list[int]) -> str:
        return self._llm.detokenize([token], prev_tokens=before).decode("utf-8", errors="replace")

    def _forget_kv(self) -> None:
        memory = self._lib.llama_get_memory(self._ctx)
        self._lib.llama_memory_seq_rm(memory, -1, 0, -1)
        self._kv_tokens: list[int] = []
        self._prefix: tuple[int, ...] | None = None
        self._prefix_row: np.ndarray | None = None
        self._suffix: tuple[int, ...] | None = None
        # generate_for_prefixes: the prefixes held in sequences 0.. (None: sequence 0 is as above).
        self._group: tuple[tuple[int, ...], ...] | None = None
        self._group_rows: list[np.ndarray] = []

    def _truncate(self, length: int) -> bool:
        """Keep only the first ``length`` cached tokens; False if the cache cannot drop a tail."""
        if length > len(self._kv_tokens):
            return False
        if length == len(self._kv_tokens):
            return True
        memory = self._lib.llama_get_memory(self._ctx)
        if not self._lib.llama_memory_seq_rm(memory, 0, length, -1):
            return False  # e.g. recurrent models; callers then start over
        del self._kv_tokens[length:]
        return True

    # Canonical evaluation: a prefix is always decoded from position 0 in the same
    # chunks and a suffix always as one decode right after it, so a score never
    # depends on what the cache held before (llama.cpp's numerics vary slightly with
    # how tokens are split into batches).
    def _enter_prefix(self, prefix_ids: tuple[int, ...]) -> np.ndarray:
        """KV := prefix; return the logits at its last position (saved, not re-decoded)."""
        if self._prefix == prefix_ids and self._truncate(len(prefix_ids)):
            self._suffix = ()
            self.kv_stats.tokens_reused += len(prefix_ids)
            assert self._prefix_row is not None
            return self._prefix_row
        self._forget_kv()
        saved = self._saved_prefixes.get(prefix_ids)
        if saved is not None:
            state, saved_row = saved
            if self._restore_state(state, saved_row, prefix_ids):
                self.kv_stats.tokens_reused += len(prefix_ids)
                return saved_row
        row = self._decode(prefix_ids)
        self._prefix, self._prefix_row, self._suffix = prefix_ids, row, ()
        if len(prefix_ids) >= _MIN_SAVED_PREFIX_TOKENS:
            self._save_state(prefix_ids, row)
        return row

    # A prefix's state is saved right after it was decoded from an empty cache, so a
    # restore puts the same values in the same cells: later decodes give the numbers a
    # fresh decode of the prefix would (tests/engines/test_engine_llama.py checks it).
    def _save_state(self, prefix_ids: tuple[int, ...], row: np.ndarray) -> None:
        size = self._lib.llama_state_seq_get_size(self._ctx, 0)
        if not 0 < size <= self._saved_prefixes.max_bytes:
            return
        state = (ctypes.c_uint8 * size)()
        if self._lib.llama_state_seq_get_data(self._ctx, state, size, 0) == size:
            self._saved_prefixes.put(prefix_ids, state, row)

    def _restore_state(self, state: ctypes.Array, row: np.ndarray, prefix_ids: tuple[int, ...]) -> bool:
        """KV (empty) := a saved prefix state; False (cache left empty) if llama.cpp refuses it."""
        if not self._lib.llama_state_seq_set_data(self._ctx, state, len(state), 0):
            self._forget_kv()
            return False
        self._kv_tokens = list(prefix_ids)
        self._prefix, self._prefix_row, self._suffix = prefix_ids, row, ()
        return True

    def _position_at(self, prefix_ids: tuple[int, ...], suffix_ids: tuple[int, ...]) -> np.ndarray:
        """KV := prefix + suffix; return the logits at the last position."""
        row = self._enter_prefix(prefix_ids)
        if suffix_ids:
            row = self._decode(suffix_ids)
            self._suffix = suffix_ids
        return row

    def _decode(self, tokens: Sequence[int], on_row: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        """Append ``tokens`` to the KV cache and return a copy of the last position's logits.

        With ``on_row``, logits are requested for every position and passed as
        ``on_row(index_in_tokens, row_view)`` (the view is only valid during the call).
        """
        if not tokens:
            raise EngineError("internal: nothing to decode")
        start = len(self._kv_tokens)
        self._check_room(start + len(tokens))
        step = min(self._n_batch, _ALL_LOGITS_CHUNK) if on_row else self._n_batch
        last_row = None
        for offset in range(0, len(tokens), step):
            chunk = tokens[offset : offset + step]
            is_last_chunk = offset + len(chunk) == len(tokens)
            self._submit(
                [(token, start + offset + i, 0) for i, token in enumerate(chunk)],
                every_row=on_row is not None,
                last_row=is_last_chunk,
            )
            self._kv_tokens.extend(chunk)
            self.kv_stats.tokens_decoded += len(chunk)
            if on_row is not None:
                for i in range(len(chunk)):
                    on_row(offset + i, self._logits_row(i))
            if is_last_chunk:
                last_row = self._logits_row(len(chunk) - 1).copy()
        assert last_row is not None
        return last_row

    # The choices' continuations go through together: each multi-token choice gets a
    # sequence of its own sharing the cells of prefix + record (llama_memory_seq_cp), and
    # all their tokens fill as few decodes as the batch allows (2-3x faster than one
    # decode per choice for BANKING77's 10 labels). Groups depend only on the choices, so
    # a score never depends on earlier calls; llama.cpp's float results do depend on the
    # batch, so a choice's score can move by batch-split noise with the other choices.
    def _choice_groups(self, choice_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Multi-token choices (indices), in order, grouped into decodes: at most one
        sequence each beside sequence 0, and at most one decode's rows per group unless a
        single choice needs more. Computed once per call, not per record."""
        limit = min(self._n_batch, _ALL_LOGITS_CHUNK)
        groups: list[list[int]] = []
        rows = 0
        for j, ids in enumerate(choice_ids):
            if len(ids) < 2:
                continue
            if groups and len(groups[-1]) < SCORING_SEQUENCES - 1 and rows + len(ids) - 1 <= limit:
                groups[-1].append(j)
                rows += len(ids) - 1
            else:
                groups.append([j])
                rows = len(ids) - 1
        return groups

    def _continuations(self, choice_ids: Sequence[Sequence[int]], groups: list[list[int]]) -> np.ndarray:
        """Per choice: sum of log p(ids[k] | KV, ids[:k]) for k >= 1 (0 for one-token choices)."""
        added = np.zeros(len(choice_ids))
        limit = min(self._n_batch, _ALL_LOGITS_CHUNK)
        memory = self._lib.llama_get_memory(self._ctx)
        start = len(self._kv_tokens)
        for group in groups:
            items = [
                (token, start + k, seq, j, choice_ids[j][k + 1])
                for seq, j in enumerate(group, 1)
                for k, token in enumerate(choice_ids[j][:-1])
            ]
            self._check_room(start + len(items))
            try:
                for seq in range(1, len(group) + 1):
                    self._lib.llama_memory_seq_cp(memory, 0, seq, 0, start)
                for offset in range(0, len(items), limit):  # one decode unless a choice is very long
                    chunk = items[offset : offset + limit]
                    self._submit([(token, pos, seq) for token, pos, seq, _, _ in chunk], every_row=True)
                    for i, (_, _, _, j, following) in enumerate(chunk):
                        added[j] += float(pick_logprobs(self._logits_row(i), np.array([following]))[0])
            finally:
                for seq in range(1, len(group) + 1):
                    self._lib.llama_memory_seq_rm(memory, seq, -1, -1)
            self.kv_stats.tokens_decoded += len(items)
        return added

    # Batched greedy generation runs in the scoring context, whose sequences share its n_ctx
    # cells: each prompt gets a sequence of its own (at most SCORING_SEQUENCES at once, and
    # only while the cells it may need are free), its prompt is prefilled in the same decodes
    # as the other sequences' next tokens, and each step decodes one token per running
    # sequence in one llama_decode. A finished sequence frees its cells and the next prompt
    # takes its place. The scoring cache is emptied before and after (the next score decodes
    # its prefix again, canonically: scores do not change).
    def _greedy_batched(self, prompts: Sequence[Sequence[int]], completions: Sequence[GreedyCompletion]) -> int:
        """Run every completion to its end, greedy (the first highest logit, as llama.cpp's
        greedy sampler); return the number of tokens decoded. ``prompts`` are token ids with
        BOS, each shorter than the context."""
        memory = self._lib.llama_get_memory(self._ctx)
        # Cells a sequence may use: its prompt, its budget and 3 more (a completion that ends
        # inside a UTF-8 character takes up to 3 tokens past its budget, as upstream).
        needs = [min(self._n_ctx, len(ids) + c.max_tokens + 3) for ids, c in zip(prompts, completions, strict=True)]
        waiting = list(range(len(prompts)))[::-1]  # popped from the end: input order
        free_seqs = list(range(SCORING_SEQUENCES))[::-1]
        running: dict[int, list[int]] = {}  # seq -> [prompt index, next position, cells reserved]
        pending: dict[int, list[int]] = {}  # seq -> tokens still to decode (prompt, or the last token)
        reserved = decoded = 0
        self._forget_kv()
        try:
            while waiting or running:
                while waiting and free_seqs and reserved + needs[waiting[-1]] <= self._n_ctx:
                    index = waiting.pop()
                    seq = free_seqs.pop()
                    running[seq] = [index, 0, needs[index]]
                    pending[seq] = list(prompts[index])
                    reserved += needs[index]
                # Running sequences' next tokens first, then prompt tokens, up to one batch.
                order = sorted(running, key=lambda q: (len(pending[q]) > 1, running[q][0]))
                items: list[tuple[int, int, int]] = []
                readers: list[tuple[int, int]] = []  # (row in the batch, seq) whose logits pick a token
                for seq in order:
                    take = min(len(pending[seq]), self._n_batch - len(items))
                    if take == 0:
                        break
                    start = running[seq][1]
                    items.extend((token, start + k, seq) for k, token in enumerate(pending[seq][:take]))
                    del pending[seq][:take]
                    running[seq][1] += take
                    if not pending[seq]:
                        readers.append((len(items) - 1, seq))
                self._submit(items, every_row=False, rows=[i for i, _ in readers])
                decoded += len(items)
                for row, seq in readers:
                    index, position, cells = running[seq]
                    token = int(np.argmax(self._logits_row(row)))
                    if completions[index].push(token) or position >= cells:
                        if completions[index].text is None:  # out of cells: ends as at its budget
                            completions[index].text = self._llm.detokenize(
                                completions[index].tokens, prev_tokens=list(prompts[index])
                            ).decode("utf-8", errors="ignore")
                        self._lib.llama_memory_seq_rm(memory, seq, -1, -1)
                        del running[seq], pending[seq]
                        free_seqs.append(seq)
                        reserved -= cells
                    else:
                        pending[seq] = [token]
        finally:
            self._forget_kv()
            self.kv_stats.tokens_decoded += decoded
        return decoded

    # Private generation (generate_after_prefix): one record at a time, never in a decode with
    # another record. The prefix is entered canonically (decoded from position 0 in the same
    # chunks, or reused / restored with the same values), the record's tokens go in one decode
    # after it and each generated token in a decode of its own; the next record truncates the
    # cache back to the prefix. So a record's text depends on the prefix and its own tokens
    # only, whatever the call's other records and their order, and whatever ran before.
    def _greedy_after_prefix(
        self, prefix_ids: tuple[int, ...], suffix_ids: tuple[int, ...], completion: GreedyCompletion
    ) -> None:
        """Run ``completion`` to its end, greedy, after prefix + suffix (which the caller checked
        fit in the context). Out of cells, it ends as at its budget."""
        row = self._position_at(prefix_ids, suffix_ids)
        while True:
            token = int(np.argmax(row))  # the first highest logit, as llama.cpp's greedy sampler
            if completion.push(token):
                return
            if len(self._kv_tokens) >= self._n_ctx:
                completion.text = self._llm.detokenize(
                    completion.tokens, prev_tokens=[*prefix_ids, *suffix_ids]
                ).decode("utf-8", errors="ignore")
                return
            row = self._decode([token])

    # Private generation under several prompts (generate_for_prefixes): ONE record after each of
    # a group of public prefixes, the group's sequences decoded together. Prefix k sits in
    # sequence k, decoded from position 0 in the same chunks, one prefix after another in an
    # empty cache (or restored from the states saved right after that decode, into the same
    # cells), and stays there between calls; the record's tokens go after every prefix in the
    # same decodes, then each step decodes the next token of every unfinished sequence in one
    # llama_decode; at the end every sequence is truncated back to its prefix. So what a
    # decode holds is a function of the public prefixes and this record only: the outputs never
    # depend on another record, nor on the order of the records or on earlier calls.
    def _enter_prefixes(self, group: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
        """KV := prefix k in sequence k for each prefix of ``group`` (public token ids, with BOS);
        return the logits at each prefix's last position."""
        if self._group == group:
            self.kv_stats.tokens_reused += sum(len(ids) for ids in group)
            return self._group_rows
        self._forget_kv()
        self._check_room(sum(len(ids) for ids in group))
        saved = [self._saved_prefixes.get(("group", group, k)) for k in range(len(group))]
        if all(one is not None for one in saved) and self._restore_group(group, saved):
            self.kv_stats.tokens_reused += sum(len(ids) for ids in group)
            return self._group_rows
        rows = []
        for seq, ids in enumerate(group):
            for offset in range(0, len(ids), self._n_batch):
                chunk = ids[offset : offset + self._n_batch]
                is_last_chunk = offset + len(chunk) == len(ids)
                self._submit(
                    [(token, offset + i, seq) for i, token in enumerate(chunk)], every_row=False, last_row=is_last_chunk
                )
                if is_last_chunk:
                    rows.append(self._logits_row(len(chunk) - 1).copy())
            self.kv_stats.tokens_decoded += len(ids)
        self._group, self._group_rows = group, rows
        if len(group) > 1 or len(group[0]) >= _MIN_SAVED_PREFIX_TOKENS:
            self._save_group(group, rows)
        return rows

    # Saved right after the group was decoded in an empty cache, restored in order into an
    # empty cache: the same values in the same cells (the invariance tests check it), so a
    # task whose prompts need several groups does not decode every group again per record.
    def _save_group(self, group: tuple[tuple[int, ...], ...], rows: list[np.ndarray]) -> None:
        for seq in range(len(group)):
            size = self._lib.llama_state_seq_get_size(self._ctx, seq)
            if not 0 < size <= self._saved_prefixes.max_bytes:
                return
            state = (ctypes.c_uint8 * size)()
            if self._lib.llama_state_seq_get_data(self._ctx, state, size, seq) != size:
                return
            self._saved_prefixes.put(("group", group, seq), state, rows[seq])

    def _restore_group(self, group: tuple[tuple[int, ...], ...], saved: list[Any]) -> bool:
        for seq, (state, _) in enumerate(saved):
            if not self._lib.llama_state_seq_set_data(self._ctx, state, len(state), seq):
                self._forget_kv()
                return False
        self._group, self._group_rows = group, [row for _, row in saved]
        return True

    def _greedy_for_prefixes(
        self, group: tuple[tuple[int, ...], ...], suffix_ids: tuple[int, ...], completions: Sequence[GreedyCompletion]
    ) -> int:
        """Run one completion per prefix of ``group`` to its end, greedy, after prefix + suffix;
        return the number of tokens decoded. The caller checked that the group's prefixes, the
        suffix after each and every completion's budget (+3) fit in the context together."""
        rows = list(self._enter_prefixes(group))
        memory = self._lib.llama_get_memory(self._ctx)
        positions = [len(ids) for ids in group]
        decoded = 0
        try:
            if suffix_ids:
                # The record after every prefix, in as few decodes as the batch allows.
                items = [
                    (token, positions[seq] + j, seq) for seq in range(len(group)) for j, token in enumerate(suffix_ids)
                ]
                last = {seq * len(suffix_ids) + len(suffix_ids) - 1: seq for seq in range(len(group))}
                for offset in range(0, len(items), self._n_batch):
                    chunk = items[offset : offset + self._n_batch]
                    wanted = [i for i in range(len(chunk)) if offset + i in last]
                    self._submit(chunk, every_row=False, rows=wanted)
                    for i in wanted:
                        rows[last[offset + i]] = self._logits_row(i).copy()
                decoded += len(items)
                positions = [p + len(suffix_ids) for p in positions]
            running = list(range(len(group)))
            while running:
                step: list[tuple[int, int, int]] = []
                for seq in running:
                    token = int(np.argmax(rows[seq]))  # the first highest logit, as llama.cpp's greedy sampler
                    if not completions[seq].push(token):
                        step.append((token, positions[seq], seq))
                if not step:
                    break
                self._submit(step, every_row=True)
                for i, (_, _, seq) in enumerate(step):
                    rows[seq] = self._logits_row(i).copy()
                    positions[seq] += 1
                running = [seq for _, _, seq in step]
                decoded += len(step)
        except BaseException:
            self._forget_kv()
            raise
        finally:
            self.kv_stats.tokens_decoded += decoded
        # Back to the prefixes alone: the next record starts from the same cache.
        for seq, ids in enumerate(group):
            if self._group is not None and not self._lib.llama_memory_seq_rm(memory, seq, len(ids), -1):
                self._forget_kv()  # a cache that cannot drop a tail: the next record decodes the prefixes again
        return decoded

    def _check_room(self, needed: int) -> None:
        if needed > self._n_ctx:
            raise EngineError(
                f"input needs {needed} tokens but the context holds {self._n_ctx}; raise n_ctx or shorten the prompt"
            )

    def _submit(
        self,
        items: Sequence[tuple[int, int, int]],
        *,
        every_row: bool,
        last_row: bool = True,
        rows: Sequence[int] | None = None,
    ) -> None:
        """One llama_decode of (token, position, sequence) items; logits for every row, the
        last, or (``rows``) the rows listed."""
        batch = self._batch
        batch.n_tokens = len(items)
        wanted = set(rows) if rows is not None else set()
        for i, (token, position, seq) in enumerate(items):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            if rows is not None:
                batch.logits[i] = i in wanted
            else:
                batch.logits[i] = every_row or (last_row and i == len(items) - 1)
        code = self._lib.llama_decode(self._ctx, batch)
        if code != 0:
            self._forget_kv()  # the cache may hold a partial batch now
            raise EngineError(f"llama.cpp decode failed with code {code}")

    def _open_scoring_context(self, *, n_ctx: int, n_batch: int, n_threads: int) -> Any:  # a llama_context pointer
        # The generation context's settings (attention kernel, KV types...), with more sequences.
        params = type(self._llm.context_params).from_buffer_copy(self._llm.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_threads = params.n_threads_batch = n_threads
        params.n_seq_max = SCORING_SEQUENCES
        params.kv_unified = True  # the sequences share the n_ctx cells (a choice's copy costs no cells)
        params.swa_full = True  # truncating back to the prefix must not lose cells the next record needs
        with quiet_native_output(self._lib):
            ctx = self._lib.llama_init_from_model(self._llm.model, params)
        if not ctx:
            raise EngineError("llama.cpp could not create a scoring context (out of memory?)")
        return ctx

    def _logits_row(self, index: int) -> np.ndarray:
        pointer = self._lib.llama_get_logits_ith(self._ctx, index)
        if not pointer:
            raise EngineError("llama.cpp returned no logits for a requested position")
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))
