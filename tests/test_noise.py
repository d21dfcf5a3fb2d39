"""NoiseSource: OS-seeded by default, reproducible only when labelled insecure."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

from dp_textgrad.dp_es.noise import NoiseSource


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
