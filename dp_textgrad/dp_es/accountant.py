"""Privacy accounting: several valid (epsilon, delta) bounds for one sequence of events.

Every accountant here is *stateless*: ``epsilon(events, delta)`` interprets a list of
``DpEvent``s (dp-accounting's own plus :mod:`dp_textgrad.dp_es.events`) and composes
them. The :class:`PrivacyLedger` keeps the events of a run, asks every accountant for
its bound, reports all of them and uses the smallest ("every valid bound reported,
the smallest used"). See ``docs/accounting.md`` for the formulas and the
dp-accounting 0.6.0 traps this module avoids.

Neighbouring relation: ``ADD_OR_REMOVE_ONE`` everywhere.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event as dpe
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant as _DpaPldAccountant
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import special

from dp_textgrad import release
from dp_textgrad.dp_es.events import GumbelTopKDpEvent, PureDpEvent, amplify_pure_dp

__all__ = [
    "Accountant",
    "AdvancedCompositionAccountant",
    "BasicCompositionAccountant",
    "BudgetExceeded",
    "DEFAULT_PLD_DISCRETIZATION",
    "DEFAULT_RDP_ORDERS",
    "LedgerEntry",
    "PldAccountant",
    "PrivacyLedger",
    "RdpAccountant",
    "UnsupportedEventError",
    "accountant_from_config",
    "calibrate_noise_multiplier",
    "calibrate_pure_epsilon",
    "default_accountants",
    "event_from_dict",
    "event_to_dict",
    "gaussian_analytic_epsilon",
    "pure_dp_rdp",
    "smallest_bound",
]

_NEIGHBOURS = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(rdp_lib.DEFAULT_RDP_ORDERS)
DEFAULT_PLD_DISCRETIZATION = 1e-4
_EXACT_GAUSSIAN_MIN_SIGMA = 0.5  # below this, merged plain Gaussians are self-composed instead
_HUGE_EPSILON = 500.0  # beyond this e^eps overflows floats; such bounds are reported as inf
_CompositionError = dp_accounting.PrivacyAccountant.CompositionErrorDetails


class UnsupportedEventError(ValueError):
    """An accountant was asked about an event it cannot interpret."""


class BudgetExceeded(RuntimeError):
    """A mechanism would exceed the privacy budget; it was not run and nothing was recorded."""

    def __init__(self, label: str, epsilon: float, budget: float, delta: float) -> None:
        self.label = label
        self.epsilon = epsilon
        self.budget = budget
        self.delta = delta
        super().__init__(
            f"privacy budget exceeded: {label!r} would raise epsilon to {epsilon:.6g} "
            f"(at delta={delta:g}), over the budget epsilon={budget:.6g}; the mechanism "
            "was not run and nothing was recorded (give a larger budget, more noise or fewer steps)"
        )


# --------------------------------------------------------------------------- validation


def _check_delta(delta: float, *, allow_zero: bool = True) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise ValueError(f"delta: must be a number in [0, 1), got {delta!r}")
    d = float(delta)
    low_ok = d >= 0.0 if allow_zero else d > 0.0
    if not (low_ok and d < 1.0):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"delta: must be in {interval}, got {delta!r}")
    return d


def _check_nonnegative(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value < 0:
        raise ValueError(f"{name}: must be a number >= 0, got {value!r}")


def _validate_event(event: Any) -> None:
    """Reject malformed parameters of the events this module interprets by hand."""
    if not isinstance(event, dpe.DpEvent):
        raise TypeError(f"event: expected a dp_accounting.DpEvent, got {type(event).__name__}")
    if isinstance(event, PureDpEvent):
        _check_nonnegative(event.epsilon, "PureDpEvent.epsilon")
    elif isinstance(event, GumbelTopKDpEvent):
        _check_nonnegative(event.epsilon0, "GumbelTopKDpEvent.epsilon0")
        if isinstance(event.k, bool) or not isinstance(event.k, numbers.Integral) or event.k < 1:
            raise ValueError(f"GumbelTopKDpEvent.k: must be an integer >= 1, got {event.k!r}")
    elif isinstance(event, dpe.PoissonSampledDpEvent):
        q = event.sampling_probability
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 <= q <= 1.0:
            raise ValueError(f"PoissonSampledDpEvent.sampling_probability: must be in [0, 1], got {q!r}")
        _validate_event(event.event)
    elif isinstance(event, dpe.SelfComposedDpEvent):
        if isinstance(event.count, bool) or not isinstance(event.count, numbers.Integral) or event.count < 0:
            raise ValueError(f"SelfComposedDpEvent.count: must be an integer >= 0, got {event.count!r}")
        _validate_event(event.event)
    elif isinstance(event, dpe.ComposedDpEvent):
        for sub in event.events:
            _validate_event(sub)


def _validate_events(events: Sequence[dpe.DpEvent]) -> list[dpe.DpEvent]:
    if isinstance(events, dpe.DpEvent):
        raise TypeError("events: pass a sequence of DpEvents, e.g. [event], not a single event")
    events = list(events)
    for event in events:
        _validate_event(event)
    return events


# --------------------------------------------------------------------------- event structure


def _group_events(events: Sequence[dpe.DpEvent]) -> list[tuple[dpe.DpEvent, int]]:
    """Flatten Composed/SelfComposed events into (atom, count) groups in a canonical order.

    Grouping identical atoms lets PLD self-compose (one FFT power instead of T
    convolutions) and RDP multiply a curve, so a long run stays fast. The order is
    canonical (sorted by a textual key) so that the same multiset of events always
    gives bit-identical numbers, whatever order it was spent in.
    """
    groups: dict[tuple[str, str], list[Any]] = {}

    def visit(event: dpe.DpEvent, count: int) -> None:
        if count == 0 or isinstance(event, dpe.NoOpDpEvent):
            return
        if isinstance(event, dpe.SelfComposedDpEvent):
            visit(event.event, count * int(event.count))
        elif isinstance(event, dpe.ComposedDpEvent):
            for sub in event.events:
                visit(sub, count)
        else:
            # attrs events may hold lists (unhashable): key on type + exact repr (floats
            # repr round-trip, so equal keys mean equal parameters).
            key = (f"{type(event).__module__}.{type(event).__qualname__}", repr(event))
            if key in groups:
                groups[key][1] += count
            else:
                groups[key] = [event, count]

    for event in events:
        visit(event, 1)
    return [(groups[k][0], groups[k][1]) for k in sorted(groups)]


def _pure_epsilon(event: dpe.DpEvent) -> float | None:
    """The epsilon of an event tree made only of pure-DP parts, or None if it has other parts.

    Pure parts compose by adding epsilons; a Poisson-subsampled pure part is amplified
    by hand: eps' = ln(1 + q (e^eps - 1)) (add/remove neighbours).
    """
    if isinstance(event, dpe.NoOpDpEvent):
        return 0.0
    if isinstance(event, PureDpEvent):
        return float(event.epsilon)
    if isinstance(event, GumbelTopKDpEvent):
        return float(event.k * event.epsilon0)
    if isinstance(event, dpe.LaplaceDpEvent):  # Laplace(b) with sensitivity 1 is (1/b)-DP
        return math.inf if event.noise_multiplier == 0 else 1.0 / float(event.noise_multiplier)
    if isinstance(event, dpe.SelfComposedDpEvent):
        inner = _pure_epsilon(event.event)
        return None if inner is None else (0.0 if event.count == 0 else event.count * inner)
    if isinstance(event, dpe.ComposedDpEvent):
        total = 0.0
        for sub in event.events:
            inner = _pure_epsilon(sub)
            if inner is None:
                return None
            total += inner
        return total
    if isinstance(event, dpe.PoissonSampledDpEvent):
        inner = _pure_epsilon(event.event)
        if inner is None:
            return None
        q = float(event.sampling_probability)
        if q == 0.0 or inner == 0.0:
            return 0.0
        if math.isinf(inner):
            return math.inf  # one included record can be revealed: no finite epsilon
        return amplify_pure_dp(inner, q)
    return None


def _contains_own_event(event: dpe.DpEvent) -> bool:
    """True if the tree holds a PureDpEvent/GumbelTopKDpEvent (dp-accounting cannot read it)."""
    if isinstance(event, (PureDpEvent, GumbelTopKDpEvent)):
        return True
    if isinstance(event, (dpe.SelfComposedDpEvent, dpe.PoissonSampledDpEvent)):
        return _contains_own_event(event.event)
    if isinstance(event, dpe.ComposedDpEvent):
        return any(_contains_own_event(e) for e in event.events)
    return False


def _effective_noise_multiplier(event: dpe.DpEvent) -> float | None:
    """Gaussians released on the same subsample act as one Gaussian: z_eff^-2 = sum z_i^-2."""
    if isinstance(event, dpe.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dpe.SelfComposedDpEvent):
        inner = _effective_noise_multiplier(event.event)
        if inner is None:
            return None
        return math.inf if event.count == 0 else inner / math.sqrt(event.count)
    if isinstance(event, dpe.ComposedDpEvent):
        inverse_sq = 0.0
        for sub in event.events:
            inner = _effective_noise_multiplier(sub)
            if inner is None:
                return None
            if inner == 0.0:
                return 0.0
            inverse_sq += 0.0 if math.isinf(inner) else inner**-2
        return math.inf if inverse_sq == 0.0 else inverse_sq**-0.5
    return None


# --------------------------------------------------------------------------- RDP curves


def pure_dp_rdp(epsilon: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Tight RDP of an epsilon-DP mechanism at each order.

    Every epsilon-DP pair of output distributions is a post-processing of binary
    randomized response with p = e^eps / (1 + e^eps) (Kairouz-Oh-Viswanath 2015,
    Thm 2.1), and Renyi divergence obeys data processing, so
    D_a <= log((e^{a eps} + e^{(1-a) eps}) / (1 + e^eps)) / (a - 1).
    """
    a = np.asarray(orders, dtype=np.float64)
    eps = float(epsilon)
    if eps == 0.0:
        return np.zeros_like(a)
    if math.isinf(eps):
        return np.full_like(a, np.inf)
    out = np.empty_like(a)
    at_one = a == 1.0
    at_inf = np.isinf(a)
    general = ~(at_one | at_inf)
    ag = a[general]
    out[general] = (np.logaddexp(ag * eps, (1.0 - ag) * eps) - np.logaddexp(0.0, eps)) / (ag - 1.0)
    out[at_one] = eps * math.tanh(eps / 2.0)  # KL divergence, the a -> 1 limit
    out[at_inf] = eps
    return np.clip(out, 0.0, eps)  # exact value lies in [0, eps]; clip rounding only


