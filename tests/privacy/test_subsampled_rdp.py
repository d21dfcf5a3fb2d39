"""Renyi DP of Poisson-subsampled selections (Zhu-Wang Theorem 6 on the bounded-range curve).

Three kinds of check: the formula against a term-by-term reference written from the
theorem and against its order-2 closed form; the bound against exact Renyi divergences
of the mechanisms the library runs (Gumbel top-k as Plackett-Luce probabilities, and the
worst case of pure-DP picks, the subsampled randomized-response pair); and properties
(monotone in q, steps and epsilon0; never looser than the amplified pure-DP curve).
"""

from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_textgrad.privacy.accounting import (
    GumbelTopKDpEvent,
    PldAccountant,
    PureDpEvent,
    RdpAccountant,
    smallest_bound,
)
from dp_textgrad.privacy.accounting.bounds import all_bounds, default_accountants
from dp_textgrad.privacy.accounting.calibration import calibrate_pure_epsilon
from dp_textgrad.privacy.accounting.dpa_extensions import (
    _gumbel_top_k_rdp,
    pure_dp_rdp,
    subsampled_pure_dp_pmfs,
)
from dp_textgrad.privacy.accounting.subsampled_rdp import poisson_subsampled_rdp

DELTA = 1e-5
CHECK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INTEGER_ORDERS = [2, 3, 4, 5, 6, 8, 10, 16]
ORDERS = INTEGER_ORDERS + [1.5, 2.5, 3.7]


def sampled(q: float, inner: dp_accounting.DpEvent, steps: int = 1) -> dp_accounting.DpEvent:
    event = dp_accounting.PoissonSampledDpEvent(q, inner)
    return event if steps == 1 else dp_accounting.SelfComposedDpEvent(event, steps)


def curve(event: dp_accounting.DpEvent, orders) -> np.ndarray:
    return RdpAccountant(orders=orders).rdp_curve([event])


def reference_bound(order: int, q: float, eps) -> float:
    """Theorem 6 of Zhu and Wang (2019), term by term in plain floats."""
    total = (1 - q) ** (order - 1) * (1 + (order - 1) * q)
    total += math.comb(order, 2) * q**2 * (1 - q) ** (order - 2) * math.exp(eps(2))
    for ell in range(3, order + 1):
        total += 3 * math.comb(order, ell) * q**ell * (1 - q) ** (order - ell) * math.exp((ell - 1) * eps(ell))
    return math.log(total) / (order - 1)


def renyi(p: np.ndarray, r: np.ndarray, order: float) -> float:
    return float(np.log(np.sum(p**order * r ** (1.0 - order))) / (order - 1.0))


def plackett_luce(utilities: np.ndarray, epsilon0: float, picks: int) -> np.ndarray:
    """Exact probabilities of every ordered top-``picks`` of u + Gumbel(1 / eps0) (clip bound 1)."""
    weights = np.exp(epsilon0 * (utilities - utilities.max()))
    out = []
    for ranking in itertools.permutations(range(len(utilities)), picks):
        left, prob = weights.sum(), 1.0
        for index in ranking:
            prob *= weights[index] / left
            left -= weights[index]
        out.append(prob)
    return np.array(out)


def test_order_two_is_the_closed_form() -> None:
    # a = 2: (1 - q)(1 + q) + q^2 e^(eps(2)) = 1 + q^2 (e^(eps(2)) - 1)
    for q, eps0, k in [(0.01, 1.0, 2), (0.3, 0.2, 1), (0.9, 3.0, 3)]:
        eps2 = float(_gumbel_top_k_rdp(eps0, k, np.array([2.0]))[0])
        got = poisson_subsampled_rdp(lambda a: _gumbel_top_k_rdp(eps0, k, a), q, [2.0])[0]
        assert got == pytest.approx(math.log1p(q**2 * math.expm1(eps2)), rel=1e-12)


