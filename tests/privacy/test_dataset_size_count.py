"""The DP count of the dataset size: its mechanism, its noise, and the two-stage ledger and plan.

Under add/remove neighbours N itself is private. When the owner declares no public N, a run
spends ``size_epsilon_share`` of epsilon on a pure-DP count first (stage 1), then plans the
search from the noisy count and calibrates it to the rest (stage 2). The two stages compose
by basic composition, which holds for an adaptively chosen second stage: the ledger must
report exactly eps_count + eps_search(delta), and the plan must fit the budget that way.
"""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.privacy.accounting import default_accountants
from dp_textgrad.privacy.accounting.events import PureDpEvent, group_events
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded, PrivacyLedger
from dp_textgrad.privacy.mechanisms import LaplaceCountMechanism
from dp_textgrad.privacy.noise import NoiseSource

SCHEDULE = dict(generations=3, population=4, parents=2, sampling_rate=0.2, feedback="none")


def search_bounds(events, delta):
    return {a.name: a.epsilon(list(events), delta) for a in default_accountants()}


# -- the mechanism and its sampler --------------------------------------------------------------
def test_the_count_is_a_pure_dp_event_with_noise_of_scale_one_over_epsilon() -> None:
    count = LaplaceCountMechanism(0.25)
    assert count.event() == PureDpEvent(0.25)  # the discrete pair is randomized response (test_count_event.py)
    assert count.metadata() == {"mechanism": "laplace_count", "epsilon": 0.25, "noise_scale": 4.0,
                                "sensitivity": 1}
    with pytest.raises(ValueError, match="epsilon"):
        LaplaceCountMechanism(0.0)
    with pytest.raises(ValueError, match="count"):
        count.release(-1, NoiseSource(insecure_seed=1))


def test_the_noisy_count_is_an_integer_at_least_one() -> None:
    count = LaplaceCountMechanism(0.05)  # scale 20: a count of 3 is often pushed below 1
    releases = [count.release(3, NoiseSource(insecure_seed=s)) for s in range(200)]
    assert all(isinstance(r, int) and r >= 1 for r in releases)
    assert releases.count(1) > 20  # the clamp is hit (post-processing), the noise is not one-sided
    secure = count.release(1000, NoiseSource())
    assert isinstance(secure, int) and secure >= 1


def test_discrete_laplace_has_the_right_distribution() -> None:
    noise = NoiseSource(insecure_seed=5)
    scale = 2.0
    draws = np.array([noise.add_discrete_laplace(0, scale) for _ in range(40_000)])
    assert draws.dtype.kind == "i"
    r = math.exp(-1.0 / scale)
    # P(0) = (1 - r) / (1 + r); variance 2 r / (1 - r)^2
    assert np.mean(draws == 0) == pytest.approx((1 - r) / (1 + r), abs=0.01)
    assert draws.var() == pytest.approx(2 * r / (1 - r) ** 2, rel=0.05)
    assert abs(draws.mean()) < 0.05
    # Reproducible from the insecure seed, and independent of the value it is added to.
    again = NoiseSource(insecure_seed=5)
    assert [again.add_discrete_laplace(100, scale) - 100 for _ in range(50)] == list(draws[:50])
    with pytest.raises(TypeError, match="value"):
        noise.add_discrete_laplace(1.5, scale)


def test_the_secure_sampler_is_opendp_and_unbiased() -> None:
    noise = NoiseSource()
    draws = np.array([noise.add_discrete_laplace(10, 1.0) for _ in range(3000)]) - 10
    assert abs(draws.mean()) < 0.15 and draws.var() == pytest.approx(2 * math.exp(-1) / (1 - math.exp(-1)) ** 2,
                                                                     rel=0.15)


# -- the two-stage ledger -----------------------------------------------------------------------
def spend_two_stages(ledger: PrivacyLedger, eps_count: float, search) -> None:
    count = LaplaceCountMechanism(eps_count)
    ledger.spend(count.event(), "dataset size: DP count", count.metadata())
    ledger.complete_stage()
    for i, event in enumerate(search):
        ledger.spend(event, f"generation {i}")


def test_the_ledger_adds_the_completed_count_stage_to_the_search_bound(tmp_path) -> None:
    delta = 1e-5
    search = [dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.2))] * 4
    ledger = PrivacyLedger(4.0, delta)
    ledger.persist_to(tmp_path / "ledger.jsonl")
    spend_two_stages(ledger, 0.2, search)
    expected = {name: 0.2 + value for name, value in search_bounds(search, delta).items()}
    assert ledger.epsilons() == pytest.approx(expected, rel=1e-9)
    assert ledger.epsilon() == pytest.approx(min(expected.values()), rel=1e-9)
    # Not the composition of everything by one accountant: basic composition across the stages.
    composed = min(search_bounds(ledger.events, delta).values())
    assert ledger.epsilon() > composed
    # Each entry states the totals after it, the count's stage included.
    assert ledger.entries[0].epsilon == pytest.approx(0.2)
    assert ledger.entries[-1].epsilon == pytest.approx(ledger.epsilon(), rel=1e-9)
    # Written and read back: the same stages and the same numbers.
    back = PrivacyLedger.from_jsonl(tmp_path / "ledger.jsonl")
    assert back.epsilons() == pytest.approx(ledger.epsilons(), rel=1e-12)
    assert back.completed_stage_epsilon == pytest.approx(0.2)
    back.to_jsonl(tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "ledger.jsonl").read_text()


