"""Where the noise of a federated run is added, and what each placement guarantees to whom.

Unit of privacy: one record at one silo (record-level DP; add or remove a record).
Every silo Poisson-samples its own records at rate q with its own secret generator, so
the union of the silos' samples is a Poisson sample of the pooled records and the
charged event is the single-machine one: a Poisson-subsampled Gaussian with the run's
noise multiplier z (std sigma = z * C * sqrt(K) on each released sum vector).

========== ===================== ===================== ====================================
placement  each silo adds         noise on the total    a record at silo s is protected by
========== ===================== ===================== ====================================
central    nothing (raw sums)     sigma                 z, against everyone but the coordinator
distributed N(0, sigma^2 / S)     sigma                 z against a coordinator that sees only the
                                                        sum (secure aggregation on); z / sqrt(S)
                                                        against one that sees each silo's value
local      N(0, sigma^2)          sigma * sqrt(S)       z, against everyone, the coordinator included
========== ===================== ===================== ====================================

So the ledger's event (and the calibration of z) is the same for every placement; the
placements differ in whom the guarantee holds against and in the noise on the total.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dp_accounting.dp_event as dpe

NoisePlacement = Literal["central", "distributed", "local"]
PLACEMENTS: tuple[NoisePlacement, ...] = ("central", "distributed", "local")


def check_placement(placement: str, silos: int) -> NoisePlacement:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: use one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise ValueError(f"silos: need at least one silo, got {silos!r}")
    return placement  # type: ignore[return-value]


def silo_noise_factor(placement: NoisePlacement, silos: int) -> float:
    """Each silo's noise std as a fraction of the run's sigma (0: the silo adds none)."""
    check_placement(placement, silos)
    return {"central": 0.0, "distributed": 1.0 / math.sqrt(silos), "local": 1.0}[placement]


def total_noise_factor(placement: NoisePlacement, silos: int) -> float:
    """The std of the noise on the summed total, as a multiple of the run's sigma."""
    check_placement(placement, silos)
    return math.sqrt(silos) if placement == "local" else 1.0


def silo_mechanism(mechanism: Any, placement: NoisePlacement, silos: int) -> Any:
    """The mechanism one silo runs: the run's mechanism with its noise scaled to the silo's share."""
    factor = silo_noise_factor(placement, silos)
    if factor == 0.0:
        raise ValueError("placement: under 'central' the silos add no noise (the coordinator does)")
    feedback = mechanism.feedback_noise_multiplier
    return dataclasses.replace(mechanism, noise_multiplier=mechanism.noise_multiplier * factor,
                               feedback_noise_multiplier=None if feedback is None else feedback * factor)


def scale_gaussian_noise(event: dpe.DpEvent, factor: float) -> dpe.DpEvent:
    """``event`` with every Gaussian noise multiplier multiplied by ``factor`` (structure kept)."""
    if isinstance(event, dpe.GaussianDpEvent):
        return dpe.GaussianDpEvent(event.noise_multiplier * factor)
    if isinstance(event, dpe.PoissonSampledDpEvent):
        return dpe.PoissonSampledDpEvent(event.sampling_probability, scale_gaussian_noise(event.event, factor))
    if isinstance(event, dpe.SelfComposedDpEvent):
        return dpe.SelfComposedDpEvent(scale_gaussian_noise(event.event, factor), event.count)
    if isinstance(event, dpe.ComposedDpEvent):
        return dpe.ComposedDpEvent([scale_gaussian_noise(e, factor) for e in event.events])
    if isinstance(event, dpe.NoOpDpEvent):
        return event
    raise ValueError(f"events: a federated run under distributed noise charges Gaussian events only, "
                     f"got {type(event).__name__}")


@dataclass(frozen=True)
class Guarantee:
    """One statement of a federated run's guarantee: (epsilon, delta) for a record at a silo, against whom."""

    against: str
    epsilon: float
    delta: float
    holds_if: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def guarantees(placement: NoisePlacement, silos: int, events: Sequence[dpe.DpEvent], delta: float,
               epsilon_of: Any, secure_aggregation: bool = False) -> list[Guarantee]:
    """What a run that charged ``events`` guarantees under ``placement`` (``epsilon_of(events, delta)``
    is the ledger's accountant: the smallest valid bound)."""
    check_placement(placement, silos)
    spent = float(epsilon_of(list(events), delta))
    if placement == "central":
        return [Guarantee("everyone who sees the released prompt, scores and logs", spent, delta,
                          "the coordinator is trusted: it sees each silo's un-noised sums")]
    if placement == "local":
        return [Guarantee("everyone, the coordinator and the other silos included", spent, delta,
                          "each silo adds the full noise before anything leaves it")]
    # What one silo's own noise share gives its records: all that is left against a coordinator that
    # sees each silo's value, or that colludes with the other S - 1 silos (they subtract their shares).
    alone = float(epsilon_of([scale_gaussian_noise(e, silo_noise_factor(placement, silos)) for e in events],
                             delta))
    if secure_aggregation:
        return [Guarantee("everyone, the coordinator included", spent, delta,
                          "secure aggregation (on): the coordinator sees only the sum of the silos' values; it "
                          "follows the protocol and colludes with no silo"),
                Guarantee("the coordinator colluding with the other silos", alone, delta,
                          f"each silo's own noise, sigma / sqrt({silos}); with c colluders the noise left is "
                          f"sigma * sqrt(({silos} - c) / {silos})")]
    return [Guarantee("everyone who sees only the released prompt, scores and logs", spent, delta,
                      "the released values are sums that carry the full noise"),
            Guarantee("the coordinator, which sees each silo's value", alone, delta,
                      f"secure aggregation is off: each silo's own noise, sigma / sqrt({silos})")]


__all__ = ["Guarantee", "NoisePlacement", "PLACEMENTS", "check_placement", "guarantees", "scale_gaussian_noise",
           "silo_mechanism", "silo_noise_factor", "total_noise_factor"]