def _gumbel_top_k_rdp(epsilon0: float, k: int, orders: np.ndarray) -> np.ndarray:
    """Minimum of three valid curves for one-shot Gumbel top-k (= k exponential mechanisms).

    k-fold composition of eps0-DP, (k eps0)-DP as a whole, and bounded range:
    k eps0^2 / 8 zCDP, i.e. rho * a (Cesar-Rogers 2021).
    """
    rho = k * epsilon0**2 / 8.0
    return np.minimum.reduce(
        [k * pure_dp_rdp(epsilon0, orders), pure_dp_rdp(k * epsilon0, orders), rho * orders]
    )


# --------------------------------------------------------------------------- dp-accounting extensions


class _ExtendedRdpAccountant(rdp_lib.RdpAccountant):
    """dp-accounting's RDP accountant that also reads PureDp / GumbelTopK (also Poisson-sampled)."""

    def __init__(self, orders: Sequence[float]) -> None:
        super().__init__(orders=list(orders), neighboring_relation=_NEIGHBOURS)

    def _add(self, curve: np.ndarray, count: int) -> None:
        self._rdp = self._rdp + count * curve

    def _maybe_compose(self, event: dpe.DpEvent, count: int, do_compose: bool):
        if isinstance(event, PureDpEvent):
            if do_compose:
                self._add(pure_dp_rdp(event.epsilon, self._orders), count)
            return None
        if isinstance(event, GumbelTopKDpEvent):
            if do_compose:
                self._add(_gumbel_top_k_rdp(float(event.epsilon0), int(event.k), self._orders), count)
            return None
        if isinstance(event, dpe.PoissonSampledDpEvent) and not _supported_by_dp_accounting(
            super()._maybe_compose, event
        ):
            amplified = _pure_epsilon(event)
            if amplified is None:
                return _CompositionError(event, "Poisson-sampled subevent must be Gaussian(s) or pure DP")
            if do_compose:  # for amplified pure DP only the pure-DP curve of eps' is used
                self._add(pure_dp_rdp(amplified, self._orders), count)
            return None
        return super()._maybe_compose(event, count, do_compose)


