"""The teacher vote (dp_textgrad.privacy.voting): keyed partition, vote histograms, GNMax and
confident GNMax (sensitivity, events, release), calibration, and the labelling step's charge.

Numbers are checked against independent computations: the Gaussian mechanism's exact
privacy curve (Balle and Wang 2018), the closed-form RDP of a Gaussian with sensitivity
sqrt(2) and noise sigma (alpha / sigma^2 per query), and dp-accounting's own accountants.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import pickle

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dp_textgrad.privacy.accounting import PrivacyLedger, RdpAccountant, event_to_dict, smallest_bound
from dp_textgrad.privacy.accounting.accountants import DEFAULT_RDP_ORDERS
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded
from dp_textgrad.privacy.data import PrivateDataError, PrivateDataset, _canonical
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.voting import (
    ConfidentGNMax,
    GNMax,
    LabellingPlan,
    TeacherPartition,
    calibrate_gnmax,
    label_by_vote,
    partition_teachers,
    plan_labelling,
    record_bytes,
    teacher_of,
    vote_histograms,
)
from tests.helpers import ZeroNoise

KEY = b"0123456789abcdef-test-key"
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclasses.dataclass(frozen=True)
class Example:
    text: str
    label: int


records_strategy = st.lists(
    st.fixed_dictionaries({"text": st.text(max_size=12), "label": st.integers(0, 2)}), min_size=1, max_size=30
)


# -- the keyed partition -------------------------------------------------------------------


def test_teacher_is_an_hmac_of_the_records_canonical_bytes() -> None:
    record = Example("great film", 1)
    assert record_bytes(record) == _canonical(record)  # as PrivateDataset canonicalises records
    assert record_bytes({"b": 1, "a": "é"}) == _canonical({"a": "é", "b": 1})
    digest = hmac.new(KEY, b"dp-textgrad-teacher-v1" + _canonical(record), hashlib.sha256).digest()
    assert teacher_of(record, KEY, 7) == int.from_bytes(digest, "big") % 7
    assert teacher_of(record, KEY, 1) == 0
    others = {teacher_of(record, bytes([k]) * 16, 1000) for k in range(20)}
    assert len(others) > 10  # the key decides the group


def test_records_whose_text_is_a_memory_address_are_refused() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError, match="content-based repr"):
        teacher_of({"text": Opaque()}, KEY, 4)
    with pytest.raises(ValueError, match="key"):
        teacher_of({"text": "x"}, b"short", 4)
    with pytest.raises(ValueError, match="teachers"):
        teacher_of({"text": "x"}, KEY, 0)


@FAST
@given(
    records_strategy,
    st.fixed_dictionaries({"text": st.text(max_size=12), "label": st.integers(0, 2)}),
    st.integers(1, 9),
    st.integers(0, 30),
)
def test_one_record_more_changes_no_other_records_group(records, extra, teachers, where) -> None:
    position = min(where, len(records))
    grown = [*records[:position], extra, *records[position:]]
    before = partition_teachers(PrivateDataset(records), KEY, teachers)
    after = partition_teachers(PrivateDataset(grown), KEY, teachers)
    home = teacher_of(extra, KEY, teachers)
    for t in range(teachers):
        old = [r.unwrap() for r in before.group(t)]
        new = [r.unwrap() for r in after.group(t)]
        if t != home:
            assert new == old
        else:
            assert sorted(map(repr, new)) == sorted(map(repr, [*old, extra]))


def _majority(group) -> list[int | None]:
    """A teacher that depends on its group only: the most common label (ties: the smallest)."""
    labels = [r.unwrap()["label"] for r in group]
    return [max(set(labels), key=lambda y: (labels.count(y), -y))]


@FAST
@given(
    records_strategy,
    st.fixed_dictionaries({"text": st.text(max_size=12), "label": st.integers(0, 2)}),
    st.integers(1, 9),
)
def test_histograms_of_neighbours_differ_in_two_cells_by_one(records, extra, teachers) -> None:
    def histogram(rows):
        partition = partition_teachers(PrivateDataset(rows), KEY, teachers)
        votes = [[None] if len(g) == 0 else _majority(g) for g in partition.groups()]
        return vote_histograms(votes, 3, 1)[0]

    before, after = histogram(records), histogram([*records, extra])
    diff = after - before
    assert np.count_nonzero(diff) <= 2
    assert np.abs(diff).max() <= 1.0
    assert np.linalg.norm(diff) <= GNMax.l2_sensitivity + 1e-12
    assert abs(after.max() - before.max()) <= ConfidentGNMax.max_count_sensitivity


def test_the_partition_reveals_only_the_number_of_teachers() -> None:
    partition = partition_teachers(PrivateDataset([{"text": "a", "label": 0}] * 5), KEY, 3)
    assert partition.teachers == 3
    assert repr(partition) == "TeacherPartition(teachers=3, <redacted>)"
    with pytest.raises(PrivateDataError):
        str(partition)
    with pytest.raises(PrivateDataError):
        f"{partition}"
    with pytest.raises(PrivateDataError):
        pickle.dumps(partition)
    with pytest.raises(AttributeError):
        partition.teachers = 4  # type: ignore[misc]
    assert {n for n in dir(TeacherPartition) if not n.startswith("_")} == {"teachers", "group", "groups"}
    assert sum(len(g) for g in partition.groups()) == 5  # (mechanism code only) every record in one group


def test_vote_histograms_count_one_vote_per_teacher_and_name_no_vote() -> None:
    counts = vote_histograms([[0, None], [2, 1], [None, 1]], 3, 2)
    assert counts.tolist() == [[1, 0, 1], [0, 2, 0]]
    with pytest.raises(ValueError, match=r"^votes: a vote must be None or a label index in \[0, 3\)$"):
        vote_histograms([[0, 7]], 3, 2)
    with pytest.raises(ValueError, match="one vote"):
        vote_histograms([[0]], 3, 2)
    with pytest.raises(ValueError):
        vote_histograms([[True]], 3, 1)


# -- sensitivity and events ---------------------------------------------------------------------


def test_gnmax_event_is_a_gaussian_of_multiplier_sigma_over_sqrt2_per_query() -> None:
    mechanism = GNMax(6.0, 4)
    assert mechanism.l2_sensitivity == math.sqrt(2)
    assert mechanism.noise_multiplier == pytest.approx(6.0 / math.sqrt(2))
    assert mechanism.event() == dp_accounting.GaussianDpEvent(6.0 / math.sqrt(2))
    assert mechanism.event(5) == dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(6.0 / math.sqrt(2)), 5)
    confident = ConfidentGNMax(threshold=10.0, threshold_sigma=8.0, sigma=6.0, num_labels=4)
    assert confident.event(5) == dp_accounting.ComposedDpEvent(
        [
            dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(8.0), 5),
            mechanism.event(5),
        ]
    )
    assert confident.metadata()["max_count_sensitivity"] == 1.0
    with pytest.raises(ValueError, match="sigma"):
        GNMax(0.0, 2)
    with pytest.raises(ValueError, match="queries"):
        mechanism.event(0)


def _balle_wang_delta(eps: float, mu: float) -> float:
    """Exact delta(eps) of a Gaussian mechanism with sensitivity / std = mu."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize("sigma, queries, delta", [(40.0, 100, 1e-5), (10.0, 1, 1e-6), (150.0, 2000, 1e-5)])
