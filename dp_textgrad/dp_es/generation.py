"""One generation of DP-ES, as data flow::

    plan.generation_mechanisms(t)  ->  strategy.choose: charge, sample, score, select  (private, charged)
                                   ->  DP feedback sentences from the released confusion matrix (free)
                                   ->  MutationEngine.offspring: sanitised feedback, critiques of the
                                       parents, children (public text and DP outputs only)
                                   ->  next population

Only :meth:`GenerationStep.run`'s call to ``strategy.choose`` reads private records, through
the scorer, which charges the mechanism the plan gave before reading. Everything after
it sees public text and DP-released values. Usage is measured per phase so that only the
public phase's costs are released.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp_textgrad import runs
from dp_textgrad.dp_es.estimates import ReleasedScores
from dp_textgrad.dp_es.mutation import (
    NO_LLM_WEIGHTS,
    CritiquePipeline,
    FeedbackSanitiser,
    MutationEngine,
    render_confusion,
    render_failures,
)
from dp_textgrad.dp_es.mutation.components import ComponentMutationEngine, component_engines, part_renderer
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.dp_es.population import Candidate, PopulationManager
from dp_textgrad.dp_es.replay import ReplayJournal
from dp_textgrad.dp_es.reports import UsageMark
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.dp_es.scoring_backends import ScoringFactory
from dp_textgrad.dp_es.warmup import WarmupResult, run_warmup
from dp_textgrad.privacy.data import PublicText
from dp_textgrad.privacy.noise import NoiseSource


def no_shrinkage(means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """Rank by the pooled noisy estimates themselves (``shrinkage=False``)."""
    return np.asarray(means, dtype=float)


@dataclass(frozen=True)
class GenerationOutcome:
    """The generation's released best candidate, its parents, and usage per phase."""

    best: Candidate
    parents: list[Candidate]
    public_usage: UsageMark  # public text and DP outputs only: releasable
    private_usage: UsageMark  # a function of the secret subsample: operator-only
    released: ReleasedScores | None = None  # the generation's released scores (None: indices only)


