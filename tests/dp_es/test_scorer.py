"""DPScorer: clipping and sensitivity, noise scale, public denominator, charge-before-read,
the combined Gaussian event of scores + confusion matrices, and shrinkage."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_textgrad.dp_es.estimates import ReleasedScores, shrink_estimates
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.dp_es.selector import top_k, tournament
from dp_textgrad.privacy.accounting import BudgetExceeded, PrivacyLedger, RdpAccountant
from dp_textgrad.privacy.mechanisms import (
    ExponentialMechanism,
    GaussianScoreMechanism,
    GumbelTopK,
    PermuteAndFlip,
    clipped_utility_sums,
    confusion_counts,
    effective_noise_multiplier,
)
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.tasks.base import Example
from tests.helpers import LABELS, RuleEngine, ZeroNoise, candidates, make_records, make_table_task, make_task


def score_gaussian(scorer, cands, z, label, feedback_candidates=(), feedback_noise_multiplier=None):
    """Score with the Gaussian mechanism the plan would hold for these candidates."""
    z_fb = feedback_noise_multiplier if feedback_candidates else None
    mechanism = GaussianScoreMechanism(z, scorer.clip_bound, max(1, len(cands)), z_fb)
    return scorer.score(cands, mechanism, label, feedback_candidates=feedback_candidates)


PROMPTS = ("Classify the ticket.", "Say billing.", "Mention shipping and account words.")

raw_scores = st.one_of(
    st.floats(min_value=-5.0, max_value=5.0),  # far outside [0, C] too
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.0]),
)


class WatchingLedger(PrivacyLedger):
    """The real ledger, noting what the engine and the subsampler had done at each charge."""

    def __init__(self, budget: float, engine: RuleEngine, rng: np.random.Generator, delta: float = 1e-5):
        super().__init__(budget, delta, accountants=[RdpAccountant()])  # one accountant keeps tests fast
        self.engine, self.rng = engine, rng
        self.seen: list[tuple[int, dict]] = []

    def spend(self, event, label, metadata=None):
        self.seen.append((self.engine.score_calls, dict(self.rng.bit_generator.state)))
        return super().spend(event, label, metadata)


class TallyLedger:
    """Accepts every charge without accounting: only for tests that make hundreds of
    releases to measure noise (the real ledger's accounting would dominate the run time)."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def spend(self, event, label, metadata=None):
        self.labels.append(label)


def make_scorer(task=None, *, budget=100.0, q=1.0, noise=None, engine=None, seed=0, tally=False):
    task = task or make_task(30)
    engine = engine or RuleEngine()
    rng = np.random.default_rng(seed)
    ledger = TallyLedger() if tally else WatchingLedger(budget, engine, rng)
    scorer = DPScorer(task, engine, ledger, sampling_rate=q, dataset_size=len(task.private_train),
                      noise=noise or NoiseSource(insecure_seed=seed), sampling_rng=rng)
    return scorer, ledger, engine, rng


# -- sensitivity ------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 5).flatmap(lambda k: st.tuples(
        st.lists(st.lists(raw_scores, min_size=k, max_size=k), min_size=0, max_size=12),
        st.lists(raw_scores, min_size=k, max_size=k),
    )),
    st.floats(min_value=0.1, max_value=10.0),
)
def test_one_record_moves_every_sum_by_at_most_c_in_the_same_direction(data, clip_bound):
    rows, extra = data  # rows: records (each a list of K raw scores); extra: the added record
    k = len(extra)
    base = np.array(rows, dtype=float).reshape(len(rows), k).T
    with_extra = np.concatenate([base, np.array(extra, dtype=float).reshape(k, 1)], axis=1)
    before = clipped_utility_sums(base, clip_bound)
    after = clipped_utility_sums(with_extra, clip_bound)
    change = after - before
    assert np.all(np.isfinite(after))
    assert np.all(change >= -1e-9) and np.all(change <= clip_bound + 1e-9)  # same direction, at most C
    assert np.all(before >= 0) and np.all(before <= clip_bound * len(rows) + 1e-9)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 4).flatmap(lambda labels: st.tuples(
    st.just(labels),
    st.lists(st.tuples(st.integers(0, labels - 1), st.integers(0, labels - 1)), max_size=20),
    st.tuples(st.integers(0, labels - 1), st.integers(0, labels - 1)),
)))
def test_one_record_changes_one_confusion_cell_by_one(data):
    labels, records, extra = data
    gold = np.array([g for g, _ in records], dtype=int)
    predicted = np.array([p for _, p in records], dtype=int)
    before = confusion_counts(gold, predicted, labels)
    after = confusion_counts(np.append(gold, extra[0]), np.append(predicted, extra[1]), labels)
    diff = after - before
    assert diff.sum() == 1 and np.count_nonzero(diff) == 1 and diff[extra] == 1


