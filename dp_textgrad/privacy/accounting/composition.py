"""Composition theorems as accountants: advanced (DRV, KOV) and basic composition.

They are looser than RDP and PLD for most runs and are reported beside them: every
valid bound is shown, the smallest is used.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dp_accounting
from dp_accounting import dp_event as dpe
from scipy import special

from dp_textgrad.privacy.accounting.accountants import (
    Accountant,
    PldAccountant,
    RdpAccountant,
)
from dp_textgrad.privacy.accounting.dpa_extensions import HUGE_EPSILON
from dp_textgrad.privacy.accounting.events import (
    GumbelTopKDpEvent,
    check_delta,
    check_nonnegative,
    group_events,
    pure_epsilon_of,
    validate_events,
)


def _gaussian_delta(sigma: float, epsilon: float) -> float:
    """Exact delta of the Gaussian mechanism (sensitivity 1) at epsilon (Balle-Wang 2018, Thm 8)."""
    upper = special.log_ndtr(0.5 / sigma - epsilon * sigma)
    lower = epsilon + special.log_ndtr(-0.5 / sigma - epsilon * sigma)
    if lower >= upper:
        return 0.0
    return float(math.exp(upper) * -math.expm1(lower - upper))


def gaussian_analytic_epsilon(sigma: float, delta: float) -> float:
    """Tight epsilon of one Gaussian release with noise multiplier ``sigma`` (analytic Gaussian).

    Uses dp-accounting's ``get_epsilon_gaussian`` (Balle-Wang) and nudges the root-finder's
    answer up if needed so that the returned value is a valid upper bound.
    """
    check_nonnegative(sigma, "sigma")
    delta = check_delta(delta)
    eps = float(dp_accounting.get_epsilon_gaussian(float(sigma), delta))
    if not math.isfinite(eps) or eps == 0.0:
        return eps
    step = max(1e-12, 1e-12 * eps)
    while _gaussian_delta(float(sigma), eps) > delta:
        eps += step
        step *= 2.0
    return eps


@dataclass(frozen=True)
class _Step:
    """``count`` adaptive steps, each (epsilon, delta)-DP."""

    epsilon: float
    delta: float
    count: int


class _PerStepConverter:
    """Turns each grouped event into per-step (eps_i, delta_i) for the composition theorems.

    Pure parts: delta_i = 0. Approximate parts: the tight per-step epsilon at delta_i:
    analytic Gaussian for a plain Gaussian, otherwise the smaller of one-step PLD and RDP.
    """

    def __init__(self, pld: PldAccountant | None = None, rdp: RdpAccountant | None = None) -> None:
        self._pld: PldAccountant = PldAccountant() if pld is None else pld
        self._rdp: RdpAccountant = RdpAccountant() if rdp is None else rdp

    def supports(self, event: dpe.DpEvent) -> bool:
        for atom, _ in group_events([event]):
            if isinstance(atom, dpe.NonPrivateDpEvent) or pure_epsilon_of(atom) is not None:
                continue
            if not (self._pld.supports(atom) or self._rdp.supports(atom)):
                return False
        return True

    @staticmethod
    def split(groups: Sequence[tuple[dpe.DpEvent, int]]) -> tuple[list[_Step], list[tuple[dpe.DpEvent, int]]]:
        pure: list[_Step] = []
        approximate: list[tuple[dpe.DpEvent, int]] = []
        for atom, count in groups:
            if isinstance(atom, dpe.NonPrivateDpEvent):
                pure.append(_Step(math.inf, 0.0, count))
                continue
            if isinstance(atom, GumbelTopKDpEvent):  # k adaptive eps0-DP picks
                if atom.epsilon0 > 0.0:
                    pure.append(_Step(float(atom.epsilon0), 0.0, count * int(atom.k)))
                continue
            eps = pure_epsilon_of(atom)
            if eps is None:
                approximate.append((atom, count))
            elif eps > 0.0:
                pure.append(_Step(eps, 0.0, count))
        return pure, approximate

    def approximate_step_epsilon(self, atom: dpe.DpEvent, delta_i: float) -> float:
        if isinstance(atom, dpe.GaussianDpEvent):
            return gaussian_analytic_epsilon(atom.noise_multiplier, delta_i)
        bounds = [acc.epsilon([atom], delta_i) for acc in (self._pld, self._rdp) if acc.supports(atom)]
        return min(bounds)


def _drv_epsilon(steps: Sequence[_Step], slack_delta: float) -> float:
    """Dwork-Rothblum-Vadhan 2010, heterogeneous form:
    sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^eps_i - 1)."""
    if any(s.epsilon > HUGE_EPSILON for s in steps):
        return math.inf  # e^eps_i would overflow; the bound is vacuous anyway
    square_sum = math.fsum(s.count * s.epsilon**2 for s in steps)
    drift = math.fsum(s.count * s.epsilon * math.expm1(s.epsilon) for s in steps)
    return math.sqrt(2.0 * math.log(1.0 / slack_delta) * square_sum) + drift


def _kov_epsilon(steps: Sequence[_Step], slack_delta: float) -> float:
    """Kairouz-Oh-Viswanath 2015, Theorem 3.5 (Theorem 3.4 when all steps are equal)."""
    total = math.fsum(s.count * s.epsilon for s in steps)
    square_sum = math.fsum(s.count * s.epsilon**2 for s in steps)
    # (e^eps - 1) eps / (e^eps + 1) = eps * tanh(eps / 2), stable for large eps
    drift = math.fsum(s.count * s.epsilon * math.tanh(s.epsilon / 2.0) for s in steps)
    second = drift + math.sqrt(2.0 * square_sum * math.log(math.e + math.sqrt(square_sum) / slack_delta))
    third = drift + math.sqrt(2.0 * square_sum * math.log(1.0 / slack_delta))
    return min(total, second, third)


class AdvancedCompositionAccountant(Accountant):
    """Advanced composition over per-step (eps_i, delta_i): ``variant="drv"`` or ``"kov"``.

    Delta split: with m approximate-DP steps, delta' = slack_fraction * delta goes to the
    composition slack and each approximate step gets (1 - slack_fraction) * delta / m; with
    only pure steps all of delta is slack. At delta = 0 a pure-only sequence gets the
    basic bound sum eps_i (the theorems need delta' > 0); anything else gets inf.
    """

    VARIANTS = ("drv", "kov")

    def __init__(
        self,
        variant: str = "drv",
        slack_fraction: float = 0.5,
        *,
        pld: PldAccountant | None = None,
        rdp: RdpAccountant | None = None,
    ) -> None:
        if variant not in self.VARIANTS:
            raise ValueError(f"variant: must be one of {self.VARIANTS}, got {variant!r}")
        if not (isinstance(slack_fraction, numbers.Real) and 0.0 < slack_fraction < 1.0):
            raise ValueError(f"slack_fraction: must be in (0, 1), got {slack_fraction!r}")
        self.variant: str = variant
        self.slack_fraction: float = float(slack_fraction)
        self.name = variant
        # pld/rdp: the accountants that give per-step epsilons (share them to share their memo)
        self._converter: _PerStepConverter = _PerStepConverter(pld, rdp)

    def supports(self, event: dpe.DpEvent) -> bool:
        return self._converter.supports(event)

    def per_step_parameters(self, events: Sequence[dpe.DpEvent], delta: float) -> tuple[list[_Step], float]:
        """The per-step (eps_i, delta_i) groups and the slack delta' used for ``events``."""
        delta = check_delta(delta)
        groups = group_events(validate_events(events))
        self._require_supported(groups)
        steps, approximate = self._converter.split(groups)
        m = sum(count for _, count in approximate)
        if m == 0:
            return steps, delta
        if delta == 0.0:
            return steps + [_Step(math.inf, 0.0, m)], 0.0
        slack = self.slack_fraction * delta
        delta_i = (delta - slack) / m
        for atom, count in approximate:
            steps.append(_Step(self._converter.approximate_step_epsilon(atom, delta_i), delta_i, count))
        return steps, slack

    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        steps, slack = self.per_step_parameters(events, delta)
        steps = [s for s in steps if s.epsilon > 0.0]
        if not steps:
            return 0.0
        if any(math.isinf(s.epsilon) for s in steps):
            return math.inf
        if slack == 0.0:
            return math.fsum(s.count * s.epsilon for s in steps)
        if self.variant == "drv":
            return _drv_epsilon(steps, slack)
        return _kov_epsilon(steps, slack)

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.slack_fraction != 0.5:
            out["slack_fraction"] = self.slack_fraction
        return out


class BasicCompositionAccountant(Accountant):
    """Basic composition: sum of per-step eps_i; delta split equally over the approximate steps."""

    def __init__(self, *, pld: PldAccountant | None = None, rdp: RdpAccountant | None = None) -> None:
        self.name = "basic"
        self._converter = _PerStepConverter(pld, rdp)

    def supports(self, event: dpe.DpEvent) -> bool:
        return self._converter.supports(event)

    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        delta = check_delta(delta)
        groups = group_events(validate_events(events))
        self._require_supported(groups)
        steps, approximate = self._converter.split(groups)
        m = sum(count for _, count in approximate)
        if m:
            if delta == 0.0:
                return math.inf
            for atom, count in approximate:
                steps.append(_Step(self._converter.approximate_step_epsilon(atom, delta / m), delta / m, count))
        return math.fsum(s.count * s.epsilon for s in steps)

    def config(self) -> dict[str, Any]:
        return {"name": self.name}
