"""Mechanisms: each one is its sensitivity, its sampler and its dp-accounting event, together.

The generation, the ledger and the planner all use these objects: the event charged is
the event of the object that then runs, and the planner asks the same objects, so
"plan equals runtime" holds by construction.

The private query is the utility sum u_k = sum over a Poisson subsample B of
clip(s_{i,k}, 0, C) (:func:`clipped_utility_sums`). Adding or removing one record moves
every u_k by at most C, all in the same direction: L-infinity sensitivity C, L2
sensitivity C sqrt(K), monotone. So the exponential-mechanism family uses scale
C / eps0 without the usual factor 2.

- :class:`GaussianScoreMechanism`: all K sums plus N(0, (z C sqrt(K))^2), optionally
  with noisy confusion matrices from the same subsample (one Gaussian, see
  :func:`effective_noise_multiplier`).
- :class:`ExponentialMechanism`: one index, P(r) proportional to exp(eps0 u_r / C);
  eps0-DP and eps0-bounded-range (``GumbelTopKDpEvent(eps0, 1)``).
- :class:`GumbelTopK`: one-shot top-k of u + Gumbel(C / eps0), equal to k sequential
  exponential mechanisms: k eps0-DP, zCDP k eps0^2 / 8.
- :class:`PermuteAndFlip` (McKenna and Sheldon 2020): eps0-DP per pick
  (``PureDpEvent``), never worse expected utility than the exponential mechanism;
  k picks peel one at a time.

Every mechanism has ``.event(q)`` (wrapped in ``PoissonSampledDpEvent`` for q < 1),
``.metadata()`` (public parameters for the ledger) and a release method; selections
also have ``.sample(utilities, noise, runs)`` for audits and tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np

from dp_textgrad.privacy.accounting.events import GumbelTopKDpEvent, PureDpEvent
from dp_textgrad.privacy.counting import LaplaceCountMechanism  # the dataset size's count, re-exported here
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.validation import (
    check_k,
    check_sampling_rate,
    finite_values,
    positive_finite,
    positive_int,
)


def _subsampled(event: dp_accounting.DpEvent, q: float) -> dp_accounting.DpEvent:
    q = check_sampling_rate(q)
    return event if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, event)


# -- the private query (the only place records meet the maths) --------------------------


def clipped_utility_sums(scores: np.ndarray, clip_bound: float) -> np.ndarray:
    """Utility sums u_k = sum_i clip(scores[k, i], 0, C), shape (K,) from (K, n).

    Non-finite raw scores count as 0 (nan, -inf) or C (+inf): a nan must never reach
    a release, where it would reveal that some record broke the scorer.
    """
    bound = positive_finite(clip_bound, "clip_bound")
    raw = np.asarray(scores, dtype=float)
    if raw.ndim != 2:
        raise ValueError(f"scores: expected shape (num_candidates, num_records), got {raw.shape}")
    clean = np.nan_to_num(raw, nan=0.0, posinf=bound, neginf=0.0)
    return np.clip(clean, 0.0, bound).sum(axis=1)


def confusion_counts(gold: np.ndarray, predicted: np.ndarray, num_labels: int) -> np.ndarray:
    """Counts[g, p] of records with gold label g predicted as p; one cell per record."""
    gold = np.asarray(gold, dtype=int).reshape(-1)
    predicted = np.asarray(predicted, dtype=int).reshape(-1)
    if gold.shape != predicted.shape:
        raise ValueError("predicted: must have one entry per record, like gold")
    if gold.size and (
        gold.min() < 0 or predicted.min() < 0 or gold.max() >= num_labels or predicted.max() >= num_labels
    ):
        raise ValueError(f"gold/predicted: label indices must be in [0, {num_labels})")
    counts = np.zeros((num_labels, num_labels), dtype=float)
    np.add.at(counts, (gold, predicted), 1.0)
    return counts


def effective_noise_multiplier(
    noise_multiplier: float, feedback_noise_multiplier: float | None, error_noise_multiplier: float | None = None
) -> float:
    """z_eff with 1/z_eff^2 = 1/z^2 + 1/z_fb^2 + 1/z_err^2: scores, confusion matrices and the
    count of failed records as one Gaussian.

    The scores (L2 sensitivity C sqrt(K), noise std z C sqrt(K)), m confusion matrices (each
    record adds 1 to one cell per matrix: L2 sensitivity sqrt(m), noise std z_fb sqrt(m)) and
    the count of records that failed to score (sensitivity 1, noise std z_err) come from the
    same subsample. Divide each block by its noise std: the joint release is a sensitivity
    vector of L2 norm at most sqrt(1/z^2 + 1/z_fb^2 + 1/z_err^2) plus N(0, I), i.e. one
    Gaussian mechanism of multiplier z_eff. A missing block contributes nothing.
    """
    z = positive_finite(noise_multiplier, "noise_multiplier")
    others = [
        positive_finite(value, name)
        for value, name in (
            (feedback_noise_multiplier, "feedback_noise_multiplier"),
            (error_noise_multiplier, "error_noise_multiplier"),
        )
        if value is not None
    ]
    if not others:
        return z
    return 1.0 / math.sqrt(1.0 / z**2 + sum(1.0 / other**2 for other in others))


@dataclass(frozen=True)
class GaussianScoreMechanism:
    """Release all K utility sums with N(0, (z C sqrt(K))^2) noise on each, and optionally
    noisy confusion matrices (noise std z_fb sqrt(m)) of m candidates and the noisy count of
    records that failed to score (noise std z_err; ``dp.max_error_share``) on the same subsample."""

    noise_multiplier: float
    clip_bound: float
    num_candidates: int
    feedback_noise_multiplier: float | None = None
    error_noise_multiplier: float | None = None

    name = "gaussian_scores"

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", positive_finite(self.noise_multiplier, "noise_multiplier"))
        object.__setattr__(self, "clip_bound", positive_finite(self.clip_bound, "clip_bound"))
        if (
            isinstance(self.num_candidates, bool)
            or not isinstance(self.num_candidates, (int, np.integer))
            or self.num_candidates < 1
        ):
            raise ValueError(f"num_candidates: must be an int >= 1, got {self.num_candidates!r}")
        for name in ("feedback_noise_multiplier", "error_noise_multiplier"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_finite(getattr(self, name), name))

    @property
    def l2_sensitivity(self) -> float:
        return self.clip_bound * math.sqrt(self.num_candidates)

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on each released sum: z * C * sqrt(K)."""
        return self.noise_multiplier * self.l2_sensitivity

    @property
    def releases_feedback(self) -> bool:
        return self.feedback_noise_multiplier is not None

    @property
    def releases_errors(self) -> bool:
        return self.error_noise_multiplier is not None

    @property
    def effective_noise_multiplier(self) -> float:
        return effective_noise_multiplier(
            self.noise_multiplier, self.feedback_noise_multiplier, self.error_noise_multiplier
        )

    def event(self, q: float) -> dp_accounting.DpEvent:
        gaussian = dp_accounting.GaussianDpEvent(self.effective_noise_multiplier)
        return dp_accounting.PoissonSampledDpEvent(check_sampling_rate(q), gaussian)

    def metadata(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "num_candidates": int(self.num_candidates),
            "noise_multiplier": self.noise_multiplier,
            "clip_bound": self.clip_bound,
            "feedback_noise_multiplier": self.feedback_noise_multiplier,
            **({"error_noise_multiplier": self.error_noise_multiplier} if self.releases_errors else {}),
            "effective_noise_multiplier": self.effective_noise_multiplier,
        }

    def release(self, sums: np.ndarray, noise: NoiseSource) -> np.ndarray:
        """Noisy sums; ``sums`` has shape (K,) or (runs, K) (independent noise per row)."""
        values = np.asarray(sums, dtype=float)
        if values.ndim not in (1, 2) or values.shape[-1] != self.num_candidates:
            raise ValueError(
                f"sums: expected shape ({self.num_candidates},) or (runs, {self.num_candidates}), got {values.shape}"
            )
        return noise.add_gaussian(values, self.noise_std)

    def release_errors(self, count: float, noise: NoiseSource) -> float:
        """The noisy count of records that failed to score (sensitivity 1: each record fails or not)."""
        if self.error_noise_multiplier is None:
            raise ValueError("error_noise_multiplier: this mechanism releases no count of failed records")
        return float(noise.add_gaussian(np.asarray([float(count)]), float(self.error_noise_multiplier))[0])

    def confusion_noise_std(self, matrices: int) -> float:
        if self.feedback_noise_multiplier is None:
            raise ValueError("feedback_noise_multiplier: this mechanism releases no confusion matrices")
        return float(self.feedback_noise_multiplier) * math.sqrt(matrices)

    def release_confusion(self, counts: np.ndarray, noise: NoiseSource) -> np.ndarray:
        """Noisy feedback counts, shape (m, ...): one block per feedback candidate (an L x L
        confusion matrix, or a histogram over failure categories). Each record adds one unit to
        one cell of each block, so the L2 sensitivity is sqrt(m) whatever the block's shape."""
        values = np.asarray(counts, dtype=float)
        if values.ndim not in (2, 3):
            raise ValueError(f"counts: expected shape (m, labels, labels) or (m, categories), got {values.shape}")
        return noise.add_gaussian(values, self.confusion_noise_std(values.shape[0]))