def test_claim_is_the_exact_gaussian_epsilon_of_the_composed_queries(sigma, queries, delta) -> None:
    # Q Gaussian releases with sensitivity sqrt(2), std sigma compose to one with mu = sqrt(2 Q) / sigma.
    claim = smallest_bound([GNMax(sigma, 3).event(queries)], delta)
    mu = math.sqrt(2 * queries) / sigma
    assert _balle_wang_delta(claim, mu) <= delta * 1.001  # valid
    assert _balle_wang_delta(claim * 0.99, mu) > delta  # and within 1% of the exact value


@pytest.mark.parametrize("sigma, queries", [(40.0, 100), (10.0, 1), (150.0, 2000)])
def test_rdp_matches_the_closed_form_alpha_over_sigma_squared(sigma, queries) -> None:
    orders = np.asarray(DEFAULT_RDP_ORDERS, dtype=float)
    closed_form = queries * orders / sigma**2  # alpha * sensitivity^2 / (2 sigma^2), sensitivity^2 = 2
    independent = dpa_rdp.compute_epsilon(orders, closed_form, 1e-5)[0]
    ours = RdpAccountant().epsilon([GNMax(sigma, 2).event(queries)], 1e-5)
    assert ours == pytest.approx(independent, rel=1e-9)
    # and dp-accounting's own PLD accountant, straight from the event, agrees with the smallest bound
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2)), queries)
    assert smallest_bound([GNMax(sigma, 2).event(queries)], 1e-5) == pytest.approx(pld.get_epsilon(1e-5), rel=0.01)


