"""The DP-ES loop as a TextGrad optimizer.

One ``step()`` is one :class:`~dp_textgrad.dp_es.generation.GenerationStep`; this module
adds what surrounds it: set-up, the checks before the first charge, checkpoints after
every generation, stopping, and the final release. Budget first:
:class:`DPEvolutionStrategy` calibrates a :class:`~dp_textgrad.dp_es.plan.RunPlan` from
(epsilon, delta), and every charge at run time is a mechanism of that plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np

from dp_textgrad import runs
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es import labelling_phase, size_count
from dp_textgrad.dp_es.config import ConfigError, DPESConfig, config_with
from dp_textgrad.dp_es.estimates import Z95, ReleasedScores
from dp_textgrad.dp_es.generation import GenerationStep, no_shrinkage
from dp_textgrad.dp_es.labelling import DPLabelled
from dp_textgrad.dp_es.mutation import CritiquePipeline, MutationEngine
from dp_textgrad.dp_es.mutation.components import ComponentMutationEngine
from dp_textgrad.dp_es.plan import RunPlan, decide_llm_operators
from dp_textgrad.dp_es.population import Candidate, PopulationManager
from dp_textgrad.dp_es.preflight import PreflightError, length_tools, preflight
from dp_textgrad.dp_es.reports import (
    FinalEstimate,
    GenerationReport,
    GenerationTelemetry,
    SearchResult,
    UsageMark,
    failures_reason,
    nothing_released,
    refusal_reason,
)
from dp_textgrad.dp_es.scorer import DPScorer
from dp_textgrad.dp_es.scoring_backends import ScoringFactory
from dp_textgrad.dp_es.selector import error_stop
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded, PrivacyLedger
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.tasks.base import Task

_tg = import_textgrad()
Optimizer: Any = _tg.optimizer.Optimizer  # TextGrad's base class (textgrad ships no type information)

StopCallback = Callable[[GenerationReport], bool]

FINAL_ESTIMATE_LABEL = "final estimate: noisy score of the released prompt on a fresh subsample"


class EvolutionController(Optimizer):
    """A TextGrad ``Optimizer`` running DP-ES on one prompt ``Variable`` under a given plan.

    Build it through :class:`DPEvolutionStrategy`, which validates the configuration and
    calibrates the plan from the budget.
    """

    def __init__(
        self,
        parameters: Sequence[Any],
        *,
        task: Task,
        engine: Any,
        plan: RunPlan,
        ledger: PrivacyLedger,
        mutation: MutationEngine | None = None,
        checkpoint_dir: str | Path | None = None,
        callbacks: Sequence[StopCallback] = (),
        scoring: ScoringFactory | None = None,
        noise: NoiseSource | None = None,
    ) -> None:
        parameters = list(parameters)
        if len(parameters) != 1:
            raise ConfigError("parameters: DP-ES optimizes exactly one prompt Variable; pass [prompt]")
        super().__init__(parameters)
        config = plan.config
        if config.llm_operators is None:  # decided with the plan (DPEvolutionStrategy), never below it
            raise ConfigError(
                "plan: its configuration leaves llm_operators undecided; build the run through "
                "DPEvolutionStrategy (it decides them from the engine) or set llm_operators"
            )
        self.variable = parameters[0]
        self.engine = engine
        self.plan = plan
        self.config = config
        self.ledger = ledger
        self.run_dir = runs.RunDir(checkpoint_dir) if checkpoint_dir is not None else None
        self.callbacks = list(callbacks)
        self.generation = 0
        self.history: list[GenerationReport] = []
        self.telemetry: list[GenerationTelemetry] = []  # operator-only, see GenerationTelemetry
        self.stopped_because: str | None = None
        self._refusal: BudgetExceeded | None = None
        self._preflight_done = False
        self.interrupted_charges = 0  # charges of generations interrupted before their checkpoint, not adopted

        # Two generators, never mixed: reproducible public choices vs DP randomness.
        self.public_rng = np.random.default_rng(config.seed)
        self.noise = noise or NoiseSource(insecure_seed=config.insecure_noise_seed)  # the DP count's, if any
        ledger.declare_noise(self.noise.sampler)
        if self.run_dir is not None:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            # From now on the ledger writes itself after every charge, with the public file time.
            ledger.persist_to(self.run_dir.ledger, runs.RELEASED_FILE_TIME)
        # A public cap on record length, applied before anything is charged (see with_bounded_records).
        self.task = task.with_bounded_records(*length_tools(engine), config.max_record_tokens, config.long_records)
        unsafe_examples = self._unsafe_examples() if config.mode == "unsafe" else ()
        self._build_args: dict[str, Any] = {
            "scoring": scoring,
            "mutation": mutation,
            "unsafe_examples": unsafe_examples,
        }
        # A resumed run reads its labels back (never labels again); a fresh one labels at its first step.
        self.labelled: DPLabelled | None = None
        if self._labelling_charged() is not None:
            self._use_labels(labelling_phase.read_labels(self.run_dir))
        self.parts = self._build_parts()
        if config.mode == "unsafe" and not ledger.unsafe:
            ledger.mark_unsafe("feedback mode 'unsafe': raw private examples reach the mutation LLM")

    def _build_parts(self) -> GenerationStep:
        return GenerationStep.build(
            self.plan,
            self.task,
            self.engine,
            self.ledger,
            self.noise,
            self.public_rng,
            dataset_size=self.public_dataset_size,
            run_dir=self.run_dir,
            **self._build_args,
        )

    # -- the labelling phase (dp.labelling) ---------------------------------------------------
    def _labelling_charged(self) -> int | None:
        """The ledger index of the labelling phase's charge, or None (not charged yet, or no phase)."""
        return None if self.config.labelling is None else labelling_phase.charge_index(self.ledger)

    def _use_labels(self, labelled: DPLabelled | None) -> None:
        """Make the DP-labelled examples public demonstrations of the search (structured start,
        demonstration operators): post-processing of the vote's release."""
        self.labelled = labelled
        if labelled is not None and labelled.examples:
            task: Any = self.task
            join = getattr(task, "with_answers", None)
            if callable(join):  # a task that renders its own demonstrations (a DSPy program's)
                self.task = join(task, labelled.examples)
            else:
                self.task = replace(task, public_examples=[*task.public_examples, *labelled.examples])

    def remaining_event(self) -> Any:
        """What this run may still spend: the labelling phase if it has not run, then generations
        from the current one and the final release."""
        remaining = self.plan.remaining_event(self.generation)
        labelling = self.plan.labelling_event
        if labelling is None or self._labelling_charged() is not None:
            return remaining
        return dp_accounting.ComposedDpEvent([labelling, remaining])

    def label(self) -> DPLabelled | None:
        """Run the labelling phase if the plan has one and it has not run: the checks on public
        values, a checkpoint, ONE charge, the teachers' vote and the release (``labels.json`` in
        the run directory). Called by the first :meth:`step`; the search is then built on the
        DP-labelled examples. Returns the labels (None without a phase)."""
        plan = self.plan.labelling(len(getattr(self.task, "labels", ())))
        if plan is None or self._labelling_charged() is not None or self.population.candidates:
            return self.labelled
        if not self._preflight_done:
            self.preflight()
        self._save_checkpoint()  # before the charge: a run stopped while labelling can be resumed
        settings = self.config.labelling
        assert settings is not None  # the plan has a labelling phase
        started, before = time.perf_counter(), UsageMark.of(self.engine)
        labelled = labelling_phase.run_labelling(
            self.task,
            self.engine,
            plan,
            self.ledger,
            self.noise,
            settings,
            self.plan.labelling_epsilons(self.config.resolved_delta),
        )
        used = UsageMark.of(self.engine) - before
        if self.run_dir is not None:  # the teachers read private records: their usage and time are operator-only
            runs.write_operator_json(
                self.run_dir.path,
                labelling_phase.USAGE_NAME,
                {**used.__dict__, "seconds": time.perf_counter() - started},
            )
        labelling_phase.write_labels(self.run_dir, labelled)
        self._use_labels(labelled)
        self.parts = self._build_parts()
        self._save_checkpoint()
        return self.labelled

    # -- views ---------------------------------------------------------------------------
    @property
    def population(self) -> PopulationManager:
        return self.parts.population

    @property
    def scorer(self) -> DPScorer:
        return self.parts.scorer

    @property
    def mutation(self) -> MutationEngine | ComponentMutationEngine:
        return self.parts.mutation

    @property
    def critique(self) -> CritiquePipeline | None:
        return self.parts.mutation.critique

    noise_multiplier = property(lambda self: self.plan.noise_multiplier, doc="the plan's z (Gaussian scores)")
    selection_epsilon = property(lambda self: self.plan.selection_epsilon, doc="the plan's eps0 per pick")
    interrupted_charges = property(
        lambda self: self._interrupted - self.ledger.replayed,  # less those adopted
        lambda self, n: setattr(self, "_interrupted", int(n) + self.ledger.replayed),
    )

    @property
    def planned_private_evaluations(self) -> float:
        """Expected record evaluations per generation, q N K: public (the realised count is not)."""
        return self.config.resolved_sampling_rate * self.public_dataset_size * self.config.population

    public_dataset_size = property(
        lambda self: int(self.config.public_dataset_size), doc="N: declared, or the DP count"
    )

    def _unsafe_examples(self) -> list[Any]:
        # Unsafe mode is an explicit research baseline: the one place private text is unwrapped
        # for the MutationEngine, and the ledger says the run is NOT differentially private.
        count = min(self.config.unsafe_examples, len(self.task.private_train))
        picks = self.public_rng.choice(len(self.task.private_train), size=count, replace=False)
        return [self.task.private_train[int(i)].unwrap() for i in picks]

    # -- one generation -----------------------------------------------------------------
    def initialise_population(self) -> None:
        self.parts.initialise(str(self.variable.value))

    def preflight(self) -> None:
        """Check the engine and the longest allowed record on public text, before any charge."""
        preflight(self.engine, self.task, str(self.variable.value), self.config.max_record_tokens)
        self._preflight_done = True

    def step(self) -> GenerationReport | None:
        """Run one DP generation; write the current best prompt into the Variable.

        Returns ``None`` (and sets ``stopped_because``) when the run is over.
        """
        if self.stopped_because is not None:
            return None
        if self.generation >= self.config.generations:
            self.stopped_because = "all generations done"
            return None
        t = self.generation
        if not self.population.candidates:
            try:
                self.label()  # before the marks: the teachers' usage is private (operator-only)
            except BudgetExceeded as exc:  # e.g. the dataset's lifetime cap: refused like a generation
                self._refused(exc, t)
                return None
        started, start = time.perf_counter(), UsageMark.of(self.engine)
        if not self.population.candidates:
            self.initialise_population()
        if not self._preflight_done:
            self.preflight()
            # A checkpoint before the first charge: a run that fails in generation 0 can be resumed.
            self._save_checkpoint()
        try:
            outcome = self.parts.run(t, start)
        except BudgetExceeded as exc:
            self._refused(exc, t)
            return None
        self.variable.set_value(outcome.best.text)
        self.generation = t + 1
        report = self._report(t, outcome.best, outcome.public_usage, outcome.released)
        private = outcome.private_usage
        telemetry = GenerationTelemetry(
            private.calls, private.prompt_tokens, private.completion_tokens, seconds=time.perf_counter() - started
        )
        self.history.append(report)
        self.telemetry.append(telemetry)
        self._save_checkpoint(report, telemetry)
        if error_stop(report.error_share_estimate, report.error_share_noise_std, self.config.max_error_share):
            self.stopped_because = failures_reason(report, self.config.max_error_share)
        elif self.generation >= self.config.generations:
            self.stopped_because = "all generations done"
        elif any(callback(report) for callback in self.callbacks):
            self.stopped_because = "stopped by callback"
        return report

    def _refused(self, exc: BudgetExceeded, t: int) -> None:
        """Stop the run: the charge before generation ``t`` was refused (nothing of it was read)."""
        self._refusal = exc
        self.stopped_because = refusal_reason(
            exc, t, self.config.generations, self.ledger.epsilon(), self.interrupted_charges
        )
        self._save_checkpoint()

    def _in_range(self, value: float) -> float:
        """A released mean score, shown within the metric's range [0, C] (post-processing): a noisy
        estimate, or an exact one over the public q N of a larger subsample, can fall outside it."""
        value = float(value)
        return value if math.isnan(value) else min(float(self.task.clip_bound), max(0.0, value))

    def _report(
        self, t: int, best: Candidate, public: UsageMark, released: ReleasedScores | None = None
    ) -> GenerationReport:
        shrunk = self.population.shrunk_estimates()
        # The mean over every candidate scored this generation (its released estimates), not over the
        # candidates kept for the next one; without released scores, the kept ones' shrunk estimates.
        values = (
            [float(v) for v in released.estimates if math.isfinite(v)]
            if released is not None
            else [v for v in shrunk.values() if math.isfinite(v)]
        )
        return GenerationReport(
            generation=t,
            best_candidate_id=best.id,
            best_estimate=self._in_range(shrunk.get(best.id, float("nan"))),
            mean_estimate=self._in_range(float(np.mean(values)) if values else float("nan")),
            noise_std_estimate=float(best.estimate_std)
            if best.evaluations and best.estimate_std is not None
            else float("nan"),
            epsilon_spent=self.ledger.epsilon(),
            epsilons=self.ledger.epsilons(),
            public_calls=public.calls,
            public_prompt_tokens=public.prompt_tokens,
            public_completion_tokens=public.completion_tokens,
            planned_private_evaluations=self.planned_private_evaluations,
            error_share_estimate=None if released is None else released.error_share,
            error_share_noise_std=None if released is None else released.error_share_std,
        )

    # -- running to the end --------------------------------------------------------------
    def run(self, progress: Callable[[GenerationReport], None] | None = None) -> SearchResult:
        while self.stopped_because is None:
            report = self.step()
            if report is not None and progress is not None:
                progress(report)
        return self.finalise()

    def finalise(self) -> SearchResult:
        """Release the final prompt (free, or a charged selection on a fresh subsample)."""
        if not self.history:
            # Nothing DP was released, so there is no prompt to release either.
            raise nothing_released(self._refusal, self.ledger, self.interrupted_charges)
        best = self._last_best()
        final = self.plan.final(float(self.task.clip_bound))
        if final is not None:
            candidates = list(self.population.candidates)
            try:
                best = candidates[self.scorer.select(candidates, final, f"final release: {final.name}")[0]]
            except BudgetExceeded:
                pass  # the last generation's best stands; it was released already
        self.variable.set_value(best.text)
        fresh = self._final_estimate(best)
        estimate = self.population.shrunk_estimates().get(best.id)
        return SearchResult(
            prompt=best.text,
            candidate_id=best.id,
            estimate=self._in_range(estimate) if estimate is not None and math.isfinite(estimate) else None,
            epsilon=self.ledger.epsilon(),
            delta=self.ledger.delta,
            epsilons=self.ledger.epsilons(),
            generations_run=self.generation,
            stopped_because=self.stopped_because or "finalised early",
            unsafe=self.ledger.unsafe,
            history=list(self.history),
            lineage=[c.to_dict() for c in self.population.lineage(best.id)],
            noise=self.noise.sampler,
            # From the history, so a resumed run counts the generations before the resume too.
            public_usage={
                "calls": sum(h.public_calls for h in self.history),
                "prompt_tokens": sum(h.public_prompt_tokens for h in self.history),
                "completion_tokens": sum(h.public_completion_tokens for h in self.history),
            },
            planned_private_evaluations=self.planned_private_evaluations,
            labelling=None if self.labelled is None else labelling_phase.labels_payload(self.labelled),
            final_estimate=fresh,
        )

    def _final_estimate(self, best: Candidate) -> FinalEstimate | None:
        """The released prompt's score on a fresh subsample with fresh noise (``dp.final_estimate``),
        charged first; None without one, or when the budget refuses it (the prompt stands)."""
        mechanism, rate = self.plan.final_estimate(float(self.task.clip_bound)), self.config.final_estimate_rate
        if mechanism is None or rate is None:
            return None
        scorer = self.scorer.at_rate(rate)
        try:
            released = scorer.score([best], mechanism, FINAL_ESTIMATE_LABEL)
        except BudgetExceeded:
            return None
        value = float(released.estimates[0])
        noise_std = float(released.noise_std_estimate)
        batch = scorer.expected_batch_size
        # Public: the rate and the declared or DP-counted N (scores in [0, C]).
        sampling = float(self.task.clip_bound) * math.sqrt(max(0.0, 1.0 - rate) / batch)
        half = Z95 * math.hypot(noise_std, sampling)
        return FinalEstimate(
            candidate_id=best.id,
            estimate=self._in_range(value),
            noise_std=noise_std,
            sampling_std_bound=sampling,
            interval=(self._in_range(value - half), self._in_range(value + half)),
            sampling_rate=rate,
            expected_batch_size=batch,
        )

    def _last_best(self) -> Candidate:
        if self.plan.strategy.releases_scores:
            return self.population.best(1)[0]
        best_id = self.history[-1].best_candidate_id  # a selection's ordered head, released then
        for candidate in self.population.archive:
            if candidate.id == best_id:
                return candidate
        return self.population.candidates[0]

    def privacy_spent(self) -> dict[str, Any]:
        """Epsilon under every accountant, the smallest (used), delta and the budget."""
        return {
            "epsilon": self.ledger.epsilon(),
            "delta": self.ledger.delta,
            "budget_epsilon": self.ledger.epsilon_budget,
            "by_accountant": self.ledger.epsilons(),
            "unsafe": self.ledger.unsafe,
        }

    # -- checkpoints ---------------------------------------------------------------------
    def state(self) -> runs.RunState:
        return runs.RunState(
            generation=self.generation,
            config=self.config.model_dump(),
            plan_value=self.plan.value,
            population=self.population.to_dict(),
            public_rng_state=dict(self.public_rng.bit_generator.state),
            history=[h.as_dict() for h in self.history],
            stopped_because=self.stopped_because,
            variable_value=self.variable.value,
            charges=len(self.ledger.entries) - self.ledger.pending_replays,  # not adopted yet: after it
            interrupted_charges=self.interrupted_charges - self.ledger.pending_replays,
        )

    def _save_checkpoint(
        self, report: GenerationReport | None = None, telemetry: GenerationTelemetry | None = None
    ) -> None:
        if self.run_dir is None:
            return
        # The ledger is on disk already: it wrote itself at every charge, before any data was read.
        if report is not None:
            line = {**report.as_dict(), **(telemetry.as_dict() if telemetry is not None else {})}
            runs.append_released_jsonl(
                self.run_dir.path, runs.METRICS_NAME, "metrics", line, key={"generation": report.generation}
            )
        self.run_dir.write_state(self.state())

    def _restore(self, state: runs.RunState) -> None:
        self.generation = int(state.generation)
        self.parts.population = PopulationManager.from_dict(
            state.population, rng=self.public_rng, shrink=None if self.config.shrinkage else no_shrinkage
        )
        self.public_rng.bit_generator.state = state.public_rng_state
        self.history = [GenerationReport.from_dict(h) for h in state.history]
        self.stopped_because = None
        self.interrupted_charges = state.interrupted_charges
        if state.charges is not None:
            charges = state.charges
            labelling = self._labelling_charged()
            if labelling is not None and labelling >= charges:  # stopped between the labelling and its checkpoint
                charges = labelling + 1  # a phase of its own, never an interrupted generation's charge
            self.interrupted_charges += max(0, len(self.ledger.entries) - charges)
            self.ledger.expect_replay(charges)  # adopted where sound, not charged again (dp_es/replay.py)
        if state.variable_value is not None:
            self.variable.set_value(state.variable_value)


