"""Audits that kill the token-vote mutants (DP answers of generation tasks): each bug is patched into
the real code (the token mutants of ``benchmarks/audit_mutants.py``), and the audit of the real
answering path (charge, keyed partition, teacher prompts, public candidates, votes, release) must
flag it (eps_lb > claim) while the correct code passes. Seeded (insecure noise): deterministic;
about 7 s per audit."""

from __future__ import annotations

import pytest

from tests.audit.mechanism_audits.test_voting_mutants import bench

CAUGHT = [(row, mutant) for row, mutants in bench.TOKEN_CAUGHT.items() for mutant in mutants]


@pytest.mark.parametrize("row", list(bench.TOKEN_SETTINGS))
def test_the_correct_token_vote_passes(row) -> None:
    result = bench.run_token_audit(row)
    assert not result.violation, (result.eps_lb, result.claimed_epsilon)
    assert result.eps_lb < 0.8 * result.claimed_epsilon  # the correct code is not near the line
    if row.endswith("b"):
        assert result.eps_lb > 0.0  # the audit sees the canary's vote at all
    else:
        assert result.eps_lb == 0.0  # a private token is never released: no trace of the canary


@pytest.mark.parametrize("row, mutant", CAUGHT)
def test_each_token_mutant_is_caught(row, mutant) -> None:
    with bench.TOKEN_MUTANTS[mutant]():
        result = bench.run_token_audit(row)
    assert result.violation, (mutant, result.eps_lb, result.claimed_epsilon)


def test_the_token_mutants_are_undone_afterwards() -> None:
    from dp_textgrad.dp_es import dp_answers
    from dp_textgrad.privacy import token_voting

    before = (token_voting._charge, token_voting.vote_histograms, token_voting.TokenGNMax.release,
              dp_answers.TeacherAnswers.candidates, dp_answers.SpanTeacherAnswers.candidates)
    for mutant in bench.TOKEN_MUTANTS.values():
        with mutant():
            pass
    assert (token_voting._charge, token_voting.vote_histograms, token_voting.TokenGNMax.release,
            dp_answers.TeacherAnswers.candidates, dp_answers.SpanTeacherAnswers.candidates) == before


def test_bad_inputs_name_the_field() -> None:
    from dp_textgrad.audit import audit_token_voting

    with pytest.raises(ValueError, match="canary_answer"):
        audit_token_voting(canary_answer="a", runs=20)
    with pytest.raises(ValueError, match="lead"):
        audit_token_voting(teachers=8, lead=3, runs=20)
    with pytest.raises(ValueError, match="vote"):
        audit_token_voting(vote="word", runs=20)
    with pytest.raises(ValueError, match="runs"):
        audit_token_voting(runs=5)
