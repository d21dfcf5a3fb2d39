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
distributed N(0, sigma^2 / t)     sigma * sqrt(S / t)   z against a coordinator that sees only a
                                                        sum of at least t silos (secure aggregation
                                                        on, t its reconstruction threshold; t = S
                                                        without it); z / sqrt(t) against one that
                                                        sees each silo's value or colludes
local      N(0, sigma^2)          sigma * sqrt(S)       z, against everyone, the coordinator included
========== ===================== ===================== ====================================

So the ledger's event (and the calibration of z) is the same for every placement; the
placements differ in whom the guarantee holds against and in the noise on the total.
Under ``distributed`` a released value must be a function of the noised *sum*: James-Stein
shrinkage and the control variate act on each silo's value, which carries only
sigma^2 / t, so they are refused there (:func:`check_estimators`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dp_accounting.dp_event as dpe

from dp_textgrad.privacy.accounting.events import PureDpEvent, pure_epsilon_of

NoisePlacement = Literal["central", "distributed", "local"]
PLACEMENTS: tuple[NoisePlacement, ...] = ("central", "distributed", "local")


def check_placement(placement: str, silos: int) -> NoisePlacement:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: use one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise ValueError(f"silos: need at least one silo, got {silos!r}")
    return placement


def check_estimators(placement: str, jse: str, control_variate: bool) -> None:
    """Refuse, before any charge, shrinkage or drift removal under ``distributed`` noise.

    There each silo's value carries only sigma^2 / t; a total built from shrunk (or
    drift-corrected) silo values is a function of those values, not of their noised sum,
    so the sum's guarantee would not cover it (docs/federated.md)."""
    if placement == "distributed" and (jse != "none" or control_variate):
        setting = f"jse {jse!r}" if jse != "none" else "control_variate true"
        raise ValueError(
            f"jse: {setting} under placement 'distributed' would release a function of each silo's "
            "value, which carries only a share of the noise, not of the noised sum; use jse 'none' and "
            "control_variate false, or placement 'local' (each silo's value then carries the full "
            "noise and shrinkage is post-processing)"
        )


def noise_shares(silos: int, unmask_threshold: int | None = None) -> int:
    """t: over how many silos the distributed noise is split (the fewest whose sum can be seen)."""
    t = silos if unmask_threshold is None else int(unmask_threshold)
    if not 1 <= t <= silos:
        raise ValueError(f"unmask_threshold: must be between 1 and the {silos} silos, got {unmask_threshold!r}")
    return t


def silo_noise_factor(placement: NoisePlacement, silos: int, unmask_threshold: int | None = None) -> float:
    """Each silo's noise std as a fraction of the run's sigma (0: the silo adds none).

    Under ``distributed`` each silo adds sigma^2 / t, t the fewest silos whose sum the
    coordinator can see (S, or the secure sum's reconstruction threshold): every such sum
    carries at least sigma^2."""
    check_placement(placement, silos)
    shares = noise_shares(silos, unmask_threshold)
    return {"central": 0.0, "distributed": 1.0 / math.sqrt(shares), "local": 1.0}[placement]


def total_noise_factor(placement: NoisePlacement, silos: int, unmask_threshold: int | None = None) -> float:
    """The std of the noise on the summed total of all S silos, as a multiple of the run's sigma."""
    check_placement(placement, silos)
    if placement == "local":
        return math.sqrt(silos)
    if placement == "distributed":
        return math.sqrt(silos / noise_shares(silos, unmask_threshold))
    return 1.0


def silo_mechanism(mechanism: Any, placement: NoisePlacement, silos: int, unmask_threshold: int | None = None) -> Any:
    """The mechanism one silo runs: the run's mechanism with its noise scaled to the silo's share."""
    factor = silo_noise_factor(placement, silos, unmask_threshold)
    if factor == 0.0:
        raise ValueError("placement: under 'central' the silos add no noise (the coordinator does)")
    feedback = mechanism.feedback_noise_multiplier
    return dataclasses.replace(
        mechanism,
        noise_multiplier=mechanism.noise_multiplier * factor,
        feedback_noise_multiplier=None if feedback is None else feedback * factor,
    )


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
    if isinstance(event, (dpe.NoOpDpEvent, dpe.LaplaceDpEvent, PureDpEvent)):  # a size count: full noise at its silo
        return event
    raise ValueError(
        f"events: a federated run under distributed noise charges Gaussian events only, got {type(event).__name__}"
    )


def _is_count(event: dpe.DpEvent, index: int) -> bool:
    """Whether ``event`` at ``index`` of a coordinator's ledger is the DP count of N (stage 1).

    The count is charged first, before anything else, as ``PureDpEvent(eps_c)``; earlier versions
    charged ``LaplaceDpEvent(1 / eps_c)``, which nothing else emits. (A bare pure event first is
    otherwise a permute-and-flip pick at q = 1 under ``central``: adding its epsilon to the rest's
    bound is then looser by at most that pick, and still valid.)"""
    return isinstance(event, dpe.LaplaceDpEvent) or (index == 0 and isinstance(event, PureDpEvent))


def staged_bound(events: Sequence[dpe.DpEvent], delta: float, epsilon_of: Any = None) -> float:
    """epsilon of a coordinator's ledger: the size count (pure, stage 1) plus the search's bound.

    The search is planned from the released counts (q from the noisy N), so the two stages
    compose by basic composition, as in the run's ledger (docs/privacy.md, "The dataset size").
    A silo checks its own account on the Renyi filter bound instead (``Silo.max_epsilon``)."""
    if epsilon_of is None:
        from dp_textgrad.privacy.accounting.bounds import smallest_bound as epsilon_of
    counts = [e for i, e in enumerate(events) if _is_count(e, i)]
    rest = [e for i, e in enumerate(events) if not _is_count(e, i)]
    pure = sum(float(pure_epsilon_of(e) or 0.0) for e in counts)  # eps_c each (Laplace scale b: 1 / b)
    return pure + (float(epsilon_of(rest, delta)) if rest else 0.0)


@dataclass(frozen=True)
class Guarantee:
    """One statement of a federated run's guarantee: (epsilon, delta) for a record at a silo, against whom."""

    against: str
    epsilon: float
    delta: float
    holds_if: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def coupled_delta(epsilon: float, delta: float, coupling_error: float) -> float:
    """delta of a mechanism within total variation ``coupling_error`` of an (epsilon, delta)-DP one.

    If TV(M(D), M*(D)) <= eta for every D and M* is (eps, delta)-DP, then
    P[M(D) in E] <= P[M*(D) in E] + eta <= e^eps (P[M(D') in E] + eta) + delta + eta."""
    if coupling_error < 0 or not math.isfinite(coupling_error):
        raise ValueError(f"coupling_error: must be finite and >= 0, got {coupling_error!r}")
    if coupling_error == 0.0:
        return delta
    return delta + (1.0 + math.exp(min(epsilon, 700.0))) * coupling_error


def guarantees(
    placement: NoisePlacement,
    silos: int,
    events: Sequence[dpe.DpEvent],
    delta: float,
    epsilon_of: Any,
    secure_aggregation: bool = False,
    unmask_threshold: int | None = None,
    coupling_error: float = 0.0,
) -> list[Guarantee]:
    """What a run that charged ``events`` guarantees under ``placement`` (``epsilon_of(events, delta)``
    is the ledger's accountant: the smallest valid bound). Under ``distributed`` with secure
    aggregation, ``unmask_threshold`` is t, the fewest silos whose sum SecAgg+ unmasks (default: its
    value for ``silos``), and ``coupling_error`` the total-variation bound of the secure sum's clipping
    and rounding over the run (:func:`dp_textgrad.federated.secure_sum.coupling_error`)."""
    check_placement(placement, silos)
    spent = staged_bound(list(events), delta, epsilon_of)
    if placement == "central":
        return [
            Guarantee(
                "everyone who sees the released prompt, scores and logs",
                spent,
                delta,
                "the coordinator is trusted: it sees each silo's un-noised sums",
            )
        ]
    if placement == "local":
        return [
            Guarantee(
                "everyone, the coordinator and the other silos included",
                spent,
                delta,
                "each silo adds the full noise before anything leaves it",
            )
        ]
    if secure_aggregation and unmask_threshold is None:
        from dp_textgrad.federated.secure_sum import unmask_threshold as threshold_of

        unmask_threshold = threshold_of(silos)
    t = noise_shares(silos, unmask_threshold if secure_aggregation else None)
    # What one silo's own noise share gives its records: all that is left against a coordinator that
    # sees each silo's value, or that colludes with the other silos (they subtract their shares).
    alone = staged_bound(
        [scale_gaussian_noise(e, silo_noise_factor(placement, silos, t)) for e in events], delta, epsilon_of
    )
    if secure_aggregation:
        return [
            Guarantee(
                "everyone, the coordinator included, also when silos drop out",
                spent,
                coupled_delta(spent, delta, coupling_error),
                f"secure aggregation (on): the coordinator sees only sums, each of at least t = {t} of "
                f"the {silos} silos (fewer cannot be unmasked, so also when silos drop out), and each "
                f"silo adds sigma^2 / {t}, so every sum it can see carries the full noise; it follows the "
                "protocol and colludes with no silo; delta includes the clipping and rounding of the "
                "fixed-point sum",
            ),
            Guarantee(
                "the coordinator colluding with other silos",
                alone,
                delta,
                f"each silo's own noise, sigma / sqrt({t}); with c colluders among the at least {t} "
                f"silos of a sum, the noise left is at least sigma * sqrt(max(1, {t} - c) / {t})",
            ),
        ]
    return [
        Guarantee(
            "everyone who sees only the released prompt, scores and logs",
            spent,
            delta,
            "the released values are the sums of all silos' values, which carry the full noise",
        ),
        Guarantee(
            "the coordinator, which sees each silo's value",
            alone,
            delta,
            f"secure aggregation is off: each silo's own noise, sigma / sqrt({silos})",
        ),
    ]


__all__ = [
    "Guarantee",
    "NoisePlacement",
    "PLACEMENTS",
    "check_estimators",
    "check_placement",
    "coupled_delta",
    "guarantees",
    "noise_shares",
    "scale_gaussian_noise",
    "staged_bound",
    "silo_mechanism",
    "silo_noise_factor",
    "total_noise_factor",
]
