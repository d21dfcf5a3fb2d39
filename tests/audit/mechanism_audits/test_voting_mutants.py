"""Audits that kill the voting mutants: each bug is patched into the real voting code (the voting
mutants of ``benchmarks/audit_mutants.py``), and the audit of the real labelling path (keyed
partition, charge, histogram, GNMax / confident GNMax) must flag it (eps_lb > claim) while the
correct code passes. Seeded (insecure noise): deterministic; about 1 s per audit."""

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
CAUGHT = [(row, mutant) for row, mutants in bench.VOTING_CAUGHT.items() for mutant in mutants]


@pytest.mark.parametrize("row", list(bench.VOTING_SETTINGS))
def test_the_correct_vote_passes(row) -> None:
    result = bench.run_voting_audit(row)
    assert not result.violation, (result.eps_lb, result.claimed_epsilon)
    assert result.eps_lb > 0.0  # the audit sees the canary at all
    assert result.eps_lb < 0.8 * result.claimed_epsilon  # and the correct code is not near the line


@pytest.mark.parametrize("row, mutant", CAUGHT)
def test_each_voting_mutant_is_caught(row, mutant) -> None:
    with bench.VOTING_MUTANTS[mutant]():
        result = bench.run_voting_audit(row)
    assert result.violation, (mutant, result.eps_lb, result.claimed_epsilon)


def test_the_voting_mutants_are_undone_afterwards() -> None:
    from dp_textgrad.privacy import voting

    before = (voting._charge, voting._assign, voting.vote_histograms, voting.ConfidentGNMax.event)
    for mutant in bench.VOTING_MUTANTS.values():
        with mutant():
            pass
    assert (voting._charge, voting._assign, voting.vote_histograms, voting.ConfidentGNMax.event) == before
    assert voting.GNMax(2.0, 2).noise_std == 2.0
    assert voting.ConfidentGNMax(1.0, 3.0, 2.0, 2).threshold_noise_std == 3.0
    assert voting.vote_histograms([[0], [1], [None]], 2, 1).tolist() == [[1.0, 1.0]]


def test_bad_inputs_name_the_field() -> None:
    from dp_textgrad.audit import audit_voting

    with pytest.raises(ValueError, match="mechanism"):
        audit_voting(mechanism="tournament", runs=20)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lead"):
        audit_voting(mechanism="gnmax", teachers=8, lead=3, runs=20)
    with pytest.raises(ValueError, match="runs"):
        audit_voting(runs=5)