@dataclass
class GenerationStep:
    """The parts one generation uses; :meth:`run` passes the data between them in order.

    ``mutation`` makes the children: the MutationEngine, with its FeedbackSanitiser and, when
    critiques are on, its CritiquePipeline.
    """

    plan: RunPlan
    task: Any
    engine: Any
    scorer: DPScorer
    population: PopulationManager
    mutation: MutationEngine | ComponentMutationEngine
    warmup: WarmupResult | None = None  # the public warm-up's outcome, when one ran or was skipped

    @classmethod
    def build(
        cls,
        plan: RunPlan,
        task: Any,
        engine: Any,
        ledger: Any,
        noise: NoiseSource,
        public_rng: np.random.Generator,
        *,
        dataset_size: int,
        mutation: MutationEngine | ComponentMutationEngine | None = None,
        unsafe_examples: Sequence[Any] = (),
        scoring: ScoringFactory | None = None,
        run_dir: runs.RunDir | None = None,
    ) -> GenerationStep:
        """The default parts for a plan; ``mutation`` replaces the default MutationEngine;
        ``scoring`` builds where private records are scored (default: this process); ``run_dir``
        keeps the journal of releases and the subsample secret (written here, before any charge)."""
        config = plan.config
        # The subsample must stay secret for amplification: it is drawn from the DP generator.
        backend = scoring(task, engine, noise.sampling_generator, noise.secure) if scoring is not None else None
        scorer = DPScorer(
            task,
            engine,
            ledger,
            sampling_rate=config.resolved_sampling_rate,
            dataset_size=dataset_size,
            noise=noise,
            backend=backend,
        )
        if run_dir is not None:  # a resumable run: an interruption costs nothing where that is sound
            scorer.journal = ReplayJournal(run_dir, noise)
            scorer.operator_log = lambda text: runs.append_operator_text(run_dir.path, runs.ERRORS_LOG_NAME, text)
        if mutation is None:
            llm_operators = bool(config.llm_operators)  # decided with the plan (plan.decide_llm_operators)
            description = PublicText(task.description, "user")
            sanitiser = FeedbackSanitiser(mode=config.mode, keep_terms=task.labels)
            critique = (
                CritiquePipeline(engine, sanitiser, config.parents, task_description=description, rng=public_rng)
                if config.use_critiques and llm_operators
                else None
            )

            def engine_for(
                description: PublicText,
                examples: Sequence[Any],
                render: Callable[[Any], str],
                critique: CritiquePipeline | None,
                record_formats: Sequence[str] | None = None,
            ) -> MutationEngine:
                return MutationEngine(
                    engine,
                    description,
                    task.labels,
                    examples,
                    public_rng,
                    mode=config.mode,
                    render_demo=render,
                    max_prompt_chars=config.max_prompt_chars,
                    unsafe_examples=unsafe_examples,
                    weights=None if llm_operators else NO_LLM_WEIGHTS,
                    sanitiser=sanitiser,
                    critique=critique,
                    record_formats=record_formats,
                    render_demo_as=task.render_demo if record_formats is not None else None,
                )

            components = tuple(getattr(task, "components", ()) or ())
            if components:  # a multi-part prompt: one engine per part, one part edited per child
                mutation = component_engines(
                    components,
                    lambda part: engine_for(
                        PublicText(part.description, "user"),
                        part.public_examples,
                        part_renderer(part, task.render_demo),
                        None,
                    ),
                )
            else:
                # A generation task's prompts may carry a record format (tasks.record_format).
                formats = getattr(task, "record_formats", None) if getattr(task, "kind", "") == "generate" else None
                mutation = engine_for(description, task.public_examples, task.render_demo, critique, formats)
        population = PopulationManager(
            config.population, config.elites, public_rng, shrink=None if config.shrinkage else no_shrinkage
        )
        return cls(plan, task, engine, scorer, population, mutation)

    def run(self, t: int, start: UsageMark | None = None) -> GenerationOutcome:
        """Generation ``t``; ``start``: usage when the step began (set-up before it is public)."""
        config, strategy = self.plan.config, self.plan.strategy
        start = UsageMark.of(self.engine) if start is None else start
        candidates = list(self.population.candidates)
        before_private = UsageMark.of(self.engine)
        # The same mechanism objects the planner composed into the calibrated run event.
        mechanisms = self.plan.generation_mechanisms(t, len(candidates), float(self.task.clip_bound))
        choice = strategy.choose(self.scorer, self.population, candidates, mechanisms, t, config.parents)
        after_private = UsageMark.of(self.engine)

        best = strategy.current_best(self.population, choice.parents)
        if t + 1 < config.generations:
            feedback = self.feedback_sentences(choice.released)
            n_children = config.population - min(config.elites, len(choice.parents))
            children = self.mutation.offspring(choice.parents, n_children, t + 1, feedback)
            self.population.next_generation(children, parents=choice.parents)
        public = (before_private - start) + (UsageMark.of(self.engine) - after_private)
        return GenerationOutcome(best, choice.parents, public, after_private - before_private, choice.released)

    def initialise(self, seed_text: str) -> None:
        """Generation 0's population: the seed prompt and public variants of it; with
        ``warmup_generations``, the seed and the best prompts of the public warm-up
        (:mod:`dp_textgrad.dp_es.warmup`), kept in ``self.warmup``."""
        seed = Candidate(
            id="g0-seed",
            text=str(seed_text),
            parent_ids=(),
            operator="seed",
            operator_meta={},
            generation=0,
            evaluations=[],
        )
        config = self.plan.config
        if config.warmup_generations > 0:  # public only: reads no private record, charges nothing
            self.warmup = run_warmup(
                seed,
                task=self.task,
                engine=self.engine,
                mutation=self.mutation,
                generations=config.warmup_generations,
                population=config.population,
                parents=config.parents,
            )
            if self.warmup.skipped_because is None:  # the seed, then the warm-up's prompts, best first
                self.population.initialise(seed, seeded=self.warmup.seeding_order())
                return
            # The reason names counts of public (or DP-labelled) examples only: releasable.
            warnings.warn(f"warm-up skipped: {self.warmup.skipped_because}", stacklevel=2)
        variants = self.mutation.variants(seed, config.population - 1, generation=0)
        self.population.initialise(seed, variants)

    def feedback_sentences(self, released: ReleasedScores | None) -> dict[str, list[PublicText]]:
        """The DP feedback rendered as sentences, per candidate id (free post-processing): the
        confusion matrix of a classification task, the failure histogram of a generation task."""
        if released is None or released.confusion is None or not released.confusion_candidate_ids:
            return {}
        blocks = np.asarray(released.confusion)
        spec = self.task.feedback
        if spec.kind == "failures":
            return {
                candidate_id: render_failures(
                    block,
                    spec.names,
                    spec.descriptions,
                    released.expected_batch_size,
                    noise_std=released.confusion_noise_std,
                )
                for candidate_id, block in zip(released.confusion_candidate_ids, blocks)
            }
        return {
            candidate_id: render_confusion(
                block, self.task.labels, released.expected_batch_size, noise_std=released.confusion_noise_std
            )
            for candidate_id, block in zip(released.confusion_candidate_ids, blocks)
        }


__all__ = ["GenerationOutcome", "GenerationStep", "no_shrinkage"]
