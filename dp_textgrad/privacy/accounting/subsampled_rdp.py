"""Renyi DP of any mechanism run on a Poisson subsample, from the mechanism's own RDP curve.

Zhu and Wang (ICML 2019, "Poisson Subsampled Renyi Differential Privacy", Theorem 6):
if M is (a, eps(a))-RDP for every integer order a >= 2 under add/remove-one
neighbours, M run on a Poisson subsample of rate q satisfies, for integer a >= 2,

    (a - 1) eps_q(a) <= log[ (1 - q)^(a-1) (1 + (a - 1) q)
                             + C(a, 2) q^2 (1 - q)^(a-2) e^(eps(2))
                             + 3 sum_{l=3..a} C(a, l) q^l (1 - q)^(a-l) e^((l-1) eps(l)) ].

No other assumption on M (the factor 3 pays for the addition direction, which has no
closed form in general). The library uses it for selections whose own curve is much
better than their pure-DP curve: Gumbel top-k is k eps0^2 / 8-zCDP by bounded range
(Cesar and Rogers 2021), so over many generations at a small q this bound beats the
PLD of the pure-DP dominating pair, which cannot see bounded range. Where it is not
tighter the smallest-bound rule simply does not pick it.

Orders between integers: a -> (a - 1) eps(a) is a log moment generating function,
hence convex, so the chord through the integer bounds on each side lies above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.special import gammaln, logsumexp

# The largest integer order evaluated; larger orders get inf here (the caller takes the
# minimum with other valid curves, and orders past 1024 never decide an epsilon in practice).
MAX_INTEGER_ORDER = 1024
_LOG3 = math.log(3.0)


def _log_binomial(n: int, ks: np.ndarray) -> np.ndarray:
    return gammaln(n + 1.0) - gammaln(ks + 1.0) - gammaln(n - ks + 1.0)


def _integer_cgf(order: int, q: float, base: np.ndarray) -> float:
    """The bracketed log above at integer ``order`` (>= 2); ``base[l - 2]`` = eps(l)."""
    log_q, log_keep = math.log(q), math.log1p(-q)
    terms = [
        (order - 1) * log_keep + math.log1p((order - 1) * q),
        float(_log_binomial(order, np.array(2.0))) + 2.0 * log_q + (order - 2) * log_keep + base[0],
    ]
    if order >= 3:
        ells = np.arange(3, order + 1, dtype=np.float64)
        higher = (
            _LOG3
            + _log_binomial(order, ells)
            + ells * log_q
            + (order - ells) * log_keep
            + (ells - 1.0) * base[1 : order - 1]
        )
        terms.extend(higher.tolist())
    return float(logsumexp(terms))


def poisson_subsampled_rdp(
    base_rdp: Callable[[np.ndarray], np.ndarray], q: float, orders: np.ndarray | list[float]
) -> np.ndarray:
    """RDP at each of ``orders`` of a mechanism with RDP curve ``base_rdp`` on a Poisson subsample.

    ``base_rdp`` maps an array of integer orders to the mechanism's RDP there (valid in
    both directions of add/remove). Orders above :data:`MAX_INTEGER_ORDER` (or infinite)
    get ``inf``: a valid, useless bound.
    """
    a = np.asarray(orders, dtype=np.float64)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling_probability: must be in [0, 1], got {q!r}")
    if np.any(a < 1.0):
        raise ValueError("orders: Renyi orders must be >= 1")
    if q == 0.0:
        return np.zeros_like(a)
    if q == 1.0:
        return np.asarray(base_rdp(a), dtype=np.float64)
    usable = a <= MAX_INTEGER_ORDER
    if not usable.any():
        return np.full_like(a, np.inf)
    needed = {2}
    for x in a[usable]:
        needed.update({max(2, math.floor(x)), max(2, math.ceil(x))})
    top = max(needed)
    base = np.asarray(base_rdp(np.arange(2, top + 1, dtype=np.float64)), dtype=np.float64)
    cgf = {m: _integer_cgf(m, q, base) for m in sorted(needed)}
    out = np.full_like(a, np.inf)
    for i, x in enumerate(a):
        if not usable[i]:
            continue
        if x <= 2.0:  # chord from (1, 0) to (2, cgf(2)); the KL (x = 1) is below its slope
            out[i] = cgf[2]
            continue
        low, high = math.floor(x), math.ceil(x)
        if low == high:
            out[i] = cgf[low] / (x - 1.0)
        else:
            out[i] = ((high - x) * cgf[low] + (x - low) * cgf[high]) / (x - 1.0)
    return np.maximum(out, 0.0)