@pytest.mark.parametrize("q,eps0,k", [(0.01, 1.0, 2), (0.1, 0.3, 1), (0.5, 2.0, 4), (0.002, 6.0, 2)])
def test_integer_orders_match_the_theorem_term_by_term(q: float, eps0: float, k: int) -> None:
    def base(a):
        return _gumbel_top_k_rdp(eps0, k, a)

    got = poisson_subsampled_rdp(base, q, INTEGER_ORDERS)
    want = [reference_bound(a, q, lambda ell: float(base(np.array([float(ell)]))[0])) for a in INTEGER_ORDERS]
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_fractional_orders_lie_on_the_chord_of_the_log_moments() -> None:
    def base(a):
        return _gumbel_top_k_rdp(0.5, 2, a)

    at = poisson_subsampled_rdp(base, 0.05, [3.0, 4.0, 3.25])
    chord = (0.75 * 2 * at[0] + 0.25 * 3 * at[1]) / 2.25
    assert at[2] == pytest.approx(chord, rel=1e-12)


def test_edge_rates_and_huge_orders() -> None:
    def base(a):
        return _gumbel_top_k_rdp(1.0, 2, np.asarray(a, dtype=float))

    assert np.all(poisson_subsampled_rdp(base, 0.0, ORDERS) == 0.0)
    np.testing.assert_allclose(poisson_subsampled_rdp(base, 1.0, ORDERS), base(ORDERS))
    assert math.isinf(poisson_subsampled_rdp(base, 0.1, [2048.0])[0])
    with pytest.raises(ValueError, match="sampling_probability"):
        poisson_subsampled_rdp(base, 1.5, [2.0])


@CHECK
@given(
    data=st.data(),
    num=st.integers(2, 4),
    eps0=st.floats(0.05, 4.0),
    q=st.floats(0.001, 1.0),
)
def test_bound_holds_for_gumbel_top_k_on_neighbouring_subsamples(data, num: int, eps0: float, q: float) -> None:
    # The record's presence raises every utility sum by a share of the clip bound (monotone);
    # conditioned on the rest of the subsample, the two output laws are PL(u) and
    # (1 - q) PL(u) + q PL(u + d). Joint convexity makes this pair the one to check.
    picks = data.draw(st.integers(1, min(2, num)))
    u = np.array(data.draw(st.lists(st.floats(0.0, 5.0), min_size=num, max_size=num)))
    d = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=num, max_size=num)))
    absent = plackett_luce(u, eps0, picks)
    present = (1.0 - q) * absent + q * plackett_luce(u + d, eps0, picks)
    bound = curve(sampled(q, GumbelTopKDpEvent(eps0, picks)), ORDERS)
    for order, limit in zip(ORDERS, bound):
        exact = max(renyi(present, absent, order), renyi(absent, present, order))
        assert exact <= limit + 1e-9, (order, exact, limit)


@pytest.mark.parametrize("eps0", [0.05, 0.2, 0.5])
def test_bounded_range_curve_is_tight_for_two_candidates(eps0: float) -> None:
    # Two candidates half a clip bound apart, the record lifting only the lower one: the
    # privacy loss is +-eps0/2, a range of exactly eps0, whose Renyi divergence is about
    # a eps0^2 / 8, the zCDP bound itself. A bound with a smaller constant fails here.
    u = np.array([0.0, 0.5])
    absent = plackett_luce(u, eps0, 1)
    present = plackett_luce(u + np.array([1.0, 0.0]), eps0, 1)
    orders = [2, 3, 4, 5, 6]  # (higher orders leave the small-loss regime at eps0 = 0.5)
    bound = curve(sampled(1.0, GumbelTopKDpEvent(eps0, 1)), orders)
    for order, limit in zip(orders, bound):
        exact = max(renyi(present, absent, order), renyi(absent, present, order))
        assert 0.75 * limit <= exact <= limit + 1e-12, (order, exact, limit)


