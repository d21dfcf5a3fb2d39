"""The ledger's epsilon for pure-DP selection plans against EXACT values (issue 35, item 6).

A plan of T generations, each k adaptive eps0-DP picks (permute-and-flip peeling, Gumbel
top-k) on one Poisson subsample, is composed by the ledger as the T-fold product of the
picks' tight dominating pair (``docs/accounting.md``). ``tests/exact_pure_dp.py`` computes
the exact epsilon of that same composition from its closed-form sum (no dp-accounting),
so the printed bound must lie in [exact, 1.01 x exact]: never below (validity), at most 1%
above (tightness). The events come from the real mechanisms and the real plan.
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.privacy.accounting import PldAccountant, PrivacyLedger
from dp_textgrad.privacy.mechanisms import GumbelTopK, PermuteAndFlip
from tests.exact_pure_dp import exact_epsilon, exact_randomized_response_epsilon

TIGHTNESS = 1.01  # the printed epsilon is at most 1% above exact
VALIDITY = 1.0 - 1e-8  # ... and never below it (the exact value is bisected to 1e-9)


def generations(mechanism, q: float, count: int) -> dp_accounting.DpEvent:
    """``count`` generations of ``mechanism`` on Poisson subsamples of rate q, as a run charges them."""
    return dp_accounting.SelfComposedDpEvent(mechanism.event(q), count)


def printed_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """What the ledger prints for a run that spent ``event``: its smallest bound."""
    return min(PrivacyLedger(epsilon_budget=1e6, delta=delta).bounds_with(event).values())


def test_the_exact_reference_matches_known_values() -> None:
    # KOV's optimal composition of 10 RR(0.1) steps at delta 0 is basic composition, and one
    # eps-DP step at any delta in (0, 1) has epsilon slightly below eps.
    assert exact_randomized_response_epsilon(0.1, 10, 1e-300) == pytest.approx(1.0, rel=1e-6)
    assert exact_randomized_response_epsilon(1.0, 1, 1e-5) == pytest.approx(1.0, abs=1e-4)
    # k = 2 enumeration and k = 1 agree where they must: q = 1, two picks = two RR steps.
    assert exact_epsilon(0.4, 2, 1.0, 50, 1e-5) == pytest.approx(exact_randomized_response_epsilon(0.4, 100, 1e-5),
                                                                 rel=1e-7)


def test_issue_example_permute_and_flip_t1000() -> None:
    """The issue's example: one permute-and-flip pick per generation, T = 1000, q = 0.005, eps0 = 0.3."""
    exact = exact_epsilon(0.3, 1, 0.005, 1000, 1e-5)
    assert exact == pytest.approx(0.15236, abs=1e-5)
    printed = printed_epsilon(generations(PermuteAndFlip(0.3), 0.005, 1000), 1e-5)
    assert exact * VALIDITY <= printed <= exact * TIGHTNESS, f"printed {printed:.6f} vs exact {exact:.6f}"


# (mechanism, eps0, k picks, q, T, delta): long and short runs, small and large q and eps0.
SCHEDULES = [
    ("permute_and_flip", 0.3, 1, 0.005, 1000, 1e-5),
    ("permute_and_flip", 0.3, 2, 0.005, 1000, 1e-5),
    ("permute_and_flip", 1.157, 2, 0.01, 100, 1e-5),    # long_run at epsilon 1
    ("permute_and_flip", 0.318, 2, 0.01, 100, 1e-5),    # long_run at epsilon 0.2
    ("permute_and_flip", 0.594, 2, 0.1, 6, 1e-5),       # library defaults at epsilon 1
    ("permute_and_flip", 2.0, 3, 0.02, 120, 1e-7),
    ("permute_and_flip", 0.05, 1, 0.2, 2000, 1e-6),
    ("exponential", 0.3, 2, 0.005, 1000, 1e-5),
    ("exponential", 3.0, 2, 0.012, 3, 1e-5),            # privacy-utility benchmark schedule
]


def _mechanism(name: str, eps0: float, picks: int):
    return PermuteAndFlip(eps0, k=picks) if name == "permute_and_flip" else GumbelTopK(eps0, picks)


@pytest.mark.parametrize("name, eps0, picks, q, steps, delta", SCHEDULES)
def test_pld_is_within_one_percent_of_exact(name, eps0, picks, q, steps, delta) -> None:
    exact = exact_epsilon(eps0, picks, q, steps, delta)
    pld = PldAccountant().epsilon([generations(_mechanism(name, eps0, picks), q, steps)], delta)
    assert exact * VALIDITY <= pld <= exact * TIGHTNESS, f"pld {pld:.6f} vs exact {exact:.6f}"