def test_scorer_level_neighbours_with_out_of_range_raw_scores():
    """Through the whole scorer (noise switched off): D vs D plus one record."""
    records = make_records(12, seed=4)
    extra = Example("ticket x: refund for the billing fee please", "billing")

    def raw(prompt: str, text: str) -> float:  # deliberately outside [0, C], incl. nan
        value = (len(text) * (PROMPTS.index(prompt) + 1)) % 7 - 2.5
        return math.nan if text.startswith("ticket 3:") else value * 3.0

    outputs = []
    for dataset in (records, records + [extra]):
        task = make_table_task(dataset, raw, clip_bound=2.0)
        scorer, *_ = make_scorer(task, noise=ZeroNoise())
        outputs.append(score_gaussian(scorer, candidates(*PROMPTS), 1.0, "scores", feedback_candidates=[0, 2],
                                             feedback_noise_multiplier=2.0))
    small, large = outputs
    change = large.noisy_sums - small.noisy_sums
    assert np.all(change >= 0) and np.all(change <= 2.0)
    expected_extra = np.clip([raw(p, extra.text) for p in PROMPTS], 0, 2.0)
    np.testing.assert_allclose(change, expected_extra)  # exactly the new record's clipped score
    cells = large.confusion - small.confusion
    assert large.confusion.shape == (2, len(LABELS), len(LABELS))
    for matrix in cells:  # one cell per feedback candidate
        assert matrix.sum() == 1 and np.count_nonzero(matrix) == 1


# -- noise scale and the public denominator -----------------------------------------------


def test_release_noise_std_is_z_c_sqrt_k():
    mechanism = GaussianScoreMechanism(noise_multiplier=0.7, clip_bound=2.0, num_candidates=5)
    assert mechanism.noise_std == pytest.approx(0.7 * 2.0 * math.sqrt(5))
    noisy = mechanism.release(np.zeros((40_000, 5)), NoiseSource(insecure_seed=9))
    ratio = noisy.std() / (0.7 * 2.0 * math.sqrt(5))
    assert abs(ratio - 1) < 0.02  # a missing sqrt(K) (ratio 0.45) or factor 2 fails
    assert abs(noisy.mean()) < 0.05
    with pytest.raises(ValueError, match="sums"):
        mechanism.release(np.zeros(4), NoiseSource(insecure_seed=0))


def test_scorer_noise_and_estimates_use_public_q_n():
    task = make_task(40)
    scorer, ledger, engine, rng = make_scorer(task, q=0.5, noise=NoiseSource(insecure_seed=1), tally=True)
    exact, *_ = make_scorer(task, q=0.5, noise=ZeroNoise(), seed=0, tally=True)  # same seed -> same subsamples
    cands = candidates(*PROMPTS)
    residuals, sizes = [], []
    for i in range(150):
        noisy = score_gaussian(scorer, cands, 0.8, f"round {i}")
        clean = score_gaussian(exact, cands, 0.8, f"round {i}")
        residuals.append(noisy.noisy_sums - clean.noisy_sums)
        np.testing.assert_allclose(noisy.estimates, noisy.noisy_sums / 20.0)  # q*N = 0.5*40, never |B|
        sizes.append(engine.records_scored)
    assert noisy.expected_batch_size == 20.0
    assert noisy.noise_std_sum == pytest.approx(0.8 * 1.0 * math.sqrt(3))
    assert noisy.noise_std_estimate == pytest.approx(noisy.noise_std_sum / 20.0)
    assert len(set(np.diff(sizes))) > 1  # realised batch sizes varied, the denominator did not
    std = np.std(residuals)
    assert abs(std / (0.8 * math.sqrt(3)) - 1) < 0.1
    assert noisy.secure_noise is False  # insecure seed is reported


