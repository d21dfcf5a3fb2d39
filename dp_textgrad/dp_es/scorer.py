"""DP scoring of candidate prompts on private records.

Per generation the :class:`DPScorer` charges the ledger FIRST, then draws a Poisson
subsample B (rate q, secret), and for each candidate k computes the utility sum
u_k = sum over B of clip(s_{i,k}, 0, C), where s_{i,k} is the task's raw score.

Sensitivity (add/remove one record): every u_k moves by at most C, all in the same
direction; L-infinity sensitivity C, L2 sensitivity C*sqrt(K), monotone utility.

Two ways to release something about the u_k:

- :meth:`DPScorer.score_gaussian`: all K noisy sums, u + N(0, (z C sqrt(K))^2 I),
  charged as ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``. Optionally noisy
  confusion matrices of some candidates on the SAME subsample (see
  :meth:`DPScorer.gaussian_event` for why the pair is one Gaussian mechanism).
  Everything computed from the noisy values afterwards (top-k parents, James-Stein
  shrinkage with :func:`shrink_estimates`, plots) is free post-processing.
- :meth:`DPScorer.select_private`: indices only, through a selection mechanism from
  ``selector.py`` on a fresh subsample.

Estimates divide by the PUBLIC expected batch size q*N, never by the realised |B|
(which is private).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import dp_accounting
import numpy as np
from scipy import optimize

from dp_textgrad.privacy.mechanisms import (
    GaussianScoreMechanism,
    check_sampling_rate,
    clipped_utility_sums,
    confusion_counts,
    effective_noise_multiplier,
    positive_finite,
)
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.data import PrivateScoringError

if TYPE_CHECKING:
    from dp_textgrad.dp_es.selector import SelectionMechanism
    from dp_textgrad.engines.base import Engine
    from dp_textgrad.tasks.base import ClassificationTask


class CandidateLike(Protocol):
    """What the scorer reads from a candidate (``population.Candidate`` fits)."""

    id: str
    text: str


class LedgerLike(Protocol):
    def spend(self, event: dp_accounting.DpEvent, label: str, metadata: Mapping[str, Any] | None = None) -> Any: ...


def _check_candidates(candidates: Sequence[CandidateLike]) -> list[CandidateLike]:
    candidates = list(candidates)
    if not candidates:
        raise ValueError("candidates: give at least one candidate to score")
    for position, candidate in enumerate(candidates):
        if not hasattr(candidate, "id") or not isinstance(getattr(candidate, "text", None), str):
            raise TypeError(f"candidates[{position}]: needs an .id and a .text (str), like population.Candidate")
    ids = [c.id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidates: candidate ids must be unique (deduplicate the population first)")
    return candidates


# -- release and post-processing ------------------------------------------------------


@dataclass
class NoisyScores:
    """What one Gaussian scoring round releases (all of it is DP).

    ``estimates`` = noisy_sums / (q*N): mean clipped score per record, public
    denominator. ``confusion`` (if requested) has shape (m, L, L): for each feedback
    candidate, noisy counts of [gold label, predicted label] on the same subsample.
    """

    candidate_ids: list[str]
    noisy_sums: np.ndarray
    estimates: np.ndarray
    noise_std_sum: float
    noise_std_estimate: float
    expected_batch_size: float
    confusion: np.ndarray | None = None
    confusion_candidate_ids: list[str] | None = None
    confusion_noise_std: float | None = None
    secure_noise: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (everything in it is already DP-released)."""
        return {
            "candidate_ids": list(self.candidate_ids),
            "noisy_sums": [float(v) for v in self.noisy_sums],
            "estimates": [float(v) for v in self.estimates],
            "noise_std_sum": float(self.noise_std_sum),
            "noise_std_estimate": float(self.noise_std_estimate),
            "expected_batch_size": float(self.expected_batch_size),
            "confusion": None if self.confusion is None else np.asarray(self.confusion).tolist(),
            "confusion_candidate_ids": self.confusion_candidate_ids,
            "confusion_noise_std": self.confusion_noise_std,
            "secure_noise": self.secure_noise,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NoisyScores":
        confusion = data.get("confusion")
        return cls(
            candidate_ids=list(data["candidate_ids"]),
            noisy_sums=np.asarray(data["noisy_sums"], dtype=float),
            estimates=np.asarray(data["estimates"], dtype=float),
            noise_std_sum=float(data["noise_std_sum"]),
            noise_std_estimate=float(data["noise_std_estimate"]),
            expected_batch_size=float(data["expected_batch_size"]),
            confusion=None if confusion is None else np.asarray(confusion, dtype=float),
            confusion_candidate_ids=data.get("confusion_candidate_ids"),
            confusion_noise_std=data.get("confusion_noise_std"),
            secure_noise=bool(data.get("secure_noise", True)),
        )


def shrink_estimates(means: Sequence[float] | np.ndarray,
                     variances: Sequence[float] | np.ndarray | float) -> np.ndarray:
    """Empirical-Bayes (James-Stein, positive part) shrinkage of noisy estimates. Free.

    Model: theta_k ~ N(mu, tau^2), x_k | theta_k ~ N(theta_k, v_k), v_k known (the DP
    noise variance, possibly different per candidate, e.g. after pooling several
    generations). tau^2 is the Paule-Mandel moment estimate (solve
    sum_k (x_k - mu_w)^2 / (v_k + tau^2) = K - 1, tau^2 >= 0), mu_w the
    precision-weighted grand mean with weights 1/(v_k + tau^2). Each estimate moves
    towards mu_w by B_k = min(1, (K-3)/(K-1) * v_k / (v_k + tau^2)) (Morris's
    correction for estimating mu and tau^2). With equal variances and spread above
    the noise this is exactly the positive-part James-Stein estimator with estimated
    mean, B = (K-3) v / sum (x - mean)^2. Fewer than 4 estimates: returned unchanged.
    """
    x = np.asarray(means, dtype=float).reshape(-1)
    v = np.broadcast_to(np.asarray(variances, dtype=float), x.shape).astype(float) if np.ndim(variances) == 0 \
        else np.asarray(variances, dtype=float).reshape(-1)
    if v.shape != x.shape:
        raise ValueError(f"variances: need one variance per estimate ({x.size}), got {v.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("means: every estimate must be finite")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("variances: every variance must be finite and >= 0")
    count = x.size
    if count < 4 or not np.any(v > 0):
        return x.copy()
    # Exact (noiseless) estimates get a negligible variance instead of 0, so the
    # weights stay finite; they then barely move, as they should.
    v = np.maximum(v, 1e-12 * v.max())

    def weighted(tau2: float) -> tuple[np.ndarray, float]:
        w = 1.0 / (v + tau2)
        return w, float(np.sum(w * x) / np.sum(w))

    def excess_spread(tau2: float) -> float:  # decreasing in tau2
        w, mu = weighted(tau2)
        return float(np.sum(w * (x - mu) ** 2)) - (count - 1)

    if excess_spread(0.0) <= 0.0:
        tau2 = 0.0  # no spread beyond the noise: shrink as far as allowed
    else:
        # Q(t) <= sum (x - mean)^2 / t, so Q <= K - 1 at t = S / (K - 1): a bracket.
        upper = float(np.sum((x - x.mean()) ** 2)) / (count - 1)
        tau2 = optimize.brentq(excess_spread, 0.0, upper) if excess_spread(upper) < 0.0 else upper
    _, grand_mean = weighted(tau2)
    factor = np.minimum(1.0, (count - 3) / (count - 1) * v / (v + tau2))
    return x - factor * (x - grand_mean)


# -- the scorer -----------------------------------------------------------------------


class DPScorer:
    """Scores candidate prompts on the private set with DP; every read is charged first.

    ``dataset_size`` is the public N (declared public, or a DP count); estimates
    divide by q*N. ``sampling_rng`` draws the Poisson subsample; it must be secret for
    amplification by subsampling, so it defaults to the DP noise generator.
    """

    def __init__(
        self,
        task: "ClassificationTask",
        engine: "Engine",
        ledger: LedgerLike,
        *,
        sampling_rate: float,
        dataset_size: float,
        noise: NoiseSource,
        sampling_rng: np.random.Generator | None = None,
    ) -> None:
        if not callable(getattr(ledger, "spend", None)):
            raise TypeError("ledger: needs a spend(event, label, metadata=None) method (a PrivacyLedger)")
        if not isinstance(noise, NoiseSource):
            raise TypeError("noise: must be a NoiseSource (DP noise is never drawn from a seeded public generator)")
        if sampling_rng is None:
            sampling_rng = noise.sampling_generator
        if not isinstance(sampling_rng, np.random.Generator):
            raise TypeError("sampling_rng: must be a numpy Generator")
        self.task = task
        self.engine = engine
        self.ledger = ledger
        self.sampling_rate = check_sampling_rate(sampling_rate)
        self.dataset_size = positive_finite(dataset_size, "dataset_size")
        self.noise = noise
        self.sampling_rng = sampling_rng

    @property
    def clip_bound(self) -> float:
        return float(self.task.clip_bound)

    @property
    def expected_batch_size(self) -> float:
        """q*N: the public denominator of every estimate."""
        return self.sampling_rate * self.dataset_size

    # -- planning (no data touched) -------------------------------------------------
    @staticmethod
    def gaussian_event(q: float, z: float, feedback_z: float | None = None) -> dp_accounting.DpEvent:
        """The event of one :meth:`score_gaussian` call: PoissonSampled(q, Gaussian(z_eff)).

        Why one Gaussian: the scores (L2 sensitivity C sqrt(K), noise std z C sqrt(K))
        and the m confusion matrices (each record adds 1 to one cell per matrix: L2
        sensitivity sqrt(m), noise std z_fb sqrt(m)) are computed on the same
        subsample. Divide each block by its noise std: the joint release is the
        sensitivity vector plus N(0, I) with L2 sensitivity at most
        sqrt(1/z^2 + 1/z_fb^2), i.e. one Gaussian mechanism of multiplier
        z_eff = (1/z^2 + 1/z_fb^2)^(-1/2), sampled once.
        """
        rate = check_sampling_rate(q)
        return dp_accounting.PoissonSampledDpEvent(
            rate, dp_accounting.GaussianDpEvent(effective_noise_multiplier(z, feedback_z))
        )

    # -- mechanisms (these read private data) ---------------------------------------
    def score_gaussian(
        self,
        candidates: Sequence[CandidateLike],
        noise_multiplier: float,
        label: str,
        feedback_candidates: Sequence[int] = (),
        feedback_noise_multiplier: float | None = None,
    ) -> NoisyScores:
        """Noisy utility sums of every candidate (+ optional noisy confusion matrices).

        ``feedback_candidates`` are indices into ``candidates``; their confusion
        matrices come from the same subsample and are charged with the scores as one
        Gaussian (see :meth:`gaussian_event`).
        """
        candidates = _check_candidates(candidates)
        mechanism = GaussianScoreMechanism(noise_multiplier, self.clip_bound, len(candidates))
        feedback = self._check_feedback(feedback_candidates, len(candidates))
        if feedback and feedback_noise_multiplier is None:
            raise ValueError("feedback_noise_multiplier: required when feedback_candidates are given "
                             "(the planned event must say how noisy the confusion matrices are)")
        if not feedback:
            feedback_noise_multiplier = None  # nothing released: do not charge for it
        event = self.gaussian_event(self.sampling_rate, noise_multiplier, feedback_noise_multiplier)
        self.ledger.spend(event, label, metadata={
            "mechanism": "gaussian_scores",
            "num_candidates": len(candidates),
            "candidate_ids": [str(c.id) for c in candidates],
            "noise_multiplier": mechanism.noise_multiplier,
            "feedback_candidates": len(feedback),
            "feedback_noise_multiplier": feedback_noise_multiplier,
            "effective_noise_multiplier": effective_noise_multiplier(noise_multiplier, feedback_noise_multiplier),
            "clip_bound": self.clip_bound,
            "sampling_rate": self.sampling_rate,
            "secure_noise": self.noise.secure,
        })
        # ---- private data is read only below this line, after the charge ----
        confusion_std = float(feedback_noise_multiplier) * math.sqrt(len(feedback)) if feedback else None

        def read() -> tuple[np.ndarray, np.ndarray | None]:
            sums, outcomes = self._utility_sums(candidates)
            noisy = mechanism.release(sums, self.noise)
            if not feedback:
                return noisy, None
            num_labels = len(self.task.labels)
            counts = np.stack([confusion_counts(outcomes[j].gold, outcomes[j].predicted, num_labels)
                               for j in feedback])
            return noisy, self.noise.add_gaussian(counts, confusion_std)

        noisy_sums, confusion = self._read_private(label, read)  # private per-record outcomes stay inside
        denominator = self.expected_batch_size
        return NoisyScores(
            candidate_ids=[str(c.id) for c in candidates],
            noisy_sums=noisy_sums,
            estimates=noisy_sums / denominator,
            noise_std_sum=mechanism.noise_std,
            noise_std_estimate=mechanism.noise_std / denominator,
            expected_batch_size=denominator,
            confusion=confusion,
            confusion_candidate_ids=[str(candidates[j].id) for j in feedback] if feedback else None,
            confusion_noise_std=confusion_std,
            secure_noise=self.noise.secure,
        )

    def score_exact(self, candidates: Sequence[CandidateLike], feedback_candidates: Sequence[int] = ()) -> NoisyScores:
        """NOT PRIVATE: exact scores (and confusion matrices) on a subsample, for baselines.

        Allowed only with a ledger already marked unsafe, so the run's record says it is
        not differentially private. Same subsample size and estimate as
        :meth:`score_gaussian`, with zero noise.
        """
        if not getattr(self.ledger, "unsafe", False):
            raise PermissionError("score_exact: reads private data without noise; the ledger must first be "
                                  "marked unsafe (use DPESConfig(privacy='off') for a non-private baseline)")
        candidates = _check_candidates(candidates)
        feedback = self._check_feedback(feedback_candidates, len(candidates))

        def read() -> tuple[np.ndarray, np.ndarray | None]:
            sums, outcomes = self._utility_sums(candidates)
            if not feedback:
                return sums, None
            num_labels = len(self.task.labels)
            return sums, np.stack([confusion_counts(outcomes[j].gold, outcomes[j].predicted, num_labels)
                                   for j in feedback]).astype(float)

        sums, confusion = self._read_private("exact scores (privacy off)", read)
        denominator = self.expected_batch_size
        return NoisyScores(
            candidate_ids=[str(c.id) for c in candidates],
            noisy_sums=np.asarray(sums, dtype=float),
            estimates=np.asarray(sums, dtype=float) / denominator,
            noise_std_sum=0.0,
            noise_std_estimate=0.0,
            expected_batch_size=denominator,
            confusion=confusion,
            confusion_candidate_ids=[str(candidates[j].id) for j in feedback] if feedback else None,
            confusion_noise_std=0.0 if feedback else None,
            secure_noise=self.noise.secure,
        )

    def select_private(self, candidates: Sequence[CandidateLike], mechanism: "SelectionMechanism",
                       label: str) -> list[int]:
        """Indices (into ``candidates``) chosen by a DP selection mechanism on a fresh subsample."""
        candidates = _check_candidates(candidates)
        for attribute in ("event", "select", "sensitivity", "k"):
            if not hasattr(mechanism, attribute):
                raise TypeError(f"mechanism: needs .{attribute}; "
                                "use ExponentialMechanism, GumbelTopK or PermuteAndFlip")
        if float(mechanism.sensitivity) < self.clip_bound:
            raise ValueError(f"mechanism.sensitivity: must be >= the task's clip_bound ({self.clip_bound}), "
                             f"got {mechanism.sensitivity}")
        if int(mechanism.k) > len(candidates):
            raise ValueError(f"mechanism.k: must be <= the number of candidates ({len(candidates)}), got {mechanism.k}")
        event = mechanism.event(self.sampling_rate)
        self.ledger.spend(event, label, metadata={
            "mechanism": getattr(mechanism, "name", type(mechanism).__name__),
            "num_candidates": len(candidates),
            "candidate_ids": [str(c.id) for c in candidates],
            "epsilon0": float(mechanism.epsilon0) if hasattr(mechanism, "epsilon0") else None,
            "k": int(mechanism.k),
            "sensitivity": float(mechanism.sensitivity),
            "sampling_rate": self.sampling_rate,
            "secure_noise": self.noise.secure,
        })
        # ---- private data is read only below this line, after the charge ----
        return self._read_private(label, lambda: list(mechanism.select(self._utility_sums(candidates)[0], self.noise)))

    # -- internals --------------------------------------------------------------------
    @staticmethod
    def _check_feedback(feedback_candidates: Sequence[int], num_candidates: int) -> list[int]:
        feedback = []
        for value in feedback_candidates:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"feedback_candidates: indices into candidates must be ints, got {value!r}")
            if not 0 <= value < num_candidates:
                raise ValueError(f"feedback_candidates: index {value} is outside [0, {num_candidates})")
            feedback.append(int(value))
        if len(set(feedback)) != len(feedback):
            raise ValueError("feedback_candidates: indices must be unique")
        return feedback

    @staticmethod
    def _read_private(label: str, read: Any) -> Any:
        """Run ``read`` (which touches private records) behind the error boundary.

        Any failure (an engine that times out, a record over the context, a task bug) is
        rewritten into :class:`PrivateScoringError`, whose message quotes no record and no
        private-derived number. It is raised outside the ``except`` block, so the original
        is neither its cause nor its context and no traceback printer can show it.
        """
        try:
            # Whether a warning fires can depend on the records: none leaves the boundary (the
            # preflight probe on public text shows the engine's own warnings before this).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return read()
        except Exception as exc:
            failure = PrivateScoringError(label, exc)
        raise failure

    def _utility_sums(self, candidates: list[CandidateLike]) -> tuple[np.ndarray, list[Any]]:
        """Draw the secret Poisson subsample and sum each candidate's clipped scores."""
        batch = self.task.private_train.poisson_subsample(self.sampling_rate, self.sampling_rng)
        outcomes = [self.task.private_outcomes(self.engine, str(c.text), batch) for c in candidates]
        per_record = np.zeros((len(candidates), len(batch)))
        for k, outcome in enumerate(outcomes):
            scores = np.asarray(outcome.scores, dtype=float).reshape(-1)
            if scores.size != len(batch):
                raise RuntimeError("task.private_outcomes: returned the wrong number of scores for the batch")
            per_record[k] = scores
        return clipped_utility_sums(per_record, self.clip_bound), outcomes


__all__ = [
    "DPScorer",
    "GaussianScoreMechanism",
    "NoisyScores",
    "clipped_utility_sums",
    "confusion_counts",
    "effective_noise_multiplier",
    "shrink_estimates",
]