# -- DP selection mechanisms ----------------------------------------------------------


def _utility_matrix(utilities: Sequence[float] | np.ndarray) -> np.ndarray:
    return finite_values(utilities, "utilities")


def _check_runs(runs: int) -> int:
    return positive_int(runs, "runs")


@dataclass(frozen=True)
class ExponentialMechanism:
    """Pick one index with P(r) proportional to exp(eps0 * u_r / C) (monotone utility)."""

    epsilon0: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon0", positive_finite(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "sensitivity", positive_finite(self.sensitivity, "sensitivity"))

    name = "exponential"
    k = 1

    @property
    def epsilon(self) -> float:
        """Pure-DP epsilon of one selection without subsampling."""
        return self.epsilon0

    def event(self, q: float = 1.0) -> dp_accounting.DpEvent:
        return _subsampled(GumbelTopKDpEvent(self.epsilon0, 1), q)

    def sample(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource, runs: int) -> np.ndarray:
        """``runs`` independent selections, shape (runs, 1)."""
        u = _utility_matrix(utilities)
        runs = _check_runs(runs)
        logits = self.epsilon0 * (u - u.max()) / self.sensitivity  # shift: exp never overflows
        cdf = np.cumsum(np.exp(logits))
        draws = noise.uniform(runs) * cdf[-1]
        picks = np.minimum(np.searchsorted(cdf, draws, side="right"), u.size - 1)
        return picks.reshape(runs, 1)

    def select(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource) -> list[int]:
        if noise.secure:  # Gumbel-max has exactly this distribution; OpenDP samples it safely
            return noise.noisy_top_k(_utility_matrix(utilities), self.sensitivity / self.epsilon0, 1, "gumbel")
        return [int(i) for i in self.sample(utilities, noise, 1)[0]]


