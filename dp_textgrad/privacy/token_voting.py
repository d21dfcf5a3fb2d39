"""DP answers for public inputs, one token at a time, by a noisy vote of teachers.

The generated-answer counterpart of :mod:`dp_textgrad.privacy.voting` (after Tang et al., ICLR
2024, "Privacy-preserving in-context learning with differentially private few-shot
generation"). A label vote has a public support (the label set); a free-text answer does not,
so the vote runs per token over a PUBLIC candidate set:

- per public input (a *query*), the private records are Poisson-subsampled at rate ``q`` (a
  fresh, secret draw per query; ``q = 1``: all of them) and the sample is split into teachers by
  the keyed partition of :func:`~dp_textgrad.privacy.voting.partition_teachers` (a record's
  teacher depends on that record alone);
- at each step the wiring proposes candidates from public values only (the public model's top
  next tokens given the public input and the answer released so far, the input's own tokens,
  an end marker); each teacher (in the wiring: a prompt with its group's records as
  demonstrations) votes for one candidate or abstains; the released token is the Gaussian
  noisy argmax of the vote histogram (GNMax), appended to the answer;
- a query ends when the released token ends the answer, or after ``max_tokens`` steps.

With ``max_tokens = 1`` the same mechanism is a vote over whole answers: the wiring's candidates
are then complete answers from a public set (the spans of the public input, for extraction) and
each teacher votes for the one its own answer equals.

Sensitivity: one record more or less changes one teacher's group, so at each step one vote
moves between two cells (or to or from abstention): L2 sensitivity sqrt(2), as for labels.

Accounting is data-independent and charged once, before any record is read
(:func:`answer_by_vote`): every query is charged ``max_tokens`` steps, whether its answer ends
sooner or not (stopping is a function of released tokens, so the steps not run are steps
whose output is never used). Given the query's sample, its steps are an adaptive composition
of ``max_tokens`` Gaussian mechanisms of noise multiplier z = sigma / sqrt(2), which is exactly
a Gaussian mechanism of multiplier z / sqrt(max_tokens) (Gaussian differential privacy composes
in the sum of squares: Dong, Roth and Su 2022, Corollary 3.3). The query's event is that
Gaussian, Poisson-subsampled when ``q < 1`` (a dominating pair of the subsampled mechanism is
the subsampled dominating pair: Zhu, Dong and Wang 2022), self-composed over the queries:
``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z / sqrt(max_tokens))), Q)``.

Nothing here imports an LLM or a task: the wiring (:mod:`dp_textgrad.dp_es.dp_answers`) gives
the candidates, the teachers' votes and how a token extends an answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import dp_accounting
import numpy as np

from dp_textgrad.privacy.accounting.accountants import Accountant
from dp_textgrad.privacy.accounting.calibration import calibrate_noise_multiplier
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.validation import positive_finite, positive_int
from dp_textgrad.privacy.voting import (
    GNMax,
    LabellingPlan,
    TeacherPartition,
    Vote,
    partition_teachers,
    vote_histograms,
)

T = TypeVar("T")


def _sampling_rate(value: float) -> float:
    rate = float(value)
    if not (math.isfinite(rate) and 0.0 < rate <= 1.0):
        raise ValueError(f"sampling_rate: must be in (0, 1], got {value!r}")
    return rate


@dataclass(frozen=True)
class TokenGNMax:
    """GNMax per token over a public candidate set, ``max_tokens`` steps per query, each query on
    a Poisson subsample of rate ``sampling_rate`` (see the module docstring for the event)."""

    sigma: float
    max_tokens: int
    sampling_rate: float = 1.0

    name = "token_gnmax"
    l2_sensitivity = math.sqrt(2.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", positive_finite(self.sigma, "sigma"))
        object.__setattr__(self, "max_tokens", positive_int(self.max_tokens, "max_tokens"))
        object.__setattr__(self, "sampling_rate", _sampling_rate(self.sampling_rate))

    @property
    def noise_multiplier(self) -> float:
        """Of one step: sigma over the histogram's L2 sensitivity."""
        return self.sigma / self.l2_sensitivity

    def query_event(self) -> dp_accounting.DpEvent:
        """One query: ``max_tokens`` steps composed (one Gaussian), subsampled when q < 1."""
        steps = dp_accounting.GaussianDpEvent(self.noise_multiplier / math.sqrt(self.max_tokens))
        if self.sampling_rate == 1.0:
            return steps
        return dp_accounting.PoissonSampledDpEvent(self.sampling_rate, steps)

    def event(self, queries: int = 1) -> dp_accounting.DpEvent:
        queries = positive_int(queries, "queries")
        event = self.query_event()
        return event if queries == 1 else dp_accounting.SelfComposedDpEvent(event, queries)

    def metadata(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "sigma": self.sigma,
            "l2_sensitivity": self.l2_sensitivity,
            "noise_multiplier": self.noise_multiplier,
            "max_tokens": int(self.max_tokens),
            "sampling_rate": self.sampling_rate,
        }

    def release(self, histogram: np.ndarray, noise: NoiseSource) -> int:
        """The index of the noisy argmax of one vote histogram (one count per candidate)."""
        counts = np.asarray(histogram, dtype=float).reshape(-1)
        (index,) = GNMax(self.sigma, counts.size).release(counts, noise)
        assert index is not None  # GNMax always answers
        return index