@FAST
@given(st.floats(2.0, 200.0), st.integers(1, 500), st.integers(1, 50))
def test_epsilon_grows_with_queries_and_falls_with_sigma(sigma, queries, more) -> None:
    rdp = RdpAccountant()

    def eps(s: float, q: int) -> float:
        return rdp.epsilon([GNMax(s, 2).event(q)], 1e-5)

    assert eps(sigma, queries + more) > eps(sigma, queries)
    assert eps(sigma * 1.1, queries) < eps(sigma, queries)
    confident = ConfidentGNMax(1.0, sigma, sigma, 2)
    assert rdp.epsilon([confident.event(queries)], 1e-5) > eps(sigma, queries)  # the threshold step costs


# -- calibration ----------------------------------------------------------------------------------


@SLOW
@given(st.floats(0.1, 8.0), st.sampled_from([1e-6, 1e-5]), st.integers(1, 2000))
def test_calibrated_sigma_never_exceeds_the_target_and_wastes_little(epsilon, delta, queries) -> None:
    sigma = calibrate_gnmax(epsilon, delta, queries)
    assert smallest_bound([GNMax(sigma, 2).event(queries)], delta) <= epsilon
    assert smallest_bound([GNMax(sigma * 0.99, 2).event(queries)], delta) > epsilon  # the smallest such sigma


@pytest.mark.parametrize("epsilon, queries, threshold_sigma", [(1.0, 200, 150.0), (4.0, 50, 20.0)])
def test_confident_calibration_fits_both_steps(epsilon, queries, threshold_sigma) -> None:
    plan = plan_labelling(
        epsilon, 1e-5, queries=queries, teachers=250, num_labels=2, threshold=100.0, threshold_sigma=threshold_sigma
    )
    assert isinstance(plan.mechanism, ConfidentGNMax) and plan.mechanism.threshold_sigma == threshold_sigma
    assert plan.epsilon(1e-5) <= epsilon
    looser = ConfidentGNMax(100.0, threshold_sigma, plan.mechanism.sigma * 0.99, 2)
    assert smallest_bound([looser.event(queries)], 1e-5) > epsilon
    assert plan.events() == [plan.mechanism.event(queries)]


def test_a_threshold_step_over_the_share_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold step alone"):
        calibrate_gnmax(0.5, 1e-5, 1000, threshold_sigma=1.0)
    with pytest.raises(ValueError, match="give both"):
        plan_labelling(1.0, 1e-5, queries=10, teachers=10, num_labels=2, threshold=5.0)


# -- the release ---------------------------------------------------------------------------------


