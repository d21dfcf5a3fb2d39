"""Audits that kill mutants: each bug is patched into the real code (the mutants of
``benchmarks/audit_mutants.py``), and the audit of the real scorer must flag it (eps_lb >
claim) while the correct code passes. Seeded (insecure noise): deterministic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "audit_mutants.py"


def load_mutants():
    spec = importlib.util.spec_from_file_location("audit_mutants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = load_mutants()
MUTANT_NAMES = ("noise std x 0.5", "clip bound ignored", "charge skipped", "subsample from a fixed seed")
CAUGHT = [(mechanism, mutant) for mechanism in bench.SETTINGS for mutant in MUTANT_NAMES]


@pytest.mark.parametrize("mechanism", list(bench.SETTINGS))
def test_the_correct_scorer_passes(mechanism) -> None:
    result = bench.run_audit(mechanism)
    assert not result.violation, (result.eps_lb, result.claimed_epsilon)
    assert result.eps_lb > 0.0  # the audit sees the canary at all


@pytest.mark.parametrize("mechanism, mutant", CAUGHT)
def test_each_mutant_is_caught(mechanism, mutant) -> None:
    with bench.MUTANTS[mutant]():
        result = bench.run_audit(mechanism)
    assert result.violation, (mutant, result.eps_lb, result.claimed_epsilon)


def test_the_mutants_are_undone_afterwards() -> None:
    from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism

    with bench.MUTANTS["noise std x 0.5"]():
        assert GaussianScoreMechanism(2.0, 1.0, 1).noise_std == 1.0
    assert GaussianScoreMechanism(2.0, 1.0, 1).noise_std == 2.0
