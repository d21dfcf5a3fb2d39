"""Statistics: AUCs, TPR at low FPR, bootstrap intervals, effect sizes and decisions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_curve

from dp_textgrad.audit import (
    bootstrap_ci,
    cohens_d,
    compare_groups,
    effect_magnitude,
    hedges_g,
    paired_bootstrap_difference,
    pr_auc,
    roc_auc,
    tpr_at_fpr,
)
from dp_textgrad.audit.statistics.metrics import PRACTICAL_EFFECT

FAST = settings(max_examples=30, deadline=None)
# Bounded, moderately spread values: the percentile bootstrap's behaviour on extreme
# floats (1e300) is a floating-point question, not a statistical one.
values = st.floats(-100, 100, allow_nan=False).map(lambda x: round(x, 3))
samples = st.lists(values, min_size=2, max_size=40)


@FAST
@given(members=samples, nonmembers=samples)
def test_aucs_are_in_the_unit_interval(members, nonmembers):
    assert 0.0 <= roc_auc(members, nonmembers) <= 1.0
    assert 0.0 <= pr_auc(members, nonmembers) <= 1.0


@FAST
@given(members=samples, nonmembers=samples)
def test_vectorised_auc_agrees_with_scikit_learn(members, nonmembers):
    # the bootstrap uses a rank formula; its point estimate must be scikit-learn's AUC
    interval = bootstrap_ci(members, nonmembers, "auc", n_resamples=1000)
    assert interval.estimate == pytest.approx(roc_auc(members, nonmembers), abs=1e-12)


def test_auc_orientation_members_high():
    assert roc_auc([5, 6, 7], [1, 2, 3]) == 1.0
    assert roc_auc([1, 2, 3], [5, 6, 7]) == 0.0
    assert pr_auc([5, 6, 7], [1, 2, 3]) == 1.0
    assert roc_auc([1, 1], [1, 1]) == 0.5


def test_non_finite_scores_are_rejected():
    with pytest.raises(ValueError, match="member_scores"):
        roc_auc([1.0, float("nan")], [0.0, 1.0])


# -- TPR at low FPR ----------------------------------------------------------------------


def test_tpr_at_low_fpr_needs_enough_nonmembers():
    result = tpr_at_fpr(np.arange(50), np.arange(99), 0.01)
    assert result.tpr is None and "at least 100 non-members" in result.reason
    result = tpr_at_fpr(np.arange(50), np.arange(999), 0.001)
    assert result.tpr is None and "1000" in result.reason


def test_tpr_at_fpr_by_hand():
    nonmembers = np.arange(100, dtype=float)  # 0..99
    members = np.array([98.5, 99.5, 100.0, 50.0])
    # 1 false positive allowed: call members above 98 -> 98.5, 99.5, 100 (3 of 4); FPR = 1/100
    result = tpr_at_fpr(members, nonmembers, 0.01)
    assert result.tpr == 0.75 and result.threshold == 98.0 and result.achieved_fpr == 0.01


@pytest.mark.parametrize("seed", range(5))
def test_tpr_at_fpr_matches_the_roc_curve(seed):
    rng = np.random.default_rng(seed)
    members, nonmembers = rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 2000)
    labels = np.r_[np.ones(300), np.zeros(2000)]
    fpr, tpr, _ = roc_curve(labels, np.r_[members, nonmembers])
    for target in (0.01, 0.001):
        result = tpr_at_fpr(members, nonmembers, target)
        assert result.achieved_fpr <= target
        assert result.tpr == pytest.approx(tpr[fpr <= target + 1e-12].max())


# -- bootstrap ------------------------------------------------------------------------------


@FAST
@given(members=samples, nonmembers=samples, statistic=st.sampled_from(["auc", "mean_difference"]),
       seed=st.integers(0, 1000))
def test_bootstrap_interval_contains_its_point_estimate(members, nonmembers, statistic, seed):
    interval = bootstrap_ci(members, nonmembers, statistic, seed=seed)
    assert interval.low <= interval.high
    assert interval.contains(interval.estimate)
    assert interval.n_resamples >= 1000


@FAST
@given(sample=st.lists(values, min_size=3, max_size=40),
       statistic=st.sampled_from(["mean_difference", "cohens_d"]), seed=st.integers(0, 1000))
def test_bootstrap_interval_crosses_zero_for_identical_samples(sample, statistic, seed):
    interval = bootstrap_ci(sample, sample, statistic, seed=seed)
    assert interval.estimate == 0.0
    assert interval.low <= 0.0 <= interval.high
    assert not interval.excludes_zero()


def test_bootstrap_is_seeded_and_needs_enough_resamples():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=30), rng.normal(size=30)
    assert bootstrap_ci(a, b, seed=3) == bootstrap_ci(a, b, seed=3)
    with pytest.raises(ValueError, match="n_resamples: must be an integer >= 1000"):
        bootstrap_ci(a, b, n_resamples=999)


def test_bootstrap_detects_a_real_difference():
    rng = np.random.default_rng(1)
    interval = bootstrap_ci(rng.normal(1.0, 1.0, 200), rng.normal(0.0, 1.0, 200), "mean_difference")
    assert interval.excludes_zero() and interval.low > 0.5


def test_bootstrap_accepts_a_function_statistic():
    rng = np.random.default_rng(2)
    a, b = rng.normal(1, 1, 20), rng.normal(0, 1, 20)

    def median_difference(x, y):
        return float(np.median(x) - np.median(y))

    interval = bootstrap_ci(a, b, median_difference)
    assert interval.statistic == "median_difference"
    assert interval.estimate == pytest.approx(np.median(a) - np.median(b))


def test_paired_bootstrap_difference():
    rng = np.random.default_rng(3)
    members, nonmembers = rng.normal(1, 1, 100), rng.normal(0, 1, 100)
    same = paired_bootstrap_difference(members, nonmembers, members, nonmembers, "auc")
    assert same.estimate == same.low == same.high == 0.0  # same items, same indices: exactly zero
    noisy_members = members + rng.normal(0, 3, 100)  # attack b: the same items with a blurred signal
    better = paired_bootstrap_difference(members, nonmembers, noisy_members, nonmembers, "auc")
    assert better.estimate > 0 and better.excludes_zero()
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap_difference(members, nonmembers, members[:-1], nonmembers)


# -- effect sizes --------------------------------------------------------------------------


def test_cohens_d_and_hedges_g_by_hand():
    # means 2 and 5, both sample variances 1 -> pooled sd 1
    assert cohens_d([1, 2, 3], [4, 5, 6]) == pytest.approx(-3.0)
    assert hedges_g([1, 2, 3], [4, 5, 6]) == pytest.approx(-3.0 * (1 - 3 / (4 * 6 - 9)))


@FAST
@given(sample=st.lists(values, min_size=3, max_size=40))
def test_cohens_d_is_zero_for_identical_samples(sample):
    assert cohens_d(sample, sample) == 0.0
    assert hedges_g(sample, sample) == 0.0


@FAST
@given(members=samples, nonmembers=samples)
def test_cohens_d_sign_follows_the_mean_difference(members, nonmembers):
    difference = np.mean(members) - np.mean(nonmembers)
    d = cohens_d(members, nonmembers)
    assert np.sign(d) == np.sign(difference)
    assert np.sign(hedges_g(members, nonmembers)) == np.sign(difference)


@pytest.mark.parametrize("d,label", [
    (0.0, "negligible"), (0.19, "negligible"), (0.2, "small"), (-0.49, "small"), (0.5, "medium"),
    (0.79, "medium"), (0.8, "large"), (-3.0, "large"), (float("inf"), "large"),
])
def test_effect_magnitude_categories(d, label):
    assert effect_magnitude(d) == label


# -- decisions -------------------------------------------------------------------------------


def test_compare_groups_decisions():
    rng = np.random.default_rng(4)
    strong = compare_groups(rng.normal(1.0, 1.0, 150), rng.normal(0.0, 1.0, 150))
    assert strong.statistically_significant and strong.practically_significant
    assert strong.magnitude in ("medium", "large")
    assert strong.auc.estimate > 0.7 and strong.tpr_at_1pct_fpr.tpr is not None
    assert strong.tpr_at_01pct_fpr.tpr is None  # 150 non-members cannot resolve FPR 0.1%
    sample = rng.normal(size=80)
    null = compare_groups(sample, sample)
    assert not null.statistically_significant and not null.practically_significant
    # a tiny but precisely measured shift is significant yet negligible
    tiny = compare_groups(rng.normal(0.12, 1.0, 3000), rng.normal(0.0, 1.0, 3000))  # 4.6 standard errors
    assert tiny.statistically_significant and not tiny.practically_significant
    assert abs(tiny.cohens_d) < PRACTICAL_EFFECT
    assert tiny.to_dict()["magnitude"] == "negligible"
