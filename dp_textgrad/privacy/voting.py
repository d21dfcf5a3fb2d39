"""DP labels for public inputs by a noisy vote of teachers (PATE's GNMax, applied to prompts).

The private records are split into ``teachers`` disjoint groups by a keyed hash of each
record (:func:`teacher_of`): a record's group depends on that record alone, so adding or
removing one record changes exactly one group. Each teacher (in the wiring: the task prompt
with its group as demonstrations) votes one label, or abstains, on each PUBLIC unlabelled
input. Per input the vote histogram n (counts per label, at most one vote per teacher) is
released through a Gaussian noisy argmax (Papernot et al. 2018, "Scalable Private Learning
with PATE"):

- :class:`GNMax`: release argmax_j (n_j + N(0, sigma^2)). One teacher's vote moves from one
  label to another (or from/to abstention), so n changes by at most 1 in at most two cells:
  L2 sensitivity sqrt(2). Event per input: ``GaussianDpEvent(sigma / sqrt(2))``.
- :class:`ConfidentGNMax`: first a threshold step, max_j n_j + N(0, sigma1^2) >= threshold
  (the max count has sensitivity 1: ``GaussianDpEvent(sigma1)``), then GNMax with sigma2 if it
  passed, else abstain (None). Both events are charged for EVERY input (see the class).

Accounting is data-independent: Q inputs cost Q self-composed events, charged once, before
any teacher reads its records (:func:`label_by_vote`). Teachers with no records, and votes
the wiring cannot map to a label, abstain: a fixed public rule that keeps the sensitivity
(a move to or from abstention changes one cell by 1). Nothing here imports an LLM or a task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import dp_accounting
import numpy as np

from dp_textgrad.privacy.accounting.accountants import Accountant
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.privacy.accounting.calibration import calibrate_noise_multiplier
from dp_textgrad.privacy.data import Private, PrivateBatch, PrivateDataError, PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.validation import positive_finite, positive_int

T = TypeVar("T")

_KEY_DOMAIN = b"dp-textgrad-teacher-v1"
MIN_KEY_BYTES = 16
# A teacher's vote on one input: a label index, or None (abstains).
Vote = int | None


# -- the keyed partition ----------------------------------------------------------------


def _content_repr(value: object) -> str:
    # data.py falls back to repr() for values json cannot write. An object without its own
    # __repr__ prints its memory address, which depends on how the other records were
    # allocated: the group would no longer be a function of the record alone.
    if type(value).__repr__ is object.__repr__:
        raise TypeError(
            f"record: a value of type {type(value).__name__} has no content-based repr; "
            "use dataclasses, dicts, lists, strings and numbers for private records"
        )
    return repr(value)


def record_bytes(record: object) -> bytes:
    """The canonical bytes of a record, as :class:`PrivateDataset` canonicalises records for its
    fingerprint (sorted-key JSON of the record or of a dataclass's fields), refusing values whose
    only text is a memory address."""
    if isinstance(record, Private):
        record = record.unwrap()
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        record = dataclasses.asdict(record)
    return json.dumps(record, sort_keys=True, default=_content_repr, ensure_ascii=False).encode("utf-8")


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ValueError(f"key: the partition key must be at least {MIN_KEY_BYTES} bytes")
    return key


def teacher_of(record: object, key: bytes, teachers: int) -> int:
    """The teacher of ``record``: HMAC-SHA256(key, canonical bytes of the record) mod ``teachers``.

    A function of the record (and the key) alone, so adding or removing one record changes
    one teacher's group and no other. The DP guarantee does not rest on the key being secret;
    a secret key keeps the groups unpredictable (no one can aim records at one teacher).
    """
    teachers = positive_int(teachers, "teachers")
    mac = hmac.new(_check_key(key), _KEY_DOMAIN, hashlib.sha256)
    mac.update(record_bytes(record))
    return int.from_bytes(mac.digest(), "big") % teachers


def _assign(dataset: PrivateDataset[Any] | PrivateBatch[Any], key: bytes, teachers: int) -> list[int]:
    """Each record's teacher, in dataset order (the only place the partition is decided)."""
    return [teacher_of(record.unwrap(), key, teachers) for record in dataset]


class TeacherPartition(Generic[T]):
    """The private records split into teacher groups. Only the number of teachers is public:
    the groups and their sizes are private (no method reports them; ``repr`` is redacted)."""

    __slots__ = ("_groups",)
    _groups: tuple[tuple[Private[T], ...], ...]

    def __init__(self, groups: Sequence[Sequence[Private[T]]]) -> None:
        if not groups:
            raise ValueError("teachers: a partition needs at least one teacher")
        object.__setattr__(self, "_groups", tuple(tuple(g) for g in groups))

    @property
    def teachers(self) -> int:
        return len(self._groups)

    def group(self, teacher: int) -> PrivateBatch[T]:
        """Teacher ``teacher``'s records (a private batch: mechanisms only)."""
        return PrivateBatch(list(self._groups[teacher]))

    def groups(self) -> Iterator[PrivateBatch[T]]:
        return (PrivateBatch(list(g)) for g in self._groups)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TeacherPartition is immutable")

    def __repr__(self) -> str:
        return f"TeacherPartition(teachers={self.teachers}, <redacted>)"

    def __str__(self) -> str:
        raise PrivateDataError("a teacher partition cannot be converted to text")

    def __format__(self, spec: str) -> str:
        raise PrivateDataError("a teacher partition cannot be formatted into text")

    def __reduce__(self) -> NoReturn:
        raise PrivateDataError("teacher partitions cannot be pickled or checkpointed")


def partition_teachers(dataset: PrivateDataset[T] | PrivateBatch[T], key: bytes, teachers: int) -> TeacherPartition[T]:
    """Split ``dataset`` (or a subsample of it) into ``teachers`` disjoint groups by
    :func:`teacher_of` (records keep their order)."""
    teachers = positive_int(teachers, "teachers")
    _check_key(key)
    groups: list[list[Private[T]]] = [[] for _ in range(teachers)]
    for record, teacher in zip(dataset, _assign(dataset, key, teachers)):
        groups[teacher].append(record)
    return TeacherPartition(groups)


def vote_histograms(votes: Sequence[Sequence[Vote]], num_labels: int, queries: int) -> np.ndarray:
    """Counts per label, shape (queries, num_labels), from one row of ``queries`` votes per teacher.

    Each teacher adds 1 to one cell per input, or nothing (None: it abstains). The checks name
    no teacher and no vote: which teacher voted what is private.
    """
    num_labels = positive_int(num_labels, "num_labels")
    queries = positive_int(queries, "queries")
    counts = np.zeros((queries, num_labels), dtype=float)
    for row in votes:
        if len(row) != queries:
            raise ValueError("votes: every teacher must give one vote (or None) per public input")
        for query, vote in enumerate(row):
            if vote is None:
                continue
            if isinstance(vote, bool) or not isinstance(vote, (int, np.integer)) or not 0 <= vote < num_labels:
                raise ValueError(f"votes: a vote must be None or a label index in [0, {num_labels})")
            counts[query, int(vote)] += 1.0
    return counts


def _check_histograms(histograms: np.ndarray, num_labels: int) -> np.ndarray:
    counts = np.asarray(histograms, dtype=float)
    if counts.ndim == 1:
        counts = counts[None, :]
    if counts.ndim != 2 or counts.shape[1] != num_labels or counts.shape[0] == 0:
        raise ValueError(f"histograms: expected shape ({num_labels},) or (queries, {num_labels}), got {counts.shape}")
    if not np.all(np.isfinite(counts)):
        raise ValueError("histograms: every count must be finite")
    return counts


# -- the mechanisms -----------------------------------------------------------------------


def _gaussian_queries(noise_multiplier: float, queries: int) -> dp_accounting.DpEvent:
    queries = positive_int(queries, "queries")
    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    return event if queries == 1 else dp_accounting.SelfComposedDpEvent(event, queries)


@dataclass(frozen=True)
class GNMax:
    """Gaussian noisy argmax of a vote histogram: argmax_j (n_j + N(0, sigma^2)), one label per input.

    Sensitivity: one record changes one teacher, whose vote moves between two cells (or to or
    from abstention, one cell): ||n - n'||_2 <= sqrt(2). Releasing the noisy histogram would
    be the Gaussian mechanism with noise multiplier sigma / sqrt(2); the argmax is
    post-processing. Event per input: ``GaussianDpEvent(sigma / sqrt(2))``.
    """

    sigma: float
    num_labels: int

    name = "gnmax"
    l2_sensitivity = math.sqrt(2.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", positive_finite(self.sigma, "sigma"))
        object.__setattr__(self, "num_labels", positive_int(self.num_labels, "num_labels"))

    @property
    def noise_std(self) -> float:
        """The standard deviation of the noise on each count."""
        return self.sigma

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.l2_sensitivity

    def event(self, queries: int = 1) -> dp_accounting.DpEvent:
        """The event of ``queries`` inputs (self-composed; no subsampling: every teacher votes)."""
        return _gaussian_queries(self.noise_multiplier, queries)

    def metadata(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "sigma": self.sigma,
            "num_labels": int(self.num_labels),
            "l2_sensitivity": self.l2_sensitivity,
            "noise_multiplier": self.noise_multiplier,
        }

    def release(self, histograms: np.ndarray, noise: NoiseSource) -> list[Vote]:
        """One noisy-argmax label per row of ``histograms`` (shape (L,) or (queries, L))."""
        counts = _check_histograms(histograms, self.num_labels)
        noisy = noise.add_gaussian(counts, self.noise_std)
        return [int(i) for i in np.argmax(noisy, axis=1)]

    def sample(self, histogram: np.ndarray, noise: NoiseSource, runs: int) -> np.ndarray:
        """``runs`` independent releases for one histogram, shape (runs,) (raw numpy noise: audits, tests)."""
        counts = _check_histograms(histogram, self.num_labels)[0]
        runs = positive_int(runs, "runs")
        noisy = counts[None, :] + noise.normal(self.noise_std, (runs, counts.size))
        return np.argmax(noisy, axis=1)


@dataclass(frozen=True)
class ConfidentGNMax:
    """Confident GNMax: answer only where the teachers agree. Per input, if
    max_j n_j + N(0, sigma1^2) >= ``threshold`` release GNMax(sigma2), else abstain (None).

    The max count moves by at most 1 when one teacher's vote moves: the threshold step is a
    Gaussian mechanism with sensitivity 1, ``GaussianDpEvent(sigma1)``. The answer step is
    :class:`GNMax`, ``GaussianDpEvent(sigma2 / sqrt(2))``.

    Both events are charged for every input, answered or not. The outcome "abstain, or the
    argmax" is a post-processing of the pair (threshold bit, GNMax answer) computed for every
    input, so the composition of both events on all Q inputs bounds it, whatever is answered.
    Charging GNMax only for the answered inputs would need a privacy filter over a
    data-dependent number of charges, and it would make the ledger (which is released) depend
    on the data; the plan would no longer equal the ledger. So with data-independent accounting
    the threshold step only costs privacy: it buys label quality (no label where the teachers
    disagree). Papernot et al.'s savings come from their data-dependent analysis, not done here.
    """

    threshold: float
    threshold_sigma: float
    sigma: float
    num_labels: int

    name = "confident_gnmax"
    max_count_sensitivity = 1.0

    def __post_init__(self) -> None:
        value = float(self.threshold)
        if not math.isfinite(value):
            raise ValueError(f"threshold: must be a finite number, got {self.threshold!r}")
        object.__setattr__(self, "threshold", value)
        object.__setattr__(self, "threshold_sigma", positive_finite(self.threshold_sigma, "threshold_sigma"))
        object.__setattr__(self, "sigma", positive_finite(self.sigma, "sigma"))
        object.__setattr__(self, "num_labels", positive_int(self.num_labels, "num_labels"))

    @property
    def answer(self) -> GNMax:
        return GNMax(self.sigma, self.num_labels)

    @property
    def threshold_noise_std(self) -> float:
        return self.threshold_sigma

    def threshold_event(self, queries: int = 1) -> dp_accounting.DpEvent:
        return _gaussian_queries(self.threshold_sigma / self.max_count_sensitivity, queries)

    def event(self, queries: int = 1) -> dp_accounting.DpEvent:
        """Threshold step and GNMax, both on every one of ``queries`` inputs."""
        return dp_accounting.ComposedDpEvent([self.threshold_event(queries), self.answer.event(queries)])

    def metadata(self) -> dict[str, Any]:
        return {
            **self.answer.metadata(),
            "mechanism": self.name,
            "threshold": self.threshold,
            "threshold_sigma": self.threshold_sigma,
            "max_count_sensitivity": self.max_count_sensitivity,
        }

    def release(self, histograms: np.ndarray, noise: NoiseSource) -> list[Vote]:
        """Per row of ``histograms``: the noisy argmax, or None where the noisy max count is below threshold."""
        counts = _check_histograms(histograms, self.num_labels)
        noisy_max = noise.add_gaussian(counts.max(axis=1), self.threshold_noise_std)
        passed = noisy_max >= self.threshold
        out: list[Vote] = [None] * counts.shape[0]
        if passed.any():  # the answer's noise, drawn only where it is used (the same distribution)
            for index, label in zip(np.flatnonzero(passed), self.answer.release(counts[passed], noise)):
                out[int(index)] = label
        return out

    def sample(self, histogram: np.ndarray, noise: NoiseSource, runs: int) -> np.ndarray:
        """``runs`` releases for one histogram, shape (runs,), -1 for an abstention (audits, tests)."""
        counts = _check_histograms(histogram, self.num_labels)[0]
        runs = positive_int(runs, "runs")
        passed = counts.max() + noise.normal(self.threshold_noise_std, runs) >= self.threshold
        labels = self.answer.sample(counts, noise, runs)
        return np.where(passed, labels, -1)


VotingMechanism = GNMax | ConfidentGNMax


# -- the labelling step: charge, then vote, then release ---------------------------------------


class _Ledger(Protocol):
    def spend(self, event: dp_accounting.DpEvent, label: str, metadata: Any = ...) -> Any: ...


def _charge(ledger: _Ledger, mechanism: VotingMechanism, queries: int, teachers: int, label: str) -> None:
    ledger.spend(mechanism.event(queries), label, {**mechanism.metadata(), "queries": queries, "teachers": teachers})


def label_by_vote(
    ledger: _Ledger,
    mechanism: VotingMechanism,
    partition: TeacherPartition[T],
    vote: Callable[[PrivateBatch[T]], Sequence[Vote]],
    queries: int,
    noise: NoiseSource,
    label: str = "labelling",
) -> list[Vote]:
    """DP labels for ``queries`` public inputs: charge ``mechanism.event(queries)`` to ``ledger``
    (before any record is read; ``BudgetExceeded`` leaves every record unread), ask each teacher
    ``vote(group)`` for one label index (or None) per input, count, release.

    A teacher with no records abstains on every input without being asked (a fixed public
    rule). ``vote`` must depend on its group and public inputs only.
    """
    queries = positive_int(queries, "queries")
    _charge(ledger, mechanism, queries, partition.teachers, label)
    abstain: list[Vote] = [None] * queries
    votes = [abstain if len(group) == 0 else list(vote(group)) for group in partition.groups()]
    return mechanism.release(vote_histograms(votes, mechanism.num_labels, queries), noise)


# -- planning and calibration ----------------------------------------------------------------


def _accountants(accountant: Accountant | Sequence[Accountant] | None) -> list[Accountant] | None:
    if accountant is None:
        return None
    return [accountant] if isinstance(accountant, Accountant) else list(accountant)


def _fits(
    event: dp_accounting.DpEvent, epsilon: float, delta: float, accountant: Accountant | Sequence[Accountant] | None
) -> bool:
    return smallest_bound([event], delta, _accountants(accountant)) <= epsilon


def calibrate_gnmax(
    epsilon: float,
    delta: float,
    queries: int,
    *,
    threshold_sigma: float | None = None,
    accountant: Accountant | Sequence[Accountant] | None = None,
) -> float:
    """The smallest GNMax sigma whose ``queries`` inputs fit (epsilon, delta) (the labelling's share).

    With ``threshold_sigma`` (confident GNMax) the threshold step's events on every input are
    part of the plan and sigma is the answer's noise. Uses the project's calibration (smallest
    valid bound of ``accountant``, default all five); the result never exceeds the target.
    """
    queries = positive_int(queries, "queries")
    fixed: list[dp_accounting.DpEvent] = []
    if threshold_sigma is not None:
        fixed.append(_gaussian_queries(positive_finite(threshold_sigma, "threshold_sigma"), queries))
        if not _fits(dp_accounting.ComposedDpEvent(fixed), epsilon, delta, accountant):
            raise ValueError(
                f"threshold_sigma: the threshold step alone on {queries} inputs exceeds epsilon={epsilon:g}; "
                "raise threshold_sigma or the labelling's share, or label fewer inputs"
            )

    def plan(z: float) -> dp_accounting.DpEvent:
        return dp_accounting.ComposedDpEvent([*fixed, _gaussian_queries(z, queries)])

    z = calibrate_noise_multiplier(plan, epsilon, delta, accountant)
    sigma = z * GNMax.l2_sensitivity
    # sigma / sqrt(2) may round below z: step up by ulps until the mechanism's own event fits.
    for _ in range(64):
        if GNMax(sigma, 2).noise_multiplier >= z:  # at least the calibrated (verified) noise
            return sigma
        if _fits(dp_accounting.ComposedDpEvent([*fixed, GNMax(sigma, 2).event(queries)]), epsilon, delta, accountant):
            return sigma
        sigma = math.nextafter(sigma, math.inf)
    return sigma


@dataclass(frozen=True)
class LabellingPlan:
    """The labelling phase as the run's plan sees it: the mechanism, the number of inputs and
    teachers (public), and the event it charges (:func:`label_by_vote` charges exactly this)."""

    mechanism: VotingMechanism
    queries: int
    teachers: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "queries", positive_int(self.queries, "queries"))
        object.__setattr__(self, "teachers", positive_int(self.teachers, "teachers"))

    @property
    def event(self) -> dp_accounting.DpEvent:
        return self.mechanism.event(self.queries)

    def events(self) -> list[dp_accounting.DpEvent]:
        """The plan's atoms: one event for the whole labelling phase (charged once)."""
        return [self.event]

    def epsilon(self, delta: float, accountant: Accountant | Sequence[Accountant] | None = None) -> float:
        return smallest_bound([self.event], delta, _accountants(accountant))


def plan_labelling(
    epsilon: float,
    delta: float,
    *,
    queries: int,
    teachers: int,
    num_labels: int,
    threshold: float | None = None,
    threshold_sigma: float | None = None,
    accountant: Accountant | Sequence[Accountant] | None = None,
) -> LabellingPlan:
    """Calibrate the labelling phase to its share (epsilon, delta): GNMax, or confident GNMax when
    ``threshold`` is given (then ``threshold_sigma`` is required and sigma2 is calibrated)."""
    if (threshold is None) != (threshold_sigma is None):
        raise ValueError("threshold, threshold_sigma: give both (confident GNMax) or neither (GNMax)")
    sigma = calibrate_gnmax(epsilon, delta, queries, threshold_sigma=threshold_sigma, accountant=accountant)
    mechanism: VotingMechanism
    if threshold is None or threshold_sigma is None:
        mechanism = GNMax(sigma, num_labels)
    else:
        mechanism = ConfidentGNMax(threshold, threshold_sigma, sigma, num_labels)
    return LabellingPlan(mechanism, queries, teachers)


__all__ = [
    "ConfidentGNMax",
    "GNMax",
    "LabellingPlan",
    "TeacherPartition",
    "Vote",
    "VotingMechanism",
    "calibrate_gnmax",
    "label_by_vote",
    "partition_teachers",
    "plan_labelling",
    "record_bytes",
    "teacher_of",
    "vote_histograms",
]
