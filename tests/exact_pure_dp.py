"""Exact (epsilon, delta) of T generations of pure-DP picks, for checking the ledger.

Independent of dp-accounting and of the library's PLD code: a closed-form sum over the
outcomes of the composed dominating pair, evaluated in log space (scipy), and a
bisection for the smallest epsilon at a given delta.

What is composed (what the ledger composes, ``docs/accounting.md``):

* one generation = ``picks`` adaptive eps0-DP picks (permute-and-flip peeling, Gumbel
  top-k) on one Poisson subsample of rate q. Its dominating pair is
  (P, Q) = (q A^picks + (1 - q) B^picks, B^picks) for removal and (Q, P) for addition,
  where (A, B) is the randomized-response pair of eps0 (Kairouz, Oh and Viswanath 2015,
  Thm 2.1; Zhu, Dong and Wang 2022 for the subsampling). Only the number j of flipped
  answers matters, so one generation lives on picks + 1 outcomes;
* q = 1 is the same formula: (A^picks, B^picks), the picks-fold randomized response;
* T generations: the T-fold product of that pair. Its privacy loss depends only on how
  many generations fell on each outcome j, a multinomial count vector, so
  delta(epsilon) = sum over count vectors n of (P^T(n) - e^epsilon Q^T(n))_+, the
  optimal composition theorem's binomial sum (Kairouz, Oh and Viswanath 2015, Thm 3.3;
  Murtagh and Vadhan 2016) when picks = 1, its multinomial form otherwise.

delta(epsilon) is the larger of the two directions. The enumeration has
C(T + picks, picks) terms: fine for picks = 1 at any T, picks = 2 up to T ~ 2000,
picks = 3 up to T ~ 150.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import gammaln, logsumexp

MAX_OUTCOMES = 3_000_000


def one_generation_log_pmfs(epsilon0: float, picks: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """log P(j), log Q(j) for j = 0..picks flipped answers (P: the member's subsample mixture)."""
    j = np.arange(picks + 1, dtype=np.float64)
    log_choose = gammaln(picks + 1.0) - gammaln(j + 1.0) - gammaln(picks - j + 1.0)
    log_keep = -np.logaddexp(0.0, -epsilon0)  # log e^eps0 / (1 + e^eps0)
    log_flip = -np.logaddexp(0.0, epsilon0)
    log_a = log_choose + (picks - j) * log_keep + j * log_flip
    log_b = log_choose + j * log_keep + (picks - j) * log_flip
    if q >= 1.0:
        return log_a, log_b
    log_mixture = np.logaddexp(math.log(q) + log_a, math.log1p(-q) + log_b)
    return log_mixture, log_b


def _count_vectors(generations: int, outcomes: int) -> np.ndarray:
    """Every vector of ``outcomes`` non-negative counts summing to ``generations`` (rows)."""
    if outcomes == 1:
        return np.array([[generations]], dtype=np.int64)
    rows = []
    for first in range(generations + 1):
        rest = _count_vectors(generations - first, outcomes - 1)
        rows.append(np.hstack([np.full((rest.shape[0], 1), first, dtype=np.int64), rest]))
    return np.vstack(rows)


@lru_cache(maxsize=32)
def _composed(epsilon0: float, picks: int, q: float, generations: int):
    """Per count vector: log P^T(n), log Q^T(n) (removal direction)."""
    if math.comb(generations + picks, picks) > MAX_OUTCOMES:
        raise ValueError("too many outcomes for an exact enumeration; lower T or picks")
    log_p, log_q = one_generation_log_pmfs(epsilon0, picks, q)
    if picks == 1:
        n1 = np.arange(generations + 1, dtype=np.float64)
        counts = np.stack([generations - n1, n1], axis=1)
    else:
        counts = _count_vectors(generations, picks + 1).astype(np.float64)
    log_multinomial = gammaln(generations + 1.0) - gammaln(counts + 1.0).sum(axis=1)
    return log_multinomial + counts @ log_p, log_multinomial + counts @ log_q


def _log_hockey_stick(log_upper: np.ndarray, log_lower: np.ndarray, epsilon: float) -> float:
    """log sum (upper - e^eps lower)_+ = log sum upper (1 - e^(eps - loss)) over loss > eps."""
    loss = log_upper - log_lower
    above = loss > epsilon
    if not above.any():
        return -math.inf
    return float(logsumexp(log_upper[above] + np.log(-np.expm1(epsilon - loss[above]))))


def exact_log_delta(epsilon: float, epsilon0: float, picks: int, q: float, generations: int) -> float:
    """log delta(epsilon) of the T-fold composition, the larger of both directions."""
    log_mixture, log_absent = _composed(float(epsilon0), int(picks), float(q), int(generations))
    return max(_log_hockey_stick(log_mixture, log_absent, epsilon),
               _log_hockey_stick(log_absent, log_mixture, epsilon))


def exact_epsilon(epsilon0: float, picks: int, q: float, generations: int, delta: float,
                  rtol: float = 1e-9) -> float:
    """Smallest epsilon with delta(epsilon) <= delta (bisection; the returned value fits)."""
    log_target = math.log(delta)
    high = generations * math.log1p(q * math.expm1(picks * epsilon0))  # basic composition: delta = 0
    if exact_log_delta(0.0, epsilon0, picks, q, generations) <= log_target:
        return 0.0
    low = 0.0
    while high - low > rtol * high:
        middle = 0.5 * (low + high)
        if exact_log_delta(middle, epsilon0, picks, q, generations) <= log_target:
            high = middle
        else:
            low = middle
    return high


def exact_randomized_response_epsilon(epsilon: float, compositions: int, delta: float) -> float:
    """Exact epsilon at delta of ``compositions`` epsilon-DP steps (the KOV binomial sum)."""
    return exact_epsilon(epsilon, 1, 1.0, compositions, delta)
