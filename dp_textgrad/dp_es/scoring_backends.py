"""Where the private records are scored: in this process, or spread over workers or silos.

Not the mechanism: charging, noising and releasing are :mod:`dp_textgrad.dp_es.scorer`'s
(:class:`~dp_textgrad.dp_es.scorer.DPScorer`); a backend computes sums for it.

A scoring backend draws the secret Poisson subsample and returns, for every candidate,
the sum of its clipped per-record scores (and, when asked, its confusion counts) over
the subsample: exactly what a DP mechanism needs, nothing per record. The
:class:`~dp_textgrad.dp_es.scorer.DPScorer` charges the ledger before it calls a backend
and adds the noise after, so every backend runs under the same mechanism objects and
events; a backend only decides where the sums are computed.

- :class:`LocalScoring` (the default) scores in this process with one engine.
- ``dp_textgrad.distributed.RayScoringPool`` partitions the records over Ray actors
  and adds up their partial sums (sums are additive over a partition of the subsample).
- ``dp_textgrad.federated.FederatedScoring`` asks silos (Flower clients) that hold their
  own records. Under the ``distributed`` and ``local`` noise placements the silos add the
  noise themselves: such a backend is a :class:`NoisingBackend`, and the scorer takes its
  already-noised values instead of adding noise (the charge is the same event).

The totals are private: they live only in the scorer's frame until a mechanism noises them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dp_textgrad.privacy.data import PrivateBatch
from dp_textgrad.privacy.mechanisms import clipped_utility_sums
from dp_textgrad.tasks.base import ERROR_CATEGORY

if TYPE_CHECKING:
    from dp_textgrad.tasks.base import Task


@dataclass(frozen=True)
class SubsampleTotals:
    """Per-candidate totals over one Poisson subsample (private until noised).

    ``sums``: shape (K,), sum of clip(score, 0, C). ``confusion``: the task's feedback counts
    per candidate, shape (K, *task.feedback.shape) (the confusion matrix of a classification
    task, the failure histogram of a generation task), or None when not asked for.
    ``errors``: how many records of the subsample failed to score (each scored 0 under every
    candidate; see :func:`batch_totals`); ``error_detail``: the first failure's text. Both are
    private: the count is released only by a mechanism that charges for it, the text is
    operator-only.
    """

    sums: np.ndarray
    confusion: np.ndarray | None
    errors: float = 0.0
    error_detail: str | None = None

    def __add__(self, other: SubsampleTotals) -> SubsampleTotals:
        if (self.confusion is None) != (other.confusion is None):
            raise ValueError("confusion: both partial totals must carry confusion counts, or neither")
        confusion = None if self.confusion is None else self.confusion + other.confusion
        return SubsampleTotals(
            self.sums + other.sums,
            confusion,
            self.errors + other.errors,
            self.error_detail if self.error_detail is not None else other.error_detail,
        )


class ScoringBackend(Protocol):
    """Draws a fresh Poisson subsample (rate q) and totals each prompt's clipped scores on it.

    A backend whose ``subsample_from_seed`` is true also takes ``sampling_rng=``, the charge's
    own generator, and draws the subsample from it (so a resumed run can redraw it)."""

    def totals(
        self, prompts: Sequence[str], sampling_rate: float, clip_bound: float, with_confusion: bool
    ) -> SubsampleTotals: ...


class SeededScoringBackend(ScoringBackend, Protocol):
    """A backend whose ``subsample_from_seed`` is true: it draws the subsample from the generator it is given."""

    def totals(
        self,
        prompts: Sequence[str],
        sampling_rate: float,
        clip_bound: float,
        with_confusion: bool,
        sampling_rng: np.random.Generator | None = None,
    ) -> SubsampleTotals: ...


@dataclass(frozen=True)
class NoisedRelease:
    """Values noised where the records live (DP already), and the std of their total noise."""

    values: np.ndarray
    noise_std: float


class NoisingBackend(ScoringBackend, Protocol):
    """A backend whose data holders add the noise: it never hands out un-noised totals.

    ``mechanism`` is the run's mechanism (the event the scorer charged); the backend
    applies its own placement of that noise. ``noised_confusion`` releases the confusion
    matrices of ``indices`` on the subsample of the last ``noised_sums`` call.
    """

    def noised_sums(
        self, prompts: Sequence[str], sampling_rate: float, mechanism: Any, keep_confusion: bool
    ) -> NoisedRelease: ...

    def noised_confusion(self, indices: Sequence[int], mechanism: Any) -> NoisedRelease: ...


def adds_noise(backend: Any) -> bool:
    """True for a :class:`NoisingBackend` (its silos add the noise)."""
    return bool(getattr(backend, "adds_noise", False))


# What builds a backend for a run: the (length-bounded) task, the driver's engine, and the
# driver's secret sampling generator (``secure`` False: an insecure test seed is in use).
ScoringFactory = Callable[["Task", Any, np.random.Generator, bool], ScoringBackend]


def _outcomes(task: Task, engine: Any, prompts: Sequence[str], batch: PrivateBatch[Any]) -> list[Any]:
    """Every prompt's outcomes on ``batch`` (one per prompt), as the task computes them."""
    # A generation task scores record by record under all the prompts (one engine call per
    # record, which an engine may batch over the prompts); classification keeps one call per prompt.
    many = getattr(task, "private_outcomes_many", None)
    if callable(many):
        outcomes = list(many(engine, [str(prompt) for prompt in prompts], batch))
        if len(outcomes) != len(prompts):
            raise RuntimeError("task.private_outcomes_many: returned the wrong number of outcomes")
        return outcomes
    return [task.private_outcomes(engine, str(prompt), batch) for prompt in prompts]


