"""Selectors: free ones on noisy values, DP ones with the right distribution and events."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest

from dp_textgrad.privacy.accounting.events import GumbelTopKDpEvent, PureDpEvent
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.dp_es.selector import top_k, tournament
from dp_textgrad.privacy.mechanisms import ExponentialMechanism, GumbelTopK, PermuteAndFlip

# -- free selectors --------------------------------------------------------------------


def test_top_k_orders_best_first_and_breaks_ties_by_index():
    assert top_k([0.1, 0.9, 0.5, 0.9], 3) == [1, 3, 2]
    assert top_k(np.array([2.0]), 1) == [0]
    assert all(isinstance(i, int) for i in top_k([1.0, 2.0], 2))


@pytest.mark.parametrize("values, k, match", [
    ([1.0, 2.0], 0, "k: must be >= 1"),
    ([1.0, 2.0], 3, r"k: must be <= the number of candidates \(2\)"),
    ([1.0, math.nan], 1, "values: every value must be finite"),
    ([], 1, "values: must be a non-empty"),
    ([[1.0, 2.0]], 1, "values: must be a non-empty 1-D"),
])
def test_top_k_validates(values, k, match):
    with pytest.raises(ValueError, match=match):
        top_k(values, k)


def test_tournament_with_everyone_entering_is_top_k():
    values = [0.3, 0.8, 0.1, 0.5]
    assert tournament(values, 3, size=4, rng=np.random.default_rng(0)) == [1, 3, 0]


def test_tournament_distinct_winners_and_selection_pressure():
    rng = np.random.default_rng(1)
    values = np.arange(10.0)
    wins = np.zeros(10)
    for _ in range(400):
        winners = tournament(values, 3, size=2, rng=rng)
        assert len(set(winners)) == 3
        wins[winners] += 1
    assert wins[9] > wins[0] * 3  # better candidates win more often
    repeated = tournament([1.0, 0.0], 5, size=1, rng=rng, distinct=False)
    assert len(repeated) == 5 and set(repeated) <= {0, 1}


def test_tournament_validates():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="size"):
        tournament([1.0, 2.0], 1, size=3, rng=rng)
    with pytest.raises(ValueError, match="k: must be <="):
        tournament([1.0, 2.0], 3, size=1, rng=rng)
    with pytest.raises(TypeError, match="rng"):
        tournament([1.0, 2.0], 1, size=1, rng=0)


# -- mechanism parameters and events ----------------------------------------------------


@pytest.mark.parametrize("factory", [
    lambda e: ExponentialMechanism(e), lambda e: GumbelTopK(e, 1), lambda e: PermuteAndFlip(e)])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_epsilon0_must_be_positive_and_finite(factory, bad):
    with pytest.raises(ValueError, match="epsilon0: must be a finite number > 0"):
        factory(bad)


def test_other_parameters_are_validated():
    with pytest.raises(ValueError, match="sensitivity"):
        GumbelTopK(1.0, 1, sensitivity=0.0)
    with pytest.raises(ValueError, match="k: must be >= 1"):
        GumbelTopK(1.0, 0)
    with pytest.raises(TypeError, match="k: must be an int"):
        GumbelTopK(1.0, 1.5)
    with pytest.raises(ValueError, match=r"k: must be <= the number of candidates \(2\)"):
        GumbelTopK(1.0, 3).select([0.0, 1.0], NoiseSource(insecure_seed=0))
    with pytest.raises(ValueError, match="utilities"):
        ExponentialMechanism(1.0).select([0.0, math.inf], NoiseSource(insecure_seed=0))
    with pytest.raises(TypeError, match="epsilon0: must be a number"):
        PermuteAndFlip("big")


def test_events_are_bare_at_q_one_and_poisson_sampled_below():
    assert GumbelTopK(0.5, 3).event(1.0) == GumbelTopKDpEvent(0.5, 3)
    assert ExponentialMechanism(0.5).event(1.0) == GumbelTopKDpEvent(0.5, 1)
    assert PermuteAndFlip(0.5).event(1.0) == PureDpEvent(0.5)
    assert GumbelTopK(0.5, 2).event(0.1) == dp_accounting.PoissonSampledDpEvent(0.1, GumbelTopKDpEvent(0.5, 2))
    assert PermuteAndFlip(0.5).event(0.2) == dp_accounting.PoissonSampledDpEvent(0.2, PureDpEvent(0.5))
    assert GumbelTopK(0.5, 2).epsilon == pytest.approx(1.0)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="sampling_rate"):
            GumbelTopK(0.5, 2).event(bad)


# -- distributions: scale C / eps0 (monotone utility, no factor 2) ---------------------

UTILS = np.array([3.0, 1.0, 0.0, 2.5])


def _softmax(logits):
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def _frequencies(mechanism, utilities, runs, seed=3):
    picks = mechanism.sample(utilities, NoiseSource(insecure_seed=seed), runs)
    return picks


def _assert_close(observed_counts, expected_probs, runs):
    # 5-sigma binomial tolerance: wrong scales (factor 2) are far outside it.
    sd = np.sqrt(expected_probs * (1 - expected_probs) / runs)
    np.testing.assert_array_less(np.abs(observed_counts / runs - expected_probs), 5 * sd + 1e-12)


@pytest.mark.parametrize("mechanism", [ExponentialMechanism(0.8, sensitivity=2.0), GumbelTopK(0.8, 1, 2.0)])
def test_single_selection_is_softmax_of_eps0_u_over_c(mechanism):
    runs = 100_000
    picks = _frequencies(mechanism, UTILS, runs)
    expected = _softmax(0.8 * UTILS / 2.0)
    _assert_close(np.bincount(picks[:, 0], minlength=4), expected, runs)
    wrong = _softmax(0.8 * UTILS / 4.0)  # the factor-2 version must be distinguishable
    assert np.max(np.abs(expected - wrong)) > 0.03


def test_gumbel_top_k_is_sequential_exponential_without_replacement():
    runs, eps0 = 100_000, 0.7
    picks = _frequencies(GumbelTopK(eps0, 2), UTILS, runs)
    assert np.all(picks[:, 0] != picks[:, 1])
    weights = np.exp(eps0 * UTILS)
    pairs = list(itertools.permutations(range(4), 2))
    expected = np.array([weights[a] / weights.sum() * weights[b] / (weights.sum() - weights[a]) for a, b in pairs])
    codes = picks[:, 0] * 4 + picks[:, 1]
    observed = np.array([np.sum(codes == a * 4 + b) for a, b in pairs])
    _assert_close(observed, expected, runs)


def _permute_and_flip_exact(utilities, eps0, sensitivity):
    """Exact PF probabilities by enumerating the visiting orders."""
    accept = np.exp(eps0 * (utilities - utilities.max()) / sensitivity)
    probs = np.zeros(len(utilities))
    orders = list(itertools.permutations(range(len(utilities))))
    for order in orders:
        survive = 1.0
        for r in order:
            probs[r] += survive * accept[r] / len(orders)
            survive *= 1 - accept[r]
    return probs


def test_permute_and_flip_matches_its_exact_distribution():
    runs = 100_000
    picks = _frequencies(PermuteAndFlip(0.9, sensitivity=1.5), UTILS, runs)
    expected = _permute_and_flip_exact(UTILS, 0.9, 1.5)
    _assert_close(np.bincount(picks[:, 0], minlength=4), expected, runs)
    # PF is never worse than the exponential mechanism in expected utility.
    assert expected @ UTILS >= _softmax(0.9 * UTILS / 1.5) @ UTILS


def test_select_returns_ordered_python_ints_and_is_exact_at_huge_epsilon():
    source = NoiseSource(insecure_seed=0)
    chosen = GumbelTopK(1e4, 3).select(UTILS, source)
    assert chosen == [0, 3, 1] and all(type(i) is int for i in chosen)
    assert ExponentialMechanism(1e4).select(UTILS, source) == [0]
    assert PermuteAndFlip(1e4).select(UTILS, source) == [0]
    assert GumbelTopK(1.0, 4).select(UTILS, source) and sorted(GumbelTopK(1.0, 4).select(UTILS, source)) == [0, 1, 2, 3]
