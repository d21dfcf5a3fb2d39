"""Calibration: the free parameter of a planned run (noise multiplier or per-selection
epsilon) such that the whole plan fits (epsilon, delta) under the smallest valid bound.

Uses dp-accounting's ``calibrate_dp_mechanism`` on an adapter accountant, then
verifies the result at full precision: a returned value never exceeds the target.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import dp_accounting
from dp_accounting import dp_event as dpe

from dp_textgrad.privacy.accounting.accountants import (
    Accountant,
    PldAccountant,
    RdpAccountant,
)
from dp_textgrad.privacy.accounting.bounds import default_accountants, smallest_bound
from dp_textgrad.privacy.accounting.dpa_extensions import _NEIGHBOURS, _CompositionError
from dp_textgrad.privacy.accounting.events import (
    UnsupportedEventError,
    _check_delta,
    _group_events,
)


class _SmallestBoundPrivacyAccountant(dp_accounting.PrivacyAccountant):
    """Adapter so dp-accounting's ``calibrate_dp_mechanism`` searches on our smallest bound."""

    def __init__(self, accountants: Sequence[Accountant]) -> None:
        super().__init__(_NEIGHBOURS)
        self._accountants = list(accountants)
        self._events: list[dpe.DpEvent] = []

    def _maybe_compose(self, event: dpe.DpEvent, count: int, do_compose: bool):
        if not any(a.supports(event) for a in self._accountants):
            return _CompositionError(event, "no dp-textgrad accountant supports this event")
        if do_compose and count > 0:
            self._events.append(event if count == 1 else dpe.SelfComposedDpEvent(event, count))
        return None

    def get_epsilon(self, target_delta: float) -> float:
        return smallest_bound(self._events, target_delta, self._accountants)


# Integer orders only: fractional-order series of subsampled Gaussians are slow to evaluate.
_SEARCH_RDP_ORDERS = tuple(float(a) for a in range(2, 65)) + (80.0, 96.0, 128.0, 256.0, 512.0)


def _resolve_accountants(accountant: Accountant | Sequence[Accountant] | None) -> list[Accountant]:
    if accountant is None:
        return default_accountants()
    if isinstance(accountant, Accountant):
        return [accountant]
    accountants = list(accountant)
    if not accountants or not all(isinstance(a, Accountant) for a in accountants):
        raise ValueError("accountant: give an Accountant, a non-empty list of them, or None")
    return accountants


def _check_target(epsilon: float, delta: float) -> tuple[float, float]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon: must be a finite number > 0, got {epsilon!r}")
    return float(epsilon), _check_delta(delta, allow_zero=True)