@CHECK
@given(eps0=st.floats(0.05, 3.0), q=st.floats(0.001, 1.0), picks=st.integers(1, 3))
def test_bound_holds_for_the_worst_pure_dp_picks(eps0: float, q: float, picks: int) -> None:
    # Subsampled randomized response is the worst case of `picks` eps0-DP steps: exact both ways.
    mixture, absent = (np.exp(np.array(list(pmf.values()))) for pmf in subsampled_pure_dp_pmfs(eps0, picks, q))
    inner = PureDpEvent(eps0) if picks == 1 else dp_accounting.ComposedDpEvent([PureDpEvent(eps0)] * picks)
    bound = curve(sampled(q, inner), ORDERS)
    for order, limit in zip(ORDERS, bound):
        exact = max(renyi(mixture, absent, order), renyi(absent, mixture, order))
        assert exact <= limit + 1e-9, (order, exact, limit)


@CHECK
@given(eps0=st.floats(0.01, 5.0), q=st.floats(0.0005, 0.999), k=st.integers(1, 4))
def test_never_looser_than_the_amplified_pure_curve(eps0: float, q: float, k: int) -> None:
    orders = np.array(ORDERS, dtype=float)
    amplified = pure_dp_rdp(math.log1p(q * math.expm1(k * eps0)), orders)
    assert np.all(curve(sampled(q, GumbelTopKDpEvent(eps0, k)), ORDERS) <= amplified + 1e-12)


@CHECK
@given(
    eps0=st.floats(0.05, 3.0),
    q=st.floats(0.001, 0.5),
    steps=st.integers(1, 400),
    bump=st.floats(1.05, 2.0),
)
def test_epsilon_is_monotone_in_rate_steps_and_epsilon0(eps0: float, q: float, steps: int, bump: float) -> None:
    def eps(e0: float, rate: float, t: int) -> float:
        return RdpAccountant().epsilon([sampled(rate, GumbelTopKDpEvent(e0, 2), t)], DELTA)

    base = eps(eps0, q, steps)
    assert eps(eps0 * bump, q, steps) >= base - 1e-12
    assert eps(eps0, min(1.0, q * bump), steps) >= base - 1e-12
    assert eps(eps0, q, steps + 1) >= base - 1e-12


def test_long_runs_at_small_rates_are_decided_by_bounded_range() -> None:
    # 1,000 generations of 2 picks at eps0 = 1, q = 0.01: the PLD of the pure-DP pair gives
    # 2.472 (the pair's exact value, tests/exact_pure_dp.py; it cannot see bounded range);
    # RDP with Zhu-Wang on the zCDP curve gives 1.339.
    event = sampled(0.01, GumbelTopKDpEvent(1.0, 2), 1000)
    bounds = all_bounds(default_accountants(), [event], DELTA)
    assert bounds["rdp"] == pytest.approx(1.339, abs=1e-3)
    assert bounds["pld"] == pytest.approx(2.472, abs=0.001)
    assert smallest_bound([event], DELTA) == bounds["rdp"]
    # Short runs (the benchmark schedules) stay with the PLD: the SST-2 epsilon-4 vector.
    short = sampled(0.012, GumbelTopKDpEvent(5.454 / 2, 2), 3)
    assert smallest_bound([short], DELTA) == pytest.approx(2.645, abs=0.005)


def test_calibration_spends_the_budget_under_the_tighter_bound() -> None:
    def plan(x: float) -> dp_accounting.DpEvent:
        return sampled(0.01, GumbelTopKDpEvent(x, 2), 1000)

    value = calibrate_pure_epsilon(plan, 4.0, DELTA)
    spent = smallest_bound([plan(value)], DELTA)
    assert 4.0 * (1 - 1e-3) <= spent <= 4.0
    # the PLD alone would allow only about 1.29 per pick
    assert PldAccountant().epsilon([plan(value)], DELTA) > 4.0
    assert value > 1.3 * calibrate_pure_epsilon(plan, 4.0, DELTA, accountant=PldAccountant())