@dataclass(frozen=True)
class GumbelTopK:
    """One-shot top-k: add Gumbel(C / eps0) to each utility sum and take the k largest, ordered."""

    epsilon0: float
    k: int = 1
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon0", positive_finite(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "k", positive_int(self.k, "k"))
        object.__setattr__(self, "sensitivity", positive_finite(self.sensitivity, "sensitivity"))

    name = "gumbel_top_k"

    @property
    def epsilon(self) -> float:
        """Pure-DP epsilon of one release of k indices without subsampling."""
        return self.k * self.epsilon0

    @property
    def noise_scale(self) -> float:
        return self.sensitivity / self.epsilon0

    def event(self, q: float = 1.0) -> dp_accounting.DpEvent:
        return _subsampled(GumbelTopKDpEvent(self.epsilon0, self.k), q)

    def sample(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource, runs: int) -> np.ndarray:
        """``runs`` independent releases, shape (runs, k), best first in each row."""
        u = _utility_matrix(utilities)
        k = check_k(self.k, u.size)
        runs = _check_runs(runs)
        noisy = u[None, :] + noise.gumbel(self.noise_scale, (runs, u.size))
        if k == 1:
            return np.argmax(noisy, axis=1).reshape(runs, 1)
        if k < u.size:
            top = np.argpartition(-noisy, k - 1, axis=1)[:, :k]
        else:
            top = np.tile(np.arange(u.size), (runs, 1))
        order = np.argsort(-np.take_along_axis(noisy, top, axis=1), axis=1)
        return np.take_along_axis(top, order, axis=1)

    def select(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource) -> list[int]:
        if noise.secure:
            u = _utility_matrix(utilities)
            return noise.noisy_top_k(u, self.noise_scale, check_k(self.k, u.size), "gumbel")
        return [int(i) for i in self.sample(utilities, noise, 1)[0]]


