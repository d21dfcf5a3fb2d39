"""Selection of parents: free selectors on noisy values and DP selection mechanisms.

Free (post-processing, never charged): :func:`top_k` and :func:`tournament` act on
values that are already differentially private (noisy Gaussian scores, shrunk
estimates). Charging again for them would be double counting.

DP selection (charged, release indices only) acts on utility SUMS of per-record
scores clipped to [0, C]. Adding or removing one record moves every sum by at most
C, all in the same direction: the utility is monotone with sensitivity C, so the
exponential-mechanism family uses scale C / eps0 without the usual factor 2.

- :class:`ExponentialMechanism`: one index, P(r) proportional to exp(eps0 u_r / C).
  eps0-DP and eps0-bounded-range, so zCDP eps0^2 / 8 (``GumbelTopKDpEvent(eps0, 1)``).
- :class:`GumbelTopK`: one-shot top-k of u + Gumbel(C / eps0); equal to k sequential
  exponential mechanisms without replacement: k*eps0-DP, zCDP k*eps0^2/8.
- :class:`PermuteAndFlip` (McKenna and Sheldon 2020): one index, eps0-DP
  (``PureDpEvent``), never worse expected utility than the exponential mechanism.

Each mechanism has ``.event(q)`` (wrapped in ``PoissonSampledDpEvent`` when the
utilities come from a Poisson subsample with rate q < 1), ``.select(utilities,
noise)`` and ``.sample(utilities, noise, runs)`` (many independent selections on the
same utilities at once, for audits and tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import dp_accounting
import numpy as np

from dp_textgrad.privacy.accounting.events import GumbelTopKDpEvent, PureDpEvent
from dp_textgrad.privacy.noise import NoiseSource

# -- validation helpers ---------------------------------------------------------------


def _positive_finite(value: float, field: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{field}: must be a number, got {type(value).__name__}") from None
    if not math.isfinite(number) or number <= 0.0:
        raise ValueError(f"{field}: must be a finite number > 0, got {value!r}")
    return number


def _positive_int(value: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{field}: must be >= 1, got {value}")
    return int(value)


def _as_values(values: Sequence[float] | np.ndarray, field: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{field}: must be a non-empty 1-D sequence of numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{field}: every value must be finite (no nan or inf)")
    return array


def _check_k(k: int, num_candidates: int, field: str = "k") -> int:
    k = _positive_int(k, field)
    if k > num_candidates:
        raise ValueError(f"{field}: must be <= the number of candidates ({num_candidates}), got {k}")
    return k


def _check_q(q: float) -> float:
    q = float(q)
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sampling_rate: q must be in (0, 1], got {q}")
    return q


def _subsampled(event: dp_accounting.DpEvent, q: float) -> dp_accounting.DpEvent:
    q = _check_q(q)
    return event if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, event)


# -- free selectors (post-processing) -------------------------------------------------


def top_k(values: Sequence[float] | np.ndarray, k: int) -> list[int]:
    """Indices of the k largest values, best first (ties: lower index first). Free."""
    array = _as_values(values, "values")
    k = _check_k(k, array.size)
    order = np.argsort(-array, kind="stable")
    return [int(i) for i in order[:k]]


def tournament(values: Sequence[float] | np.ndarray, k: int, size: int, rng: np.random.Generator,
               *, distinct: bool = True) -> list[int]:
    """k tournament winners; each tournament draws ``size`` entrants without replacement. Free.

    ``rng`` is the NON-private seeded generator (selection on noisy values needs no
    secure randomness). With ``distinct`` a winner leaves the pool, so k <= number of
    candidates; otherwise winners may repeat.
    """
    array = _as_values(values, "values")
    k = _check_k(k, array.size) if distinct else _positive_int(k, "k")
    size = _check_k(size, array.size, "size")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng: must be a numpy Generator (np.random.default_rng(seed))")
    pool = list(range(array.size))
    winners: list[int] = []
    for _ in range(k):
        entrants = rng.choice(len(pool), size=min(size, len(pool)), replace=False)
        best = max(entrants, key=lambda j: (array[pool[j]], -pool[j]))
        winners.append(pool[best])
        if distinct:
            pool.pop(best)
    return winners


# -- DP selection mechanisms ----------------------------------------------------------


def _utility_matrix(utilities: Sequence[float] | np.ndarray) -> np.ndarray:
    return _as_values(utilities, "utilities")


def _check_runs(runs: int) -> int:
    return _positive_int(runs, "runs")


@dataclass(frozen=True)
class ExponentialMechanism:
    """Pick one index with P(r) proportional to exp(eps0 * u_r / C) (monotone utility)."""

    epsilon0: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon0", _positive_finite(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "sensitivity", _positive_finite(self.sensitivity, "sensitivity"))

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
        object.__setattr__(self, "epsilon0", _positive_finite(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "k", _positive_int(self.k, "k"))
        object.__setattr__(self, "sensitivity", _positive_finite(self.sensitivity, "sensitivity"))

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
        k = _check_k(self.k, u.size)
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
            return noise.noisy_top_k(u, self.noise_scale, _check_k(self.k, u.size), "gumbel")
        return [int(i) for i in self.sample(utilities, noise, 1)[0]]


@dataclass(frozen=True)
class PermuteAndFlip:
    """Permute-and-flip (k = 1): visit candidates in random order, accept r with
    probability exp(eps0 (u_r - u_max) / C); the first accepted is released."""

    epsilon0: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon0", _positive_finite(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "sensitivity", _positive_finite(self.sensitivity, "sensitivity"))

    name = "permute_and_flip"
    k = 1

    @property
    def epsilon(self) -> float:
        return self.epsilon0

    def event(self, q: float = 1.0) -> dp_accounting.DpEvent:
        return _subsampled(PureDpEvent(self.epsilon0), q)

    def sample(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource, runs: int) -> np.ndarray:
        """``runs`` independent selections, shape (runs, 1).

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

    def select(self, utilities: Sequence[float] | np.ndarray, noise: NoiseSource) -> list[int]:
        if noise.secure:  # report-noisy-max with Exponential(C/eps0) noise is permute-and-flip
            return noise.noisy_top_k(_utility_matrix(utilities), self.sensitivity / self.epsilon0, 1, "exponential")
        return [int(i) for i in self.sample(utilities, noise, 1)[0]]


SelectionMechanism = ExponentialMechanism | GumbelTopK | PermuteAndFlip

__all__ = [
    "ExponentialMechanism",
    "GumbelTopK",
    "PermuteAndFlip",
    "SelectionMechanism",
    "top_k",
    "tournament",
]