def test_confusion_noise_std_is_z_fb_sqrt_m():
    task = make_task(20)
    noisy_scorer, *_ = make_scorer(task, noise=NoiseSource(insecure_seed=2), tally=True)
    clean_scorer, *_ = make_scorer(task, noise=ZeroNoise(), tally=True)
    cands = candidates(*PROMPTS)
    clean = score_gaussian(clean_scorer, cands, 1.0, "clean", [0, 1, 2], 1.5)
    assert clean.confusion.sum() == 3 * 20  # q = 1: every record once per matrix
    residuals = [score_gaussian(noisy_scorer, cands, 1.0, f"r{i}", [0, 1, 2], 1.5).confusion - clean.confusion
                 for i in range(60)]
    assert abs(np.std(residuals) / (1.5 * math.sqrt(3)) - 1) < 0.06
    assert clean.confusion_candidate_ids == ["c0", "c1", "c2"]


# -- the combined event ----------------------------------------------------------------------


@pytest.mark.parametrize("z, z_fb", [(1.0, 3.0), (2.0, 1.2)])
def test_scores_plus_confusion_is_one_gaussian_of_z_eff(z, z_fb):
    z_eff = effective_noise_multiplier(z, z_fb)
    assert 1 / z_eff**2 == pytest.approx(1 / z**2 + 1 / z_fb**2)
    both = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z), dp_accounting.GaussianDpEvent(z_fb)])
    single = dp_accounting.GaussianDpEvent(z_eff)
    for delta in (1e-5, 1e-3):
        r_both, r_single = rdp.RdpAccountant(), rdp.RdpAccountant()
        r_both.compose(both)
        r_single.compose(single)
        assert r_both.get_epsilon(delta) == pytest.approx(r_single.get_epsilon(delta), rel=1e-9)
    p_both, p_single = pld.PLDAccountant(value_discretization_interval=1e-3), \
        pld.PLDAccountant(value_discretization_interval=1e-3)
    p_both.compose(both)
    p_single.compose(single)
    eps_both, eps_single = p_both.get_epsilon(1e-5), p_single.get_epsilon(1e-5)
    assert eps_both == pytest.approx(eps_single, rel=5e-3)
    # ... and it is not the same as ignoring the confusion matrices (the test can fail).
    p_scores = pld.PLDAccountant(value_discretization_interval=1e-3)
    p_scores.compose(dp_accounting.GaussianDpEvent(z))
    assert p_scores.get_epsilon(1e-5) < 0.97 * eps_both
    event = GaussianScoreMechanism(z, 1.0, 3, z_fb).event(0.1)
    assert event == dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z_eff))
    without = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z))
    assert GaussianScoreMechanism(z, 1.0, 3).event(0.1) == without


def test_gaussian_event_validates_its_parameters():
    with pytest.raises(ValueError, match="noise_multiplier: must be a finite number > 0"):
        GaussianScoreMechanism(0.0, 1.0, 2)
    with pytest.raises(ValueError, match="sampling_rate"):
        GaussianScoreMechanism(1.0, 1.0, 2).event(1.5)


# -- charge before read -------------------------------------------------------------------


def test_score_charges_the_planned_event_before_reading():
    scorer, ledger, engine, rng = make_scorer(q=0.4)
    start_state = dict(rng.bit_generator.state)
    noisy = score_gaussian(scorer, candidates(*PROMPTS), 1.2, "generation 0", [1], 4.0)
    [(calls_at_charge, rng_at_charge)] = ledger.seen
    assert calls_at_charge == 0 and rng_at_charge == start_state  # nothing read, no subsample drawn yet
    assert engine.score_calls == 3
    [entry] = ledger.entries
    assert entry.event == GaussianScoreMechanism(1.2, 1.0, 3, 4.0).event(0.4) and entry.label == "generation 0"
    assert entry.metadata["candidate_ids"] == ["c0", "c1", "c2"]
    assert noisy.candidate_ids == ["c0", "c1", "c2"]


def test_budget_refusal_reads_nothing():
    scorer, ledger, engine, rng = make_scorer(budget=0.05, q=0.5)
    start_state = dict(rng.bit_generator.state)
    with pytest.raises(BudgetExceeded):
        score_gaussian(scorer, candidates(*PROMPTS), 1.0, "too expensive")
    with pytest.raises(BudgetExceeded):
        scorer.select(candidates(*PROMPTS), GumbelTopK(5.0, 2), "too expensive")
    assert engine.score_calls == 0 and engine.records_scored == 0
    assert rng.bit_generator.state == start_state  # not even the subsample was drawn
    assert ledger.entries == []