class _ExtendedPldAccountant(_DpaPldAccountant):
    """dp-accounting's PLD accountant that also reads PureDp / GumbelTopK (also Poisson-sampled).

    A pure eps'-DP part becomes ``from_privacy_parameters(eps', 0)`` (the randomized
    response PLD, which dominates every eps'-DP mechanism), self-composed ``count`` times.
    """

    def __init__(self, value_discretization_interval: float) -> None:
        super().__init__(neighboring_relation=_NEIGHBOURS, value_discretization_interval=value_discretization_interval)

    def _compose_pure(self, epsilon: float, count: int) -> None:
        if epsilon == 0.0:
            return
        if epsilon > _HUGE_EPSILON:  # e^eps overflows in dp-accounting; inf is still a valid bound
            self._contains_non_dp_event = True
            return
        params = pld_common.DifferentialPrivacyParameters(epsilon=epsilon, delta=0.0)
        single = pld_lib.from_privacy_parameters(params, value_discretization_interval=self._value_discretization_interval)
        self._pld = self._pld.compose(single.self_compose(count) if count > 1 else single)

    def _maybe_compose(self, event: dpe.DpEvent, count: int, do_compose: bool):
        if isinstance(event, PureDpEvent):
            if do_compose:
                self._compose_pure(float(event.epsilon), count)
            return None
        if isinstance(event, GumbelTopKDpEvent):
            # one-shot top-k = k adaptive eps0-DP picks (peeling): k eps0-DP PLDs composed,
            # which is never looser than one (k eps0)-DP PLD
            if do_compose:
                self._compose_pure(float(event.epsilon0), count * int(event.k))
            return None
        if isinstance(event, dpe.PoissonSampledDpEvent) and not _supported_by_dp_accounting(
            super()._maybe_compose, event
        ):
            amplified = _pure_epsilon(event)
            if amplified is not None:
                if do_compose:
                    self._compose_pure(amplified, count)
                return None
            z_eff = _effective_noise_multiplier(event.event)
            if z_eff is None:
                return _CompositionError(event, "Poisson-sampled subevent must be Gaussian(s) or pure DP")
            if math.isinf(z_eff):
                return None
            single = dpe.PoissonSampledDpEvent(event.sampling_probability, dpe.GaussianDpEvent(z_eff))
            return super()._maybe_compose(single, count, do_compose)
        return super()._maybe_compose(event, count, do_compose)


