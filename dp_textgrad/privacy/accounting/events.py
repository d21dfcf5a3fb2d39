"""Privacy events that dp-accounting 0.6.0 does not have, as plain data.

They subclass ``dp_accounting.DpEvent`` so that they nest inside dp-accounting's own
events (``PoissonSampledDpEvent``, ``ComposedDpEvent``, ``SelfComposedDpEvent``).
The accountants in ``accountants.py`` and ``composition.py`` interpret them; dp-accounting's own
accountants reject them as unsupported, which is the safe failure.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import attr
import dp_accounting
from dp_accounting import dp_event as dpe


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


class UnsupportedEventError(ValueError):
    """An accountant was asked about an event it cannot interpret."""


# --------------------------------------------------------------------------- validation


def check_delta(delta: float, *, allow_zero: bool = True) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise ValueError(f"delta: must be a number in [0, 1), got {delta!r}")
    d = float(delta)
    low_ok = d >= 0.0 if allow_zero else d > 0.0
    if not (low_ok and d < 1.0):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"delta: must be in {interval}, got {delta!r}")
    return d


def check_nonnegative(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value < 0:
        raise ValueError(f"{name}: must be a number >= 0, got {value!r}")


def validate_event(event: Any) -> None:
    """Reject malformed parameters of the events this module interprets by hand."""
    if not isinstance(event, dpe.DpEvent):
        raise TypeError(f"event: expected a dp_accounting.DpEvent, got {type(event).__name__}")
    if isinstance(event, PureDpEvent):
        check_nonnegative(event.epsilon, "PureDpEvent.epsilon")
    elif isinstance(event, dpe.LaplaceDpEvent):
        check_nonnegative(event.noise_multiplier, "LaplaceDpEvent.noise_multiplier")
    elif isinstance(event, GumbelTopKDpEvent):
        check_nonnegative(event.epsilon0, "GumbelTopKDpEvent.epsilon0")
        if isinstance(event.k, bool) or not isinstance(event.k, numbers.Integral) or event.k < 1:
            raise ValueError(f"GumbelTopKDpEvent.k: must be an integer >= 1, got {event.k!r}")
    elif isinstance(event, dpe.PoissonSampledDpEvent):
        q = event.sampling_probability
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 <= float(q) <= 1.0:
            raise ValueError(f"PoissonSampledDpEvent.sampling_probability: must be in [0, 1], got {q!r}")
        validate_event(event.event)
    elif isinstance(event, dpe.SelfComposedDpEvent):
        if isinstance(event.count, bool) or not isinstance(event.count, numbers.Integral) or event.count < 0:
            raise ValueError(f"SelfComposedDpEvent.count: must be an integer >= 0, got {event.count!r}")
        validate_event(event.event)
    elif isinstance(event, dpe.ComposedDpEvent):
        for sub in event.events:
            validate_event(sub)


def validate_events(events: Sequence[dpe.DpEvent]) -> list[dpe.DpEvent]:
    if isinstance(events, dpe.DpEvent):
        raise TypeError("events: pass a sequence of DpEvents, e.g. [event], not a single event")
    events = list(events)
    for event in events:
        validate_event(event)
    return events


# --------------------------------------------------------------------------- event structure


def read_laplace_as_pure(event: dpe.DpEvent) -> dpe.DpEvent:
    """``event`` with every ``LaplaceDpEvent(b)`` in it read as ``PureDpEvent(1 / b)``.

    Earlier versions charged the discrete-Laplace count of N as ``LaplaceDpEvent(1 / eps_c)``, and
    their ledgers, lifetime stores and silo accounts still hold it. Shifted by one, a discrete
    Laplace is exactly the randomized-response pair of eps_c, whose RDP and PLD exceed the
    continuous Laplace's that dp-accounting would give. A sensitivity-1 Laplace of scale b,
    discrete or not, is (1/b)-DP, and randomized response dominates every such pair, so the pure
    event is a valid reading of both (and tight for the count).
    """
    if isinstance(event, dpe.LaplaceDpEvent):
        scale = float(event.noise_multiplier)
        return PureDpEvent(math.inf if scale == 0.0 else 1.0 / scale)
    if isinstance(event, dpe.PoissonSampledDpEvent):
        inner = read_laplace_as_pure(event.event)
        return event if inner is event.event else dpe.PoissonSampledDpEvent(event.sampling_probability, inner)
    if isinstance(event, dpe.SelfComposedDpEvent):
        inner = read_laplace_as_pure(event.event)
        return event if inner is event.event else dpe.SelfComposedDpEvent(inner, event.count)
    if isinstance(event, dpe.ComposedDpEvent):
        parts = [read_laplace_as_pure(sub) for sub in event.events]
        same = all(new is old for new, old in zip(parts, event.events))
        return event if same else dpe.ComposedDpEvent(parts)
    return event


def group_events(events: Sequence[dpe.DpEvent]) -> list[tuple[dpe.DpEvent, int]]:
    """Flatten Composed/SelfComposed events into (atom, count) groups in a canonical order.

    Grouping identical atoms lets PLD self-compose (one FFT power instead of T
    convolutions) and RDP multiply a curve, so a long run stays fast. The order is
    canonical (sorted by a textual key) so that the same multiset of events always
    gives bit-identical numbers, whatever order it was spent in. A ``LaplaceDpEvent`` is read
    as the pure event of its epsilon (:func:`read_laplace_as_pure`), by every accountant.
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
            event = read_laplace_as_pure(event)
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


def pure_epsilon_of(event: dpe.DpEvent) -> float | None:
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
        inner = pure_epsilon_of(event.event)
        return None if inner is None else (0.0 if event.count == 0 else event.count * inner)
    if isinstance(event, dpe.ComposedDpEvent):
        total = 0.0
        for sub in event.events:
            inner = pure_epsilon_of(sub)
            if inner is None:
                return None
            total += inner
        return total
    if isinstance(event, dpe.PoissonSampledDpEvent):
        inner = pure_epsilon_of(event.event)
        if inner is None:
            return None
        q = float(event.sampling_probability)
        if q == 0.0 or inner == 0.0:
            return 0.0
        if math.isinf(inner):
            return math.inf  # one included record can be revealed: no finite epsilon
        return amplify_pure_dp(inner, q)
    return None


def contains_own_event(event: dpe.DpEvent) -> bool:
    """True if the tree holds a PureDpEvent/GumbelTopKDpEvent (dp-accounting cannot read it)."""
    if isinstance(event, (PureDpEvent, GumbelTopKDpEvent)):
        return True
    if isinstance(event, (dpe.SelfComposedDpEvent, dpe.PoissonSampledDpEvent)):
        return contains_own_event(event.event)
    if isinstance(event, dpe.ComposedDpEvent):
        return any(contains_own_event(e) for e in event.events)
    return False


def effective_noise_multiplier_of(event: dpe.DpEvent) -> float | None:
    """Gaussians released on the same subsample act as one Gaussian: z_eff^-2 = sum z_i^-2."""
    if isinstance(event, dpe.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dpe.SelfComposedDpEvent):
        inner = effective_noise_multiplier_of(event.event)
        if inner is None:
            return None
        return math.inf if event.count == 0 else inner / math.sqrt(event.count)
    if isinstance(event, dpe.ComposedDpEvent):
        inverse_sq = 0.0
        for sub in event.events:
            inner = effective_noise_multiplier_of(sub)
            if inner is None:
                return None
            if inner == 0.0:
                return 0.0
            inverse_sq += 0.0 if math.isinf(inner) else inner**-2
        return math.inf if inverse_sq == 0.0 else inverse_sq**-0.5
    return None