@pytest.mark.parametrize("call, match", [
    (lambda s, c: score_gaussian(s, [], 1.0, "x"), "candidates: give at least one"),
    (lambda s, c: score_gaussian(s, c + c[:1], 1.0, "x"), "ids must be unique"),
    (lambda s, c: score_gaussian(s, c, 1.0, "x", [1]), "feedback_candidates: give them exactly"),
    (lambda s, c: score_gaussian(s, c, 1.0, "x", [5], 1.0), "feedback_candidates: index 5"),
    (lambda s, c: score_gaussian(s, c, math.nan, "x"), "noise_multiplier: must be a finite number > 0"),
    (lambda s, c: s.select(c, GumbelTopK(1.0, 4), "x"), "mechanism.k"),
    (lambda s, c: s.select(c, GumbelTopK(1.0, 1, sensitivity=0.5), "x"), "mechanism.sensitivity"),
])
def test_bad_arguments_fail_before_any_charge(call, match):
    scorer, ledger, engine, _ = make_scorer()
    with pytest.raises(ValueError, match=match):
        call(scorer, candidates(*PROMPTS))
    assert ledger.seen == [] and engine.score_calls == 0


def test_constructor_validates():
    task, engine = make_task(5), RuleEngine()
    ledger = PrivacyLedger(1.0, 1e-5)
    with pytest.raises(ValueError, match="sampling_rate"):
        DPScorer(task, engine, ledger, sampling_rate=0.0, dataset_size=5, noise=NoiseSource())
    with pytest.raises(ValueError, match="dataset_size"):
        DPScorer(task, engine, ledger, sampling_rate=0.5, dataset_size=-1, noise=NoiseSource())
    with pytest.raises(TypeError, match="noise"):
        DPScorer(task, engine, ledger, sampling_rate=0.5, dataset_size=5, noise=np.random.default_rng(0))
    with pytest.raises(TypeError, match="ledger"):
        DPScorer(task, engine, object(), sampling_rate=0.5, dataset_size=5, noise=NoiseSource())
    noise = NoiseSource()
    default = DPScorer(task, engine, ledger, sampling_rate=0.5, dataset_size=5, noise=noise)
    assert default.sampling_rng is noise.sampling_generator  # secret subsample, apart from the noise


# -- private selection and free post-processing ------------------------------------------------


def _favour_candidate_one(prefix, suffix, choices):
    # Prompts containing "expert" answer with the label word found in the record (else the
    # first label); other prompts always answer the first label. So "expert" is never worse.
    gold_word = next((c for c in choices if c.strip() in suffix), choices[0]) if "expert" in prefix else choices[0]
    return [5.0 if c == gold_word else 0.0 for c in choices]


@pytest.mark.parametrize("mechanism", [GumbelTopK(20.0, 2), ExponentialMechanism(20.0), PermuteAndFlip(20.0)])
def test_select_private_charges_first_and_finds_the_best(mechanism):
    task = make_task(30)
    engine = RuleEngine(_favour_candidate_one)
    scorer, ledger, engine, rng = make_scorer(task, engine=engine, q=1.0)
    cands = candidates("plain prompt", "expert prompt", "another plain")
    chosen = scorer.select(cands, mechanism, "parents")
    assert chosen[0] == 1 and len(chosen) == mechanism.k and all(type(i) is int for i in chosen)
    [(calls_at_charge, _)] = ledger.seen
    assert calls_at_charge == 0
    assert ledger.entries[0].event == mechanism.event(1.0)


def test_free_selection_and_shrinkage_never_touch_the_ledger():
    scorer, ledger, engine, _ = make_scorer(q=0.5)
    noisy = score_gaussian(scorer, candidates(*PROMPTS, "Fourth prompt."), 1.0, "gen 0")
    before = (len(ledger.entries), ledger.epsilon(), engine.score_calls)
    shrunk = shrink_estimates(noisy.estimates, noisy.noise_std_estimate**2)
    top_k(shrunk, 2)
    tournament(noisy.estimates, 2, size=2, rng=np.random.default_rng(0))
    ReleasedScores.from_dict(json.loads(json.dumps(noisy.to_dict())))
    assert (len(ledger.entries), ledger.epsilon(), engine.score_calls) == before


def test_noisy_scores_round_trip():
    scorer, *_ = make_scorer()
    noisy = score_gaussian(scorer, candidates(*PROMPTS), 1.0, "gen", [0], 2.0)
    again = ReleasedScores.from_dict(json.loads(json.dumps(noisy.to_dict())))
    np.testing.assert_array_equal(again.noisy_sums, noisy.noisy_sums)
    np.testing.assert_array_equal(again.confusion, noisy.confusion)
    assert again.candidate_ids == noisy.candidate_ids and again.noise_std_sum == noisy.noise_std_sum