def _supported_by_dp_accounting(parent_maybe_compose: Callable[..., Any], event: dpe.DpEvent) -> bool:
    if _contains_own_event(event):
        return False
    return parent_maybe_compose(event, 0, False) is None


# --------------------------------------------------------------------------- accountants


class _DropConvergenceWarnings(logging.Filter):
    """dp-accounting logs, for each fractional RDP order whose series does not converge,
    that it excludes that order. Excluding an order keeps the bound valid, so the
    message is noise to users; everything else from absl still gets through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


class _quiet_absl_convergence:
    _filter = _DropConvergenceWarnings()

    def __enter__(self) -> None:
        logging.getLogger("absl").addFilter(self._filter)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("absl").removeFilter(self._filter)


class Accountant(ABC):
    """A stateless interpreter of a sequence of DpEvents into one (epsilon, delta) bound."""

    name: str

    @abstractmethod
    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        """Smallest epsilon this method proves for the composition of ``events`` at ``delta``.

        ``math.inf`` where the method cannot give a bound (e.g. delta = 0 for RDP/PLD).
        Raises :class:`UnsupportedEventError` for events it cannot interpret.
        """

    @abstractmethod
    def supports(self, event: dpe.DpEvent) -> bool:
        """Whether ``epsilon`` can interpret ``event`` (recursively)."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """JSON-able description, enough for :func:`accountant_from_config` to rebuild it."""

    def _require_supported(self, groups: Sequence[tuple[dpe.DpEvent, int]]) -> None:
        for event, _ in groups:
            if not self.supports(event):
                raise UnsupportedEventError(
                    f"events: the {self.name} accountant cannot interpret {type(event).__name__} "
                    f"({event!r}); use events from dp_textgrad.dp_es.events or ones dp-accounting "
                    "supports under ADD_OR_REMOVE_ONE"
                )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config()})"


class RdpAccountant(Accountant):
    """Renyi DP (dp-accounting's RdpAccountant) plus hand-made curves for pure-DP events."""

    _CACHE_LIMIT = 256

    def __init__(self, orders: Sequence[float] | None = None) -> None:
        orders = DEFAULT_RDP_ORDERS if orders is None else tuple(float(a) for a in orders)
        if not orders or any(not a >= 1.0 for a in orders):
            raise ValueError("orders: must be a non-empty list of Renyi orders >= 1")
        self.orders = orders
        self.name = "rdp"
        self._curves: dict[tuple[str, str], np.ndarray] = {}

    def supports(self, event: dpe.DpEvent) -> bool:
        return _ExtendedRdpAccountant(self.orders).supports(event)

    def _unit_curve(self, atom: dpe.DpEvent) -> np.ndarray:
        """RDP curve of one run of ``atom`` (memoised: subsampled-Gaussian curves are slow).

        RDP composes additively, so ``count`` runs cost exactly ``count * curve``.
        """
        key = (f"{type(atom).__module__}.{type(atom).__qualname__}", repr(atom))
        curve = self._curves.get(key)
        if curve is None:
            accountant = _ExtendedRdpAccountant(self.orders)
            with _quiet_absl_convergence():
                accountant.compose(atom, 1)
            curve = accountant.rdp
            if len(self._curves) >= self._CACHE_LIMIT:
                self._curves.clear()
            self._curves[key] = curve
        return curve

    def rdp_curve(self, events: Sequence[dpe.DpEvent]) -> np.ndarray:
        """The composed RDP value at each of ``self.orders``."""
        groups = _group_events(_validate_events(events))
        self._require_supported(groups)
        total = np.zeros(len(self.orders), dtype=np.float64)
        for atom, count in groups:
            total = total + count * self._unit_curve(atom)
        return total

    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        delta = _check_delta(delta)
        curve = self.rdp_curve(events)
        eps, _ = rdp_lib.compute_epsilon(self.orders, curve, delta)
        return float(eps)

    def config(self) -> dict[str, Any]:
        if self.orders == DEFAULT_RDP_ORDERS:
            return {"name": self.name}
        return {"name": self.name, "orders": list(self.orders)}


class PldAccountant(Accountant):
    """Privacy loss distributions (dp-accounting's PLDAccountant, pessimistic estimate).

    Each distinct part is turned into a PLD once (by dp-accounting's own PLDAccountant,
    extended to our pure-DP events) and self-composed ``count`` times here, so the
    count of every event is honoured whatever dp-accounting does with it. Building a
    subsampled-Gaussian PLD is the slow step (seconds: a Python loop over ~1e5 points),
    so built PLDs are memoised, shared by all instances in the process (a calibration
    and the ledger of the run it calibrated build the same PLDs). PLDs are immutable
    values and the key is the event's full repr, so this does not change any result.
    """

    _CACHE_LIMIT = 128
    # Process-wide memo of pure results: (discretization, event type, repr, count) -> PLD.
    _shared: dict[tuple[float, str, str, int], tuple[pld_lib.PrivacyLossDistribution, bool]] = {}

    def __init__(self, value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION) -> None:
        if not (isinstance(value_discretization_interval, numbers.Real) and 0 < value_discretization_interval < 1):
            raise ValueError(
                f"value_discretization_interval: must be in (0, 1), got {value_discretization_interval!r}"
            )
        self.value_discretization_interval = float(value_discretization_interval)
        self.name = "pld"

    def supports(self, event: dpe.DpEvent) -> bool:
        return _ExtendedPldAccountant(self.value_discretization_interval).supports(event)

    def _build(self, atom: dpe.DpEvent, count: int) -> tuple[pld_lib.PrivacyLossDistribution, bool]:
        """PLD of ``count`` runs of ``atom`` and whether it is non-private (memoised)."""
        key = (self.value_discretization_interval, f"{type(atom).__module__}.{type(atom).__qualname__}",
               repr(atom), count)
        cache = PldAccountant._shared
        built = cache.get(key)
        if built is None:
            # A plain Gaussian run `count` times is one Gaussian with z / sqrt(count), which
            # dp-accounting builds exactly. Its build time grows like 1/sigma (~10 s at
            # sigma = 0.05), so for small merged sigmas self-compose the single PLD instead
            # (pessimistic as well, and cheap).
            merge_gaussian = isinstance(atom, dpe.GaussianDpEvent) and (
                atom.noise_multiplier / math.sqrt(count) >= _EXACT_GAUSSIAN_MIN_SIGMA
            )
            if count > 1 and not merge_gaussian:
                single, non_private = self._build(atom, 1)
                built = (single.self_compose(count), non_private)
            else:
                accountant = _ExtendedPldAccountant(self.value_discretization_interval)
                accountant.compose(atom, count)
                built = (accountant._pld, accountant._contains_non_dp_event)
            if len(cache) >= self._CACHE_LIMIT:
                cache.clear()
            cache[key] = built
        return built

    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        delta = _check_delta(delta)
        groups = _group_events(_validate_events(events))
        self._require_supported(groups)
        if not groups:
            return 0.0
        total: pld_lib.PrivacyLossDistribution | None = None
        for atom, count in groups:
            part, non_private = self._build(atom, count)
            if non_private:
                return math.inf
            total = part if total is None else total.compose(part)
        return float(total.get_epsilon_for_delta(delta))

    def config(self) -> dict[str, Any]:
        if self.value_discretization_interval == DEFAULT_PLD_DISCRETIZATION:
            return {"name": self.name}
        return {"name": self.name, "value_discretization_interval": self.value_discretization_interval}


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
    _check_nonnegative(sigma, "sigma")
    delta = _check_delta(delta)
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
        self._pld = PldAccountant() if pld is None else pld
        self._rdp = RdpAccountant() if rdp is None else rdp

    def supports(self, event: dpe.DpEvent) -> bool:
        for atom, _ in _group_events([event]):
            if isinstance(atom, dpe.NonPrivateDpEvent) or _pure_epsilon(atom) is not None:
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
            eps = _pure_epsilon(atom)
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
    if any(s.epsilon > _HUGE_EPSILON for s in steps):
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
        self.variant = variant
        self.slack_fraction = float(slack_fraction)
        self.name = variant
        # pld/rdp: the accountants that give per-step epsilons (share them to share their memo)
        self._converter = _PerStepConverter(pld, rdp)

    def supports(self, event: dpe.DpEvent) -> bool:
        return self._converter.supports(event)

    def per_step_parameters(self, events: Sequence[dpe.DpEvent], delta: float) -> tuple[list[_Step], float]:
        """The per-step (eps_i, delta_i) groups and the slack delta' used for ``events``."""
        delta = _check_delta(delta)
        groups = _group_events(_validate_events(events))
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
        delta = _check_delta(delta)
        groups = _group_events(_validate_events(events))
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


def default_accountants() -> list[Accountant]:
    """RDP, PLD, DRV, KOV and basic composition (fresh instances)."""
    rdp, pld = RdpAccountant(), PldAccountant()
    return [
        rdp,
        pld,
        AdvancedCompositionAccountant("drv", pld=pld, rdp=rdp),
        AdvancedCompositionAccountant("kov", pld=pld, rdp=rdp),
        BasicCompositionAccountant(pld=pld, rdp=rdp),
    ]


def accountant_from_config(
    config: Mapping[str, Any],
    *,
    pld: PldAccountant | None = None,
    rdp: RdpAccountant | None = None,
) -> Accountant:
    """Rebuild an accountant from :meth:`Accountant.config` (pld/rdp: shared per-step helpers)."""
    options = dict(config)
    name = options.pop("name", None)
    if name == "rdp":
        return RdpAccountant(**options)
    if name == "pld":
        return PldAccountant(**options)
    if name in AdvancedCompositionAccountant.VARIANTS:
        return AdvancedCompositionAccountant(name, **options, pld=pld, rdp=rdp)
    if name == "basic":
        return BasicCompositionAccountant(**options, pld=pld, rdp=rdp)
    raise ValueError(f"accountant.name: unknown accountant {name!r}; use rdp, pld, drv, kov or basic")


def _accountants_from_configs(configs: Sequence[Mapping[str, Any]]) -> list[Accountant]:
    """Rebuild a list, letting the composition baselines share the default-configured RDP/PLD."""
    built: list[Accountant | None] = [None] * len(configs)
    shared: dict[str, Any] = {}
    for i, config in enumerate(configs):
        if config.get("name") in ("rdp", "pld"):
            built[i] = accountant_from_config(config)
            if len(config) == 1:
                shared[config["name"]] = built[i]
    for i, config in enumerate(configs):
        if built[i] is None:
            built[i] = accountant_from_config(config, pld=shared.get("pld"), rdp=shared.get("rdp"))
    return [a for a in built if a is not None]


def _all_bounds(accountants: Sequence[Accountant], events: Sequence[dpe.DpEvent], delta: float) -> dict[str, float]:
    """Every accountant's bound; inf for an accountant that cannot read some event."""
    groups = _group_events(events)
    # hand every accountant the grouped form: each distinct part once, with its count
    compact = [atom if n == 1 else dpe.SelfComposedDpEvent(atom, n) for atom, n in groups]
    bounds: dict[str, float] = {}
    for accountant in accountants:
        if all(accountant.supports(atom) for atom, _ in groups):
            bounds[accountant.name] = float(accountant.epsilon(compact, delta))
        else:
            bounds[accountant.name] = math.inf
    return bounds


def smallest_bound(
    events: Sequence[dpe.DpEvent], delta: float, accountants: Sequence[Accountant] | None = None
) -> float:
    """The smallest valid epsilon among ``accountants`` (default: all five) at ``delta``."""
    accountants = default_accountants() if accountants is None else list(accountants)
    return min(_all_bounds(accountants, _validate_events(events), delta).values())


# --------------------------------------------------------------------------- event (de)serialisation


def _event_registry() -> dict[str, type]:
    registry: dict[str, type] = {}
    for value in vars(dpe).values():
        if isinstance(value, type) and issubclass(value, dpe.DpEvent) and attr.has(value):
            registry[value.__name__] = value
    registry["PureDpEvent"] = PureDpEvent
    registry["GumbelTopKDpEvent"] = GumbelTopKDpEvent
    return registry


def _encode_value(value: Any) -> Any:
    if isinstance(value, dpe.DpEvent):
        return event_to_dict(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else {"float": repr(v)}  # strict JSON has no inf/nan
    if isinstance(value, tuple):
        return {"tuple": [_encode_value(v) for v in value]}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    raise TypeError(f"event field: cannot serialise a value of type {type(value).__name__}")


def event_to_dict(event: dpe.DpEvent) -> dict[str, Any]:
    """JSON-able form of a DpEvent: ``{"type": class name, <fields>}``, nested events inline."""
    if not isinstance(event, dpe.DpEvent) or not attr.has(type(event)):
        raise TypeError(f"event: expected an attrs DpEvent, got {type(event).__name__}")
    name = type(event).__name__
    if _event_registry().get(name) is not type(event):
        raise TypeError(f"event: {name} is not a known dp-accounting or dp-textgrad event type")
    out: dict[str, Any] = {"type": name}
    for f in attr.fields(type(event)):
        out[f.name] = _encode_value(getattr(event, f.name))
    return out


def _decode_value(value: Any, registry: Mapping[str, type]) -> Any:
    if isinstance(value, dict):
        if "type" in value:
            return _event_from_dict(value, registry)
        if set(value) == {"float"}:
            return float(value["float"])
        if set(value) == {"tuple"}:
            return tuple(_decode_value(v, registry) for v in value["tuple"])
        raise ValueError(f"event field: unrecognised object {sorted(value)}")
    if isinstance(value, list):
        return [_decode_value(v, registry) for v in value]
    return value


def _event_from_dict(data: Mapping[str, Any], registry: Mapping[str, type]) -> dpe.DpEvent:
    name = data.get("type")
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:  # whitelist only: never import a module named by a file
        raise ValueError(f"event.type: unknown event type {name!r}")
    fields = {f.name for f in attr.fields(cls)}
    extra = set(data) - fields - {"type"}
    if extra:
        raise ValueError(f"event: unknown fields {sorted(extra)} for {name}")
    kwargs = {k: _decode_value(v, registry) for k, v in data.items() if k != "type"}
    return cls(**kwargs)


def event_from_dict(data: Mapping[str, Any]) -> dpe.DpEvent:
    """Inverse of :func:`event_to_dict` (only known event types are rebuilt)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"event: expected a mapping, got {type(data).__name__}")
    return _event_from_dict(data, _event_registry())


def _encode_float(x: float) -> float | str:
    return x if math.isfinite(x) else repr(float(x))


def _decode_float(x: float | str) -> float:
    return float(x)


# --------------------------------------------------------------------------- ledger


@dataclass(frozen=True)
class LedgerEntry:
    """One charged mechanism. ``epsilons``/``epsilon`` are the totals after this entry."""

    index: int
    label: str
    event: dpe.DpEvent
    event_dict: dict[str, Any]
    epsilons: dict[str, float]
    epsilon: float
    metadata: dict[str, Any] = field(default_factory=dict)
    differentially_private: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "label": self.label,
            "event": self.event_dict,
            "epsilons": {k: _encode_float(v) for k, v in self.epsilons.items()},
            "epsilon": _encode_float(self.epsilon),
            "metadata": self.metadata,
            "differentially_private": self.differentially_private,
            "note": None if self.differentially_private else "NOT differentially private (unsafe mode)",
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LedgerEntry":
        event_dict = dict(data["event"])
        return cls(
            index=int(data["index"]),
            label=str(data["label"]),
            event=event_from_dict(event_dict),
            event_dict=event_dict,
            epsilons={k: _decode_float(v) for k, v in data["epsilons"].items()},
            epsilon=_decode_float(data["epsilon"]),
            metadata=dict(data.get("metadata") or {}),
            differentially_private=bool(data.get("differentially_private", True)),
        )


_LEDGER_FORMAT = "dp-textgrad-ledger"
_LEDGER_VERSION = 1


class PrivacyLedger:
    """The privacy budget of one run: charge-before-read, every bound reported, smallest used."""

    def __init__(
        self,
        epsilon_budget: float,
        delta: float,
        accountants: Sequence[Accountant] | None = None,
    ) -> None:
        if (
            isinstance(epsilon_budget, bool)
            or not isinstance(epsilon_budget, numbers.Real)
            or not math.isfinite(epsilon_budget)
            or epsilon_budget <= 0
        ):
            raise ValueError(f"epsilon_budget: must be a finite number > 0, got {epsilon_budget!r}")
        self.epsilon_budget = float(epsilon_budget)
        self.delta = _check_delta(delta, allow_zero=False)
        accountants = default_accountants() if accountants is None else list(accountants)
        if not accountants:
            raise ValueError("accountants: give at least one accountant (or None for the defaults)")
        names = [a.name for a in accountants]
        if len(set(names)) != len(names):
            raise ValueError(f"accountants: names must be unique, got {names}")
        self.accountants: tuple[Accountant, ...] = tuple(accountants)
        self._entries: list[LedgerEntry] = []
        self._unsafe_reasons: list[str] = []
        # What draws the run's noise (set by the optimizer; the header says it, e.g. when insecure).
        self.noise: str | None = None
        self._cache_key: tuple | None = None
        self._cache_value: dict[str, float] | None = None
        # Where the ledger persists itself after every charge (None: in memory only).
        self.persist_path: str | None = None

    def persist_to(self, path: str | os.PathLike[str] | None) -> None:
        """Write the ledger to ``path`` now and again after every charge, before data is read.

        A crash or kill in the middle of a mechanism then never loses its charge, so a
        resumed run cannot spend the same budget twice.
        """
        self.persist_path = None if path is None else os.fspath(path)
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    # -- read-only views
    @property
    def events(self) -> list[dpe.DpEvent]:
        return [e.event for e in self._entries]

    @property
    def entries(self) -> list[LedgerEntry]:
        return list(self._entries)

    @property
    def unsafe(self) -> bool:
        return bool(self._unsafe_reasons)

    @property
    def unsafe_reasons(self) -> list[str]:
        return list(self._unsafe_reasons)

    # -- bounds
    def _bounds(self, events: Sequence[dpe.DpEvent]) -> dict[str, float]:
        # can_afford(e) followed by spend(e) asks the same question: remember the last answer.
        key = tuple(
            (f"{type(ev).__module__}.{type(ev).__qualname__}", repr(ev), n) for ev, n in _group_events(events)
        )
        if key != self._cache_key or self._cache_value is None:
            self._cache_value = _all_bounds(self.accountants, events, self.delta)
            self._cache_key = key
        return dict(self._cache_value)

    def epsilons(self) -> dict[str, float]:
        """Every accountant's bound for the recorded events at the ledger's delta."""
        return self._bounds(self.events)

    def mechanism_epsilon(self) -> float:
        """Smallest bound of the recorded mechanisms alone (ignores :meth:`mark_unsafe`)."""
        return min(self.epsilons().values())

    def epsilon(self) -> float:
        """The smallest valid bound at ``delta``; ``math.inf`` once the run was marked unsafe."""
        return math.inf if self.unsafe else self.mechanism_epsilon()

    def remaining(self) -> float:
        """Budget left for mechanisms (on the mechanism bound; see :meth:`mark_unsafe`)."""
        return max(0.0, self.epsilon_budget - self.mechanism_epsilon())

    def _check_event(self, event: dpe.DpEvent) -> None:
        _validate_event(event)
        if not any(a.supports(event) for a in self.accountants):
            raise UnsupportedEventError(
                f"event: none of the ledger's accountants ({', '.join(a.name for a in self.accountants)}) "
                f"can interpret {type(event).__name__}"
            )

    def bounds_with(self, event: dpe.DpEvent) -> dict[str, float]:
        """Every bound if ``event`` were spent now (nothing is recorded)."""
        self._check_event(event)
        return self._bounds(self.events + [event])

    def can_afford(self, event: dpe.DpEvent) -> bool:
        """Whether spending ``event`` keeps the smallest bound within the budget."""
        try:
            bounds = self.bounds_with(event)
        except UnsupportedEventError:
            return False
        return min(bounds.values()) <= self.epsilon_budget

    def spend(self, event: dpe.DpEvent, label: str, metadata: Mapping[str, Any] | None = None) -> LedgerEntry:
        """Charge ``event`` BEFORE the mechanism reads any data.

        Raises :class:`BudgetExceeded` (and records nothing) if the smallest valid bound
        with the event would exceed the budget.
        """
        if not isinstance(label, str) or not label:
            raise ValueError("label: must be a non-empty string naming the mechanism")
        try:
            metadata_copy = json.loads(json.dumps(dict(metadata or {}), allow_nan=False))
        except (TypeError, ValueError) as err:
            raise ValueError(f"metadata: must be JSON-serialisable with finite numbers ({err})") from None
        event_dict = event_to_dict(event)
        bounds = self.bounds_with(event)
        smallest = min(bounds.values())
        if not smallest <= self.epsilon_budget:
            raise BudgetExceeded(label, smallest, self.epsilon_budget, self.delta)
        entry = LedgerEntry(
            index=len(self._entries),
            label=label,
            event=event,
            event_dict=event_dict,
            epsilons=bounds,
            epsilon=math.inf if self.unsafe else smallest,
            metadata=metadata_copy,
            differentially_private=not self.unsafe,
        )
        self._entries.append(entry)
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)
        return entry

    def mark_unsafe(self, reason: str) -> None:
        """Void the guarantee (e.g. raw private text reached an LLM in unsafe mode).

        Afterwards :meth:`epsilon` is ``math.inf`` and new entries say they are NOT
        differentially private. Mechanisms are still charged against the budget on the
        mechanism bound, so the run keeps its noise schedule.
        """
        if not isinstance(reason, str) or not reason:
            raise ValueError("reason: must be a non-empty string saying why the run is unsafe")
        self._unsafe_reasons.append(reason)
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    # -- persistence
    def _header(self) -> dict[str, Any]:
        return {
            "format": _LEDGER_FORMAT,
            "version": _LEDGER_VERSION,
            "epsilon_budget": self.epsilon_budget,
            "delta": self.delta,
            "accountants": [a.config() for a in self.accountants],
            "unsafe": self.unsafe,
            "unsafe_reasons": list(self._unsafe_reasons),
            "differentially_private": not self.unsafe,
            "noise": self.noise,
        }

    def declare_noise(self, sampler: str) -> None:
        """Record what draws the noise (the ledger's header states it, insecure seeds included)."""
        self.noise = sampler
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    def to_jsonl(self, path: str | os.PathLike[str]) -> None:
        """Write header + one line per entry, atomically (temp file, fsync, os.replace)."""
        path = os.fspath(path)
        lines = [json.dumps(self._header(), allow_nan=False)]
        lines += [json.dumps(release.released("ledger_entry", e.to_dict()), allow_nan=False) for e in self._entries]
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".ledger-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        try:  # make the rename itself durable where the platform allows it
            dir_fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> "PrivacyLedger":
        """Rebuild a ledger (budget, delta, accountants, entries, unsafe marks) from :meth:`to_jsonl`."""
        with open(path, encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        if not records or records[0].get("format") != _LEDGER_FORMAT:
            raise ValueError(f"path: {os.fspath(path)!r} is not a dp-textgrad ledger file")
        header = records[0]
        if header.get("version") != _LEDGER_VERSION:
            raise ValueError(f"version: unsupported ledger version {header.get('version')!r}")
        ledger = cls(
            header["epsilon_budget"],
            header["delta"],
            _accountants_from_configs(header["accountants"]),
        )
        ledger._unsafe_reasons = list(header.get("unsafe_reasons", []))
        ledger.noise = header.get("noise")
        for i, record in enumerate(records[1:]):
            entry = LedgerEntry.from_dict(record)
            if entry.index != i:
                raise ValueError(f"index: ledger entry {i} has index {entry.index}; the file is out of order")
            ledger._entries.append(entry)
        return ledger

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(epsilon_budget={self.epsilon_budget}, delta={self.delta}, "
            f"entries={len(self._entries)}, unsafe={self.unsafe})"
        )


# --------------------------------------------------------------------------- calibration


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
