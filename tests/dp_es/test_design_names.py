"""The design's names (DESIGN.md, sections 2, 4 and 8): each part is a class of that name, in its
module, doing that job; no other name for it beside."""

from __future__ import annotations

import importlib

import pytest

import dp_textgrad
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es import mutation, selector
from dp_textgrad.dp_es.mutation import CritiquePipeline, FeedbackSanitiser, MutationEngine
from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy, EvolutionController
from dp_textgrad.dp_es.population import PopulationManager
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES, DPSelector, NoisyScoreTopK
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.tasks.synthetic import make_support_task

tg = import_textgrad()

DESIGN_NAMES = {
    "EvolutionController": "dp_textgrad.dp_es.optimizer",
    "DPEvolutionStrategy": "dp_textgrad.dp_es.optimizer",
    "PopulationManager": "dp_textgrad.dp_es.population",
    "DPScorer": "dp_textgrad.dp_es.scorer",
    "DPSelector": "dp_textgrad.dp_es.selector",
    "MutationEngine": "dp_textgrad.dp_es.mutation.mutation_engine",
    "FeedbackSanitiser": "dp_textgrad.dp_es.mutation.feedback",
    "CritiquePipeline": "dp_textgrad.dp_es.mutation.critique",
}


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=120, n_test=20)


def controller(task, **settings) -> DPEvolutionStrategy:
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    defaults = dict(epsilon=3.0, delta=1e-5, generations=2, population=4, parents=2, sampling_rate=0.3,
                    dataset_size=120, insecure_noise_seed=7, llm_operators=True)
    return DPEvolutionStrategy([prompt], task=task, engine=ScriptedEngine(), **{**defaults, **settings})


@pytest.mark.parametrize("name, module", sorted(DESIGN_NAMES.items()))
def test_each_named_part_is_a_class_of_that_name_in_its_module(name, module) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and cls.__name__ == name and cls.__module__ == module  # not an alias


def test_the_old_names_are_gone() -> None:
    assert not hasattr(mutation, "Mutator") and not hasattr(selector, "SelectionStrategy")


def test_the_controller_is_a_textgrad_optimizer_and_the_strategy_the_python_entry() -> None:
    assert issubclass(EvolutionController, tg.optimizer.Optimizer)
    assert issubclass(DPEvolutionStrategy, EvolutionController)
    assert dp_textgrad.DPEvolutionStrategy is DPEvolutionStrategy


def test_dp_selector_is_the_base_of_every_selection_strategy() -> None:
    assert SELECTION_STRATEGIES and all(isinstance(s, DPSelector) for s in SELECTION_STRATEGIES.values())
    assert isinstance(SELECTION_STRATEGIES["gaussian"], NoisyScoreTopK)  # noisy scores, then top-k (free)
    charged = {name for name, s in SELECTION_STRATEGIES.items() if s.calibrates == "epsilon0"}
    assert charged == {"exponential", "permute_and_flip"}  # the exponential mechanism and its sibling


def test_the_controller_runs_the_named_parts(task) -> None:
    opt = controller(task)
    assert isinstance(opt, EvolutionController)
    assert isinstance(opt.population, PopulationManager)
    assert isinstance(opt.scorer, DPScorer)
    assert isinstance(opt.plan.strategy, DPSelector)
    assert isinstance(opt.mutation, MutationEngine)


@pytest.mark.parametrize("use_critiques", [True, False])
def test_the_mutation_engine_holds_its_sanitiser_and_critique_pipeline(task, use_critiques) -> None:
    engine = controller(task, use_critiques=use_critiques).mutation
    assert isinstance(engine.sanitiser, FeedbackSanitiser)
    if use_critiques:
        assert isinstance(engine.critique, CritiquePipeline)
        assert engine.critique.sanitiser is engine.sanitiser  # one sanitiser for the feedback and the advice
    else:
        assert engine.critique is None
