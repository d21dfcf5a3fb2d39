"""The two tight accountants: Renyi DP and privacy loss distributions.

Every accountant is *stateless*: ``epsilon(events, delta)`` interprets a list of
``DpEvent``s and composes them. The composition-theorem baselines are in
``composition.py``; ``bounds.py`` asks all of them and keeps the smallest.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
from dp_accounting import dp_event as dpe
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dp_textgrad.privacy.accounting.dpa_extensions import (
    ExtendedPldAccountant,
    ExtendedRdpAccountant,
    pure_picks,
    quiet_absl_convergence,
)
from dp_textgrad.privacy.accounting.events import (
    GumbelTopKDpEvent,
    UnsupportedEventError,
    check_delta,
    contains_own_event,
    group_events,
    pure_epsilon_of,
    read_laplace_as_pure,
    validate_events,
)

DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(rdp_lib.DEFAULT_RDP_ORDERS)
DEFAULT_PLD_DISCRETIZATION = 1e-4
# Grid step relative to the answer: a loss grid of step h adds at most ~h per composition
# (pessimistic rounding; measured far less), so steps x compositions <= 1e-3 x epsilon keeps the
# bound within 0.1% of the fine one (measured: within 2e-6 at epsilon 4), while a large epsilon
# (a wide loss range, slow on the fine grid: 15 s at epsilon 100) stays cheap to build.
DEFAULT_PLD_RELATIVE_DISCRETIZATION = 2e-3
_COARSE_STEPS = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4)
_FINEST_STEP = 1e-7  # the finest grid a tiny epsilon is refined to
_TINY_STEPS = 100  # an epsilon under this many default grid steps is refined
_EXACT_GAUSSIAN_MIN_SIGMA = 0.5  # below this, merged plain Gaussians are self-composed instead
# Pure-DP parts (connect-the-dots PLDs, a few points each) get a grid this many times finer than
# their smallest per-step privacy loss: the discretization error then stays far below 1% of
# epsilon (measured against exact values, tests/privacy/test_pure_plan_exact.py), while a T-fold
# composition spans only ~ 2 x this many points per step, so the finer grid stays cheap.
_PURE_STEPS_PER_LOSS = 20
_FINEST_PURE_STEP = 1e-6  # a Laplace count in the same plan costs ~1 s to build on this grid
_PURE_COARSE_SHARE = 0.1  # pure plans take a coarse grid only within a tenth of r x epsilon
# Slack on delta for the float error of dp-accounting's FFT composition (see _epsilon_on). The error
# grows with the number of compositions (a T-fold power magnifies the transform's rounding T times):
# measured against the exact binomial sums of randomized-response compositions (q = 1, eps0 from 0.003
# to 0.15, T from 300 to 10000, delta 1e-10 to 1e-7; and 118 random subsampled and unsampled plans of
# up to 4000 compositions), the PLD's delta at the exact epsilon fell short by at most 6.5e-17 per
# composition (1.6e-13 for 3000 steps of 0.01). The slack is the float epsilon 2.2e-16 per
# composition, at least 1e-13.
_FFT_DELTA_NOISE = 1e-13
_FFT_DELTA_NOISE_PER_COMPOSITION = float(np.finfo(np.float64).eps)


def _parts(event: dpe.DpEvent) -> int:
    """How many PLDs composing ``event`` takes (each adds at most one grid step)."""
    if isinstance(event, dpe.ComposedDpEvent):
        return sum(_parts(e) for e in event.events)
    if isinstance(event, dpe.SelfComposedDpEvent):
        return event.count * _parts(event.event)
    if isinstance(event, GumbelTopKDpEvent):  # unsampled: k randomized-response PLDs
        return int(event.k)
    return 1


def has_gaussian(event: dpe.DpEvent) -> bool:
    if isinstance(event, dpe.GaussianDpEvent):
        return True
    inner = getattr(event, "events", None)
    if inner is not None:
        return any(has_gaussian(e) for e in inner)
    nested = getattr(event, "event", None)
    return nested is not None and has_gaussian(nested)


def _pure_loss_scale(atom: dpe.DpEvent) -> float | None:
    """The largest privacy loss of one run of a pure-DP ``atom`` (None if it is not one of ours)."""
    if not contains_own_event(atom):
        return None
    if isinstance(atom, dpe.PoissonSampledDpEvent):
        return pure_epsilon_of(atom)  # ln(1 + q (e^(m eps0) - 1)): the dominating pair's largest loss
    picks = pure_picks(atom)
    return None if not picks else min(picks)


def _pure_grid(groups: Sequence[tuple[dpe.DpEvent, int]], default: float) -> float:
    """A grid step fine enough against the smallest per-step loss of the plan's pure parts."""
    scales = [s for s in (_pure_loss_scale(atom) for atom, _ in groups) if s is not None and 0.0 < s < math.inf]
    if not scales or min(scales) / _PURE_STEPS_PER_LOSS >= default:
        return default
    wanted = min(scales) / _PURE_STEPS_PER_LOSS
    return max(_FINEST_PURE_STEP, 10.0 ** (math.floor(2.0 * math.log10(wanted)) / 2.0))


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
                    f"({event!r}); use events from dp_textgrad.privacy.accounting.events or ones dp-accounting "
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

    # Process-wide memo (orders, event type, repr) -> read-only curve: the ledger, a lifetime
    # total and a calibration each make fresh accountants for the same events.
    _curves: dict[tuple[tuple[float, ...], str, str], np.ndarray] = {}

    def supports(self, event: dpe.DpEvent) -> bool:
        return ExtendedRdpAccountant(self.orders).supports(read_laplace_as_pure(event))

    def _unit_curve(self, atom: dpe.DpEvent) -> np.ndarray:
        """RDP curve of one run of ``atom`` (memoised: subsampled-Gaussian curves are slow).

        RDP composes additively, so ``count`` runs cost exactly ``count * curve``.
        """
        key = (self.orders, f"{type(atom).__module__}.{type(atom).__qualname__}", repr(atom))
        cache = RdpAccountant._curves
        curve = cache.get(key)
        if curve is None:
            accountant = ExtendedRdpAccountant(self.orders)
            with quiet_absl_convergence():
                accountant.compose(atom, 1)
            curve = np.array(accountant.rdp, dtype=np.float64)
            curve.setflags(write=False)
            if len(cache) >= self._CACHE_LIMIT:
                cache.clear()
            cache[key] = curve
        return curve

    def rdp_curve(self, events: Sequence[dpe.DpEvent]) -> np.ndarray:
        """The composed RDP value at each of ``self.orders``."""
        groups = group_events(validate_events(events))
        self._require_supported(groups)
        total = np.zeros(len(self.orders), dtype=np.float64)
        for atom, count in groups:
            total = total + count * self._unit_curve(atom)
        return total

    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        delta = check_delta(delta)
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

    def __init__(
        self,
        value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
        relative_discretization: float | None = DEFAULT_PLD_RELATIVE_DISCRETIZATION,
    ) -> None:
        if not (isinstance(value_discretization_interval, numbers.Real) and 0 < value_discretization_interval < 1):
            raise ValueError(f"value_discretization_interval: must be in (0, 1), got {value_discretization_interval!r}")
        if relative_discretization is not None and not (
            isinstance(relative_discretization, numbers.Real) and 0 < relative_discretization < 1
        ):
            raise ValueError(f"relative_discretization: must be in (0, 1) or None, got {relative_discretization!r}")
        self.value_discretization_interval: float = float(value_discretization_interval)
        self.relative_discretization: float | None = (
            None if relative_discretization is None else float(relative_discretization)
        )
        self.name = "pld"

    def supports(self, event: dpe.DpEvent) -> bool:
        return ExtendedPldAccountant(self.value_discretization_interval).supports(read_laplace_as_pure(event))

    def _build(
        self, atom: dpe.DpEvent, count: int, interval: float | None = None
    ) -> tuple[pld_lib.PrivacyLossDistribution, bool]:
        """PLD of ``count`` runs of ``atom`` on a grid of step ``interval`` and whether it is non-private."""
        interval = self.value_discretization_interval if interval is None else interval
        key = (interval, f"{type(atom).__module__}.{type(atom).__qualname__}", repr(atom), count)
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
                single, non_private = self._build(atom, 1, interval)
                built = (single.self_compose(count), non_private)
            else:
                accountant = ExtendedPldAccountant(interval)
                accountant.compose(atom, count)
                built = (accountant._pld, accountant._contains_non_dp_event)
            if len(cache) >= self._CACHE_LIMIT:
                cache.clear()
            cache[key] = built
        return built

    def epsilon(self, events: Sequence[dpe.DpEvent], delta: float) -> float:
        """Epsilon on the finest grid needed: with ``relative_discretization`` r, coarse grids
        (0.1 down to 3e-4) are tried first and one is kept once its step times the number of
        compositions is at most r x its epsilon (r / 10 for plans made only of pure-DP parts),
        so the grid adds at most that share (every grid gives a valid, pessimistic bound; a
        finer one is only tighter). Otherwise the default grid, refined for a tiny epsilon
        and, in pure plans, to 1/20 of the smallest per-step loss and to at most r x epsilon."""
        delta = check_delta(delta)
        groups = group_events(validate_events(events))
        self._require_supported(groups)
        if not groups:
            return 0.0
        pure = self.relative_discretization is not None and not any(has_gaussian(atom) for atom, _ in groups)
        if self.relative_discretization is not None:
            # A large epsilon spans a wide loss range, slow on a fine grid. Each composition can add
            # up to one grid step (connect-the-dots never more than rounding up): bound the total by
            # r x epsilon, or a tenth of that for pure plans (cheap on the default grid unless
            # epsilon is large, and then only the coarse grid is fast).
            share = self.relative_discretization * (_PURE_COARSE_SHARE if pure else 1.0)
            compositions = sum(count * _parts(atom) for atom, count in groups)
            ceiling = math.inf  # the coarsest grid's answer bounds every finer one from above
            for step in _COARSE_STEPS:
                if step <= self.value_discretization_interval:
                    break
                if step * compositions > share * ceiling:
                    continue  # cannot pass the test below: skip building it
                epsilon = self._epsilon_on(groups, delta, step)
                if not math.isfinite(epsilon) or step * compositions <= share * epsilon:
                    return epsilon
                ceiling = min(ceiling, epsilon)
        step = self.value_discretization_interval
        if pure:
            # Pure plans: each generation's loss can be far below the default grid (a subsampled
            # pick at small q), so the grid follows the smallest per-step loss; every grid is valid.
            step = _pure_grid(groups, step)
        epsilon = self._epsilon_on(groups, delta, step)
        if pure and self.relative_discretization is not None:  # pure: r is set
            # ... and a step of at most r x epsilon (loss ranges scale with epsilon: still cheap).
            wanted = self.relative_discretization * epsilon
        elif self.relative_discretization is not None and epsilon < _TINY_STEPS * self.value_discretization_interval:
            # A tiny epsilon, a few grid steps wide: refine the grid to 1% of it (the loss range
            # is then small too, so the finer grid stays cheap); both grids give valid bounds.
            wanted = 1e-2 * epsilon
        else:
            return epsilon
        if 0.0 < wanted < step:
            finer = max(_FINEST_STEP, 10.0 ** (math.floor(2.0 * math.log10(wanted)) / 2.0))
            if finer < step:
                epsilon = min(epsilon, self._epsilon_on(groups, delta, finer))
        return epsilon

    def _epsilon_on(self, groups: Sequence[tuple[dpe.DpEvent, int]], delta: float, interval: float) -> float:
        total: pld_lib.PrivacyLossDistribution | None = None
        for atom, count in groups:
            part, non_private = self._build(atom, count, interval)
            if non_private:
                return math.inf
            total = part if total is None else total.compose(part)
        if total is None:  # no events: nothing spent (epsilon() answers this case before)
            return 0.0
        # dp-accounting composes by FFT, whose float noise moves delta either way by up to ~1e-16
        # per composition (measured against exact binomial sums, see _FFT_DELTA_NOISE_PER_COMPOSITION):
        # ask for a little less, in proportion to the compositions.
        compositions = sum(count * _parts(atom) for atom, count in groups)
        noise = max(_FFT_DELTA_NOISE, _FFT_DELTA_NOISE_PER_COMPOSITION * compositions)
        return float(total.get_epsilon_for_delta(delta - min(noise, 0.5 * delta)))

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"name": self.name}
        if self.value_discretization_interval != DEFAULT_PLD_DISCRETIZATION:
            config["value_discretization_interval"] = self.value_discretization_interval
        if self.relative_discretization != DEFAULT_PLD_RELATIVE_DISCRETIZATION:
            config["relative_discretization"] = self.relative_discretization
        return config
