"""NoiseSource: OS-seeded by default, reproducible only when labelled insecure."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

from dp_textgrad.privacy.noise import NoiseSource


def test_default_source_is_secure_and_fresh_each_construction():
    first, second = NoiseSource(), NoiseSource()
    assert first.secure and second.secure
    assert first.insecure_seed is None
    # Two OS-seeded sources agreeing on 16 Gaussian draws has probability ~0.
    assert not np.array_equal(first.normal(1.0, 16), second.normal(1.0, 16))
    assert "secure=True" in repr(first)


def test_insecure_seed_is_reproducible_and_labelled():
    a, b = NoiseSource(insecure_seed=42), NoiseSource(insecure_seed=42)
    assert not a.secure and a.insecure_seed == 42
    assert "secure=False" in repr(a)
    np.testing.assert_array_equal(a.normal(2.0, 10), b.normal(2.0, 10))
    np.testing.assert_array_equal(a.gumbel(1.0, 5), b.gumbel(1.0, 5))
    assert not np.array_equal(NoiseSource(insecure_seed=1).uniform(8), NoiseSource(insecure_seed=2).uniform(8))


def test_secure_source_refuses_pickling_and_copying():
    source = NoiseSource()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(source)
    with pytest.raises(TypeError, match="cannot be pickled"):
        copy.deepcopy(source)


def test_insecure_source_pickles_with_its_stream_position():
    source = NoiseSource(insecure_seed=5)
    source.normal(1.0, 3)
    clone = pickle.loads(pickle.dumps(source))
    assert not clone.secure
    np.testing.assert_array_equal(source.normal(1.0, 4), clone.normal(1.0, 4))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_scale_is_validated(bad):
    source = NoiseSource(insecure_seed=0)
    with pytest.raises(ValueError, match="scale"):
        source.normal(bad, 3)
    with pytest.raises(ValueError, match="scale"):
        source.gumbel(bad, 3)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_bernoulli_probability_is_validated(bad):
    with pytest.raises(ValueError, match="p:"):
        NoiseSource(insecure_seed=0).bernoulli(bad)


@pytest.mark.parametrize("bad, error", [(-3, ValueError), ("7", TypeError), (True, TypeError), (1.5, TypeError)])
def test_insecure_seed_is_validated(bad, error):
    with pytest.raises(error, match="insecure_seed"):
        NoiseSource(insecure_seed=bad)


def test_distributions_have_the_documented_scale():
    source = NoiseSource(insecure_seed=11)
    n = 200_000
    normal = source.normal(3.0, n)
    assert abs(normal.mean()) < 0.05 and abs(normal.std() / 3.0 - 1) < 0.01
    gumbel = source.gumbel(2.0, n)
    assert abs(gumbel.mean() - 2.0 * np.euler_gamma) < 0.03  # Gumbel(0, b): mean b * gamma
    assert abs(gumbel.std() - 2.0 * math.pi / math.sqrt(6)) < 0.03
    uniform = source.uniform(n)
    assert uniform.min() >= 0.0 and uniform.max() < 1.0 and abs(uniform.mean() - 0.5) < 0.01
    flips = source.bernoulli(np.full(n, 0.3))
    assert flips.dtype == bool and abs(flips.mean() - 0.3) < 0.01
    assert source.bernoulli(1.0) is True and source.bernoulli(0.0) is False
    assert isinstance(source.generator, np.random.Generator)


# -- releases through OpenDP (floating-point safe) -----------------------------------------------
def test_secure_gaussian_release_has_the_declared_scale():
    values = np.zeros(20_000)
    noisy = NoiseSource().add_gaussian(values, 2.5)
    assert noisy.shape == values.shape
    # std of 20k draws: relative standard error about 0.5%; 4% is far outside chance.
    assert abs(float(np.std(noisy)) / 2.5 - 1.0) < 0.04
    assert abs(float(np.mean(noisy))) < 4 * 2.5 / math.sqrt(values.size)


def test_secure_gaussian_keeps_shape_and_adds_to_the_values():
    counts = np.arange(12, dtype=float).reshape(3, 4) * 1000.0
    noisy = NoiseSource().add_gaussian(counts, 0.5)
    assert noisy.shape == (3, 4)
    assert np.all(np.abs(noisy - counts) < 10.0)


def test_secure_gaussian_uses_opendp_and_its_map_matches_the_charged_gaussian():
    from dp_textgrad.privacy.noise import _opendp_gaussian

    measurement = _opendp_gaussian(4, 3.0)
    # zCDP of the Gaussian mechanism: rho = (sensitivity / sigma)^2 / 2; OpenDP rounds the
    # sensitivity up to its grid, so its rho may exceed ours only by that rounding.
    rho = float(measurement.map(1.0))
    assert rho == pytest.approx(1.0 / (2 * 9.0), rel=1e-6)


@pytest.mark.parametrize("noise, expected", [
    ("gumbel", 1.0 / (1.0 + math.exp(-1.0))),       # logistic: Gumbel-max of a gap of 1 at scale 1
    ("exponential", 1.0 - 0.5 * math.exp(-1.0)),    # permute-and-flip with eps0 = 1, gap 1
])
def test_secure_top_k_has_the_mechanism_distribution(noise, expected):
    source = NoiseSource()
    draws = 6000
    wins = sum(source.noisy_top_k(np.array([1.0, 0.0]), 1.0, 1, noise)[0] == 0 for _ in range(draws))
    # binomial standard error about 0.006; 0.03 is five of them
    assert abs(wins / draws - expected) < 0.03


def test_insecure_top_k_and_gaussian_are_reproducible_and_labelled():
    a, b = NoiseSource(insecure_seed=3), NoiseSource(insecure_seed=3)
    assert a.noisy_top_k(np.arange(6.0), 2.0, 3) == b.noisy_top_k(np.arange(6.0), 2.0, 3)
    np.testing.assert_array_equal(a.add_gaussian(np.ones(5), 1.0), b.add_gaussian(np.ones(5), 1.0))
    assert "INSECURE" in a.sampler and "opendp" in NoiseSource().sampler


def test_subsample_generator_is_apart_from_the_noise_generator():
    # A dataset that gains a record draws one more subsample uniform: the noise must not shift.
    a, b = NoiseSource(insecure_seed=9), NoiseSource(insecure_seed=9)
    a.sampling_generator.random(40)
    b.sampling_generator.random(41)
    np.testing.assert_array_equal(a.add_gaussian(np.zeros(6), 1.0), b.add_gaussian(np.zeros(6), 1.0))
    assert a.sampling_generator is not a.generator


def test_top_k_rejects_bad_input():
    source = NoiseSource()
    with pytest.raises(ValueError, match="k:"):
        source.noisy_top_k(np.arange(3.0), 1.0, 4)
    with pytest.raises(ValueError, match="noise:"):
        source.noisy_top_k(np.arange(3.0), 1.0, 1, "laplace")
    with pytest.raises(ValueError, match="utilities"):
        source.noisy_top_k(np.array([1.0, math.nan]), 1.0, 1)
