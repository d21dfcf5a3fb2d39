"""Scoring with ``transformers``: choice log-probs on a shared prefix, token log-probs with
full-vocabulary statistics, and gradient norms (for the audits' Min-K%++ and GradNorm).

A mixin of :class:`~dp_textgrad.engines.transformers_engine.TransformersEngine`; the
tokenization rule of the engine's module docstring applies to every method.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.engines.base import EngineError, TokenLogprobs
from dp_textgrad.engines.transformers_loading import chunks

TOP_ALTERNATIVES = 5
# log_softmax over a 262k vocabulary in float32 is ~1 MB a position: bound the work
# done at once when many positions are needed (token_logprobs on a long text).
_POSITIONS_PER_CHUNK = 64


class HfScoring:
    """Log-probabilities and gradients (mixin; see the module docstring)."""

    if TYPE_CHECKING:  # what TransformersEngine, which mixes this in, provides
        model: Any
        device: Any
        max_batch_size: int
        reuse_prefix: bool
        _torch: Any
        _lock: threading.RLock
        _pad_id: int

        def _cache_get(self, key: Hashable | None) -> tuple[bool, Any]: ...
        def _cache_put(self, key: Hashable | None, value: Any) -> None: ...
        def _count(
            self,
            *,
            calls: int = ...,
            prompt_tokens: int = ...,
            completion_tokens: int = ...,
            seconds: float = ...,
            cost_usd: float = ...,
            retries: int = ...,
        ) -> None: ...
        @contextmanager
        def _timed(self) -> Iterator[dict[str, float]]: ...
        def _encode_context(self, text: str) -> list[int]: ...
        def _encode_piece(self, text: str) -> list[int]: ...
        def _token_text(self, token_id: int) -> str: ...
        def _forward(self, input_ids: Any, keep: Sequence[int] | int, **kwargs: Any) -> Any: ...
        def _tensor(self, rows: Sequence[Sequence[int]]) -> Any: ...

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        """log p(choice | prefix + suffix) for every suffix and choice, shape
        (len(suffixes), len(choices)); multi-token choices are summed over their tokens."""
        if isinstance(suffixes, str):
            raise TypeError("suffixes: pass a sequence of strings, not one string")
        if isinstance(choices, str):
            raise TypeError("choices: pass a sequence of strings, not one string")
        suffixes, choices = tuple(suffixes), tuple(choices)
        if not choices:
            raise ValueError("choices: need at least one choice")
        if not suffixes:
            return np.zeros((0, len(choices)))
        key = ("score", prefix, suffixes, choices)
        hit, cached = self._cache_get(key)
        if hit:
            return cached.copy()
        with self._timed() as timer, self._lock, self._torch.no_grad():
            scores, tokens = self._score(prefix, suffixes, choices)
        self._count(prompt_tokens=tokens, seconds=timer["seconds"])
        self._cache_put(key, scores.copy())
        return scores

    def _score(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> tuple[np.ndarray, int]:
        prefix_ids = self._encode_context(prefix)
        suffix_ids = [self._encode_piece(s) for s in suffixes]
        choice_ids = [self._encode_piece(c) for c in choices]
        for j, ids in enumerate(choice_ids):
            if not ids:
                raise ValueError(f"choices[{j}]: encodes to no tokens; a choice must be non-empty text")
        # A row is what follows the prefix: suffix + all but the last token of a choice.
        # Single-token choices share one row per suffix; the logits at position p predict
        # token p + 1, with p = -1 the prefix's last position.
        row_index: dict[tuple[int, ...], int] = {}
        needed: list[dict[int, set[int]]] = []
        plan: list[tuple[int, int, int, list[tuple[int, int]]]] = []
        for i, s_ids in enumerate(suffix_ids):
            for j, c_ids in enumerate(choice_ids):
                row = row_index.setdefault(tuple(s_ids + c_ids[:-1]), len(row_index))
                if row == len(needed):
                    needed.append({})
                steps = [(len(s_ids) + k - 1, token) for k, token in enumerate(c_ids)]
                for position, token in steps:
                    needed[row].setdefault(position, set()).add(token)
                plan.append((i, j, row, steps))
        rows = [list(r) for r in row_index]  # dicts keep insertion order, so indices match
        logprobs, tokens = self._row_logprobs(prefix_ids, rows, needed)
        scores = np.empty((len(suffixes), len(choices)), dtype=np.float64)
        for i, j, row, steps in plan:
            scores[i, j] = sum(logprobs[(row, position, token)] for position, token in steps)
        return scores, tokens

    def _row_logprobs(
        self, prefix_ids: list[int], rows: list[list[int]], needed: list[dict[int, set[int]]]
    ) -> tuple[dict[tuple[int, int, int], float], int]:
        if self.reuse_prefix:
            result = self._row_logprobs_shared_prefix(prefix_ids, rows, needed)
            if result is not None:
                return result
        return self._row_logprobs_full(prefix_ids, rows, needed)

    def _gather(
        self, logits: Any, targets: set[int], key: tuple[int, int], into: dict[tuple[int, int, int], float]
    ) -> None:
        """log_softmax in float32 of one position, read at the target tokens."""
        row = logits.float()
        lse = self._torch.logsumexp(row, dim=-1)
        ordered = sorted(targets)
        picked = (row[ordered] - lse).tolist()
        for token, value in zip(ordered, picked):
            into[(key[0], key[1], token)] = float(value)

    def _row_logprobs_shared_prefix(
        self, prefix_ids: list[int], rows: list[list[int]], needed: list[dict[int, set[int]]]
    ) -> tuple[dict[tuple[int, int, int], float], int] | None:
        """Run the prefix once, then each batch of rows on a copy of its cache."""
        torch = self._torch
        prefix_out = self._forward(self._tensor([prefix_ids]), 1, use_cache=True)
        prefix_cache = getattr(prefix_out, "past_key_values", None)
        if prefix_cache is None or not hasattr(prefix_cache, "batch_repeat_interleave"):
            return None  # this model's cache cannot be shared across a batch
        into: dict[tuple[int, int, int], float] = {}
        for row, wanted in enumerate(needed):
            if -1 in wanted:
                self._gather(prefix_out.logits[0, -1], wanted[-1], (row, -1), into)
        n_prefix = len(prefix_ids)
        tokens = n_prefix
        # Longest first, so rows of similar length share a batch (less padding).
        order = sorted((r for r in range(len(rows)) if rows[r]), key=lambda r: -len(rows[r]))
        for batch in chunks(order, self.max_batch_size):
            width = len(rows[batch[0]])
            input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long, device=self.device)
            mask = torch.zeros((len(batch), n_prefix + width), dtype=torch.long, device=self.device)
            mask[:, :n_prefix] = 1
            for b, r in enumerate(batch):
                input_ids[b, : len(rows[r])] = torch.tensor(rows[r], dtype=torch.long)
                mask[b, n_prefix : n_prefix + len(rows[r])] = 1  # right padding: real tokens first
                tokens += len(rows[r])
            keep = sorted({p for r in batch for p in needed[r] if p >= 0})
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(batch))
            out = self._forward(input_ids, keep, attention_mask=mask, past_key_values=cache, use_cache=True)
            column = {p: c for c, p in enumerate(keep)}
            for b, r in enumerate(batch):
                for position, targets in needed[r].items():
                    if position >= 0:
                        self._gather(out.logits[b, column[position]], targets, (r, position), into)
        return into, tokens

    def _row_logprobs_full(
        self, prefix_ids: list[int], rows: list[list[int]], needed: list[dict[int, set[int]]]
    ) -> tuple[dict[tuple[int, int, int], float], int]:
        """Whole sequences (prefix + row), right-padded, for models without a shareable cache."""
        torch = self._torch
        into: dict[tuple[int, int, int], float] = {}
        n_prefix = len(prefix_ids)
        tokens = 0
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r]))
        for batch in chunks(order, self.max_batch_size):
            width = n_prefix + len(rows[batch[0]])
            input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long, device=self.device)
            mask = torch.zeros((len(batch), width), dtype=torch.long, device=self.device)
            for b, r in enumerate(batch):
                sequence = prefix_ids + rows[r]
                input_ids[b, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
                mask[b, : len(sequence)] = 1
                tokens += len(sequence)
            keep = sorted({n_prefix + p for r in batch for p in needed[r]})
            out = self._forward(input_ids, keep, attention_mask=mask, use_cache=False)
            column = {p: c for c, p in enumerate(keep)}
            for b, r in enumerate(batch):
                for position, targets in needed[r].items():
                    self._gather(out.logits[b, column[n_prefix + position]], targets, (r, position), into)
        return into, tokens

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        """Per-token log p of ``text`` after ``context``, the top-5 alternatives, and at each
        position the mean and standard deviation of log p(z) for z drawn from the model's
        next-token distribution over the full vocabulary (Min-K%++'s mu and sigma)."""
        key = ("tokens", text, context)
        hit, cached = self._cache_get(key)
        if hit:
            return cached
        with self._timed() as timer, self._lock, self._torch.no_grad():
            context_ids = self._encode_context(context)
            text_ids = self._encode_piece(text)
            result = self._token_logprobs(context_ids, text_ids)
        self._count(prompt_tokens=len(context_ids) + len(text_ids), seconds=timer["seconds"])
        self._cache_put(key, result)
        return result

    def _token_logprobs(self, context_ids: list[int], text_ids: list[int]) -> TokenLogprobs:
        torch = self._torch
        n = len(text_ids)
        if n == 0:
            empty = np.zeros(0)
            return TokenLogprobs([], empty, [], empty.copy(), empty.copy())
        # The last n + 1 positions hold the logits predicting the n text tokens (the last
        # position predicts past the end and is dropped).
        out = self._forward(self._tensor([context_ids + text_ids]), n + 1, use_cache=False)
        logits = out.logits[0, :n]
        targets = torch.tensor(text_ids, dtype=torch.long, device=logits.device)
        logprobs, means, stds, alternatives = [], [], [], []
        for start in range(0, n, _POSITIONS_PER_CHUNK):
            part = torch.log_softmax(logits[start : start + _POSITIONS_PER_CHUNK].float(), dim=-1)
            probs = part.exp()
            mean = (probs * part).sum(-1)
            var = (probs * (part - mean[:, None]) ** 2).sum(-1).clamp_min(0.0)
            logprobs.extend(part.gather(1, targets[start : start + len(part), None])[:, 0].tolist())
            means.extend(mean.tolist())
            stds.extend(var.sqrt().tolist())
            top = torch.topk(part, k=min(TOP_ALTERNATIVES, part.shape[-1]), dim=-1)
            for values, ids in zip(top.values.tolist(), top.indices.tolist()):
                alternatives.append([(self._token_text(t), float(v)) for t, v in zip(ids, values)])
        return TokenLogprobs(
            tokens=[self._token_text(t) for t in text_ids],
            logprobs=np.array(logprobs, dtype=np.float64),
            top_alternatives=alternatives,
            vocab_mean=np.array(means, dtype=np.float64),
            vocab_std=np.array(stds, dtype=np.float64),
        )

    # -- gradients --------------------------------------------------------------------
    def grad_norm(self, text: str, context: str = "") -> float:
        """L2 norm of the gradient of the mean NLL of ``text`` (given ``context``) with
        respect to all floating-point model parameters (GradNorm membership score).

        The model is in eval mode (no dropout), so the value is deterministic; the
        parameters' ``.grad`` and ``requires_grad`` are restored afterwards.
        """
        key = ("grad_norm", text, context)
        hit, cached = self._cache_get(key)
        if hit:
            return cached
        torch = self._torch
        with self._timed() as timer, self._lock:
            context_ids = self._encode_context(context)
            text_ids = self._encode_piece(text)
            if not text_ids:
                raise ValueError("text: encodes to no tokens; GradNorm needs at least one token")
            value = self._grad_norm(torch, context_ids, text_ids)
        self._count(prompt_tokens=len(context_ids) + len(text_ids), seconds=timer["seconds"])
        if not math.isfinite(value):
            raise EngineError("the gradient norm is not finite (overflow in this dtype?)")
        self._cache_put(key, value)
        return value

    def _grad_norm(self, torch: Any, context_ids: list[int], text_ids: list[int]) -> float:
        model = self.model
        params = [p for p in model.parameters() if p.is_floating_point()]
        saved = [(p.requires_grad, p.grad) for p in params]
        was_training = model.training
        try:
            model.eval()
            for p in params:
                p.requires_grad_(True)
                p.grad = None
            with torch.enable_grad():
                n = len(text_ids)
                out = self._forward(self._tensor([context_ids + text_ids]), n + 1, use_cache=False)
                logits = out.logits[0, :n].float()
                targets = torch.tensor(text_ids, dtype=torch.long, device=logits.device)
                loss = torch.nn.functional.cross_entropy(logits, targets)  # mean NLL per token
                loss.backward()
            norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
            if not norms:
                raise EngineError("the model has no trainable floating-point parameters")
            return float(torch.linalg.vector_norm(torch.stack(norms)))
        finally:
            for p, (requires_grad, grad) in zip(params, saved):
                p.grad = grad
                p.requires_grad_(requires_grad)
            model.train(was_training)
