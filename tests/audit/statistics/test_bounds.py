"""Empirical epsilon lower bounds: published reference values, validity and power."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from dp_textgrad.audit import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    eps_from_error_rates,
    eps_lower_bound_from_counts,
    eps_lower_bound_from_scores,
    gaussian_dp_estimate,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    one_run_bound_from_scores,
    one_run_eps_lower_bound,
    one_run_guesses,
    one_run_p_value,
)

FAST = settings(max_examples=30, deadline=None)


# -- reference values -----------------------------------------------------------------------


def test_clopper_pearson_reference_value():
    # zero errors in 100 runs per arm, alpha = 0.05, delta = 1e-5: exact one-sided CP at alpha/2 per arm
    bound = eps_lower_bound_from_counts(0, 100, 0, 100, delta=1e-5, alpha=0.05)
    assert bound.epsilon == pytest.approx(3.2813, abs=1e-3)
    # zero successes: the upper bound has the closed form 1 - level^(1/n)
    assert bound.fpr_upper == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-12)


def test_clopper_pearson_reference_value_through_scores():
    members, nonmembers = np.ones(100), np.zeros(100)
    bound = eps_lower_bound_from_scores(members, nonmembers, 1e-5, 0.05, "bonferroni", thresholds=[0.5])
    assert bound.epsilon == pytest.approx(3.2813, abs=1e-3)


def test_one_run_reference_value():
    bound = one_run_eps_lower_bound(m=100, r=100, v=100, delta=1e-5, alpha=0.05)
    assert bound.epsilon == pytest.approx(3.4902, abs=1e-3)
    # without the delta correction the same guesses give slightly more
    assert one_run_eps_lower_bound(100, 100, 100, 0.0, 0.05).epsilon == pytest.approx(3.4930, abs=1e-3)


# -- Clopper-Pearson ---------------------------------------------------------------------------


@FAST
@given(n=st.integers(1, 500), data=st.data(), level=st.floats(1e-4, 0.4))
def test_clopper_pearson_bounds_bracket_the_estimate(n, data, level):
    k = data.draw(st.integers(0, n))
    lower, upper = clopper_pearson_lower(k, n, level), clopper_pearson_upper(k, n, level)
    assert 0.0 <= lower <= k / n <= upper <= 1.0
    # exactness: at the upper bound, seeing k or fewer successes has probability `level`
    if k < n:
        assert sps.binom.cdf(k, n, upper) == pytest.approx(level, rel=1e-6)


def test_clopper_pearson_coverage_by_simulation():
    rng = np.random.default_rng(0)
    p, n, level = 0.07, 80, 0.05
    draws = rng.binomial(n, p, size=4000)
    misses = np.mean([clopper_pearson_upper(int(k), n, level) < p for k in draws])
    assert misses <= level  # exact CP is conservative


@FAST
@given(fpr=st.floats(1e-6, 1.0), fnr=st.floats(1e-6, 1.0))
def test_error_rate_bound_is_symmetric_and_non_negative(fpr, fnr):
    eps = eps_from_error_rates(fpr, fnr, 1e-5)
    assert eps >= 0.0
    assert eps == pytest.approx(eps_from_error_rates(fnr, fpr, 1e-5))
    if fpr + fnr >= 1 - 1e-5:  # no better than guessing: nothing to show
        assert eps == 0.0


def test_more_errors_give_a_smaller_bound():
    bounds = [eps_lower_bound_from_counts(k, 200, k, 200, delta=1e-5).epsilon for k in (0, 2, 10, 40, 100)]
    assert bounds == sorted(bounds, reverse=True)
    assert bounds[-1] == 0.0


def test_bonferroni_divides_alpha_over_thresholds():
    single = eps_lower_bound_from_counts(0, 100, 0, 100, delta=1e-5, alpha=0.05, n_tests=1)
    ten = eps_lower_bound_from_counts(0, 100, 0, 100, delta=1e-5, alpha=0.05, n_tests=10)
    assert ten.fpr_upper == pytest.approx(1 - (0.05 / 20) ** (1 / 100))
    assert ten.epsilon < single.epsilon


def test_scores_bound_needs_a_fair_threshold_choice():
    members, nonmembers = np.ones(50), np.zeros(50)
    with pytest.raises(ValueError, match="thresholds"):
        eps_lower_bound_from_scores(members, nonmembers, 1e-5, 0.05, "bonferroni")
    with pytest.raises(ValueError, match="threshold_split"):
        eps_lower_bound_from_scores(members[:1], nonmembers[:1], 1e-5, 0.05, 0.5)
    split = eps_lower_bound_from_scores(members, nonmembers, 1e-5, 0.05, 0.5)
    # threshold picked on 25+25 scores, bound on the other 25+25 with zero errors
    assert split.epsilon == pytest.approx(eps_lower_bound_from_counts(0, 25, 0, 25, delta=1e-5).epsilon)
    assert split.threshold is not None and "held-out" in split.method


def test_scores_bound_is_valid_for_randomised_response():
    """Each run releases one eps-randomised-response bit: no bound may exceed eps often."""
    eps, runs, trials = 1.0, 200, 40
    keep = math.exp(eps) / (1 + math.exp(eps))
    rng = np.random.default_rng(7)
    bounds = []
    for t in range(trials):
        members = (rng.random(runs) < keep).astype(float)  # runs with the canary report 1 w.p. keep
        nonmembers = (rng.random(runs) >= keep).astype(float)
        bounds.append(eps_lower_bound_from_scores(members, nonmembers, 0.0, 0.05, 0.5, seed=t).epsilon)
    assert np.mean(np.array(bounds) > eps) <= 0.1  # at most alpha in expectation
    assert max(bounds) > 0.2  # and it is not vacuous


# -- one run -----------------------------------------------------------------------------------


def test_one_run_p_value_without_delta_is_the_binomial_tail():
    for eps in (0.0, 0.5, 2.0):
        q = math.exp(eps) / (1 + math.exp(eps))
        assert one_run_p_value(500, 100, 70, eps, 0.0) == pytest.approx(sps.binom.sf(69, 100, q))


def test_one_run_p_value_grows_with_epsilon():
    values = [one_run_p_value(1000, 200, 150, eps, 1e-5) for eps in np.linspace(0, 4, 30)]
    assert all(b >= a - 1e-15 for a, b in zip(values, values[1:]))


@FAST
@given(m=st.integers(1, 2000), data=st.data(), delta=st.sampled_from([0.0, 1e-6, 1e-5]))
def test_one_run_bound_is_the_largest_epsilon_below_alpha(m, data, delta):
    r = data.draw(st.integers(0, min(m, 300)))
    v = data.draw(st.integers(0, r))
    eps = one_run_eps_lower_bound(m, r, v, delta, 0.05).epsilon
    assert eps >= 0.0
    if eps > 0:
        assert one_run_p_value(m, r, v, eps, delta) < 0.05
        assert one_run_p_value(m, r, v, eps + 1e-6, delta) >= 0.05 - 1e-9


def test_one_run_chance_accuracy_shows_nothing():
    assert one_run_eps_lower_bound(1000, 200, 100, 1e-5).epsilon == 0.0
    assert one_run_eps_lower_bound(10, 0, 0, 1e-5).epsilon == 0.0


def test_one_run_more_correct_guesses_give_a_larger_bound():
    bounds = [one_run_eps_lower_bound(1000, 100, v, 1e-5).epsilon for v in (60, 75, 90, 100)]
    assert bounds == sorted(bounds) and bounds[0] > 0


def test_one_run_guesses_by_hand():
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.5])
    included = np.array([True, False, False, False, True])
    # top 2 guessed in (0.9 yes, 0.8 no), bottom 1 guessed out (0.1 correct)
    assert one_run_guesses(scores, included, 2, 1) == (3, 2)
    with pytest.raises(ValueError, match="exceed"):
        one_run_guesses(scores, included, 4, 2)


def test_one_run_bound_is_valid_and_has_power_on_randomised_response():
    """Canaries each included w.p. 1/2; the attacker sees an eps-randomised-response bit."""
    m = 1000
    rng = np.random.default_rng(11)

    def audit(eps: float, seed: int) -> float:
        local = np.random.default_rng(seed)
        included = local.random(m) < 0.5
        keep = local.random(m) < math.exp(eps) / (1 + math.exp(eps))
        signal = np.where(keep, included, ~included).astype(float) + local.random(m) * 1e-3  # break ties
        return one_run_bound_from_scores(signal, included, k_pos=100, k_neg=100, delta=1e-5).epsilon

    seeds = rng.integers(0, 2**31, size=30)
    valid = [audit(1.0, int(s)) for s in seeds]
    assert np.mean(np.array(valid) > 1.0) <= 0.1
    assert np.mean(valid) > 0.3  # it detects some privacy loss
    assert audit(8.0, 1) > 2.5  # positive control: a nearly non-private mechanism is caught


# -- Gaussian DP estimate ----------------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0, 4.0])
def test_gdp_epsilon_matches_the_gaussian_mechanism(mu):
    # mu-GDP is exactly the Gaussian mechanism with noise multiplier 1/mu (PLD is near-exact)
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
    expected = accountant.get_epsilon(1e-5)
    assert gdp_epsilon(mu, 1e-5) == pytest.approx(expected, rel=1e-3)
    assert gdp_delta(mu, gdp_epsilon(mu, 1e-5)) == pytest.approx(1e-5, rel=1e-6)


def test_gdp_mu_inverts_the_trade_off_curve():
    for mu in (0.3, 1.0, 2.5):
        fpr = 0.05
        tpr = sps.norm.cdf(sps.norm.ppf(fpr) + mu)
        assert gdp_mu(tpr, fpr) == pytest.approx(mu)
    assert gdp_epsilon(0.0, 1e-5) == 0.0


def test_gaussian_dp_estimate_recovers_mu_and_says_it_is_an_estimate():
    rng = np.random.default_rng(5)
    estimate = gaussian_dp_estimate(rng.normal(1.5, 1.0, 4000), rng.normal(0.0, 1.0, 4000), 1e-5)
    assert estimate.mu == pytest.approx(1.5, abs=0.3)
    assert estimate.epsilon == pytest.approx(gdp_epsilon(estimate.mu, 1e-5))
    assert "not a bound" in estimate.kind


@FAST
@given(members=st.lists(st.integers(-5, 5), min_size=1, max_size=30),
       nonmembers=st.lists(st.integers(-5, 5), min_size=1, max_size=30))
def test_vectorised_threshold_counts_agree_with_the_definition(members, nonmembers):
    from dp_textgrad.audit.statistics._bounds_common import counts_at, counts_over

    m, n = np.array(members, dtype=float), np.array(nonmembers, dtype=float)
    grid = np.arange(-6.0, 7.0, 0.5)
    fp, fn = counts_over(m, n, grid)
    assert [(int(a), int(b)) for a, b in zip(fp, fn)] == [counts_at(m, n, float(t)) for t in grid]
