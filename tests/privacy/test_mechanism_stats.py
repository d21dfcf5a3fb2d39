"""Statistical audit of the mechanisms on neighbouring datasets.

D and D' = D plus one record that favours candidate 0 (it adds C to candidate 0's
utility sum and nothing elsewhere). Each mechanism runs many times on both; from the
outcome frequencies, Clopper-Pearson bounds (alpha = 0.05, Bonferroni over events)
give an empirical epsilon lower bound that must not exceed the declared epsilon.
Positive controls (noise off; noise at the wrong scale) must be caught by the same
audit, so the audit has the power to fail.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld

from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.mechanisms import ExponentialMechanism, GumbelTopK, PermuteAndFlip
from tests.helpers import ZeroNoise, epsilon_lower_bound, outcome_counts

ALPHA = 0.05
RUNS = 100_000
C = 1.0
K = 20

# Candidate 0 is slightly behind the rest on D and ahead on D' (ties never decide).
U_D = np.full(K, 5.0)
U_D[0] = 5.0 - 0.5 * C
U_PLUS = U_D.copy()
U_PLUS[0] += C


def _audit_single(mechanism, noise_d=None, noise_plus=None) -> float:
    picks_d = mechanism.sample(U_D, noise_d or NoiseSource(insecure_seed=101), RUNS)[:, 0]
    picks_plus = mechanism.sample(U_PLUS, noise_plus or NoiseSource(insecure_seed=202), RUNS)[:, 0]
    return epsilon_lower_bound(outcome_counts(picks_d, K), outcome_counts(picks_plus, K), RUNS, RUNS, alpha=ALPHA)


def _make(kind: str, eps0: float):
    return {"exponential": ExponentialMechanism, "gumbel": lambda e: GumbelTopK(e, 1),
            "permute_and_flip": PermuteAndFlip}[kind](eps0)


@pytest.mark.parametrize("kind", ["exponential", "gumbel", "permute_and_flip"])
def test_single_selection_respects_declared_epsilon(kind):
    mechanism = _make(kind, 1.0)
    declared = mechanism.epsilon
    lower = _audit_single(mechanism)
    assert lower <= declared
    assert lower > 0.7 * declared  # the audit is nearly tight here, so it can see a violation


@pytest.mark.parametrize("kind", ["exponential", "gumbel", "permute_and_flip"])
def test_positive_controls_are_detected(kind):
    declared = _make(kind, 1.0).epsilon
    # Noise off: an (almost) deterministic argmax.
    if kind == "gumbel":
        off = _audit_single(_make(kind, 1.0), ZeroNoise(), ZeroNoise())
    else:
        off = _audit_single(_make(kind, 1e6))
    assert off > declared
    # Noise at half the declared scale (eps0 doubled): a factor-2 bug is caught.
    assert _audit_single(_make(kind, 2.0)) > declared


def _audit_top2(mechanism: GumbelTopK) -> float:
    k_small = 10
    u = np.full(k_small, 5.0)
    u[:2] -= 0.5 * C
    u_plus = u.copy()
    u_plus[:2] += C  # the added record favours candidates 0 and 1
    picks_d = mechanism.sample(u, NoiseSource(insecure_seed=303), RUNS)
    picks_plus = mechanism.sample(u_plus, NoiseSource(insecure_seed=404), RUNS)
    codes_d = picks_d[:, 0] * k_small + picks_d[:, 1]  # ordered pairs are the outcomes
    codes_plus = picks_plus[:, 0] * k_small + picks_plus[:, 1]
    return epsilon_lower_bound(outcome_counts(codes_d, k_small**2), outcome_counts(codes_plus, k_small**2),
                               RUNS, RUNS, alpha=ALPHA)


def test_gumbel_top_2_respects_k_eps0_and_catches_a_wrong_scale():
    declared = GumbelTopK(1.0, 2).epsilon
    assert declared == 2.0
    lower = _audit_top2(GumbelTopK(1.0, 2))
    assert 0.6 * declared < lower <= declared
    assert _audit_top2(GumbelTopK(2.0, 2)) > declared


# -- the Gaussian noisy-score mechanism -------------------------------------------------------

Z = 1.0
K_GAUSS = 4
DELTA = 1e-2


def _declared_gaussian_epsilon(mechanism: GaussianScoreMechanism) -> float:
    accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                   value_discretization_interval=1e-3)
    accountant.compose(mechanism.event(1.0))
    return accountant.get_epsilon(DELTA)


def _gaussian_releases(mechanism, noise_d, noise_plus):
    u = np.full(K_GAUSS, 5.0)
    u[0] -= 0.5 * C
    u_plus = u + C * np.eye(K_GAUSS)[0]  # record favours candidate 0
    released_d = mechanism.release(np.tile(u, (RUNS, 1)), noise_d)
    released_plus = mechanism.release(np.tile(u_plus, (RUNS, 1)), noise_plus)
    return u, released_d, released_plus


def _audit_gaussian_top1(mechanism, noise_d=None, noise_plus=None) -> float:
    _, released_d, released_plus = _gaussian_releases(mechanism, noise_d or NoiseSource(insecure_seed=5),
                                                      noise_plus or NoiseSource(insecure_seed=6))
    top_d, top_plus = released_d.argmax(axis=1), released_plus.argmax(axis=1)
    return epsilon_lower_bound(outcome_counts(top_d, K_GAUSS), outcome_counts(top_plus, K_GAUSS),
                               RUNS, RUNS, delta=DELTA, alpha=ALPHA)


def test_gaussian_top1_respects_its_pld_epsilon_and_noise_off_is_caught():
    mechanism = GaussianScoreMechanism(Z, C, K_GAUSS)
    declared = _declared_gaussian_epsilon(mechanism)
    assert 2.0 < declared < 2.6  # mu = 1/z = 1 Gaussian at delta = 1e-2
    assert _audit_gaussian_top1(mechanism) <= declared
    assert _audit_gaussian_top1(mechanism, ZeroNoise(), ZeroNoise()) > declared


def _audit_gaussian_full_release(mechanism, noise_d=None, noise_plus=None) -> float:
    """The most revealing statistic of the whole release: where the record would push it.

    A record that adds C to every sum moves the total by K*C; its noise has std z*C*K,
    so thresholding the total traces the Gaussian's own privacy curve (mu = 1/z).
    """
    u = np.full(K_GAUSS, 5.0)
    released_d = mechanism.release(np.tile(u, (RUNS, 1)), noise_d or NoiseSource(insecure_seed=7))
    released_plus = mechanism.release(np.tile(u + C, (RUNS, 1)), noise_plus or NoiseSource(insecure_seed=8))
    scale = Z * C * K_GAUSS  # declared std of the total
    totals_d = (released_d.sum(axis=1) - u.sum()) / scale
    totals_plus = (released_plus.sum(axis=1) - u.sum()) / scale
    thresholds = np.array([0.5, 1.0, 1.5, 2.0, 2.5])  # fixed before looking at the data
    counts_d = np.array([(totals_d > t).sum() for t in thresholds] + [(totals_d <= t).sum() for t in thresholds])
    counts_plus = np.array([(totals_plus > t).sum() for t in thresholds]
                           + [(totals_plus <= t).sum() for t in thresholds])
    return epsilon_lower_bound(counts_d, counts_plus, RUNS, RUNS, delta=DELTA, alpha=ALPHA)


def test_gaussian_full_release_is_tight_and_a_missing_sqrt_k_is_caught():
    mechanism = GaussianScoreMechanism(Z, C, K_GAUSS)
    declared = _declared_gaussian_epsilon(mechanism)
    lower = _audit_gaussian_full_release(mechanism)
    assert 0.7 * declared < lower <= declared
    # Positive controls: noise off, and noise std z*C instead of z*C*sqrt(K).
    assert _audit_gaussian_full_release(mechanism, ZeroNoise(), ZeroNoise()) > declared
    too_little = GaussianScoreMechanism(Z / math.sqrt(K_GAUSS), C, K_GAUSS)
    assert too_little.noise_std == pytest.approx(Z * C)
    assert _audit_gaussian_full_release(too_little) > declared
