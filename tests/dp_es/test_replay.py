"""Adopting an interrupted attempt's charge (dp_textgrad/dp_es/replay.py): only where it is sound.

The whole-run behaviour (kill -9, resume, same releases, ledger = plan) is in
tests/test_fault_injection.py; these check the rules one by one, in process.
"""

from __future__ import annotations

import numpy as np
import pytest

from dp_textgrad import runs
from dp_textgrad.dp_es.replay import ReplayJournal
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.noise import NoiseSource
from tests.helpers import RuleEngine, candidates, make_task

CANDIDATES = candidates("Classify the ticket.", "Say billing.", "Mention shipping and account words.")


class ExactEngine(RuleEngine):
    deterministic_scores = True


def scorer_for(run_dir, ledger, *, engine=None, secure=False) -> DPScorer:
    task = make_task(30)
    noise = NoiseSource() if secure else NoiseSource(insecure_seed=3)
    scorer = DPScorer(task, engine or ExactEngine(), ledger, sampling_rate=0.5, dataset_size=30, noise=noise)
    scorer.journal = ReplayJournal(runs.RunDir(run_dir), noise)
    return scorer


def mechanism() -> GaussianScoreMechanism:
    return GaussianScoreMechanism(1.0, 1.0, len(CANDIDATES))


def interrupted(tmp_path, *, journaled: bool, engine=None, secure=False):
    """A ledger whose last charge was made by an attempt killed before (or after) its release."""
    ledger = PrivacyLedger(50.0, 1e-5)
    first = scorer_for(tmp_path, ledger, engine=engine, secure=secure)
    if journaled:
        released = first.score(CANDIDATES, mechanism(), "generation 0: scores").noisy_sums
    else:
        first._charge(mechanism(), "generation 0: scores", CANDIDATES, {"feedback_candidates": 0})
        released = None
    ledger.expect_replay(0)  # the checkpoint was written before that charge
    return ledger, released


def test_a_charge_without_its_release_is_adopted_when_the_scores_replay_exactly(tmp_path) -> None:
    ledger, _ = interrupted(tmp_path, journaled=False)
    scorer = scorer_for(tmp_path, ledger)
    assert scorer.replays_exactly
    released = scorer.score(CANDIDATES, mechanism(), "generation 0: scores")
    assert len(ledger.entries) == 1 and ledger.replayed == 1 and ledger.pending_replays == 0
    # The same subsample (from the charge's seed) and, insecure, the same noise: an uninterrupted run's value.
    fresh = PrivacyLedger(50.0, 1e-5)
    uninterrupted = scorer_for(tmp_path / "other", fresh).score(CANDIDATES, mechanism(), "generation 0: scores")
    np.testing.assert_array_equal(released.noisy_sums, uninterrupted.noisy_sums)


def test_a_charge_without_its_release_is_charged_again_when_the_engine_is_not_exact(tmp_path) -> None:
    ledger, _ = interrupted(tmp_path, journaled=False, engine=RuleEngine())
    scorer = scorer_for(tmp_path, ledger, engine=RuleEngine())
    assert not scorer.replays_exactly
    scorer.score(CANDIDATES, mechanism(), "generation 0: scores")
    assert len(ledger.entries) == 2 and ledger.replayed == 0


def test_a_journaled_release_is_reused_whatever_the_engine(tmp_path) -> None:
    ledger, released = interrupted(tmp_path, journaled=True, engine=RuleEngine())
    again = scorer_for(tmp_path, ledger, engine=RuleEngine()).score(CANDIDATES, mechanism(), "generation 0: scores")
    assert len(ledger.entries) == 1 and ledger.replayed == 1
    np.testing.assert_array_equal(again.noisy_sums, released)  # post-processing of the one release


@pytest.mark.parametrize("change", ["label", "event", "candidates"])
def test_a_charge_that_differs_from_the_interrupted_one_is_charged_again(tmp_path, change) -> None:
    ledger, _ = interrupted(tmp_path, journaled=True)
    scorer = scorer_for(tmp_path, ledger)
    label = "generation 1: scores" if change == "label" else "generation 0: scores"
    chosen = GaussianScoreMechanism(2.0, 1.0, len(CANDIDATES)) if change == "event" else mechanism()
    cands = candidates("Other.", "Say billing.", "Mention shipping.") if change == "candidates" else CANDIDATES
    scorer.score(cands, chosen, label)
    assert len(ledger.entries) == 2 and ledger.replayed == 0 and ledger.pending_replays == 0


def test_without_the_secret_that_drew_the_subsample_a_charge_is_charged_again(tmp_path) -> None:
    ledger, _ = interrupted(tmp_path, journaled=False, secure=True)
    secret = runs.RunDir(tmp_path).run_secret
    assert len(bytes.fromhex(secret.read_text().strip())) == 16  # 128 bits, operator-only
    secret.unlink()  # a run directory from before the secret existed
    scorer_for(tmp_path, ledger, secure=True).score(CANDIDATES, mechanism(), "generation 0: scores")
    assert len(ledger.entries) == 2 and ledger.replayed == 0
