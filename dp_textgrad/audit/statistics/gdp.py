"""Gaussian-DP estimate: the mu of Gaussian DP that explains an observed TPR/FPR trade-off,
converted to epsilon at delta. An ESTIMATE, never a bound.

Exported by :mod:`dp_textgrad.audit`; the bounds are in :mod:`~dp_textgrad.audit.statistics.lower_bounds`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

from dp_textgrad.audit._asdict import AsDict
from dp_textgrad.audit.statistics._bounds_common import as_scores, check_unit, counts_over


def gdp_mu(tpr: float, fpr: float) -> float:
    """mu such that mu-GDP's trade-off curve passes through (fpr, tpr): Phi^-1(TPR) - Phi^-1(FPR)."""
    check_unit("tpr", tpr)
    check_unit("fpr", fpr)
    return float(sps.norm.ppf(tpr) - sps.norm.ppf(fpr))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    if mu <= 0:
        return 0.0
    a, b = -epsilon / mu + mu / 2, -epsilon / mu - mu / 2
    return float(special.ndtr(a) - math.exp(epsilon + special.log_ndtr(b)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at which mu-GDP is (epsilon, delta)-DP (0 when delta already suffices)."""
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"mu: must be a finite number >= 0, got {mu}")
    check_unit("delta", delta)
    if mu == 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    high = 1.0
    while gdp_delta(mu, high) > delta:
        high *= 2
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, high, xtol=1e-12))


@dataclass(frozen=True)
class GdpEstimate(AsDict):
    """Gaussian-DP fit to an observed trade-off: an ESTIMATE, not a bound."""

    mu: float
    epsilon: float
    delta: float
    tpr: float
    fpr: float
    threshold: float
    kind: str = "estimate (not a bound)"


def gaussian_dp_estimate(
    member_scores: object, nonmember_scores: object, delta: float, *, smoothing: float = 0.5
) -> GdpEstimate:
    """The largest mu over thresholds ("member" iff score >= t), converted to epsilon.

    The trivial threshold that calls every score a member is skipped; identical
    scores everywhere give mu = 0.

    Rates are smoothed, (count + smoothing) / (n + 2 smoothing), so that a perfect
    separation gives a finite mu. Tuned on the same scores and without confidence
    intervals: report it as an estimate next to the bounds, never as one.
    """
    members, nonmembers = as_scores("member_scores", member_scores), as_scores("nonmember_scores", nonmember_scores)
    if not (math.isfinite(smoothing) and smoothing > 0):
        raise ValueError(f"smoothing: must be a finite number > 0, got {smoothing}")
    check_unit("delta", delta)
    # The lowest score calls everyone a member (TPR = FPR = 1): no information, but with
    # unequal group sizes smoothing would turn it into a spurious mu > 0. Skip it.
    thresholds = np.unique(np.r_[members, nonmembers])[1:]
    if thresholds.size == 0:  # every score equal: nothing tells members apart
        threshold = float(members[0])
        return GdpEstimate(0.0, 0.0, delta, 1.0, 1.0, threshold)
    fp, fn = counts_over(members, nonmembers, thresholds)
    tprs = (members.size - fn + smoothing) / (members.size + 2 * smoothing)
    fprs = (fp + smoothing) / (nonmembers.size + 2 * smoothing)
    mus = sps.norm.ppf(tprs) - sps.norm.ppf(fprs)
    best = int(np.argmax(mus))
    mu, tpr, fpr, threshold = max(float(mus[best]), 0.0), float(tprs[best]), float(fprs[best]), float(thresholds[best])
    return GdpEstimate(mu, gdp_epsilon(mu, delta), delta, tpr, fpr, threshold)
