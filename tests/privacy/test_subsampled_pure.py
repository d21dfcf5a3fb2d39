"""Tight accounting of Poisson-subsampled pure-DP steps (exponential, Gumbel top-k, permute-and-flip).

The reference here is independent of dp-accounting: the exact hockey-stick divergence of
the T-fold composed dominating pair, summed over binomial outcomes in both directions.
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_textgrad.privacy.accounting import (
    BasicCompositionAccountant,
    GumbelTopKDpEvent,
    PldAccountant,
    PureDpEvent,
    amplify_pure_dp,
    smallest_bound,
)
from dp_textgrad.privacy.accounting.dpa_extensions import subsampled_pure_dp_pmfs

DELTA = 1e-5


def run(eps: float, q: float, steps: int, picks: int = 1) -> dp_accounting.DpEvent:
    inner = PureDpEvent(eps) if picks == 1 else GumbelTopKDpEvent(eps, picks)
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, inner), steps)


def exact_epsilon(eps: float, q: float, steps: int, delta: float) -> float:
    """Smallest epsilon with delta(epsilon) <= delta for T one-pick steps, both directions, exactly."""
    p = math.exp(eps) / (1 + math.exp(eps))
    member = (p, 1 - p)
    absent = (1 - p, p)
    mixture = tuple(q * a + (1 - q) * b for a, b in zip(member, absent))

    def hockey(upper: tuple[float, float], lower: tuple[float, float], e: float) -> float:
        return math.fsum(math.comb(steps, n) * max(0.0, upper[1] ** n * upper[0] ** (steps - n)
                                                   - math.exp(e) * lower[1] ** n * lower[0] ** (steps - n))
                         for n in range(steps + 1))

    def divergence(e: float) -> float:
        return max(hockey(mixture, absent, e), hockey(absent, mixture, e))

    low, high = 0.0, steps * math.log1p(q * math.expm1(eps)) + 1e-9  # basic composition fits delta = 0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (low, middle) if divergence(middle) <= delta else (middle, high)
    return high


# The vectors: k eps0, q, T -> epsilon at delta = 1e-5 (computed by hand from the binary pair).
VECTORS = [
    (5.454, 0.012, 3, 2.645),   # SST-2 benchmark schedule at epsilon 4
    (3.526, 0.012, 3, 0.829),   # the same at epsilon 1
    (7.754, 0.0012, 3, 1.331),  # N = 20,000 at epsilon 4
    (3.287, 0.0667, 4, 3.885),  # demo schedule, exponential mode
    (2.349, 0.1, 6, 3.458),     # library defaults, exponential mode
]


@pytest.mark.parametrize("eps, q, steps, expected", VECTORS)
def test_published_vectors(eps, q, steps, expected) -> None:
    event = run(eps, q, steps)
    assert PldAccountant().epsilon([event], DELTA) == pytest.approx(expected, abs=1.5e-3)
    assert smallest_bound([event], DELTA) == pytest.approx(expected, abs=1.5e-3)  # the ledger's bound


@pytest.mark.parametrize("eps, q, steps", [(1.0, 0.5, 1), (2.0, 0.1, 2), (5.454, 0.012, 3), (0.7, 0.3, 5)])
def test_matches_the_exact_binomial_computation(eps, q, steps) -> None:
    exact = exact_epsilon(eps, q, steps, DELTA)
    pld = PldAccountant().epsilon([run(eps, q, steps)], DELTA)
    assert exact - 1e-9 <= pld <= exact + 2e-3  # pessimistic, and tight to the discretization


def test_one_step_at_tiny_delta_is_the_amplified_epsilon() -> None:
    # Closed form: the largest privacy loss of one subsampled eps-DP step is ln(1 + q (e^eps - 1)).
    eps, q = 1.0, 0.5
    assert amplify_pure_dp(eps, q) == pytest.approx(0.620115, abs=1e-6)  # by hand: ln(1 + (e - 1) / 2)
    assert PldAccountant().epsilon([run(eps, q, 1)], 1e-12) == pytest.approx(amplify_pure_dp(eps, q), abs=2e-4)


def test_the_pair_is_a_distribution_pair_over_binomial_outcomes() -> None:
    upper, lower = subsampled_pure_dp_pmfs(1.0, 3, 0.25)
    assert sorted(upper) == sorted(lower) == [0, 1, 2, 3]
    assert math.fsum(math.exp(v) for v in upper.values()) == pytest.approx(1.0)
    assert math.fsum(math.exp(v) for v in lower.values()) == pytest.approx(1.0)
    huge, _ = subsampled_pure_dp_pmfs(800.0, 2, 0.01)  # no overflow for very large eps0
    assert all(math.isfinite(v) for v in huge.values())


def test_tighter_than_basic_composition_where_amplification_matters() -> None:
    # SST-2 N = 2,000 schedule at epsilon 4 (the accounting benchmark's row): library / basic <= 0.7.
    event = run(5.454, 0.012, 3)
    assert smallest_bound([event], DELTA) / BasicCompositionAccountant().epsilon([event], DELTA) <= 0.7


def test_k_picks_use_the_product_pair_and_are_never_looser() -> None:
    pld = PldAccountant()
    product = pld.epsilon([run(1.763, 0.012, 3, picks=2)], DELTA)  # Gumbel top-2 with eps0 = k eps0 / 2
    single = pld.epsilon([run(3.526, 0.012, 3)], DELTA)  # one (k eps0)-DP step
    assert product < single


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eps=st.floats(0.2, 6.0), q=st.floats(0.005, 0.9), steps=st.integers(1, 6),
       bump=st.floats(1.05, 1.5))
def test_monotone_in_q_steps_and_eps(eps, q, steps, bump) -> None:
    pld = PldAccountant(value_discretization_interval=1e-3)
    base = pld.epsilon([run(eps, q, steps)], DELTA)
    slack = 1e-3  # one grid step: pessimistic rounding can move a value by up to the discretization
    assert pld.epsilon([run(eps, min(1.0, q * bump), steps)], DELTA) >= base - slack
    assert pld.epsilon([run(eps * bump, q, steps)], DELTA) >= base - slack
    assert pld.epsilon([run(eps, q, steps + 1)], DELTA) >= base - slack
