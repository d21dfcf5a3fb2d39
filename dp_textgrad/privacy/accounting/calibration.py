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
    has_gaussian,
)
from dp_textgrad.privacy.accounting.bounds import default_accountants, smallest_bound
from dp_textgrad.privacy.accounting.dpa_extensions import NEIGHBOURS, CompositionError
from dp_textgrad.privacy.accounting.events import (
    UnsupportedEventError,
    check_delta,
    group_events,
)


class _SmallestBoundPrivacyAccountant(dp_accounting.PrivacyAccountant):
    """Adapter so dp-accounting's ``calibrate_dp_mechanism`` searches on our smallest bound."""

    def __init__(self, accountants: Sequence[Accountant]) -> None:
        super().__init__(NEIGHBOURS)
        self._accountants = list(accountants)
        self._events: list[dpe.DpEvent] = []

    def _maybe_compose(
        self, event: dpe.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if not any(a.supports(event) for a in self._accountants):
            return CompositionError(event, "no dp-textgrad accountant supports this event")
        if do_compose and count > 0:
            self._events.append(event if count == 1 else dpe.SelfComposedDpEvent(event, count))
        return None

    def get_epsilon(self, target_delta: float) -> float:
        return smallest_bound(self._events, target_delta, self._accountants)


# The search's PLD grid, relative to epsilon (the final check uses the ledger's own grid).
_SEARCH_RELATIVE_GRID = 1e-2
_FINEST_SEARCH_GRID = 1e-6
# dp-accounting's PLD computes exp(epsilon): beyond this it overflows.
_PLD_FLOAT_LIMIT = 500.0
# Refine with the ledger's PLD when the search left more than this share of epsilon unused.
# Gaussian PLDs cost ~0.2 s per fresh point on the ledger's grid, which itself resolves epsilon
# to 0.2%: refine those to 0.1%. Pure-DP PLDs have a few points and cost little: refine far.
_REFINE_SLACK_GAUSSIAN = 1e-3
_REFINE_SLACK_PURE = 1e-5
_REFINE_STEPS = 6


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
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, numbers.Real)
        or not (math.isfinite(epsilon) and epsilon > 0)
    ):
        raise ValueError(f"epsilon: must be a finite number > 0, got {epsilon!r}")
    return float(epsilon), check_delta(delta, allow_zero=True)


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
    # The search evaluates the plan a dozen times. With the defaults it uses one PLD on a
    # grid of 1% of epsilon: a valid (pessimistic) bound, so a value found with it also fits
    # under the full set, which the final check below confirms at full precision.
    # The grid follows the target, not each answer, so the searched function has no jumps.
    grid = min(0.5, max(_FINEST_SEARCH_GRID, _SEARCH_RELATIVE_GRID * epsilon))
    probe = plan(1.0)
    # A plan without Gaussians is cheap for RDP (closed-form curves), which beats the PLD
    # for long runs of subsampled selections (bounded range): search on the smaller of both.
    cheap_rdp = [] if has_gaussian(probe) else [a for a in accountants if a.name == "rdp"]
    search = [PldAccountant(grid, relative_discretization=None), *cheap_rdp] if accountant is None else accountants
    if accountant is None and epsilon > _PLD_FLOAT_LIMIT:
        # PLD epsilons past ~709 overflow a float; RDP still answers (the full set's own
        # instance: its memo then serves the final check too).
        search = [a for a in accountants if a.name == "rdp"] or [RdpAccountant()]
    if not any(all(a.supports(atom) for atom, _ in group_events([probe])) for a in accountants):
        raise UnsupportedEventError(
            f"plan: no accountant among {[a.name for a in accountants]} can interpret the planned event"
        )
    if search is not accountants and not all(search[0].supports(atom) for atom, _ in group_events([probe])):
        search = accountants

    memo: dict[float, float] = {}

    def spent(x: float) -> float:
        if x not in memo:
            try:
                memo[x] = smallest_bound([plan(x)], delta, search)
            except (OverflowError, FloatingPointError):  # a loss range beyond floats: no usable bound
                memo[x] = math.inf
        return memo[x]

    def fits(x: float) -> bool:
        return spent(x) <= epsilon

    tight = [a for a in accountants if a.name == "pld"] + cheap_rdp or accountants

    def tight_bound(x: float) -> float:
        # The slack is judged on the bounds the search approximates (for Gaussian plans RDP
        # is rarely tighter and costs as much as the whole search, so it is left out there).
        try:
            return smallest_bound([plan(x)], delta, tight)
        except (OverflowError, FloatingPointError):
            return math.inf

    # PLD past its float range overflows slowly: RDP answers there.
    first = {"pld": 0, "rdp": 1} if epsilon <= _PLD_FLOAT_LIMIT else {"rdp": 0, "pld": 1}

    def fits_exactly(x: float) -> bool:
        # The ledger uses the smallest bound, so one accountant within the target proves it.
        # The tight ones first: they usually prove it and the loose ones are not cheaper.
        events = [plan(x)]
        for a in sorted(accountants, key=lambda a: first.get(a.name, 2)):
            try:
                if all(a.supports(atom) for atom, _ in group_events(events)) and a.epsilon(events, delta) <= epsilon:
                    return True
            except (OverflowError, FloatingPointError):
                continue
        return False

    # Bracketing probes far from the answer, where a fine grid is slow and not needed: a
    # grid relative to each answer decides fits / does not fit there (the signs are checked
    # again with the search bound below).
    rough_memo: dict[float, bool] = {}
    rough = (
        [PldAccountant(relative_discretization=_SEARCH_RELATIVE_GRID), *cheap_rdp]
        if search is not accountants and epsilon <= _PLD_FLOAT_LIMIT
        else search
    )

    def roughly_fits(x: float) -> bool:
        if x not in rough_memo:
            try:
                rough_memo[x] = smallest_bound([plan(x)], delta, rough) <= epsilon
            except (OverflowError, FloatingPointError):
                rough_memo[x] = False
        return rough_memo[x]

    # An explicit bracket with finite values at both ends (brentq cannot use inf).
    factor = 4.0 if increasing else 0.25  # moves a parameter toward spending more
    if increasing:
        # A positive lower end: mechanisms reject epsilon0 = 0 (it would select uniformly).
        good, bad = 1e-9, 1.0
        if not fits(good):
            raise ValueError(
                f"epsilon: even a negligible per-step epsilon exceeds epsilon={epsilon:g}; "
                "does the plan contain a fixed cost (e.g. final_epsilon) above the budget?"
            )
        while roughly_fits(bad):
            good, bad = bad, bad * 4.0
            if bad > 2.0**40:
                raise ValueError("epsilon: the plan fits the budget for every parameter value; nothing to calibrate")
    else:
        good = 1.0
        while not roughly_fits(good):
            good *= 4.0
            if good > 2.0**40:
                raise ValueError(
                    f"epsilon: no noise multiplier makes the plan fit epsilon={epsilon:g} at delta={delta:g} "
                    "(does the plan contain a fixed non-noise cost?); raise the budget or shorten the plan"
                )
        bad = good / 4.0
        while roughly_fits(bad):
            good, bad = bad, bad / 4.0
            if bad < 1e-12:
                return good
    # The same signs under the search bound (it may differ slightly from the rough one).
    for _ in range(60):
        if fits(good):
            break
        good, bad = good / factor, good
    for _ in range(60):
        if not fits(bad):
            break
        good, bad = bad, bad * factor
    # bisect until `bad` has a finite bound above the target, so brentq sees finite values
    for _ in range(200):
        if math.isfinite(spent(bad)):
            break
        middle = (bad + good) / 2.0
        if fits(middle):
            good = middle
        else:
            bad = middle
    if not math.isfinite(spent(bad)) or fits(bad):
        # Past `good` no accountant can evaluate the plan (floats overflow) before it reaches
        # the target: `good` is the largest value with a proven bound.
        return good if fits_exactly(good) else _shrink_until(good, fits_exactly, increasing)
    # Epsilon is close to a power law in the parameter, so a root search in log-log space
    # (Brent) needs a handful of evaluations where a linear one needs a dozen or more.
    from scipy.optimize import brentq

    def log_gap(u: float) -> float:
        return math.log(max(spent(math.exp(u)), 1e-300) / epsilon)

    lo, hi = sorted((math.log(good), math.log(bad)))
    root = float(brentq(log_gap, lo, hi, xtol=max(1e-6, tol / max(good, bad)), maxiter=60))
    value = math.exp(root)
    # Never return a value whose plan exceeds the target: verify and nudge toward `good`.
    step = tol
    while not (fits(value) and fits_exactly(value)):
        value = value + step if not increasing else value - step
        step *= 2.0
        if (not increasing and value >= good) or (increasing and value <= good):
            value = good
            break
    # (Past the PLD's float range the search used RDP alone and the result is kept as is:
    # tightening a budget of hundreds of epsilons buys nothing.)
    slack = _REFINE_SLACK_GAUSSIAN if has_gaussian(probe) else _REFINE_SLACK_PURE
    if search is not accountants and epsilon <= _PLD_FLOAT_LIMIT and tight_bound(value) < epsilon * (1.0 - slack):
        # The PLD (and RDP where cheap): any accountant within the target proves the ledger's
        # (smallest) bound, and the others cost as much as the whole search without being tighter.
        value = _refine(
            value, plan, epsilon, delta, tight, increasing=increasing, slack=slack, slope_hint=_log_slope(memo, value)
        )
    return value


