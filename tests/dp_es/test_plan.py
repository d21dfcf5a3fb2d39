"""The run's plan: where ``llm_operators`` is decided (once, before calibration)."""

from __future__ import annotations

import pytest

from dp_textgrad import ConfigError, DPEvolutionStrategy
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.mutation import NO_LLM_WEIGHTS
from dp_textgrad.dp_es.optimizer import EvolutionController
from dp_textgrad.dp_es.plan import RunPlan, decide_llm_operators
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
from dp_textgrad.tasks.synthetic import make_support_task

tg = import_textgrad()

SCHEDULE = dict(epsilon=3.0, delta=1e-5, generations=2, population=4, parents=2, sampling_rate=0.3,
                dataset_size=120, insecure_noise_seed=7)


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=120, n_test=20)


@pytest.mark.parametrize("declared, follows, expected", [
    (None, True, True), (None, False, False), (True, False, True), (False, True, False)])
def test_a_declared_value_wins_else_the_engine_decides(declared, follows, expected) -> None:
    assert decide_llm_operators(declared, follows) is expected


@pytest.mark.parametrize("follows", [True, False])
def test_the_run_decides_once_and_its_plan_carries_the_bool(task, follows) -> None:
    engine = ScriptedEngine()
    engine.instruction_following = follows
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=engine, **SCHEDULE)
    assert opt.config.llm_operators is follows and opt.plan.config.llm_operators is follows
    # What the generation builds follows the plan's bool: no LLM operator, no critique, without them.
    assert all((opt.mutation.weights[name] > 0) is follows for name in NO_LLM_WEIGHTS)
    assert (opt.critique is not None) is follows


def test_a_controller_refuses_a_plan_that_left_it_undecided(task) -> None:
    """Below the plan nothing decides ``llm_operators`` again: an undecided plan is refused, where
    the generation used to decide it from the engine on its own."""
    config = DPESConfig(**SCHEDULE).resolved()
    assert config.llm_operators is None
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    with pytest.raises(ConfigError, match="llm_operators undecided"):
        EvolutionController([prompt], task=task, engine=ScriptedEngine(), plan=RunPlan.calibrated(config),
                            ledger=PrivacyLedger(config.epsilon, config.delta))
