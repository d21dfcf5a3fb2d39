"""The token vote of DP answers (dp_textgrad.privacy.token_voting): its event, its calibration, and
the order charge -> subsample -> partition -> vote -> release."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.accounting.accountants import PldAccountant, RdpAccountant
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.token_voting import AnsweringPlan, TokenGNMax, answer_by_vote, calibrate_token_gnmax
from dp_textgrad.privacy.voting import teacher_of

KEY = b"k" * 32


def gdp_epsilon(mu: float, delta: float) -> float:
    """Dong, Roth and Su (2022), Corollary 2.13: mu-GDP is (eps, delta)-DP for all eps >= 0 with
    delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2); solved here for eps."""

    def gap(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return brentq(gap, 0.0, 100.0)


# -- the event -----------------------------------------------------------------------------------
def test_the_event_is_one_gaussian_per_answer_self_composed() -> None:
    mechanism = TokenGNMax(sigma=10.0, max_tokens=16)
    z = 10.0 / math.sqrt(2)
    assert mechanism.noise_multiplier == pytest.approx(z)
    assert mechanism.query_event() == dp_accounting.GaussianDpEvent(z / 4.0)
    assert mechanism.event(5) == dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z / 4.0), 5)
    subsampled = TokenGNMax(sigma=10.0, max_tokens=16, sampling_rate=0.1)
    assert subsampled.query_event() == dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z / 4.0))


@pytest.mark.parametrize(("sigma", "tokens", "queries"), [(10.0, 16, 4), (30.0, 20, 8), (5.0, 1, 1)])
def test_one_gaussian_per_answer_is_the_composition_of_its_steps(sigma, tokens, queries) -> None:
    """The L steps of an answer, charged as one Gaussian, cost what L Gaussian steps cost: by the
    accountants (PLD, RDP) and by the analytic mu-GDP bound with mu = sqrt(Q L) / z."""
    mechanism = TokenGNMax(sigma, tokens)
    steps = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(mechanism.noise_multiplier), tokens * queries)
    for accountant in (PldAccountant(), RdpAccountant()):
        ours = smallest_bound([mechanism.event(queries)], 1e-5, [accountant])
        stepwise = smallest_bound([steps], 1e-5, [accountant])
        assert ours == pytest.approx(stepwise, rel=2e-3)
    mu = math.sqrt(queries * tokens) / mechanism.noise_multiplier
    assert smallest_bound([mechanism.event(queries)], 1e-5, [PldAccountant()]) == pytest.approx(
        gdp_epsilon(mu, 1e-5), rel=5e-3
    )


def test_subsampling_each_answer_costs_less_than_all_records() -> None:
    full = TokenGNMax(10.0, 16).event(8)
    sampled = TokenGNMax(10.0, 16, 0.1).event(8)
    assert smallest_bound([sampled], 1e-5) < 0.5 * smallest_bound([full], 1e-5)


@settings(max_examples=12, deadline=None)
@given(
    epsilon=st.floats(0.3, 4.0),
    queries=st.integers(1, 12),
    tokens=st.integers(1, 24),
    rate=st.sampled_from([1.0, 0.5, 0.1]),
)
def test_calibrated_sigma_never_exceeds_the_target(epsilon, queries, tokens, rate) -> None:
    sigma = calibrate_token_gnmax(epsilon, 1e-5, queries, tokens, rate)
    plan = AnsweringPlan(TokenGNMax(sigma, tokens, rate), queries, teachers=10)
    assert plan.epsilon(1e-5) <= epsilon * (1 + 1e-9)
    # ... and is tight: 2% less noise would not fit.
    assert AnsweringPlan(TokenGNMax(0.98 * sigma, tokens, rate), queries, 10).epsilon(1e-5) > epsilon


@settings(max_examples=8, deadline=None)
@given(queries=st.integers(1, 8), tokens=st.integers(1, 16), more=st.integers(1, 8))
def test_the_noise_grows_with_answers_and_tokens_and_the_cost_falls_with_noise(queries, tokens, more) -> None:
    base = calibrate_token_gnmax(2.0, 1e-5, queries, tokens, 0.2)
    assert calibrate_token_gnmax(2.0, 1e-5, queries + more, tokens, 0.2) >= base
    assert calibrate_token_gnmax(2.0, 1e-5, queries, tokens + more, 0.2) >= base
    assert smallest_bound([TokenGNMax(2 * base, tokens, 0.2).event(queries)], 1e-5) <= smallest_bound(
        [TokenGNMax(base, tokens, 0.2).event(queries)], 1e-5
    )


@pytest.mark.parametrize(("field", "kwargs"), [("sigma", {"sigma": 0.0}), ("max_tokens", {"max_tokens": 0}),
                                               ("sampling_rate", {"sampling_rate": 1.5})])
def test_bad_parameters_are_named(field, kwargs) -> None:
    values = {"sigma": 1.0, "max_tokens": 4, "sampling_rate": 1.0, **kwargs}
    with pytest.raises(ValueError, match=field):
        TokenGNMax(**values)


# -- the order: charge, then read ----------------------------------------------------------------
class Query:
    """A stub query: candidates "a", "b", "<end>"; each teacher votes for the letter of its group's
    first record, "<end>" once the answer has two letters."""

    def __init__(self, partition, log):
        self.groups = [list(group) for group in partition.groups()]
        self.log = log

    def candidates(self, answer):
        return ["a", "b", "<end>"]

    def votes(self, answer, candidates):
        self.log.append(answer)
        if len(answer) >= 2:
            return [2] * len(self.groups)
        return [None if not g else candidates.index(g[0].unwrap()["letter"]) for g in self.groups]

    def extend(self, answer, token):
        return (answer, True) if token == "<end>" else (answer + token, False)


def records(n, letter="a"):
    return PrivateDataset([{"id": i, "letter": letter} for i in range(n)])


def test_the_whole_phase_is_charged_once_before_any_record_is_read() -> None:
    ledger = PrivacyLedger(1e4, 1e-5)
    mechanism = TokenGNMax(0.3, 5)  # 4 unanimous votes against noise of 0.3: the vote wins
    log: list[str] = []

    def open_query(index, partition):
        assert len(ledger.entries) == 1  # charged already
        return Query(partition, log)

    answers = answer_by_vote(ledger, mechanism, records(40), KEY, 4, 3, open_query, NoiseSource(insecure_seed=0))
    assert answers == ["aa", "aa", "aa"]  # near-zero noise: the unanimous vote, then the end marker
    assert [entry.event for entry in ledger.entries] == [mechanism.event(3)]
    assert log.count("aa") == 3  # each answer stopped at the released end marker


def test_a_budget_that_cannot_pay_reads_nothing() -> None:
    ledger = PrivacyLedger(0.01, 1e-5)

    def open_query(index, partition):  # pragma: no cover - must not run
        raise AssertionError("a record was read before the charge")

    with pytest.raises(BudgetExceeded):
        answer_by_vote(ledger, TokenGNMax(1.0, 8), records(10), KEY, 2, 4, open_query, NoiseSource(insecure_seed=0))


def test_an_answer_never_runs_past_its_charged_tokens() -> None:
    class Endless(Query):
        def votes(self, answer, candidates):
            return [0] * len(self.groups)

        def extend(self, answer, token):
            return answer + token, False

    ledger = PrivacyLedger(1e4, 1e-5)
    answers = answer_by_vote(ledger, TokenGNMax(0.3, 6), records(20), KEY, 3, 2,
                             lambda i, p: Endless(p, []), NoiseSource(insecure_seed=1))
    assert answers == ["aaaaaa", "aaaaaa"]


def test_a_vote_outside_the_candidates_or_an_empty_candidate_set_is_an_error() -> None:
    class Outside(Query):
        def votes(self, answer, candidates):
            return [len(candidates)] * len(self.groups)

    class Empty(Query):
        def candidates(self, answer):
            return []

    for query, message in ((Outside, "label index"), (Empty, "candidate set of a step is empty")):
        with pytest.raises(ValueError, match=message):
            answer_by_vote(PrivacyLedger(100.0, 1e-5), TokenGNMax(1.0, 3), records(8), KEY, 2, 1,
                           lambda i, p, q=query: q(p, []), NoiseSource(insecure_seed=0))


def test_without_subsampling_every_answer_has_the_same_teachers_partitioned_once() -> None:
    # At q = 1 the groups are the dataset's keyed partition for every answer: built once per call (the
    # wiring then builds the teachers' prompts once too), and the same groups a fresh partition gives.
    seen: list[object] = []

    def open_query(index, partition):
        seen.append(partition)
        return Query(partition, [])

    dataset = records(60)
    answer_by_vote(PrivacyLedger(100.0, 1e-5), TokenGNMax(1.0, 2), dataset, KEY, 4, 5, open_query,
                   NoiseSource(insecure_seed=3))
    assert len(seen) == 5 and all(partition is seen[0] for partition in seen)
    for teacher, group in enumerate(seen[0].groups()):
        assert [r.unwrap()["id"] for r in group] == [
            i for i in range(60) if teacher_of({"id": i, "letter": "a"}, KEY, 4) == teacher]


def test_each_answer_draws_a_fresh_subsample_split_by_the_keyed_partition() -> None:
    seen: list[list[list[int]]] = []

    def open_query(index, partition):
        seen.append([[r.unwrap()["id"] for r in g] for g in partition.groups()])
        return Query(partition, [])

    dataset = records(400)
    answer_by_vote(PrivacyLedger(100.0, 1e-5), TokenGNMax(1.0, 2, 0.1), dataset, KEY, 5, 6, open_query,
                   NoiseSource(insecure_seed=3))
    sizes = [sum(len(g) for g in groups) for groups in seen]
    assert all(10 <= size <= 80 for size in sizes)  # about q N = 40 each (Poisson)
    assert len({tuple(sorted(i for g in groups for i in g)) for groups in seen}) == 6  # fresh draws
    for groups in seen:  # each sampled record sits with the teacher the keyed hash names
        for teacher, group in enumerate(groups):
            assert all(teacher_of({"id": i, "letter": "a"}, KEY, 5) == teacher for i in group)


def test_the_release_is_the_noisy_argmax_of_the_histogram() -> None:
    mechanism = TokenGNMax(sigma=1.0, max_tokens=1)
    noise = NoiseSource(insecure_seed=0)
    picks = [mechanism.release(np.array([0.0, 10.0, 0.0]), noise) for _ in range(200)]
    assert picks.count(1) == 200
    picks = [mechanism.release(np.array([5.0, 5.0]), noise) for _ in range(400)]
    assert 150 < picks.count(0) < 250  # a tie: the noise decides, evenly