# -- shrinkage --------------------------------------------------------------------------------


def test_equal_variances_give_positive_part_james_stein():
    x = np.array([0.1, 0.4, 0.35, 0.9, 0.2, 0.6])
    v = 0.01
    spread = np.sum((x - x.mean()) ** 2)
    expected = x - min(1.0, (len(x) - 3) * v / spread) * (x - x.mean())
    np.testing.assert_allclose(shrink_estimates(x, np.full(6, v)), expected, rtol=1e-9)
    np.testing.assert_allclose(shrink_estimates(x, v), expected, rtol=1e-9)  # scalar variance


def test_shrinkage_edge_cases():
    np.testing.assert_array_equal(shrink_estimates([1.0, 5.0, 2.0], [1.0, 1.0, 1.0]), [1.0, 5.0, 2.0])  # K < 4
    np.testing.assert_allclose(shrink_estimates([2.0] * 5, [1.0] * 5), [2.0] * 5)
    x = np.array([0.0, 1.0, 3.0, 10.0, 4.0])
    v = np.array([0.0, 4.0, 4.0, 4.0, 1.0])  # an exact (noiseless) estimate stays put
    out = shrink_estimates(x, v)
    assert out[0] == pytest.approx(0.0, abs=1e-6)
    assert np.all(np.abs(out[1:] - x[1:]) > 1e-3)  # the noisy ones do move
    for bad, match in ((([1.0, math.nan, 2.0, 3.0], 1.0), "means"), (([1.0, 2.0, 3.0, 4.0], -1.0), "variances"),
                       (([1.0, 2.0, 3.0, 4.0], [1.0, 2.0]), "variances")):
        with pytest.raises(ValueError, match=match):
            shrink_estimates(*bad)


def test_shrunk_values_lie_between_estimate_and_grand_mean_and_beat_raw_mse():
    rng = np.random.default_rng(0)
    raw_error = shrunk_error = 0.0
    for _ in range(400):
        theta = rng.normal(0.5, 0.05, 10)
        v = rng.uniform(0.002, 0.03, 10)  # different noise per candidate
        x = theta + rng.normal(0, np.sqrt(v))
        out = shrink_estimates(x, v)
        # Everything moves towards one common point: risers all sit below fallers.
        risers, fallers = x[out > x], x[out < x]
        if risers.size and fallers.size:
            assert risers.max() <= fallers.min()
        raw_error += np.sum((x - theta) ** 2)
        shrunk_error += np.sum((out - theta) ** 2)
    assert shrunk_error < 0.8 * raw_error  # shrinkage helps when the noise rivals the spread


def test_budget_refusal_with_the_default_accountants():
    task, engine = make_task(10), RuleEngine()
    ledger = PrivacyLedger(0.05, 1e-5)  # RDP, PLD, advanced and basic composition
    scorer = DPScorer(task, engine, ledger, sampling_rate=0.5, dataset_size=10, noise=NoiseSource())
    with pytest.raises(BudgetExceeded):
        score_gaussian(scorer, candidates(*PROMPTS), 2.0, "too expensive")
    assert engine.score_calls == 0 and ledger.entries == []


@pytest.mark.parametrize("bad", [2.0, float("nan"), float("inf")], ids=["two units", "nan", "inf"])
def test_feedback_counts_that_are_not_one_unit_a_record_are_refused(bad) -> None:
    # The check behind the feedback's sensitivity: each record adds exactly one unit (a NaN or an
    # infinite count fails it too), else the scoring stops before anything is released.
    from types import SimpleNamespace

    from dp_textgrad.dp_es.scoring_backends import _scored
    from dp_textgrad.tasks.base import FeedbackSpec

    spec = FeedbackSpec("confusion", ("a", "b"))
    task = SimpleNamespace(feedback=spec, feedback_counts=lambda outcome: outcome.counts)
    good = SimpleNamespace(scores=[1.0, 0.0, 1.0], counts=np.array([[2.0, 0.0], [1.0, 0.0]]))
    assert _scored(task, [good], 3, True).counts.sum() == 3.0
    wrong = SimpleNamespace(scores=[1.0, 0.0, 1.0], counts=np.array([[2.0, 0.0], [bad, 0.0]]))
    with pytest.raises(RuntimeError, match="exactly one unit"):
        _scored(task, [wrong], 3, True)
