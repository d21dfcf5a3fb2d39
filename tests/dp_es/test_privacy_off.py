"""privacy='off': the non-private baseline runs the same loop without noise and says so."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from dp_textgrad import ConfigError, DPEvolutionStrategy
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.tasks.synthetic import make_support_task

tg = import_textgrad()


def length_rule(context: str, choices: Sequence[str]) -> list[float]:
    # Deterministic and prompt-dependent: which label wins depends on the prompt's and record's lengths.
    prompt, _, record = context.rpartition("Message:")
    pick = (len(prompt) + len(record)) % len(choices)
    return [1.0 if i == pick else 0.0 for i in range(len(choices))]


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=5, n_private=120, n_test=20)


def make_engine() -> ScriptedEngine:
    return ScriptedEngine(responses=["Sort the message into its category.</PROMPT>",
                                     "Name the customer's request.</PROMPT>"], choice_rule=length_rule)


def test_off_rejects_dp_only_settings(task) -> None:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    with pytest.raises(ConfigError, match="privacy"):
        DPEvolutionStrategy([prompt], task=task, engine=make_engine(), privacy="off", selection="exponential",
                            feedback="none")
    with pytest.raises(ConfigError, match="privacy"):
        DPEvolutionStrategy([prompt], task=task, engine=make_engine(), privacy="off", final_selection="exponential")


def test_off_scores_exactly_and_is_labelled_not_private(task, tmp_path) -> None:
    engine = make_engine()
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=engine, privacy="off", sampling_rate=1.0,
                              generations=2, population=4, parents=2, seed=3, checkpoint_dir=tmp_path)
    assert opt.noise_multiplier is None and opt.ledger.unsafe
    report = opt.step()
    assert report is not None
    # With q = 1 every estimate is the candidate's exact mean score on the whole private set.
    candidates = {c.id: c for c in opt.population.archive}
    records = [opt.task.private_train[i].unwrap() for i in range(len(opt.task.private_train))]
    checked = 0
    for candidate in candidates.values():
        if not candidate.evaluations:
            continue
        exact = opt.task.accuracy(engine, candidate.text, records)
        assert candidate.evaluations[0].estimate == pytest.approx(exact, abs=1e-12)
        assert candidate.evaluations[0].noise_std == 0.0
        checked += 1
    assert checked == 4  # the whole first generation
    result = opt.run()
    assert result.unsafe and math.isinf(result.epsilon)
    assert opt.ledger.entries == []  # nothing was charged: the run claims no guarantee at all
    assert any("non-private" in reason for reason in opt.ledger.unsafe_reasons)


def test_score_exact_refuses_a_private_ledger(task) -> None:
    ledger = PrivacyLedger(1.0, 1e-5)
    scorer = DPScorer(task, make_engine(), ledger, sampling_rate=0.5, dataset_size=len(task.private_train),
                      noise=NoiseSource(insecure_seed=1))
    calls_before = scorer.engine.usage.calls if hasattr(scorer.engine, "usage") else 0

    class _Candidate:
        id = "c0"
        text = "Classify."

    with pytest.raises(PermissionError, match="unsafe"):
        scorer.score_exact([_Candidate()])
    assert (scorer.engine.usage.calls if hasattr(scorer.engine, "usage") else 0) == calls_before
    assert np.isfinite(ledger.epsilon()) and ledger.entries == []


def test_shrinkage_off_ranks_by_the_pooled_noisy_estimates(task) -> None:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=make_engine(), epsilon=2.0, sampling_rate=0.5,
                              generations=1, population=4, parents=2, seed=3, insecure_noise_seed=11,
                              shrinkage=False)
    assert opt.step() is not None
    evaluated = [c for c in opt.population.archive if c.evaluations]
    raw = {c.id: c.mean_estimate for c in evaluated}
    assert opt.population.shrunk_estimates() == pytest.approx(raw)  # no shrinkage applied
    on = DPEvolutionStrategy([tg.Variable(task.seed_prompt, role_description="i", requires_grad=True)], task=task,
                             engine=make_engine(), epsilon=2.0, sampling_rate=0.5, generations=1, population=4,
                             parents=2, seed=3, insecure_noise_seed=11)
    assert on.step() is not None
    shrunk = on.population.shrunk_estimates()
    raw_on = {c.id: c.mean_estimate for c in on.population.archive if c.evaluations}
    spread = lambda values: max(values) - min(values)  # noqa: E731
    assert spread(list(shrunk.values())) < spread(list(raw_on.values()))  # shrinkage pulls estimates together
