"""L1 mechanism-level audits (dp_textgrad.audit.mechanism_audits): the claim must survive the audit,
the noise-off positive control must be caught, and a deliberately broken mechanism too.

Each audit compares D with D plus one canary record; eps_lb is a 95%-confidence
Clopper-Pearson lower bound, so "eps_lb <= claim" fails with probability <= 5% per
audit for a correct mechanism; the seeds are fixed, so the outcome is reproducible.
"""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from dp_textgrad.audit.mechanism_audits.controller_loop import audit_controller_loop
from dp_textgrad.audit.mechanism_audits.gaussian_scores import audit_gaussian_scores
from dp_textgrad.audit.mechanism_audits.selection import audit_exponential, audit_gumbel_topk
from dp_textgrad.audit.mechanism_audits.trials import POSITIVE_CONTROL_FLOOR
from dp_textgrad.cli.audit import audit_app
from dp_textgrad.privacy.accounting.events import amplify_pure_dp

RUNS = 1000  # per arm: the positive control must reach 3 here
DELTA = 1e-5

MECHANISM_AUDITS = {
    "gaussian": lambda **kw: audit_gaussian_scores(noise_multiplier=2.0, num_candidates=4, **kw),
    "gaussian_subsampled": lambda **kw: audit_gaussian_scores(noise_multiplier=1.0, sampling_rate=0.5, **kw),
    "exponential": lambda **kw: audit_exponential(epsilon0=1.0, num_candidates=4, **kw),
    "gumbel_top_k_subsampled": lambda **kw: audit_gumbel_topk(epsilon0=0.5, k=2, sampling_rate=0.5, **kw),
}


@pytest.fixture(scope="module")
def audits():
    return {name: make(runs=RUNS, delta=DELTA) for name, make in MECHANISM_AUDITS.items()}


@pytest.mark.parametrize("name", list(MECHANISM_AUDITS))
def test_claim_survives_the_audit_and_noise_off_is_caught(audits, name):
    result = audits[name]
    assert result.runs_per_arm == RUNS
    assert math.isfinite(result.claimed_epsilon) and result.claimed_epsilon > 0
    assert not result.violation
    assert 0.0 <= result.eps_lb <= result.claimed_epsilon
    assert result.positive_control_eps_lb >= POSITIVE_CONTROL_FLOOR
    assert result.positive_control_eps_lb > result.claimed_epsilon
    # Every run is one guess: the counts cover all runs of both arms.
    assert result.bound.negatives + result.bound.positives in (2 * RUNS, RUNS)  # all, or the held-out half