def _log_slope(memo: dict[float, float], value: float) -> float | None:
    """d log(epsilon) / d log(parameter) at ``value`` from the search's two nearest evaluations."""
    near = sorted(
        (x for x, e in memo.items() if x > 0 and 0 < e < math.inf and x != value),
        key=lambda x: abs(math.log(x / value)),
    )[:1] + [value]
    if len(near) < 2 or value not in memo or not 0 < memo[value] < math.inf or memo[near[0]] == memo[value]:
        return None
    return math.log(memo[near[0]] / memo[value]) / math.log(near[0] / value)


def _shrink_until(value: float, ok: Callable[[float], bool], increasing: bool) -> float:
    for _ in range(200):
        value = value * (0.999 if increasing else 1.001)
        if ok(value):
            return value
    raise ValueError("epsilon: no parameter value with a proven bound within the target was found")


def _refine(
    value: float,
    plan: Callable[[float], dpe.DpEvent],
    epsilon: float,
    delta: float,
    accountants: Sequence[Accountant],
    *,
    increasing: bool,
    slack: float,
    slope_hint: float | None = None,
) -> float:
    """Tighten a value found with the fast search bounds, using ``accountants``.

    ``value`` fits under ``accountants`` with a little slack (the search grid is pessimistic).
    Epsilon is close to a power law in the parameter, so secant steps in log-log space land
    within ``slack`` of the target in one or two exact evaluations; every point that fits is a
    valid answer, so the best one seen is returned and the loop is capped.
    """

    def bound(x: float) -> float:
        try:
            return smallest_bound([plan(x)], delta, accountants)
        except (OverflowError, FloatingPointError):
            return math.inf

    aim = math.log(epsilon * (1.0 - slack / 5.0))  # a hair inside: rounding stays safe
    # A first guess of d log(epsilon) / d log(parameter). The search's slope is a good guess
    # for smooth plans; a stepwise one (a coarse grid against small per-step losses) gives
    # nonsense, hence the plausible range.
    default = 2.0 if increasing else -2.0
    plausible = slope_hint is not None and 0.2 <= abs(slope_hint) <= 20 and (slope_hint > 0) == increasing
    slope = slope_hint if slope_hint is not None and plausible else default
    best, best_spent = value, bound(value)
    over: tuple[float, float] | None = None  # the nearest point past the target, once seen
    u0, e0 = math.log(value), math.log(best_spent)
    for _ in range(_REFINE_STEPS):
        if best_spent >= epsilon * (1.0 - slack):
            break
        ub, eb = math.log(best), math.log(best_spent)
        if over is not None and over[1] != eb:
            # Bracketed: interpolate between the best fitting point and the nearest one past it.
            u = ub + (aim - eb) * (over[0] - ub) / (over[1] - eb)
        else:
            u = u0 + max(-0.05, min(0.05, (aim - e0) / slope))  # steps of at most 5%
        spent_u = bound(math.exp(u))
        if not math.isfinite(spent_u):
            break
        if spent_u != best_spent and u != ub:
            slope = (math.log(spent_u) - eb) / (u - ub)
            if (slope > 0) != increasing:  # grid noise: keep the known direction
                slope = default
        if spent_u <= epsilon:
            if spent_u > best_spent:
                best, best_spent = math.exp(u), spent_u
        elif over is None or abs(u - ub) < abs(over[0] - ub):
            over = (u, math.log(spent_u))
        u0, e0 = math.log(best), math.log(best_spent)
    return best


def calibrate_noise_multiplier(
    plan: Callable[[float], dpe.DpEvent],
    epsilon: float,
    delta: float,
    accountant: Accountant | Sequence[Accountant] | None = None,
    *,
    tol: float = 1e-6,
) -> float:
    """Smallest noise multiplier z (within ``tol``) such that ``plan(z)`` fits (epsilon, delta).

    ``plan`` maps z to the event of the WHOLE planned run. The bound is the smallest among
    ``accountant`` (one, a list, or None for the five defaults). The result is verified:
    the plan at the returned z never exceeds ``epsilon``.
    """
    return _calibrate(plan, epsilon, delta, accountant, increasing=False, tol=tol)


def calibrate_pure_epsilon(
    plan: Callable[[float], dpe.DpEvent],
    epsilon: float,
    delta: float,
    accountant: Accountant | Sequence[Accountant] | None = None,
    *,
    tol: float = 1e-6,
) -> float:
    """Largest per-selection epsilon0 (within ``tol``) such that ``plan(eps0)`` fits (epsilon, delta)."""
    return _calibrate(plan, epsilon, delta, accountant, increasing=True, tol=tol)
