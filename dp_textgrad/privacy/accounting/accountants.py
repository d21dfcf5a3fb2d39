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
    _ExtendedPldAccountant,
    _ExtendedRdpAccountant,
    _quiet_absl_convergence,
)
from dp_textgrad.privacy.accounting.events import (
    UnsupportedEventError,
    _check_delta,
    _group_events,
    _validate_events,
)

DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(rdp_lib.DEFAULT_RDP_ORDERS)
DEFAULT_PLD_DISCRETIZATION = 1e-4
_EXACT_GAUSSIAN_MIN_SIGMA = 0.5  # below this, merged plain Gaussians are self-composed instead


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