@dataclass(frozen=True)
class _Scored:
    """One batch's per-record results: scores (K, n), feedback counts (K, *shape) or None, which
    records failed under some candidate (n,), and the first failure's text."""

    scores: np.ndarray
    counts: np.ndarray | None
    failed: np.ndarray
    detail: str | None


def _scored(task: Task, outcomes: Sequence[Any], records: int, with_confusion: bool) -> _Scored:
    """Check and stack ``outcomes``; raises unless every record has a score and adds exactly one
    unit to each candidate's feedback counts. A task may flag records whose pipeline raised
    (``outcomes.failed``; it scored them 0 and put them in its ``error`` category already)."""
    scores = np.zeros((len(outcomes), records))
    failed = np.zeros(records, dtype=bool)
    detail = None
    for k, outcome in enumerate(outcomes):
        values = np.asarray(outcome.scores, dtype=float).reshape(-1)
        if values.size != records:
            raise RuntimeError("task.private_outcomes: returned the wrong number of scores for the batch")
        scores[k] = values
        flags = getattr(outcome, "failed", None)
        if flags is not None:
            failed |= np.asarray(flags, dtype=bool).reshape(records)
            detail = detail if detail is not None else getattr(outcome, "error_detail", None)
    counts = None
    if with_confusion:
        counts = np.stack([np.asarray(task.feedback_counts(o), dtype=float) for o in outcomes])
        # np.allclose's tolerance without its per-call overhead (this runs once per scored batch);
        # written as "not all within" so that a NaN or infinite count fails it, as with allclose
        units = counts.reshape(len(outcomes), -1).sum(1)
        if counts.shape[1:] != task.feedback.shape or not np.all(np.abs(units - records) <= 1e-8 + 1e-5 * records):
            raise RuntimeError("task.feedback_counts: each record must add exactly one unit to the feedback counts")
    return _Scored(scores, counts, failed, detail)


def failure_unit(task: Task) -> np.ndarray:
    """What a record that failed to score adds to one candidate's feedback counts: one unit in the
    task's public ``error`` category where its feedback has one (a generation task's failure
    histogram), else nothing (a confusion matrix has no cell for it). At most one unit either way,
    so the feedback's sensitivity is unchanged."""
    spec = task.feedback
    unit = np.zeros(spec.shape)
    if spec.kind == "failures" and ERROR_CATEGORY in spec.names:
        unit[spec.names.index(ERROR_CATEGORY)] = 1.0
    return unit


