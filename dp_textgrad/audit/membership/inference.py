"""Membership inference through the model conditioned on a released prompt.

Each text (a candidate member record, e.g. a canary) is scored by the engine as the
continuation of ``render_prefix(prompt) + <record template head>``. Every score is
oriented "higher = member":

- ``loss``: mean token log-probability (the negative LOSS).
- ``zlib``: mean token log-probability / zlib-compressed length in bytes (the
  negative of Carlini et al.'s log-perplexity-to-zlib-entropy ratio).
- ``min_k``: mean of the lowest k share of token log-probabilities (Min-K%, k = 0.2).
- ``min_k_pp``: the same over z-scored log-probabilities (log p - mu) / sigma, with mu
  and sigma of log p over the vocabulary at each position (Min-K%++); needs the
  engine's ``vocab_mean``/``vocab_std``, otherwise skipped with a note.
- ``reference``: log-likelihood given the released prompt minus given a reference
  prompt (the task's seed prompt, or the prompt of a canary-free run).
- ``recall``: ReCaLL, mean log-likelihood with a non-member prefix (public demos
  before the record) divided by the mean log-likelihood without it; members lose
  more likelihood under a non-member prefix, so the ratio is larger for members.
- ``grad_norm``: minus the gradient norm of the text's loss, on engines with
  ``grad_norm(text, context)`` (the transformers engine); skipped elsewhere.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dp_textgrad.audit.membership.leakage import record_context
from dp_textgrad.tasks.base import ClassificationTask, Example

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine, TokenLogprobs

ATTACKS: tuple[str, ...] = ("loss", "zlib", "min_k", "min_k_pp", "reference", "recall", "grad_norm")
DEFAULT_K = 0.2
DEFAULT_RECALL_DEMOS = 3


# -- per-text scores -------------------------------------------------------------------------


def _logprobs(values: object) -> np.ndarray:
    array = np.asarray(values, dtype=float).reshape(-1)
    if array.size == 0:
        raise ValueError("logprobs: the text has no tokens to score")
    return array


def _lowest_share(values: np.ndarray, k: float) -> np.ndarray:
    if not 0 < k <= 1:
        raise ValueError(f"k: must be in (0, 1], got {k}")
    count = max(1, int(math.floor(k * values.size)))
    return np.sort(values)[:count]


def loss_score(logprobs: object) -> float:
    """Mean token log-probability (higher = member)."""
    return float(np.mean(_logprobs(logprobs)))


def zlib_score(logprobs: object, text: str) -> float:
    """Mean token log-probability over the zlib-compressed length of ``text`` (bytes)."""
    if not text:
        raise ValueError("text: empty text has no zlib entropy")
    return loss_score(logprobs) / len(zlib.compress(text.encode("utf-8")))


def min_k_score(logprobs: object, k: float = DEFAULT_K) -> float:
    """Min-K%: mean of the lowest ``k`` share of token log-probabilities (at least one)."""
    return float(np.mean(_lowest_share(_logprobs(logprobs), k)))


def min_k_pp_score(logprobs: object, vocab_mean: object, vocab_std: object, k: float = DEFAULT_K) -> float:
    """Min-K%++: Min-K% over (log p - mu) / sigma per position (sigma 0 gives z = 0)."""
    lp = _logprobs(logprobs)
    mu = np.asarray(vocab_mean, dtype=float).reshape(-1)
    sigma = np.asarray(vocab_std, dtype=float).reshape(-1)
    if mu.size != lp.size or sigma.size != lp.size:
        raise ValueError("vocab_mean, vocab_std: need one value per token")
    z = np.divide(lp - mu, sigma, out=np.zeros_like(lp), where=sigma > 0)
    return float(np.mean(_lowest_share(z, k)))


def recall_score(logprobs_with_prefix: object, logprobs_without: object) -> float:
    """ReCaLL: mean LL with a non-member prefix / mean LL without it."""
    without = loss_score(logprobs_without)
    if without == 0:
        raise ValueError("logprobs_without: a mean log-likelihood of 0 leaves the ReCaLL ratio undefined")
    return loss_score(logprobs_with_prefix) / without


# -- batch scoring through an engine ------------------------------------------------------------


@dataclass(frozen=True)
class AttackScores:
    """Scores of one attack, one per text (higher = member), or ``None`` with the reason."""

    attack: str
    scores: np.ndarray | None
    note: str = ""

    @property
    def available(self) -> bool:
        return self.scores is not None


def demos_prefix(task: ClassificationTask, examples: Sequence[Example]) -> str:
    """Non-member records rendered as demonstrations, to put before a scored record."""
    return "".join(task.render_demo(e) + "\n\n" for e in examples)


def membership_scores(
    engine: Engine,
    task: ClassificationTask,
    prompt: str,
    texts: Sequence[str],
    *,
    reference_prompt: str | None = None,
    nonmember_prefix: Sequence[Example] | None = None,
    k: float = DEFAULT_K,
    attacks: Sequence[str] = ATTACKS,
) -> dict[str, AttackScores]:
    """Every requested attack's scores for ``texts`` under the released ``prompt``.

    ``reference_prompt`` defaults to the task's seed prompt. ``nonmember_prefix``
    (ReCaLL) defaults to the first 3 public examples; with none, ReCaLL is skipped.
    """
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        raise ValueError(f"attacks: unknown {unknown}; choose from {list(ATTACKS)}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts: need at least one text to score")
    if any(not t for t in texts):
        raise ValueError("texts: empty texts cannot be scored")
    if not 0 < k <= 1:
        raise ValueError(f"k: must be in (0, 1], got {k}")

    context = record_context(task, prompt)
    base: list[TokenLogprobs] = [engine.token_logprobs(t, context) for t in texts]
    out: dict[str, AttackScores] = {}

    def put(name: str, values: list[float] | None, note: str = "") -> None:
        if name in attacks:
            out[name] = AttackScores(name, None if values is None else np.array(values, dtype=float), note)

    put("loss", [loss_score(b.logprobs) for b in base])
    put("zlib", [zlib_score(b.logprobs, t) for b, t in zip(base, texts)])
    put("min_k", [min_k_score(b.logprobs, k) for b in base])
    if "min_k_pp" in attacks:
        if all(b.vocab_mean is not None and b.vocab_std is not None for b in base):
            put("min_k_pp", [min_k_pp_score(b.logprobs, b.vocab_mean, b.vocab_std, k) for b in base])
        else:
            put("min_k_pp", None, "the engine gives no vocabulary mean/std of log p (needed for Min-K%++)")
    if "reference" in attacks:
        ref_prompt = task.seed_prompt if reference_prompt is None else reference_prompt
        ref_context = record_context(task, ref_prompt)
        put(
            "reference",
            [
                float(np.sum(b.logprobs) - np.sum(engine.token_logprobs(t, ref_context).logprobs))
                for b, t in zip(base, texts)
            ],
        )
    if "recall" in attacks:
        if nonmember_prefix is None:
            demos = list(task.public_examples[:DEFAULT_RECALL_DEMOS])
        else:
            demos = list(nonmember_prefix)
        if demos:
            with_prefix = record_context(task, prompt, before_record=demos_prefix(task, demos))
            put(
                "recall",
                [recall_score(engine.token_logprobs(t, with_prefix).logprobs, b.logprobs) for b, t in zip(base, texts)],
            )
        else:
            put("recall", None, "no non-member prefix: the task has no public examples and none were given")
    if "grad_norm" in attacks:
        grad_norm = getattr(engine, "grad_norm", None)
        if callable(grad_norm):
            put("grad_norm", [-float(grad_norm(t, context)) for t in texts])
        else:
            put("grad_norm", None, "the engine has no grad_norm(text, context) (use the transformers engine)")
    return out


def split_by_membership(scores: AttackScores, is_member: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """(member scores, non-member scores) of an available attack."""
    if scores.scores is None:
        raise ValueError(f"scores: attack {scores.attack!r} was not available ({scores.note})")
    mask = np.asarray(is_member, dtype=bool).reshape(-1)
    if mask.size != scores.scores.size:
        raise ValueError(f"is_member: need one flag per score ({scores.scores.size}), got {mask.size}")
    return scores.scores[mask], scores.scores[~mask]