class DPEvolutionStrategy(EvolutionController):
    """Differentially private evolution strategy over prompts (budget first): the TextGrad optimizer.

    The ``step()`` path, for a TextGrad loop of your own (``tg = dp_textgrad.textgrad()``)::

        prompt = tg.Variable("Classify the message.", role_description="system prompt", requires_grad=True)
        opt = DPEvolutionStrategy([prompt], task=task, engine=engine, epsilon=4.0, delta=1e-5,
                                  generations=6, population=6, parents=2)
        for _ in range(opt.generations):
            opt.step()                 # one charged generation; prompt.value is its best candidate
        result = opt.finalise()        # the release: runs the plan's charged final selection, if any

    This path writes only ``checkpoint_dir`` (checkpoint, ledger, metrics), and nothing without
    one: no ``result.json``, no report, no run-log line, no lifetime-store record, and no final
    charged selection unless ``finalise()`` is called. ``dp_textgrad.optimize`` does all of it.

    The noise multiplier (Gaussian scores) or the per-pick epsilon (charged selections)
    is calibrated so that the whole planned schedule spends at most ``(epsilon, delta)``
    under the tightest valid accountant.
    """

    def __init__(
        self,
        parameters: Sequence[Any],
        *,
        task: Task,
        engine: Any,
        config: DPESConfig | None = None,
        checkpoint_dir: str | Path | None = None,
        callbacks: Sequence[StopCallback] = (),
        mutation: MutationEngine | None = None,
        ledger: PrivacyLedger | None = None,
        plan: RunPlan | None = None,
        scoring: ScoringFactory | None = None,
        **settings: Any,
    ) -> None:
        base = config_with(config, settings)
        if not isinstance(task, Task):
            raise ConfigError(
                "task: expected a dp_textgrad task (ClassificationTask or GenerationTask, see dp_textgrad.tasks)"
            )
        if labelling_phase.charge_index(ledger) is None:
            labelling_phase.check_task(base, task)  # before any charge, the count of N's too
            labelling_phase.check_engine(base, engine, task)
        ledger, resolved, noise, counted = size_count.stage_one(
            base, task, engine, parameters, ledger, plan, checkpoint_dir
        )
        # Decided here, before the plan (is feedback read?); the resolved configuration carries the bool.
        resolved = resolved.model_copy(
            update={
                "llm_operators": decide_llm_operators(
                    resolved.llm_operators, getattr(engine, "instruction_following", True)
                )
            }
        )
        resolved = labelling_phase.resolved_config(resolved, task)
        if plan is None:
            plan = RunPlan.calibrated(resolved)
        elif plan.config != resolved:
            raise ConfigError("plan: it was made for another configuration; omit it to calibrate this one")
        if ledger is None:
            ledger = PrivacyLedger(resolved.epsilon, resolved.resolved_delta)
        if resolved.privacy == "off" and not ledger.unsafe:
            ledger.mark_unsafe("privacy 'off': non-private baseline; exact scores on private data, no noise")
        elif (ledger.epsilon_budget, ledger.delta) != (resolved.epsilon, resolved.delta):
            raise ConfigError("ledger: its budget differs from the configuration's epsilon/delta")
        super().__init__(
            parameters,
            task=task,
            engine=engine,
            plan=plan,
            ledger=ledger,
            mutation=mutation,
            noise=noise,
            checkpoint_dir=checkpoint_dir,
            callbacks=callbacks,
            scoring=scoring,
        )
        if counted:  # the engine was checked before the count (size_count.py); a resume reuses the count
            self._preflight_done = True
            self._save_checkpoint()

    @property
    def generations(self) -> int:
        return self.config.generations

    @classmethod
    def resume(
        cls,
        checkpoint_dir: str | Path,
        parameters: Sequence[Any],
        *,
        task: Task,
        engine: Any,
        callbacks: Sequence[StopCallback] = (),
        **kwargs: Any,
    ) -> DPEvolutionStrategy:
        """Continue a run from its checkpoint: the spent budget carries over, never resets,
        and the calibrated plan is read back, never recalibrated."""
        run_dir = runs.RunDir(checkpoint_dir)
        try:
            state = run_dir.resume_state()
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        config = DPESConfig(**state.config)
        # The ledger on disk is the truth about what was spent (it is written at every
        # charge, so it can be ahead of the checkpoint): load it before anything else.
        ledger = PrivacyLedger.from_jsonl(run_dir.ledger)
        plan = RunPlan.with_value(size_count.resolved_for_run(config, task), state.plan_value)
        opt = cls(
            parameters,
            task=task,
            engine=engine,
            config=config,
            checkpoint_dir=run_dir.path,
            callbacks=callbacks,
            ledger=ledger,
            plan=plan,
            **kwargs,
        )
        opt._restore(state)
        return opt


__all__ = ["DPEvolutionStrategy", "EvolutionController", "PreflightError", "RunPlan", "StopCallback"]