def batch_totals(
    task: Task,
    engine: Any,
    prompts: Sequence[str],
    batch: PrivateBatch[Any],
    clip_bound: float,
    with_confusion: bool,
) -> SubsampleTotals:
    """Totals of every prompt over ``batch``: the one scoring routine every backend runs.

    Failures are data (docs/privacy.md, "Failures on private records"): when scoring the batch
    raises, each record is scored on its own, and a record whose scoring raises scores 0 under
    every candidate and adds one unit to the feedback's ``error`` category (:func:`failure_unit`).
    The rule is the same for every record and a record's outcome depends on that record alone,
    so one record still moves each sum by at most C and each feedback block by one unit; whether
    a run stops never depends on one record's failure. How many records failed is counted into
    the totals (private, like the sums); the first failure's text is kept for the operator.
    """
    prompts = [str(prompt) for prompt in prompts]
    try:
        found = _scored(task, _outcomes(task, engine, prompts, batch), len(batch), with_confusion)
    except Exception:  # noqa: BLE001 - which record failed is found below, one record at a time
        found = _one_by_one(task, engine, prompts, batch, with_confusion)
    return SubsampleTotals(
        clipped_utility_sums(found.scores, clip_bound), found.counts, float(found.failed.sum()), found.detail
    )


def _one_by_one(
    task: Task, engine: Any, prompts: Sequence[str], batch: PrivateBatch[Any], with_confusion: bool
) -> _Scored:
    """:func:`batch_totals`'s fallback: each record scored on its own; one that raises scores 0."""
    scores = np.zeros((len(prompts), len(batch)))
    counts = np.zeros((len(prompts), *task.feedback.shape)) if with_confusion else None
    failed = np.zeros(len(batch), dtype=bool)
    detail = None
    for i, record in enumerate(batch):
        try:
            one = _scored(task, _outcomes(task, engine, prompts, PrivateBatch([record])), 1, with_confusion)
        except Exception as exc:  # noqa: BLE001 - a failure on one private record is data: score 0
            failed[i] = True
            detail = detail if detail is not None else f"{type(exc).__name__}: {exc}"
            if counts is not None:
                counts += failure_unit(task)
            continue
        scores[:, i] = one.scores[:, 0]
        failed[i] = bool(one.failed[0])
        detail = detail if detail is not None else one.detail
        if counts is not None and one.counts is not None:
            counts += one.counts
    return _Scored(scores, counts, failed, detail)


class LocalScoring:
    """Score the private records in this process with the run's engine (the default backend).

    It draws the subsample from the generator it is given per charge (``sampling_rng``), so a
    resumed run can redraw an interrupted charge's subsample from that charge's secret seed
    (``subsample_from_seed``; see :mod:`dp_textgrad.dp_es.replay`).
    """

    subsample_from_seed = True

    def __init__(self, task: Task, engine: Any, sampling_rng: np.random.Generator, secure: bool = True) -> None:
        self.task, self.engine, self.sampling_rng = task, engine, sampling_rng

    def totals(
        self,
        prompts: Sequence[str],
        sampling_rate: float,
        clip_bound: float,
        with_confusion: bool,
        sampling_rng: np.random.Generator | None = None,
    ) -> SubsampleTotals:
        rng = self.sampling_rng if sampling_rng is None else sampling_rng
        batch = self.task.private_train.poisson_subsample(sampling_rate, rng)
        return batch_totals(self.task, self.engine, prompts, batch, clip_bound, with_confusion)


__all__ = [
    "LocalScoring",
    "NoisedRelease",
    "NoisingBackend",
    "ScoringBackend",
    "ScoringFactory",
    "SubsampleTotals",
    "adds_noise",
    "batch_totals",
    "failure_unit",
]
