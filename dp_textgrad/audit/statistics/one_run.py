"""One-run epsilon lower bound: Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1)
training run".

m canaries are each included with probability 1/2 in ONE run; the auditor makes r
guesses (in/out), v of them correct. Exported by :mod:`dp_textgrad.audit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy import stats as sps

from dp_textgrad.audit._asdict import AsDict
from dp_textgrad.audit.statistics._bounds_common import as_scores, check_count, check_unit

# Bisection stops when the bracket is this narrow (well below the 1e-3 we report).
_EPS_TOLERANCE = 1e-9
# Past this, 1 / (1 + e^-eps) is 1.0 in double precision: no finite audit can show more.
_EPS_CEILING = 60.0


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of "v or more of r guesses correct" under (epsilon, delta)-DP.

    With W ~ Binomial(r, e^eps / (1 + e^eps)) and f(k) = P[W >= k], the paper's
    theorem bounds P[correct >= v] by f(v) + 2 m delta * max_{1<=i<=m} (f(v-i) - f(v)) / i;
    f(v-i) - f(v) = P[v - i <= W < v], and i > v adds nothing (the sum stops growing).
    """
    m, r, v = check_count("m", m), check_count("r", r), check_count("v", v)
    if not v <= r <= m:
        raise ValueError(f"v, r, m: need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: must be a finite number >= 0, got {epsilon}")
    check_unit("delta", delta, open_low=False, open_high=False)
    q = special.expit(epsilon)  # accuracy of eps-DP randomised response
    beta = float(sps.binom.sf(v - 1, r, q))  # P[W >= v]
    if delta == 0 or v == 0:
        return min(1.0, beta)
    below = sps.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[W = v-1], P[W = v-2], ..., P[W = 0]
    correction = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(1.0, beta + 2 * m * delta * correction)


@dataclass(frozen=True)
class OneRunBound(AsDict):
    """Steinke-Nasr-Jagielski one-run lower bound and its inputs."""

    epsilon: float
    m: int
    r: int
    v: int
    alpha: float
    delta: float
    method: str = "steinke-nasr-jagielski one-run"


def one_run_eps_lower_bound(m: int, r: int, v: int, delta: float, alpha: float = 0.05) -> OneRunBound:
    """The largest epsilon whose one-run p-value stays below ``alpha`` (bisection).

    ``m`` canaries, each included independently with probability 1/2; the auditor
    guessed in/out for ``r`` of them (abstaining on the rest) and ``v`` guesses were right.
    """
    check_unit("alpha", alpha)
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return OneRunBound(0.0, m, r, v, alpha, delta)
    low, high = 0.0, 1.0  # invariant: p(low) < alpha <= p(high)
    while one_run_p_value(m, r, v, high, delta) < alpha:
        low, high = high, 2 * high
        if high > _EPS_CEILING:
            return OneRunBound(_EPS_CEILING, m, r, v, alpha, delta)
    while high - low > _EPS_TOLERANCE:
        mid = (low + high) / 2
        if one_run_p_value(m, r, v, mid, delta) < alpha:
            low = mid
        else:
            high = mid
    return OneRunBound(low, m, r, v, alpha, delta)


def one_run_guesses(scores: object, included: object, k_pos: int, k_neg: int) -> tuple[int, int]:
    """(r, v): guess "in" for the ``k_pos`` highest scores, "out" for the ``k_neg`` lowest.

    Fix ``k_pos`` and ``k_neg`` before looking at the scores; picking them afterwards
    to maximise the bound invalidates its confidence level.
    """
    values = as_scores("scores", scores)
    truth = np.asarray(included, dtype=bool).reshape(-1)
    if truth.size != values.size:
        raise ValueError(f"included: need one inclusion bit per score ({values.size}), got {truth.size}")
    k_pos, k_neg = check_count("k_pos", k_pos), check_count("k_neg", k_neg)
    if k_pos + k_neg > values.size:
        raise ValueError(f"k_pos, k_neg: {k_pos} + {k_neg} guesses exceed the {values.size} canaries")
    order = np.argsort(-values, kind="stable")
    guessed_in, guessed_out = order[:k_pos], order[values.size - k_neg :]
    correct = int(truth[guessed_in].sum() + (~truth[guessed_out]).sum())
    return k_pos + k_neg, correct


def one_run_bound_from_scores(
    scores: object, included: object, *, k_pos: int, k_neg: int, delta: float, alpha: float = 0.05
) -> OneRunBound:
    """One-run bound from per-canary membership scores and the inclusion mask."""
    r, v = one_run_guesses(scores, included, k_pos, k_neg)
    return one_run_eps_lower_bound(int(np.asarray(scores).size), r, v, delta, alpha)