def test_without_noise_it_is_the_plain_argmax() -> None:
    counts = np.array([[3, 9, 1], [7, 0, 2], [0, 0, 5]])
    assert GNMax(5.0, 3).release(counts, ZeroNoise()) == [1, 0, 2]
    assert GNMax(5.0, 3).sample(counts[0], ZeroNoise(), 4).tolist() == [1, 1, 1, 1]
    confident = ConfidentGNMax(threshold=6.0, threshold_sigma=2.0, sigma=5.0, num_labels=3)
    assert confident.release(counts, ZeroNoise()) == [1, 0, None]
    assert confident.sample(counts[2], ZeroNoise(), 3).tolist() == [-1, -1, -1]


def test_a_huge_margin_always_wins_and_the_secure_sampler_releases_labels() -> None:
    picks = GNMax(5.0, 4).sample(np.array([0, 200, 0, 0]), NoiseSource(insecure_seed=3), 5000)
    assert np.all(picks == 1)
    assert GNMax(5.0, 4).release(np.array([[0, 200, 0, 0]] * 3), NoiseSource()) == [1, 1, 1]
    released = ConfidentGNMax(50.0, 5.0, 5.0, 4).release(np.array([[0, 200, 0, 0], [1, 1, 1, 1]]), NoiseSource())
    assert released == [1, None]


def test_release_frequencies_match_the_gaussian() -> None:
    sigma, runs = 3.0, 40_000
    picks = GNMax(sigma, 2).sample(np.array([12.0, 10.0]), NoiseSource(insecure_seed=11), runs)
    expected = norm.sf(2.0 / (math.sqrt(2) * sigma))  # P(n1 - n0 + N(0, 2 sigma^2) > 0)
    assert abs(picks.mean() - expected) < 4 * math.sqrt(expected * (1 - expected) / runs)
    confident = ConfidentGNMax(threshold=14.0, threshold_sigma=2.0, sigma=sigma, num_labels=2)
    answered = confident.sample(np.array([12.0, 10.0]), NoiseSource(insecure_seed=12), runs) >= 0
    expected = norm.sf(2.0 / 2.0)  # P(12 + N(0, 4) >= 14)
    assert abs(answered.mean() - expected) < 4 * math.sqrt(expected * (1 - expected) / runs)


# -- the labelling step ---------------------------------------------------------------------------


def test_label_by_vote_charges_the_planned_event_before_any_teacher_reads() -> None:
    dataset = PrivateDataset([{"text": f"t{i}", "label": i % 2} for i in range(40)])
    partition = partition_teachers(dataset, KEY, 50)  # more teachers than records: some have none
    ledger = PrivacyLedger(5.0, 1e-5)
    asked: list[int] = []

    def vote(group):
        assert len(ledger.entries) == 1  # charged first
        asked.append(len(group))
        return [r.unwrap()["label"] for r in group][:1] * 3

    plan = LabellingPlan(GNMax(20.0, 2), queries=3, teachers=50)
    labels = label_by_vote(ledger, plan.mechanism, partition, vote, 3, NoiseSource(insecure_seed=0))
    assert len(labels) == 3 and all(label in (0, 1) for label in labels)
    assert 0 not in asked  # a teacher without records abstains without being asked
    assert len(asked) == sum(1 for g in partition.groups() if len(g))
    assert [event_to_dict(e.event) for e in ledger.entries] == [event_to_dict(e) for e in plan.events()]
    assert ledger.entries[0].label == "labelling"
    assert ledger.entries[0].metadata["queries"] == 3 and ledger.entries[0].metadata["teachers"] == 50


def test_an_unaffordable_vote_reads_nothing() -> None:
    partition = partition_teachers(PrivateDataset([{"text": "x", "label": 0}]), KEY, 2)
    ledger = PrivacyLedger(0.1, 1e-5)

    def vote(group):
        raise AssertionError("a teacher read its records although the charge was refused")

    with pytest.raises(BudgetExceeded):
        label_by_vote(ledger, GNMax(1.0, 2), partition, vote, 10, NoiseSource(insecure_seed=0))
    assert ledger.entries == []