def test_budget_checks_and_refusals_count_the_completed_stage() -> None:
    delta = 1e-5
    gaussian = dp_accounting.GaussianDpEvent(1.0)
    alone = min(search_bounds([gaussian], delta).values())
    ledger = PrivacyLedger(alone + 0.1, delta)
    spend_two_stages(ledger, 0.2, [])
    assert ledger.epsilon() == pytest.approx(0.2)
    assert ledger.remaining() == pytest.approx(alone - 0.1)
    assert not ledger.can_afford(gaussian)  # fits alone, not after the count
    with pytest.raises(BudgetExceeded) as refused:
        ledger.spend(gaussian, "generation 0")
    assert refused.value.epsilon == pytest.approx(alone + 0.2, rel=1e-9)
    assert len(ledger.entries) == 1


def test_a_stage_must_be_pure_dp_to_complete() -> None:
    ledger = PrivacyLedger(4.0, 1e-5)
    ledger.spend(dp_accounting.GaussianDpEvent(2.0), "generation 0")
    with pytest.raises(ValueError, match="pure"):
        ledger.complete_stage()


def test_a_ledger_without_stages_reads_as_before(tmp_path) -> None:
    # A ledger file from before the stages (version 1 header, no stage field): one stage, as written.
    search = [dp_accounting.GaussianDpEvent(3.0)] * 2
    ledger = PrivacyLedger(4.0, 1e-5)
    for i, event in enumerate(search):
        ledger.spend(event, f"generation {i}")
    path = tmp_path / "ledger.jsonl"
    ledger.to_jsonl(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["version"] = 1
    header.pop("completed_stages", None)
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    old = PrivacyLedger.from_jsonl(path)
    assert old.completed_stage_epsilon == 0.0
    assert old.epsilons() == pytest.approx(search_bounds(search, 1e-5), rel=1e-9)


# -- the plan ---------------------------------------------------------------------------------
def two_stage_total(plan: RunPlan, delta: float) -> float:
    return plan.config.size_epsilon + min(search_bounds([plan.search_event], delta).values())


def test_an_undeclared_size_puts_the_count_first_in_the_plan() -> None:
    config = DPESConfig(epsilon=2.0, delta=1e-5, **SCHEDULE)
    plan = RunPlan.calibrated(config)
    assert plan.size_count == LaplaceCountMechanism(0.1)
    assert group_events([plan.event]) == group_events([plan.size_count.event(), plan.search_event])
    total = two_stage_total(plan, 1e-5)
    assert total <= 2.0 + 1e-9 and total > 1.95  # fits by basic composition, wastes nothing
    assert plan.epsilons(1e-5) == pytest.approx(
        {name: 0.1 + value for name, value in search_bounds([plan.search_event], 1e-5).items()}, rel=1e-9)


def test_a_declared_size_plans_no_count_and_keeps_the_old_numbers() -> None:
    declared = RunPlan.calibrated(DPESConfig(epsilon=2.0, delta=1e-5, dataset_size=500, **SCHEDULE))
    assert declared.size_count is None and declared.config.size_epsilon == 0.0
    assert declared.event == declared.search_event
    spent = min(search_bounds([declared.event], 1e-5).values())
    assert spent <= 2.0 + 1e-9 and spent > 1.99
    counted = RunPlan.calibrated(DPESConfig(epsilon=2.0, delta=1e-5, **SCHEDULE))
    assert counted.value > declared.value  # the count's share costs the search some noise


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(share=st.sampled_from([0.01, 0.05, 0.2, 0.45]), epsilon=st.sampled_from([0.5, 2.0, 8.0]),
       selection=st.sampled_from(["gaussian", "permute_and_flip"]))
def test_calibrated_two_stage_runs_never_exceed_the_target(share, epsilon, selection) -> None:
    config = DPESConfig(epsilon=epsilon, delta=1e-5, size_epsilon_share=share, selection=selection, **SCHEDULE)
    plan = RunPlan.calibrated(config)
    assert plan.config.size_epsilon == pytest.approx(share * epsilon)
    assert two_stage_total(plan, 1e-5) <= epsilon * (1 + 1e-9)
    assert min(plan.epsilons(1e-5).values()) <= epsilon * (1 + 1e-9)


@pytest.mark.parametrize("share", [0.0, 0.5, -0.1, 1.0])
def test_the_share_must_leave_most_of_the_budget_to_the_search(share) -> None:
    with pytest.raises(ValueError, match="size_epsilon_share"):
        DPESConfig(size_epsilon_share=share)