def _gaussian_delta(eps: float, mu: float) -> float:
    """Balle & Wang (2018): the exact delta(eps) of a Gaussian mechanism with mu = sensitivity / std."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def test_claims_match_independent_formulas(audits):
    # Gaussian, z = 2, no subsampling: mu = 1/2; the claim is a valid and nearly tight epsilon.
    claim = audits["gaussian"].claimed_epsilon
    assert _gaussian_delta(claim, 0.5) <= DELTA * 1.001
    assert _gaussian_delta(claim - 0.02, 0.5) > DELTA
    # Exponential mechanism: pure eps0; a positive delta buys almost nothing for one selection.
    assert 0.99 < audits["exponential"].claimed_epsilon <= 1.0 + 1e-9
    # Gumbel top-2 with eps0 = 0.5 under q = 0.5: at most the amplified pure bound ln(1 + q(e^{k eps0} - 1)).
    topk = audits["gumbel_top_k_subsampled"].claimed_epsilon
    assert topk <= amplify_pure_dp(1.0, 0.5) + 1e-9
    assert topk == pytest.approx(math.log(1 + 0.5 * (math.e - 1)), abs=0.05)


def test_subsampling_is_exercised(audits):
    # With q = 0.5 the canary misses about half of the "with" runs: even with noise off the
    # attacker misses them (false negatives), so amplification is really being audited.
    control = audits["gumbel_top_k_subsampled"].positive_control
    assert 0.4 * RUNS < control.false_negatives < 0.6 * RUNS
    assert control.false_positives == 0


@pytest.mark.parametrize("name, runs, kwargs", [
    ("gaussian", 1000, {}),
    ("exponential", 1000, {}),
    ("gumbel_top_k", 2000, {"sampling_rate": 1.0}),
])
def test_a_mechanism_with_a_quarter_of_its_noise_is_detected(name, runs, kwargs):
    make = {"gaussian": MECHANISM_AUDITS["gaussian"], "exponential": MECHANISM_AUDITS["exponential"],
            "gumbel_top_k": lambda **kw: audit_gumbel_topk(epsilon0=0.5, k=2, **kw)}[name]
    broken = make(runs=runs, delta=DELTA, actual_noise_factor=0.25, positive_control=False, **kwargs)
    assert broken.violation
    assert broken.eps_lb > broken.claimed_epsilon
    assert broken.positive_control is None


@pytest.mark.parametrize("selection", ["gaussian", "exponential"])
def test_whole_controller_loop_survives_the_audit(selection):
    result = audit_controller_loop(epsilon=2.0, delta=DELTA, generations=2, population=3, runs=300,
                                   selection=selection, seed=0)
    assert result.runs_per_arm == 300
    assert result.name == f"controller_loop_{selection}"
    assert result.claimed_epsilon <= 2.0 + 1e-6  # what one run charged fits the budget it was calibrated to
    assert not result.violation and result.eps_lb <= result.claimed_epsilon
    assert result.positive_control_eps_lb >= POSITIVE_CONTROL_FLOOR


@pytest.mark.parametrize("settings", [
    dict(selection="gaussian", generations=2, population=3, runs=120),  # q = 1, positive control, children
    dict(selection="exponential", generations=2, population=6, runs=120, sampling_rate=0.3, positions=2,
         n_background=3, positive_control=False),
])
def test_replayed_variants_give_the_same_runs_as_building_them(settings, monkeypatch):
    from dp_textgrad.dp_es.mutation.mutation_engine import MutationEngine

    built = []
    real = MutationEngine.variants
    monkeypatch.setattr(MutationEngine, "variants", lambda self, *a, **kw: built.append(1) or real(self, *a, **kw))

    def without_seconds(result):
        return {k: v for k, v in result.to_dict().items() if k != "seconds"}

    replayed = audit_controller_loop(epsilon=1.0, delta=DELTA, seed=3, replay_variants=True, **settings)
    builds_when_replayed = len(built)
    rebuilt = audit_controller_loop(epsilon=1.0, delta=DELTA, seed=3, replay_variants=False, **settings)
    assert without_seconds(replayed) == without_seconds(rebuilt)
    runs = len(built) - builds_when_replayed
    assert runs >= 240 and builds_when_replayed <= 2  # the planner's build, then one per audit


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="runs"):
        audit_exponential(runs=5)
    with pytest.raises(ValueError, match="sampling_rate"):
        audit_gumbel_topk(sampling_rate=1.5, runs=100)
    with pytest.raises(ValueError, match="actual_noise_factor"):
        audit_gaussian_scores(runs=100, actual_noise_factor=0.0)
    with pytest.raises(ValueError, match="selection"):
        audit_controller_loop(runs=100, selection="tournament")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="favour"):
        audit_gaussian_scores(runs=100, favour="some")  # type: ignore[arg-type]


def test_cli_prints_the_table_logs_one_line_per_audit_and_fails_on_bad_input(tmp_path):
    runner = CliRunner()
    result = runner.invoke(audit_app, ["mechanisms", "--runs", "1000", "--only", "exponential",
                                       "--only", "gumbel_top_k", "--min-control", "3",
                                       "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "exponential" in result.output and "claimed eps" in result.output
    lines = [json.loads(line) for line in (tmp_path / "run_metadata.jsonl").read_text().splitlines()]
    assert [line["audit"] for line in lines] == ["exponential", "gumbel_top_k"]
    assert all(line["kind"] == "audit_l1" and line["violation"] is False and "code_version" in line for line in lines)
    assert all(line["eps_lb"] <= line["claimed_epsilon"] for line in lines)

    bad = runner.invoke(audit_app, ["mechanisms", "--only", "nonsense", "--runs-dir", str(tmp_path)])
    assert bad.exit_code == 2
    # A positive control that cannot reach the floor (too few runs) fails the command.
    weak = runner.invoke(audit_app, ["mechanisms", "--runs", "20", "--only", "exponential",
                                     "--min-control", "3", "--no-log"])
    assert weak.exit_code == 1
    assert "CONTROL TOO WEAK" in weak.output
