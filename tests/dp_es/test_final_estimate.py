"""The fresh DP estimate of the released prompt (``dp.final_estimate``, issue 46 item 6).

The search's estimate of the prompt it releases is the best of K noisy estimates: biased upward
(the winner's curse). The final estimate re-scores that prompt once on a fresh Poisson subsample
with fresh noise, so its error is independent of the choice. Here: its configuration and refusals,
its place in the plan (calibrated at its share, composed with the search, never past the budget),
its unbiasedness against the search's bias, and its release in a run (result, report, console).
The ledger-equals-plan cases are in ``test_generation_privacy.py``, the twin runs in
``test_release_twin.py`` and the kill-and-resume points in ``tests/test_fault_injection.py``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting import pld
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dp_textgrad
from dp_textgrad.dp_es.config import ConfigError, DPESConfig, FinalEstimateConfig, config_with
from dp_textgrad.dp_es.plan import RunPlan, final_estimate_std, final_evaluations
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.privacy.accounting.bounds import all_bounds, default_accountants
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.noise import NoiseSource
from tests.helpers import RuleEngine, ZeroNoise, candidates, make_task


# -- configuration ---------------------------------------------------------------------------------
def test_true_asks_for_the_defaults_and_false_for_none() -> None:
    assert DPESConfig(final_estimate=True).final_estimate == FinalEstimateConfig(epsilon_share=0.2)
    assert DPESConfig(final_estimate=False).final_estimate is None
    assert DPESConfig().final_estimate is None  # off unless asked: it spends budget
    config = DPESConfig(final_estimate=True, dataset_size=600, population=6).resolved()
    assert config.final_estimate_rate == pytest.approx(min(1.0, 6 * 150 / 600))  # one generation's records
    large = DPESConfig(final_estimate=True, dataset_size=20_000, population=6).resolved()
    assert large.final_estimate_rate == pytest.approx(6 * 150 / 20_000)
    given_rate = DPESConfig(final_estimate={"sampling_rate": 0.3}, dataset_size=600).resolved()
    assert given_rate.final_estimate_rate == 0.3


@pytest.mark.parametrize(
    ("settings_", "field", "fix"),
    [
        ({"final_estimate": {"epsilon_share": 0.5}}, "final_estimate.epsilon_share", "(0, 0.5)"),
        ({"final_estimate": {"epsilon_share": 0.0}}, "final_estimate.epsilon_share", "(0, 0.5)"),
        ({"final_estimate": {"epsilon_share": math.nan}}, "final_estimate.epsilon_share", "(0, 0.5)"),
        ({"final_estimate": {"sampling_rate": 0.0}}, "final_estimate.sampling_rate", "(0, 1]"),
        ({"final_estimate": {"sampling_rate": 1.5}}, "final_estimate.sampling_rate", "(0, 1]"),
        ({"final_estimate": {"share": 0.1}}, "final_estimate.share", "Extra inputs"),
        ({"final_estimate": True, "privacy": "off"}, "final_estimate", "remove final_estimate"),
    ],
)
def test_bad_settings_are_refused_naming_the_field_and_the_fix(settings_, field, fix) -> None:
    with pytest.raises(ConfigError) as caught:
        config_with(None, settings_)
    message = str(caught.value)
    assert field in message and fix in message, message


def test_shares_that_leave_the_search_nothing_are_refused_before_any_charge() -> None:
    config = DPESConfig(
        epsilon=2.0,
        final_estimate={"epsilon_share": 0.45},
        labelling={"epsilon_share": 0.5, "queries": 4, "teachers": 10},
        counted_dataset_size=400,  # N not declared: the count's 0.05 of epsilon goes first
    ).resolved()
    with pytest.raises(ConfigError, match="final_estimate.epsilon_share"):
        RunPlan.calibrated(config)


# -- the plan ---------------------------------------------------------------------------------------
def _plan(epsilon: float, share: float | None, size: int = 600, **extra) -> RunPlan:
    fresh = None if share is None else {"epsilon_share": share}
    return RunPlan.calibrated(DPESConfig(epsilon=epsilon, dataset_size=size, final_estimate=fresh, **extra).resolved())


def test_the_estimate_is_charged_last_at_its_own_rate() -> None:
    plan = _plan(2.0, 0.2, size=2000)
    *search, last = plan.charges()
    rate = plan.config.final_estimate_rate
    assert last == GaussianScoreMechanism(plan.final_estimate_noise_multiplier, 1.0, 1).event(rate)
    q = plan.config.resolved_sampling_rate
    assert search == [e for t in range(plan.config.generations) for e in plan.generation_mechanisms(t).events(q)]
    assert len(_plan(2.0, None, size=2000).charges()) == len(search)
    assert final_evaluations(plan) == pytest.approx(rate * 2000)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    epsilon=st.floats(min_value=0.5, max_value=8.0),
    share=st.floats(min_value=0.05, max_value=0.45),
    size=st.integers(min_value=100, max_value=5000),
)
def test_calibration_never_exceeds_the_budget_nor_the_share(epsilon, share, size) -> None:
    plan = _plan(epsilon, share, size)
    delta = plan.config.resolved_delta
    assert min(plan.epsilons(delta).values()) <= epsilon * (1 + 1e-9)
    # The estimate alone, by the accountants the run uses, within its share; and by dp-accounting's own PLD
    # at its defaults (a coarser discretisation: a slightly larger upper bound) within 2% of it.
    event = GaussianScoreMechanism(plan.final_estimate_noise_multiplier, 1.0, 1).event(plan.config.final_estimate_rate)
    assert min(all_bounds(default_accountants(), [event], delta).values()) <= share * epsilon * (1 + 1e-6)
    accountant = pld.PLDAccountant()
    accountant.compose(event)
    assert accountant.get_epsilon(delta) <= share * epsilon * 1.02


def test_a_larger_share_buys_less_noise_and_costs_the_search_little() -> None:
    plans = [_plan(1.0, share) for share in (0.1, 0.2, 0.3)]
    fresh = [plan.final_estimate_noise_multiplier for plan in plans]
    search = [plan.value for plan in plans]
    assert fresh[0] > fresh[1] > fresh[2]  # monotone in the share
    assert search[0] <= search[1] <= search[2]  # the search pays for it ...
    alone = _plan(1.0, None).value
    assert search[1] / alone < 1.03  # ... little: Gaussians compose sub-additively (docs/privacy.md)
    stds = [final_estimate_std(plan) for plan in plans]
    assert stds[0][0] > stds[1][0] > stds[2][0]
    assert all(std[1] == 0.0 for std in stds)  # q_f = 1 at N = 600: no subsampling error
    assert final_estimate_std(_plan(1.0, None)) is None


# -- unbiased where the search's estimate is not ---------------------------------------------------------
def test_the_fresh_estimate_is_unbiased_where_the_best_of_k_is_not() -> None:
    # K copies of one prompt (equal candidates: the winner's curse at its largest). Each round the
    # search's noisy scores pick a winner; its estimate overstates the prompt's mean over the private set
    # by about E[max of K normals] noise stds. The fresh estimate scores the winner again on a new
    # subsample with new noise: its mean error is 0 (the scores' mean 0.5 keeps clipping away).
    task = make_task(60)
    truth_scorer = DPScorer(task, RuleEngine(), _Tally(), sampling_rate=1.0, dataset_size=60, noise=ZeroNoise())
    pool = candidates(*(["Classify the ticket."] * 6))
    truth = float(truth_scorer.score(pool[:1], GaussianScoreMechanism(1.0, 1.0, 1), "exact").estimates[0])
    assert 0.2 < truth < 0.8
    noise = NoiseSource(insecure_seed=5)
    scorer = DPScorer(task, RuleEngine(), _Tally(), sampling_rate=0.5, dataset_size=60, noise=noise)
    search, fresh = GaussianScoreMechanism(0.4, 1.0, 6), GaussianScoreMechanism(6.0, 1.0, 1)
    search_errors, fresh_errors = [], []
    for _ in range(300):
        released = scorer.score(pool, search, "generation")
        best = int(np.argmax(released.estimates))
        search_errors.append(float(released.estimates[best]) - truth)
        again = scorer.at_rate(1.0).score([pool[best]], fresh, "final estimate")
        fresh_errors.append(float(again.estimates[0]) - truth)
    fresh_se = np.std(fresh_errors) / math.sqrt(len(fresh_errors))
    assert abs(np.mean(fresh_errors)) < 4 * fresh_se, (np.mean(fresh_errors), fresh_se)
    # The search's winner is biased by about 1.27 noise stds (E[max of 6 normals]); well above 4 SE.
    search_se = np.std(search_errors) / math.sqrt(len(search_errors))
    assert np.mean(search_errors) > max(4 * search_se, 0.5 * released.noise_std_estimate)


class _Tally:
    """Accepts charges without accounting (hundreds of releases; the real ledger is tested elsewhere)."""

    def spend(self, event, label, metadata=None):
        return None


def test_a_view_at_another_rate_shares_everything_but_the_rate() -> None:
    scorer = DPScorer(make_task(10), RuleEngine(), _Tally(), sampling_rate=0.2, dataset_size=10, noise=ZeroNoise())
    view = scorer.at_rate(0.8)
    assert (view.sampling_rate, scorer.sampling_rate) == (0.8, 0.2)
    assert view.ledger is scorer.ledger and view.noise is scorer.noise and view.backend is scorer.backend
    assert view.expected_batch_size == pytest.approx(8.0)
    with pytest.raises(ValueError, match="sampling_rate"):
        scorer.at_rate(0.0)


# -- a run releases it ---------------------------------------------------------------------------------
def test_a_run_releases_the_fresh_estimate_in_its_result_report_and_console(tmp_path) -> None:
    outcome = dp_textgrad.optimize(
        make_task(40),
        RuleEngine(),
        runs_root=tmp_path,
        epsilon=3.0,
        generations=2,
        population=3,
        parents=1,
        dataset_size=40,
        sampling_rate=0.5,
        final_estimate={"epsilon_share": 0.2},
        insecure_noise_seed=3,
        evaluate=False,
    )
    result = outcome.result
    fresh = result.final_estimate
    assert fresh is not None and fresh.candidate_id == result.candidate_id
    assert fresh.sampling_rate == 1.0 and fresh.sampling_std_bound == 0.0 and fresh.expected_batch_size == 40
    assert fresh.noise_std == pytest.approx(outcome.optimizer.plan.final_estimate_noise_multiplier / 40)
    assert 0.0 <= fresh.interval[0] <= fresh.estimate <= fresh.interval[1] <= 1.0
    saved = json.loads((outcome.run_dir / "result.json").read_text())["final_estimate"]
    assert saved["estimate"] == fresh.estimate and saved["interval"] == list(fresh.interval)
    report = (outcome.run_dir / "report.md").read_text()
    assert "Fresh DP estimate (`dp.final_estimate`)" in report and "The fresh estimate below" in report
    assert "one Gaussian estimate of the released prompt's mean score" in report
    assert min(result.epsilons.values()) <= 3.0 + 1e-9

    from rich.console import Console

    from dp_textgrad.cli.progress import print_outcome
    from dp_textgrad.run_events import RunFinished

    console = Console(record=True, width=300)
    print_outcome(console, RunFinished.of(outcome))
    assert f"Fresh DP estimate of the released prompt's score on the private set: {fresh.estimate:.3f}" in (
        console.export_text()
    )


def test_gepa_with_max_metric_calls_counts_the_estimate_and_refuses_its_rate() -> None:
    from dp_textgrad.integrations.gepa import _schedule_for

    config = DPESConfig(dataset_size=100, sampling_rate=0.5, population=4)
    without = _schedule_for(1000, config)["generations"]
    with_estimate = _schedule_for(1000, config.model_copy(update={"final_estimate": FinalEstimateConfig()}))
    assert with_estimate["generations"] == without - 1  # one generation's calls kept for the estimate
    rated = config.model_copy(update={"final_estimate": FinalEstimateConfig(sampling_rate=0.9)})
    with pytest.raises(ConfigError, match="final_estimate.sampling_rate"):
        _schedule_for(1000, rated)
