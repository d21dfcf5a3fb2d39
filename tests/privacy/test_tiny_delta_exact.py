"""Long unsampled pure-DP plans at tiny delta, against their exact epsilon (issue 47, item 7).

3000 permute-and-flip picks of eps0 0.01 on every record (q = 1) are 3000 randomized-response
steps, whose exact epsilon is the optimal composition theorem's binomial sum
(``tests/exact_pure_dp.py``). dp-accounting composes the PLD by FFT; its float error on delta grows
with the number of compositions (1.6e-13 here, above the fixed 1e-13 slack), which put the PLD
bound 5e-5 below exact at delta 1e-10. The printed bound must be at least the exact value, and a
bound printed with fixed decimals is rounded up, never to nearest.
"""

from __future__ import annotations

import math
import re

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.privacy.accounting import PldAccountant
from dp_textgrad.privacy.accounting.bounds import format_epsilon
from tests.exact_pure_dp import exact_randomized_response_epsilon

FLAGS = ["--selection", "permute_and_flip", "--selection-epsilon", "0.01", "--parents", "1", "--population", "4",
         "--generations", "3000", "--sampling-rate", "1", "--dataset-size", "100000"]
VALIDITY = 1.0 - 1e-9  # the exact value is bisected to a relative 1e-9, from above
# Exact epsilon of 3000 randomized-response steps of 0.01 (KOV's binomial sum, bisected).
EXACT = {1e-8: 2.9848326, 1e-9: 3.2051616, 1e-10: 3.4120379}


def plan(delta: float) -> RunPlan:
    config = DPESConfig(epsilon=1.0, delta=delta, generations=3000, population=4, parents=1, sampling_rate=1.0,
                        selection="permute_and_flip", feedback="none", dataset_size=100_000)
    return RunPlan.with_value(config, 0.01)


@pytest.mark.parametrize("delta", sorted(EXACT))
def test_the_exact_references(delta) -> None:
    assert exact_randomized_response_epsilon(0.01, 3000, delta) == pytest.approx(EXACT[delta], abs=1e-7)


@pytest.mark.parametrize("delta", sorted(EXACT))
def test_a_long_unsampled_plan_is_never_below_exact_at_tiny_delta(delta) -> None:
    exact = exact_randomized_response_epsilon(0.01, 3000, delta)
    pld = PldAccountant().epsilon([plan(delta).event], delta)
    used = min(plan(delta).epsilons(delta).values())
    for name, value in (("pld", pld), ("used", used)):
        assert exact * VALIDITY <= value <= exact * 1.001, f"{name} {value:.7f} vs exact {exact:.7f}"


def test_the_printed_bound_is_rounded_up() -> None:
    result = CliRunner().invoke(cli.app, ["budget", *FLAGS, "--delta", "1e-10"])
    assert result.exit_code == 0, result.output
    printed = dict(re.findall(r"^\s+(\w+): ([0-9.]+)", result.output, re.MULTILINE))
    used = min(plan(1e-10).epsilons(1e-10).values())
    assert printed["used"] == printed["pld"] == format_epsilon(used), result.output
    assert float(printed["used"]) >= used >= EXACT[1e-10]  # exact 3.412038: never "3.4120"
    assert float(printed["used"]) <= 3.4125


@pytest.mark.parametrize("value, text", [
    (3.412038, "3.4121"), (3.41200001, "3.4121"), (3.412, "3.4120"), (0.2, "0.2000"), (4.0, "4.0000"),
    (1e-12, "0.0001"), (0.0, "0.0000"), (29.99999999999, "30.0000"), (math.inf, "inf"),
])
def test_format_epsilon_rounds_up_at_its_precision(value, text) -> None:
    assert format_epsilon(value) == text
    assert format_epsilon(3.412038, 2) == "3.42"
