"""Privacy events that dp-accounting 0.6.0 does not have, as plain data.

They subclass ``dp_accounting.DpEvent`` so that they nest inside dp-accounting's own
events (``PoissonSampledDpEvent``, ``ComposedDpEvent``, ``SelfComposedDpEvent``).
The accountants in ``accountant.py`` interpret them; dp-accounting's own
accountants reject them as unsupported, which is the safe failure.
"""

from __future__ import annotations

import math

import attr
import dp_accounting


@attr.s(frozen=True, slots=True, auto_attribs=True)
class PureDpEvent(dp_accounting.DpEvent):
    """An ``epsilon``-DP mechanism (delta = 0), e.g. permute-and-flip."""

    epsilon: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class GumbelTopKDpEvent(dp_accounting.DpEvent):
    """One-shot Gumbel top-k = k-fold exponential mechanism with a monotone utility.

    Each of the k picks is ``epsilon0``-DP and ``epsilon0``-bounded-range, so the
    release is ``k * epsilon0``-DP and ``k * epsilon0**2 / 8``-zCDP.
    """

    epsilon0: float
    k: int = 1

    @property
    def pure_epsilon(self) -> float:
        return self.k * self.epsilon0

    @property
    def zcdp_rho(self) -> float:
        return self.k * self.epsilon0**2 / 8.0


def amplify_pure_dp(epsilon: float, q: float) -> float:
    """Privacy amplification of a pure-DP mechanism by Poisson sampling with rate q.

    eps' = ln(1 + q (e^eps - 1)), valid for add/remove-one neighbours.
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling_rate: q must be in (0, 1], got {q}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    return math.log1p(q * math.expm1(epsilon))
