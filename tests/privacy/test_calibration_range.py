"""Calibration is total on its supported range and never exceeds the target (issue: calibration
that is fast and total). Timings are in docs/performance.md (a benchmark), not here."""

from __future__ import annotations

import math

import pytest
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.dp_es.config import ConfigError, DPESConfig
from dp_textgrad.dp_es.plan import CALIBRATION_EPSILON_RANGE, RunPlan
from dp_textgrad.privacy.accounting import default_accountants
from dp_textgrad.privacy.accounting.accountants import PldAccountant
from dp_textgrad.privacy.accounting.bounds import smallest_bound

DEFAULT_SCHEDULE = dict(delta=1e-5, generations=6, population=6, sampling_rate=0.1)


@pytest.mark.parametrize("selection", ["gaussian", "exponential"])
@pytest.mark.parametrize("epsilon", [1e-3, 0.01, 0.3, 4.0, 50.0, 800.0, 1e4])
def test_calibrated_plans_fit_and_use_the_budget(selection, epsilon) -> None:
    extra = {} if selection == "gaussian" else {"selection": selection, "feedback": "none"}
    plan = RunPlan.calibrated(DPESConfig(epsilon=epsilon, **DEFAULT_SCHEDULE, **extra))
    assert plan.value is not None and math.isfinite(plan.value) and plan.value > 0
    spent = smallest_bound([plan.event], 1e-5, default_accountants())
    assert spent <= epsilon  # never over the target, under the ledger's own accountants
    if epsilon <= 500:  # past it the PLD overflows floats and the search runs on RDP alone
        assert spent >= 0.95 * epsilon, (epsilon, spent)  # and not wastefully under it


@pytest.mark.parametrize("epsilon", [CALIBRATION_EPSILON_RANGE[0] / 2, CALIBRATION_EPSILON_RANGE[1] * 2])
def test_outside_the_supported_range_is_a_clear_error(epsilon) -> None:
    with pytest.raises(ConfigError, match=r"epsilon: calibration supports 0\.001 <= epsilon <= 10000"):
        RunPlan.calibrated(DPESConfig(epsilon=epsilon, **DEFAULT_SCHEDULE))
    result = CliRunner().invoke(cli.app, ["budget", "--epsilon", str(epsilon)])
    assert result.exit_code == 2 and "calibration supports" in result.stderr


def test_the_relative_pld_grid_stays_within_its_share_of_the_fine_one() -> None:
    # The ledger's PLD picks a coarse grid when steps x compositions <= 2e-3 x epsilon: check it
    # against the fine grid (1e-4) on a run-like event where the fine grid is still affordable.
    event = SelfComposedDpEvent(PoissonSampledDpEvent(0.1, GaussianDpEvent(0.9)), 6)
    fine = PldAccountant(relative_discretization=None).epsilon([event], 1e-5)
    relative = PldAccountant().epsilon([event], 1e-5)
    assert fine <= relative <= fine * (1 + 2e-3)