def _calibrate(
    plan: Callable[[float], dpe.DpEvent],
    epsilon: float,
    delta: float,
    accountant: Accountant | Sequence[Accountant] | None,
    *,
    increasing: bool,
    tol: float,
) -> float:
    """Shared search. ``increasing``: epsilon grows with the parameter (eps0) or not (z)."""
    epsilon, delta = _check_target(epsilon, delta)
    if not (isinstance(tol, numbers.Real) and tol > 0):
        raise ValueError(f"tol: must be > 0, got {tol!r}")
    accountants = _resolve_accountants(accountant)
    # The search evaluates the plan dozens of times. With the defaults it uses RDP and a
    # coarser PLD grid: both are valid (pessimistic) bounds, so a value found with them also
    # fits under the full set, which the final check below confirms at full precision.
    search = (
        [RdpAccountant(orders=_SEARCH_RDP_ORDERS), PldAccountant(value_discretization_interval=1e-3)]
        if accountant is None
        else accountants
    )
    probe = plan(1.0)
    if not any(all(a.supports(atom) for atom, _ in _group_events([probe])) for a in accountants):
        raise UnsupportedEventError(
            f"plan: no accountant among {[a.name for a in accountants]} can interpret the planned event"
        )

    def spent(x: float) -> float:
        return smallest_bound([plan(x)], delta, search)

    def fits(x: float) -> bool:
        return spent(x) <= epsilon

    def fits_exactly(x: float) -> bool:
        return smallest_bound([plan(x)], delta, accountants) <= epsilon

    # An explicit bracket with finite values at both ends (brentq cannot use inf).
    if increasing:
        # A positive lower end: mechanisms reject epsilon0 = 0 (it would select uniformly).
        good, bad = 1e-9, 1.0
        if not fits(good):
            raise ValueError(f"epsilon: even a negligible per-step epsilon exceeds epsilon={epsilon:g}; "
                             "does the plan contain a fixed cost (e.g. final_epsilon) above the budget?")
        while fits(bad):
            good, bad = bad, bad * 2.0
            if bad > 2.0**40:
                raise ValueError("epsilon: the plan fits the budget for every parameter value; nothing to calibrate")
    else:
        good = 1.0
        while not fits(good):
            good *= 2.0
            if good > 2.0**40:
                raise ValueError(
                    f"epsilon: no noise multiplier makes the plan fit epsilon={epsilon:g} at delta={delta:g} "
                    "(does the plan contain a fixed non-noise cost?); raise the budget or shorten the plan"
                )
        bad = good / 2.0
        while fits(bad):
            good, bad = bad, bad / 2.0
            if bad < 1e-12:
                return good
    # bisect until `bad` has a finite bound above the target, so brentq sees finite values
    for _ in range(200):
        if math.isfinite(spent(bad)):
            break
        middle = (bad + good) / 2.0
        if fits(middle):
            good = middle
        else:
            bad = middle
    bracket = dp_accounting.ExplicitBracketInterval(min(good, bad), max(good, bad))
    value = float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: _SmallestBoundPrivacyAccountant(search),
            plan,
            epsilon,
            delta,
            bracket_interval=bracket,
            tol=tol,
        )
    )
    # Never return a value whose plan exceeds the target: verify and nudge toward `good`.
    step = tol
    while not (fits(value) and fits_exactly(value)):
        value = value + step if not increasing else value - step
        step *= 2.0
        if (not increasing and value >= good) or (increasing and value <= good):
            value = good
            break
    if search is not accountants:
        value = _refine(value, plan, epsilon, delta, accountants, increasing=increasing, tol=tol)
    return value


def _refine(value: float, plan: Callable[[float], dpe.DpEvent], epsilon: float, delta: float,
            accountants: Sequence[Accountant], *, increasing: bool, tol: float) -> float:
    """Tighten a value found with the fast search bounds, using the full set.

    ``value`` fits under the full set. The search bounds can be a few percent looser for
    tiny per-step losses (PLD grid rounding), so look a little further with the full set;
    a few evaluations suffice because the optimum is close.
    """

    def gap(x: float) -> float:
        return smallest_bound([plan(x)], delta, accountants) - epsilon

    direction = 1.0 if increasing else -1.0
    far = value * (1.0 + direction * 0.05)
    for _ in range(6):  # find a point past the optimum
        if far > 0 and gap(far) > 0:
            break
        value = far if far > 0 else value
        far = value * (1.0 + direction * 0.05)
    else:
        return value
    lo, hi = sorted((value, far))
    try:
        from scipy.optimize import brentq

        root = float(brentq(gap, lo, hi, xtol=max(tol, 1e-5 * value), maxiter=30))
    except ValueError:
        return value
    # brentq lands within xtol on either side: step back to the safe side until it fits.
    step = max(tol, 1e-5 * value)
    while gap(root) > 0:
        root -= direction * step
        step *= 2.0
    return root if (root > value) == increasing or root == value else value


def calibrate_noise_multiplier(plan: Callable[[float], dpe.DpEvent], epsilon: float, delta: float,
                               accountant: Accountant | Sequence[Accountant] | None = None,
                               *, tol: float = 1e-6) -> float:
    """Smallest noise multiplier z (within ``tol``) such that ``plan(z)`` fits (epsilon, delta).

    ``plan`` maps z to the event of the WHOLE planned run. The bound is the smallest among
    ``accountant`` (one, a list, or None for the five defaults). The result is verified:
    the plan at the returned z never exceeds ``epsilon``.
    """
    return _calibrate(plan, epsilon, delta, accountant, increasing=False, tol=tol)


def calibrate_pure_epsilon(plan: Callable[[float], dpe.DpEvent], epsilon: float, delta: float,
                           accountant: Accountant | Sequence[Accountant] | None = None,
                           *, tol: float = 1e-6) -> float:
    """Largest per-selection epsilon0 (within ``tol``) such that ``plan(eps0)`` fits (epsilon, delta)."""
    return _calibrate(plan, epsilon, delta, accountant, increasing=True, tol=tol)