@dataclass(frozen=True)
class PermuteAndFlip:
    """Permute-and-flip: visit candidates in random order, accept r with probability
    exp(eps0 (u_r - u_max) / C); the first accepted is released. With k > 1 the picks
    peel: each later pick runs on the candidates not yet chosen (k eps0-DP in all)."""

    epsilon0: float
    sensitivity: float = 1.0
    k: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon0", positive_finite(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "sensitivity", positive_finite(self.sensitivity, "sensitivity"))
        object.__setattr__(self, "k", positive_int(self.k, "k"))

    name = "permute_and_flip"

    @property
    def epsilon(self) -> float:
        return self.k * self.epsilon0

    def event(self, q: float = 1.0) -> dp_accounting.DpEvent:
        # k adaptive eps0-DP picks on one subsample: their composition is sampled once.
        pick = PureDpEvent(self.epsilon0)
        return _subsampled(pick if self.k == 1 else dp_accounting.ComposedDpEvent([pick] * self.k), q)

    def sample(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource, runs: int) -> np.ndarray:
        """``runs`` independent selections of one index, shape (runs, 1).

        Drawing every coin up front and releasing the first accepted candidate in
        permutation order has exactly the distribution of the sequential loop (later
        coins are never looked at). The maximum's coin has probability 1, so some
        candidate is always accepted.
        """
        u = _utility_matrix(utilities)
        runs = _check_runs(runs)
        accept_prob = np.exp(self.epsilon0 * (u - u.max()) / self.sensitivity)
        accept_prob[np.argmax(u)] = 1.0  # exact 1 even after float rounding
        permutation = np.argsort(noise.uniform((runs, u.size)), axis=1)
        accepted = noise.bernoulli(accept_prob[permutation])
        first = np.argmax(accepted, axis=1)  # first True in visiting order
        return permutation[np.arange(runs), first].reshape(runs, 1)

    def _pick_one(self, u: np.ndarray, noise: NoiseSource) -> int:
        if noise.secure:  # report-noisy-max with Exponential(C/eps0) noise is permute-and-flip
            return noise.noisy_top_k(u, self.sensitivity / self.epsilon0, 1, "exponential")[0]
        return int(self.sample(u, noise, 1)[0, 0])

    def select(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource) -> list[int]:
        u = _utility_matrix(utilities)
        remaining = list(range(u.size))
        picks: list[int] = []
        for _ in range(check_k(self.k, u.size)):
            chosen = remaining[self._pick_one(u[remaining], noise)]
            picks.append(chosen)
            remaining.remove(chosen)
        return picks


SelectionMechanism = ExponentialMechanism | GumbelTopK | PermuteAndFlip

# The charged selections a run can be configured with: name -> (epsilon0, k, sensitivity) -> mechanism.
SELECTION_MECHANISMS: dict[str, Callable[[float, int, float], SelectionMechanism]] = {
    "exponential": lambda epsilon0, k, sensitivity: GumbelTopK(epsilon0, k, sensitivity),
    "permute_and_flip": lambda epsilon0, k, sensitivity: PermuteAndFlip(epsilon0, sensitivity, k),
}


def selection_mechanism(name: str, epsilon0: float, k: int, sensitivity: float) -> SelectionMechanism:
    """The registered selection mechanism ``name`` (one-shot Gumbel top-k for 'exponential')."""
    try:
        build = SELECTION_MECHANISMS[name]
    except KeyError:
        raise ValueError(f"selection: unknown mechanism {name!r}; use one of {sorted(SELECTION_MECHANISMS)}") from None
    return build(epsilon0, k, sensitivity)


def selection_metadata(mechanism: SelectionMechanism) -> dict[str, Any]:
    """Public parameters of a selection for its ledger entry."""
    return {
        "mechanism": mechanism.name,
        "epsilon0": float(mechanism.epsilon0),
        "k": int(mechanism.k),
        "sensitivity": float(mechanism.sensitivity),
    }


__all__ = [
    "SELECTION_MECHANISMS",
    "ExponentialMechanism",
    "GaussianScoreMechanism",
    "GumbelTopK",
    "LaplaceCountMechanism",
    "PermuteAndFlip",
    "SelectionMechanism",
    "check_sampling_rate",
    "clipped_utility_sums",
    "confusion_counts",
    "effective_noise_multiplier",
    "positive_finite",
    "selection_mechanism",
    "selection_metadata",
]