@pytest.mark.parametrize("name, eps0, picks, q, steps, delta", SCHEDULES)
def test_printed_epsilon_is_within_one_percent_of_exact(name, eps0, picks, q, steps, delta) -> None:
    exact = exact_epsilon(eps0, picks, q, steps, delta)
    printed = printed_epsilon(generations(_mechanism(name, eps0, picks), q, steps), delta)
    assert printed <= exact * TIGHTNESS, f"printed {printed:.6f} vs exact {exact:.6f}"
    if name == "permute_and_flip":
        # Permute-and-flip is only known to be pure DP: no valid bound can beat the exact pair.
        # (Gumbel top-k is also bounded-range, so its RDP bound may go below the pure pair.)
        assert printed >= exact * VALIDITY


@pytest.mark.parametrize("eps0, picks, steps", [(0.3, 2, 200), (1.0, 1, 100), (0.05, 3, 400)])
def test_unsampled_picks_count_every_composition(eps0, picks, steps) -> None:
    # q = 1: T generations of k picks are T k randomized-response steps (KOV's binomial sum).
    # Nested counts must all be honoured (dp-accounting 0.6.0's PLD drops the count of a
    # self-composed RandomizedResponse event; ours are composed here, not there).
    exact = exact_randomized_response_epsilon(eps0, picks * steps, 1e-5)
    nested = dp_accounting.SelfComposedDpEvent(generations(PermuteAndFlip(eps0, k=picks), 1.0, steps // 4), 4)
    for event in (generations(PermuteAndFlip(eps0, k=picks), 1.0, steps), nested):
        printed = printed_epsilon(event, 1e-5)
        assert exact * VALIDITY <= printed <= exact * TIGHTNESS, f"printed {printed:.6f} vs exact {exact:.6f}"


def test_a_tiny_delta_is_not_lost_to_fft_noise() -> None:
    # 496 randomized-response steps at delta = 2.1e-10: dp-accounting's FFT composition moves
    # delta by ~1e-14, which read at delta itself put the bound 1.5e-6 (relative) below exact.
    exact = exact_randomized_response_epsilon(0.07449, 496, 2.1e-10)
    printed = printed_epsilon(generations(PermuteAndFlip(0.07449), 1.0, 496), 2.1e-10)
    assert exact * VALIDITY <= printed <= exact * TIGHTNESS, f"printed {printed:.9f} vs exact {exact:.9f}"


def test_a_planned_run_is_charged_within_one_percent_of_exact() -> None:
    """The whole event of a real plan (permute-and-flip, two parents, T = 300, q = 0.01)."""
    config = DPESConfig(epsilon=1.0, delta=1e-5, generations=300, population=6, parents=2, sampling_rate=0.01,
                        selection="permute_and_flip", feedback="none", final_selection="last",
                        dataset_size=30_000)  # a declared public N: the plan spends nothing on counting it
    eps0 = 0.5
    exact = exact_epsilon(eps0, 2, 0.01, 300, 1e-5)
    printed = printed_epsilon(RunPlan.with_value(config, eps0).event, 1e-5)
    assert exact * VALIDITY <= printed <= exact * TIGHTNESS, f"printed {printed:.6f} vs exact {exact:.6f}"


def test_calibration_spends_the_budget_on_a_long_pure_plan() -> None:
    """The calibrated eps0 fits the target and leaves at most 1% of it unused, in exact terms too."""
    config = DPESConfig(epsilon=0.2, delta=1e-5, generations=100, population=6, parents=2, sampling_rate=0.01,
                        selection="permute_and_flip", feedback="none", final_selection="last",
                        dataset_size=30_000)  # a declared public N: the plan spends nothing on counting it
    plan = RunPlan.calibrated(config)
    exact = exact_epsilon(plan.value, 2, 0.01, 100, 1e-5)
    printed = printed_epsilon(plan.event, 1e-5)
    assert 0.99 * 0.2 <= printed <= 0.2, f"calibrated eps0 {plan.value:.6f} prints {printed:.6f}"
    assert exact >= 0.99 * 0.2 / TIGHTNESS, f"calibrated eps0 {plan.value:.6f} spends only {exact:.6f} (exact)"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eps0=st.floats(0.02, 3.0), picks=st.integers(1, 2), q=st.floats(0.001, 1.0),
       steps=st.integers(1, 400), log10_delta=st.floats(-9.0, -3.0))
def test_refined_bound_is_never_below_exact_nor_one_percent_above(eps0, picks, q, steps, log10_delta) -> None:
    # dp-accounting's PLD overflows floats (exp) past epsilon ~ 700: stay well inside.
    assume(steps * math.log1p(q * math.expm1(picks * eps0)) <= 200.0)
    delta = 10.0 ** log10_delta
    exact = exact_epsilon(eps0, picks, q, steps, delta)
    pld = PldAccountant().epsilon([generations(PermuteAndFlip(eps0, k=picks), q, steps)], delta)
    if exact == 0.0:
        assert pld <= 1e-6  # nothing to spend at this delta: at most a grid step of rounding
        return
    assert exact * VALIDITY <= pld <= exact * TIGHTNESS, f"pld {pld:.6f} vs exact {exact:.6f}"
