"""Accounting per noise placement, against closed forms (Gaussian DP) and as properties."""

from __future__ import annotations

import math

import dp_accounting.dp_event as dpe
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from dp_textgrad.federated.placement import (
    guarantees,
    scale_gaussian_noise,
    silo_mechanism,
    silo_noise_factor,
    total_noise_factor,
)
from dp_textgrad.privacy.accounting import RdpAccountant
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism


def rdp_epsilon(events: list, delta: float) -> float:
    return RdpAccountant().epsilon(events, delta)


def gdp_epsilon(mu: float, delta: float) -> float:
    """Closed form (Dong, Roth and Su): mu-GDP is (eps, delta)-DP with
    delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2); solved for eps here."""
    def gap(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta
    return optimize.brentq(gap, 1e-9, 200.0)


def test_noise_factors_are_the_placement_table() -> None:
    assert silo_noise_factor("central", 9) == 0.0 and total_noise_factor("central", 9) == 1.0
    assert silo_noise_factor("distributed", 9) == pytest.approx(1 / 3) and total_noise_factor("distributed", 9) == 1.0
    assert silo_noise_factor("local", 9) == 1.0 and total_noise_factor("local", 9) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="placement"):
        silo_noise_factor("coordinator", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="silos"):
        total_noise_factor("local", 0)


def test_silo_mechanism_scales_both_noise_multipliers() -> None:
    mechanism = GaussianScoreMechanism(noise_multiplier=2.0, clip_bound=1.0, num_candidates=4,
                                       feedback_noise_multiplier=6.0)
    share = silo_mechanism(mechanism, "distributed", 4)
    assert (share.noise_multiplier, share.feedback_noise_multiplier) == (1.0, 3.0)
    # S silos each adding N(0, sigma^2 / S): the sum carries exactly the run's sigma.
    assert math.sqrt(4) * share.noise_std == pytest.approx(mechanism.noise_std)
    assert silo_mechanism(mechanism, "local", 4) == mechanism
    with pytest.raises(ValueError, match="central"):
        silo_mechanism(mechanism, "central", 4)


@pytest.mark.parametrize("z, steps, silos", [(2.0, 6, 4), (5.0, 3, 10), (1.2, 1, 2)])
def test_guarantees_match_gaussian_dp_closed_forms(z: float, steps: int, silos: int) -> None:
    """Without subsampling, T Gaussian steps with multiplier z are sqrt(T)/z-GDP: central and local
    hold that against their adversaries; distributed without secure aggregation is sqrt(S T)/z-GDP."""
    delta = 1e-5
    events = [dpe.GaussianDpEvent(z)] * steps
    central = guarantees("central", silos, events, delta, smallest_bound)
    local = guarantees("local", silos, events, delta, smallest_bound)
    distributed = guarantees("distributed", silos, events, delta, smallest_bound)
    expected = gdp_epsilon(math.sqrt(steps) / z, delta)
    alone = gdp_epsilon(math.sqrt(steps * silos) / z, delta)
    assert central[0].epsilon == pytest.approx(expected, rel=2e-3)
    assert local[0].epsilon == pytest.approx(expected, rel=2e-3)
    assert distributed[0].epsilon == pytest.approx(expected, rel=2e-3)
    assert distributed[1].epsilon == pytest.approx(alone, rel=2e-3)
    assert "secure aggregation is off" in distributed[1].holds_if and len(distributed) == 2
    assert "the coordinator" in local[0].against and "trusted" in central[0].holds_if


def test_scaling_keeps_the_event_structure() -> None:
    event = dpe.ComposedDpEvent([dpe.SelfComposedDpEvent(dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(2.0)), 3),
                                 dpe.NoOpDpEvent()])
    scaled = scale_gaussian_noise(event, 0.5)
    assert scaled == dpe.ComposedDpEvent([dpe.SelfComposedDpEvent(
        dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(1.0)), 3), dpe.NoOpDpEvent()])
    # A silo's DP count of its records carries its full noise at that silo: never scaled.
    assert scale_gaussian_noise(dpe.LaplaceDpEvent(10.0), 0.5) == dpe.LaplaceDpEvent(10.0)
    with pytest.raises(ValueError, match="Gaussian events only"):
        scale_gaussian_noise(dpe.RandomizedResponseDpEvent(0.5, 3), 0.5)


@settings(max_examples=15, deadline=None)
@given(z=st.floats(0.8, 6.0), q=st.floats(0.01, 1.0), steps=st.integers(1, 8), silos=st.integers(2, 64))
def test_distributed_without_secure_aggregation_is_never_better(z: float, q: float, steps: int, silos: int) -> None:
    events = [dpe.PoissonSampledDpEvent(q, dpe.GaussianDpEvent(z))] * steps
    # RDP alone: the property is the placement's, and PLD at a silo's small z costs ~6 s a draw.
    with_sa, alone = guarantees("distributed", silos, events, 1e-5, rdp_epsilon)
    more_silos = guarantees("distributed", silos * 2, events, 1e-5, rdp_epsilon)[1]
    assert alone.epsilon >= with_sa.epsilon - 1e-9
    assert more_silos.epsilon >= alone.epsilon - 1e-9  # each silo's share of the noise shrinks with S