class AnswerQuery(Protocol):
    """One public input as the wiring sees it while the teachers answer it."""

    def candidates(self, answer: str) -> Sequence[str]:
        """The public candidates for the next token after ``answer`` (public values only)."""
        ...

    def votes(self, answer: str, candidates: Sequence[str]) -> Sequence[Vote]:
        """One vote per teacher (a candidate index, or None: abstains), each a function of that
        teacher's group, the public input, ``answer`` and ``candidates``."""
        ...

    def extend(self, answer: str, token: str) -> tuple[str, bool]:
        """``answer`` with the released ``token`` appended, and whether the answer is complete
        (public: a function of released values)."""
        ...


class _Ledger(Protocol):
    def spend(self, event: dp_accounting.DpEvent, label: str, metadata: Any = ...) -> Any: ...


def _charge(ledger: _Ledger, mechanism: TokenGNMax, queries: int, teachers: int, label: str) -> None:
    ledger.spend(mechanism.event(queries), label, {**mechanism.metadata(), "queries": queries, "teachers": teachers})


def answer_by_vote(
    ledger: _Ledger,
    mechanism: TokenGNMax,
    dataset: PrivateDataset[T],
    key: bytes,
    teachers: int,
    queries: int,
    open_query: Callable[[int, TeacherPartition[T]], AnswerQuery],
    noise: NoiseSource,
    label: str = "labelling",
) -> list[str]:
    """DP answers for ``queries`` public inputs: charge ``mechanism.event(queries)`` to ``ledger``
    (before any record is read), then per query draw the subsample (``noise``'s secret sampling
    generator), split it into ``teachers`` groups (at q = 1 the whole dataset, split once for
    every query), open the query (``open_query(index, partition)``: the wiring builds its
    teachers) and release up to ``mechanism.max_tokens``
    tokens, each the noisy argmax of the teachers' votes over the public candidates.

    Returns the answers as ``extend`` built them (possibly empty). A vote outside the
    candidates is an error (it names no teacher), as a candidate set of the wrong shape is.
    """
    queries = positive_int(queries, "queries")
    teachers = positive_int(teachers, "teachers")
    _charge(ledger, mechanism, queries, teachers, label)
    # Without subsampling every answer's teachers are the same groups: partition once.
    whole = partition_teachers(dataset, key, teachers) if mechanism.sampling_rate == 1.0 else None
    answers: list[str] = []
    for index in range(queries):
        if whole is not None:
            partition = whole
        else:
            # A child generator per answer (spawned: no draw from the parent's stream), so that how
            # many records one answer's draw covered never moves the next answer's draws.
            generator = noise.sampling_generator.spawn(1)[0]
            partition = partition_teachers(dataset.poisson_subsample(mechanism.sampling_rate, generator), key, teachers)
        query = open_query(index, partition)
        answer = ""
        for _ in range(mechanism.max_tokens):
            candidates = [str(c) for c in query.candidates(answer)]
            if not candidates:
                raise ValueError("candidates: the public candidate set of a step is empty")
            votes = list(query.votes(answer, candidates))
            if len(votes) != teachers:
                raise ValueError("votes: every teacher must give one vote (or None) per step")
            histogram = vote_histograms([[v] for v in votes], len(candidates), 1)[0]
            answer, done = query.extend(answer, candidates[mechanism.release(histogram, noise)])
            if done:
                break
        answers.append(answer)
    return answers


# -- planning and calibration ----------------------------------------------------------------


def calibrate_token_gnmax(
    epsilon: float,
    delta: float,
    queries: int,
    max_tokens: int,
    sampling_rate: float = 1.0,
    *,
    accountant: Accountant | Sequence[Accountant] | None = None,
) -> float:
    """The smallest sigma (in votes) whose ``queries`` answers of ``max_tokens`` steps fit
    (epsilon, delta), with the project's calibration (the result never exceeds the target)."""
    queries = positive_int(queries, "queries")
    max_tokens = positive_int(max_tokens, "max_tokens")
    rate = _sampling_rate(sampling_rate)

    def plan(z: float) -> dp_accounting.DpEvent:
        return TokenGNMax(z * TokenGNMax.l2_sensitivity, max_tokens, rate).event(queries)

    z = calibrate_noise_multiplier(plan, epsilon, delta, accountant)
    sigma = z * TokenGNMax.l2_sensitivity
    # sigma / sqrt(2) may round below z: step up by ulps to at least the calibrated (verified) noise.
    while TokenGNMax(sigma, max_tokens, rate).noise_multiplier < z:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


@dataclass(frozen=True)
class AnsweringPlan(LabellingPlan):
    """The labelling phase of a generation task as the run's plan sees it: the token vote, the
    number of public inputs answered and of teachers (public), and the one event it charges."""

    mechanism: TokenGNMax  # type: ignore[assignment]  # narrowed: the token vote, not a label vote


__all__ = [
    "AnswerQuery",
    "AnsweringPlan",
    "TokenGNMax",
    "answer_by_vote",
    "calibrate_token_gnmax",
]
