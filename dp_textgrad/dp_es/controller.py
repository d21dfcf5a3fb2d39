"""The DP-ES loop as a TextGrad optimizer.

One ``step()`` is one generation::

    score population (DP) -> choose parents (free, or DP top-k) -> write best into the
    Variable -> (not last) DP feedback -> critiques -> children -> next population

Every read of private data goes through the scorer, which charges the ledger first.
Everything else here sees only public text and DP-released values.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
from pydantic import ValidationError

from dp_textgrad import _io, runs
from dp_textgrad.privacy import release
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.privacy.accounting import BudgetExceeded, PrivacyLedger, calibrate_noise_multiplier, calibrate_pure_epsilon
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.critique import CritiquePipeline
from dp_textgrad.dp_es.feedback import FeedbackSanitiser, render_confusion
from dp_textgrad.dp_es.mutation import NO_LLM_WEIGHTS, MutationEngine
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.dp_es.population import Candidate, PopulationManager
from dp_textgrad.privacy.data import PublicText
from dp_textgrad.dp_es.scorer import DPScorer, NoisyScores
from dp_textgrad.privacy.mechanisms import GumbelTopK
from dp_textgrad.tasks.base import ClassificationTask

_tg = import_textgrad()
Optimizer = _tg.optimizer.Optimizer
Variable = _tg.Variable

CHECKPOINT_NAME = runs.CHECKPOINT_NAME
LEDGER_NAME = runs.LEDGER_NAME
METRICS_NAME = runs.METRICS_NAME

StopCallback = Callable[["GenerationReport"], bool]


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the field and the fix."""


@dataclass(frozen=True)
class GenerationReport:
    """What one generation released: DP statistics, public parameters and public-phase costs.

    This is what callbacks and progress displays receive; every field is classified in
    :mod:`dp_textgrad.privacy.release` (channel ``metrics``). Real private-phase usage is in
    :class:`GenerationTelemetry`, which stays with the operator.
    """

    generation: int
    best_candidate_id: str
    best_estimate: float
    mean_estimate: float
    noise_std_estimate: float
    epsilon_spent: float
    epsilons: dict[str, float]
    public_calls: int = 0
    public_prompt_tokens: int = 0
    public_completion_tokens: int = 0
    planned_private_evaluations: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationReport":
        """Tolerant of older checkpoints (their usage fields were private: they are dropped)."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class GenerationTelemetry:
    """OPERATOR-ONLY: real usage and wall time of one generation, private phase included.

    Functions of the secret subsample (|B_t|, the length of the records in it): never
    released. Runs keep it under ``operator/``.
    """

    private_calls: int
    private_prompt_tokens: int
    private_completion_tokens: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class _UsageMark:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, engine: Any) -> "_UsageMark":
        usage = getattr(engine, "usage", None)
        return cls(int(getattr(usage, "calls", 0)), int(getattr(usage, "prompt_tokens", 0)),
                   int(getattr(usage, "completion_tokens", 0)))

    def __sub__(self, other: "_UsageMark") -> "_UsageMark":
        return _UsageMark(self.calls - other.calls, self.prompt_tokens - other.prompt_tokens,
                          self.completion_tokens - other.completion_tokens)


class PreflightError(RuntimeError):
    """The engine, the context window or the run directory failed a check on public inputs,
    before anything was charged."""


@dataclass
class RunResult:
    """The released prompt with its guarantee and the run's public history."""

    prompt: str
    candidate_id: str
    estimate: float | None
    epsilon: float
    delta: float
    epsilons: dict[str, float]
    generations_run: int
    stopped_because: str
    unsafe: bool
    history: list[GenerationReport] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    noise: str | None = None
    public_usage: dict[str, int] = field(default_factory=dict)
    planned_private_evaluations: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["history"] = [h.as_dict() for h in self.history]
        return out


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: ``field: message``."""
    parts = []
    for item in error.errors():
        where = ".".join(str(x) for x in item.get("loc", ())) or "config"
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _no_shrinkage(means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """Rank by the pooled noisy estimates themselves (``shrinkage=False``)."""
    return np.asarray(means, dtype=float)


class EvolutionController(Optimizer):
    """A TextGrad ``Optimizer`` running DP-ES on one prompt ``Variable``.

    Build it through :class:`DPEvolutionStrategy`, which validates the configuration and
    calibrates the noise from the budget.
    """

    def __init__(
        self,
        parameters: Sequence[Any],
        *,
        task: ClassificationTask,
        engine: Any,
        config: DPESConfig,
        ledger: PrivacyLedger,
        noise_multiplier: float | None,
        selection_epsilon: float | None,
        mutation_engine: Any | None = None,
        critique: Any | None = None,
        checkpoint_dir: str | Path | None = None,
        callbacks: Sequence[StopCallback] = (),
    ) -> None:
        parameters = list(parameters)
        if len(parameters) != 1:
            raise ConfigError("parameters: DP-ES optimizes exactly one prompt Variable; pass [prompt]")
        super().__init__(parameters)
        self.variable = parameters[0]
        self.task = task
        self.engine = engine
        self.config = config
        self.ledger = ledger
        self.noise_multiplier = noise_multiplier
        self.selection_epsilon = selection_epsilon
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.callbacks = list(callbacks)
        self.generation = 0
        self.history: list[GenerationReport] = []
        self.telemetry: list[GenerationTelemetry] = []  # operator-only, see GenerationTelemetry
        self.stopped_because: str | None = None
        self._refused_epsilon = math.inf
        self._preflight_done = False

        # Two generators, never mixed: reproducible public choices vs DP randomness.
        self.public_rng = np.random.default_rng(config.seed)
        self.noise = NoiseSource(insecure_seed=config.insecure_noise_seed)
        if callable(getattr(ledger, "declare_noise", None)):
            ledger.declare_noise(self.noise.sampler)
        if self.checkpoint_dir is not None:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            ledger.persist_to(self.checkpoint_dir / LEDGER_NAME)
        self._started = time.perf_counter()
        # A public cap on record length, applied before anything is charged (see with_bounded_records).
        task = task.with_bounded_records(*_length_tools(engine), config.max_record_tokens, config.long_records)
        self.task = task
        self.scorer = DPScorer(
            task,
            engine,
            ledger,
            sampling_rate=config.sampling_rate,
            dataset_size=config.dataset_size or len(task.private_train),
            noise=self.noise,
            # The subsample must stay secret for amplification: draw it from the DP generator.
            sampling_rng=self.noise.sampling_generator,
        )
        llm_operators = config.llm_operators if config.llm_operators is not None \
            else bool(getattr(engine, "instruction_following", True))
        self.mutation = mutation_engine or MutationEngine(
            engine,
            PublicText(task.description, "user"),
            task.labels,
            task.public_examples,
            self.public_rng,
            mode=config.mode,
            render_demo=task.render_demo,
            max_prompt_chars=config.max_prompt_chars,
            unsafe_examples=self._unsafe_examples() if config.mode == "unsafe" else (),
            weights=None if llm_operators else NO_LLM_WEIGHTS,
        )
        self.sanitiser = FeedbackSanitiser(mode=config.mode, keep_terms=task.labels)
        self.critique = critique
        if self.critique is None and config.use_critiques and llm_operators:
            self.critique = CritiquePipeline(
                engine,
                self.sanitiser,
                config.parents,
                task_description=PublicText(task.description, "user"),
                rng=self.public_rng,
            )
        self.population = PopulationManager(config.population, config.elites, self.public_rng,
                                            shrink=None if config.shrinkage else _no_shrinkage)
        # DP feedback sentences per candidate id (the confusion matrix describes one candidate).
        self._pending_feedback: dict[str, list[PublicText]] = {}
        if config.mode == "unsafe" and not ledger.unsafe:
            ledger.mark_unsafe("feedback mode 'unsafe': raw private examples reach the mutation LLM")

    # -- set-up ------------------------------------------------------------------------
    def _unsafe_examples(self) -> list[Any]:
        # Unsafe mode is an explicit research baseline: the one place private text is unwrapped
        # for the mutator, and the ledger says the run is NOT differentially private.
        count = min(self.config.unsafe_examples, len(self.task.private_train))
        picks = self.public_rng.choice(len(self.task.private_train), size=count, replace=False)
        return [self.task.private_train[int(i)].unwrap() for i in picks]

    def initialise_population(self) -> None:
        seed_text = self.variable.get_value() if hasattr(self.variable, "get_value") else self.variable.value
        seed = Candidate(
            id="g0-seed",
            text=str(seed_text),
            parent_ids=(),
            operator="seed",
            operator_meta={},
            generation=0,
            evaluations=[],
        )
        variants = self.mutation.variants(seed, self.config.population - 1, generation=0)
        self.population.initialise(seed, variants)

    # -- one generation -----------------------------------------------------------------
    def step(self) -> GenerationReport | None:
        """Run one DP generation; write the current best prompt into the Variable.

        Returns ``None`` (and sets ``stopped_because``) when the run is over.
        """
        if self.stopped_because is not None:
            return None
        if self.generation >= self.config.generations:
            self.stopped_because = "all generations done"
            return None
        started = time.perf_counter()
        mark = _UsageMark.of(self.engine)
        if not self.population.candidates:
            self.initialise_population()
        if not self._preflight_done:
            self.preflight()
            # A checkpoint before the first charge: a run that fails in generation 0 can be resumed.
            self._save_checkpoint()
        t = self.generation
        candidates = list(self.population.candidates)
        before_private = _UsageMark.of(self.engine)
        try:
            if self.config.selection == "gaussian":
                parents = self._gaussian_generation(t, candidates)
            else:
                parents = self._exponential_generation(t, candidates)
        except BudgetExceeded as exc:
            self._refused_epsilon = exc.epsilon
            self.stopped_because = f"budget exhausted: {exc}"
            self._save_checkpoint()
            return None
        after_private = _UsageMark.of(self.engine)

        best = self._current_best(parents)
        self.variable.set_value(best.text)
        self.generation = t + 1
        last = self.generation >= self.config.generations
        if not last:
            children = self._make_children(parents, self.generation)
            self.population.next_generation(children, parents=parents)
        # Usage outside the private phase saw public text and DP outputs only: releasable.
        before, after = before_private - mark, _UsageMark.of(self.engine) - after_private
        public = _UsageMark(before.calls + after.calls, before.prompt_tokens + after.prompt_tokens,
                            before.completion_tokens + after.completion_tokens)
        report = self._report(t, best, public)
        private = after_private - before_private
        telemetry = GenerationTelemetry(private.calls, private.prompt_tokens, private.completion_tokens,
                                        seconds=time.perf_counter() - started)
        self.history.append(report)
        self.telemetry.append(telemetry)
        self._save_checkpoint(report, telemetry)
        if last:
            self.stopped_because = "all generations done"
        elif any(callback(report) for callback in self.callbacks):
            self.stopped_because = "stopped by callback"
        return report

    def _gaussian_generation(self, t: int, candidates: list[Candidate]) -> list[Candidate]:
        if self.config.privacy == "off":
            return self._exact_generation(t, candidates)
        feedback_idx: list[int] = []
        z_fb = None
        if self.config.feedback == "dp_confusion" and t + 1 < self.config.generations:
            feedback_idx = [self._index_of_current_best(candidates)]
            z_fb = self.noise_multiplier * self.config.feedback_noise_ratio
        noisy = self.scorer.score_gaussian(
            candidates,
            self.noise_multiplier,
            label=f"generation {t}: noisy scores of {len(candidates)} candidates"
            + (" + DP confusion matrix" if feedback_idx else ""),
            feedback_candidates=feedback_idx,
            feedback_noise_multiplier=z_fb,
        )
        self.population.record(noisy, t)
        self._pending_feedback = self._feedback_sentences(noisy)
        # Free post-processing: parents are the top-k of the shrunk noisy estimates.
        return self.population.best(self.config.parents)

    def _exact_generation(self, t: int, candidates: list[Candidate]) -> list[Candidate]:
        # Non-private baseline: the same loop on the same subsample size, without noise.
        feedback_idx = []
        if self.config.feedback == "dp_confusion" and t + 1 < self.config.generations:
            feedback_idx = [self._index_of_current_best(candidates)]
        exact = self.scorer.score_exact(candidates, feedback_candidates=feedback_idx)
        self.population.record(exact, t)
        self._pending_feedback = self._feedback_sentences(exact)
        return self.population.best(self.config.parents)

    def _exponential_generation(self, t: int, candidates: list[Candidate]) -> list[Candidate]:
        mechanism = GumbelTopK(self.selection_epsilon, self.config.parents, self.task.clip_bound)
        chosen = self.scorer.select_private(
            candidates, mechanism, label=f"generation {t}: exponential top-{self.config.parents}"
        )
        self._pending_feedback = {}
        return [candidates[i] for i in chosen]

    def _index_of_current_best(self, candidates: list[Candidate]) -> int:
        shrunk = self.population.shrunk_estimates()
        scored = [(shrunk.get(c.id, -math.inf), -i) for i, c in enumerate(candidates)]
        return -max(scored)[1]

    def _feedback_sentences(self, noisy: NoisyScores) -> dict[str, list[PublicText]]:
        if noisy.confusion is None or not noisy.confusion_candidate_ids:
            return {}
        matrices = np.asarray(noisy.confusion)
        return {
            candidate_id: render_confusion(matrix, self.task.labels, noisy.expected_batch_size,
                                           noise_std=noisy.confusion_noise_std)
            for candidate_id, matrix in zip(noisy.confusion_candidate_ids, matrices)
        }

    def _current_best(self, parents: list[Candidate]) -> Candidate:
        if self.config.selection == "exponential":
            return parents[0]  # the Gumbel top-k output is ordered: free to release its head
        return self.population.best(1)[0]

    def _make_children(self, parents: list[Candidate], generation: int) -> list[Candidate]:
        dp_feedback = {cid: self.sanitiser.sanitise_all(sentences) for cid, sentences in self._pending_feedback.items()}
        critiques: dict[str, list[PublicText]] = {}
        if self.critique is not None:
            critiques = self.critique.critiques_by_parent(parents, dp_feedback)
        feedback = {p.id: list(dp_feedback.get(p.id, [])) + list(critiques.get(p.id, [])) for p in parents}
        n_children = self.config.population - min(self.config.elites, len(parents))
        return self.mutation.children(parents, n_children, generation, feedback=feedback)

    @property
    def planned_private_evaluations(self) -> float:
        """Expected record evaluations per generation, q N K: public (the realised count is not)."""
        return float(self.config.sampling_rate) * self.public_dataset_size * self.config.population

    @property
    def public_dataset_size(self) -> int:
        """N as released: the declared ``dataset_size`` (the record count when none was declared)."""
        return int(self.config.dataset_size or len(self.task.private_train))

    def _report(self, t: int, best: Candidate, public: _UsageMark) -> GenerationReport:
        shrunk = self.population.shrunk_estimates()
        values = [v for v in shrunk.values() if math.isfinite(v)]
        return GenerationReport(
            generation=t,
            best_candidate_id=best.id,
            best_estimate=float(shrunk.get(best.id, float("nan"))),
            mean_estimate=float(np.mean(values)) if values else float("nan"),
            noise_std_estimate=float(best.estimate_std) if best.evaluations else float("nan"),
            epsilon_spent=self.ledger.epsilon(),
            epsilons=self.ledger.epsilons(),
            public_calls=public.calls,
            public_prompt_tokens=public.prompt_tokens,
            public_completion_tokens=public.completion_tokens,
            planned_private_evaluations=self.planned_private_evaluations,
        )

    # -- checks on public inputs, before anything is charged ------------------------------
    def preflight(self) -> None:
        """Check the engine answers and the longest allowed record fits, on public text only.

        Raises :class:`PreflightError` before any charge. The probe is made of public
        text, so its error message may be shown as it is.
        """
        count_tokens, truncate = _length_tools(self.engine)
        cap = self.config.max_record_tokens
        probe = truncate(" ".join(["word"] * (2 * cap)), cap)
        prompt = str(self.variable.value)
        prefix = self.task.render_prefix(prompt)
        context = getattr(self.engine, "context_tokens", None)
        if context is not None:
            longest_label = max(count_tokens(v) for v in self.task.verbalizers.values())
            needed = count_tokens(prefix) + count_tokens(self.task.render_record(probe)) + longest_label + 1
            if needed > context:
                raise PreflightError(
                    f"preflight: a record of dp.max_record_tokens = {cap} tokens after the seed prompt needs about "
                    f"{needed} tokens but the engine's context holds {context}; lower dp.max_record_tokens or "
                    "raise the engine's context (n_ctx)"
                )
        choices = [self.task.verbalizers[label] for label in self.task.labels]
        try:
            scores = np.asarray(self.engine.score_choices_batch(prefix, [self.task.render_record(probe)], choices))
        except Exception as exc:  # public probe: its error text holds no private data
            raise PreflightError(f"preflight: the engine failed on a public probe before anything was charged "
                                 f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
        if scores.shape != (1, len(choices)) or not np.all(np.isfinite(scores)):
            raise PreflightError("preflight: the engine returned malformed scores for a public probe "
                                 f"(shape {scores.shape}); check the engine")
        self._preflight_done = True

    # -- running to the end --------------------------------------------------------------
    def run(self, progress: Callable[[GenerationReport], None] | None = None) -> RunResult:
        while self.stopped_because is None:
            report = self.step()
            if report is not None and progress is not None:
                progress(report)
        return self.finalise()

    def finalise(self) -> RunResult:
        """Release the final prompt (free, or a charged exponential mechanism)."""
        if not self.history:
            # Nothing DP was released, so there is no prompt to release either.
            raise BudgetExceeded("generation 0", self._refused_epsilon, self.ledger.epsilon_budget, self.ledger.delta)
        best = self.population.best(1)[0] if self.config.selection == "gaussian" else self._last_exponential_best()
        if self.config.final_selection == "exponential":
            best = self._final_exponential(best)
        self.variable.set_value(best.text)
        shrunk = self.population.shrunk_estimates()
        estimate = shrunk.get(best.id)
        return RunResult(
            prompt=best.text,
            candidate_id=best.id,
            estimate=float(estimate) if estimate is not None and math.isfinite(estimate) else None,
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
            public_usage={"calls": sum(h.public_calls for h in self.history),
                          "prompt_tokens": sum(h.public_prompt_tokens for h in self.history),
                          "completion_tokens": sum(h.public_completion_tokens for h in self.history)},
            planned_private_evaluations=self.planned_private_evaluations,
        )

    def _last_exponential_best(self) -> Candidate:
        best_id = self.history[-1].best_candidate_id
        for candidate in self.population.archive:
            if candidate.id == best_id:
                return candidate
        return self.population.candidates[0]

    def _final_exponential(self, fallback: Candidate) -> Candidate:
        candidates = list(self.population.candidates)
        mechanism = GumbelTopK(self.config.final_epsilon, 1, self.task.clip_bound)
        try:
            chosen = self.scorer.select_private(candidates, mechanism, label="final release: exponential mechanism")
        except BudgetExceeded:
            return fallback
        return candidates[chosen[0]]

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
    def _save_checkpoint(self, report: GenerationReport | None = None,
                         telemetry: GenerationTelemetry | None = None) -> None:
        if self.checkpoint_dir is None:
            return
        directory = self.checkpoint_dir
        directory.mkdir(parents=True, exist_ok=True)
        # Ledger first: a crash between the two files leaves the budget charged, never refunded.
        self.ledger.to_jsonl(directory / LEDGER_NAME)
        if report is not None:
            line = {**report.as_dict(), **(telemetry.as_dict() if telemetry is not None else {})}
            runs.append_released_jsonl(directory, METRICS_NAME, "metrics", line,
                                       key={"generation": report.generation})
        state = {
            "format": 1,
            "generation": self.generation,
            "config": self.config.model_dump(),
            "noise_multiplier": self.noise_multiplier,
            "selection_epsilon": self.selection_epsilon,
            "population": self.population.to_dict(),
            "public_rng_state": self.public_rng.bit_generator.state,
            "history": [h.as_dict() for h in self.history],
            "stopped_because": self.stopped_because,
            "variable_value": self.variable.value,
        }
        # The DP noise generator's state is never saved: it would let a reader subtract the noise.
        _io.atomic_write_json(directory / CHECKPOINT_NAME, release.released("checkpoint", state))

    def _restore(self, state: dict[str, Any]) -> None:
        self.generation = int(state["generation"])
        self.population = PopulationManager.from_dict(state["population"], rng=self.public_rng,
                                                      shrink=None if self.config.shrinkage else _no_shrinkage)
        self.public_rng.bit_generator.state = state["public_rng_state"]
        self.history = [GenerationReport.from_dict(h) for h in state.get("history", [])]
        self.stopped_because = None
        if state.get("variable_value") is not None:
            self.variable.set_value(state["variable_value"])


class DPEvolutionStrategy(EvolutionController):
    """Differentially private evolution strategy over prompts (budget first).

    Example::

        prompt = tg.Variable("Classify the message.", role_description="system prompt", requires_grad=True)
        opt = DPEvolutionStrategy([prompt], task=task, engine=engine, epsilon=4.0, delta=1e-5,
                                  generations=6, population=6, parents=2)
        for _ in range(opt.generations):
            opt.step()
        print(prompt.value, opt.privacy_spent())

    The noise multiplier (Gaussian scores) or the per-selection epsilon (exponential
    top-k) is calibrated so that the whole planned schedule spends at most
    ``(epsilon, delta)`` under the tightest valid accountant.
    """

    def __init__(
        self,
        parameters: Sequence[Any],
        *,
        task: ClassificationTask,
        engine: Any,
        config: DPESConfig | None = None,
        checkpoint_dir: str | Path | None = None,
        callbacks: Sequence[StopCallback] = (),
        mutation_engine: Any | None = None,
        critique: Any | None = None,
        ledger: PrivacyLedger | None = None,
        **settings: Any,
    ) -> None:
        try:
            base = config.model_copy(update=settings) if config is not None else DPESConfig(**settings)
            if config is not None and settings:
                base = DPESConfig(**base.model_dump())  # re-validate the merged settings
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from None
        if not isinstance(task, ClassificationTask):
            raise ConfigError("task: expected a dp_textgrad ClassificationTask (see dp_textgrad.tasks)")
        resolved = base.resolved(len(task.private_train))
        plan = RunPlan.non_private() if resolved.privacy == "off" else RunPlan.from_config(resolved)
        if ledger is None:
            ledger = PrivacyLedger(resolved.epsilon, resolved.delta)
        if resolved.privacy == "off" and not ledger.unsafe:
            ledger.mark_unsafe("privacy 'off': non-private baseline; exact scores on private data, no noise")
        elif (ledger.epsilon_budget, ledger.delta) != (resolved.epsilon, resolved.delta):
            raise ConfigError("ledger: its budget differs from the configuration's epsilon/delta")
        super().__init__(
            parameters,
            task=task,
            engine=engine,
            config=resolved,
            ledger=ledger,
            noise_multiplier=plan.noise_multiplier,
            selection_epsilon=plan.selection_epsilon,
            mutation_engine=mutation_engine,
            critique=critique,
            checkpoint_dir=checkpoint_dir,
            callbacks=callbacks,
        )
        self.plan = plan

    @property
    def generations(self) -> int:
        return self.config.generations

    @classmethod
    def resume(
        cls,
        checkpoint_dir: str | Path,
        parameters: Sequence[Any],
        *,
        task: ClassificationTask,
        engine: Any,
        callbacks: Sequence[StopCallback] = (),
        **kwargs: Any,
    ) -> "DPEvolutionStrategy":
        """Continue a run from its checkpoint. The spent budget carries over, never resets."""
        directory = Path(checkpoint_dir)
        state_path = directory / CHECKPOINT_NAME
        if not state_path.exists():
            raise ConfigError(f"resume: no {CHECKPOINT_NAME} in {directory}; is this a run directory?")
        state = json.loads(state_path.read_text(encoding="utf-8"))
        config = DPESConfig(**state["config"])
        # The ledger on disk is the truth about what was spent (it is written after every
        # charge, so it can be ahead of the checkpoint): load it before anything else.
        ledger = PrivacyLedger.from_jsonl(directory / LEDGER_NAME)
        opt = cls(parameters, task=task, engine=engine, config=config, checkpoint_dir=directory,
                  callbacks=callbacks, ledger=ledger, **kwargs)
        opt.noise_multiplier = state["noise_multiplier"]
        opt.selection_epsilon = state["selection_epsilon"]
        opt._restore(state)
        return opt


@dataclass(frozen=True)
class RunPlan:
    """The calibrated mechanism parameters of a planned run and its per-run event."""

    noise_multiplier: float | None
    selection_epsilon: float | None
    event: dp_accounting.DpEvent

    @staticmethod
    def generation_event(config: DPESConfig, noise_multiplier: float | None = None,
                         selection_epsilon: float | None = None) -> dp_accounting.DpEvent:
        q = float(config.sampling_rate)
        if config.selection == "gaussian":
            feedback_z = None
            if config.feedback == "dp_confusion":
                feedback_z = noise_multiplier * config.feedback_noise_ratio
            return DPScorer.gaussian_event(q, noise_multiplier, feedback_z)
        return GumbelTopK(selection_epsilon, config.parents, 1.0).event(q)

    @classmethod
    def whole_run_event(cls, config: DPESConfig, noise_multiplier: float | None = None,
                        selection_epsilon: float | None = None) -> dp_accounting.DpEvent:
        per_generation = cls.generation_event(config, noise_multiplier, selection_epsilon)
        events: list[dp_accounting.DpEvent] = []
        if config.selection == "gaussian" and config.feedback == "dp_confusion" and config.generations > 1:
            # The last generation releases no feedback (nothing follows it).
            events.append(dp_accounting.SelfComposedDpEvent(per_generation, config.generations - 1))
            events.append(DPScorer.gaussian_event(float(config.sampling_rate), noise_multiplier, None))
        else:
            events.append(dp_accounting.SelfComposedDpEvent(per_generation, config.generations))
        if config.final_selection == "exponential":
            events.append(GumbelTopK(config.final_epsilon, 1, 1.0).event(float(config.sampling_rate)))
        return dp_accounting.ComposedDpEvent(events)

    @classmethod
    def non_private(cls) -> "RunPlan":
        """The plan of a ``privacy='off'`` baseline: nothing calibrated, not DP."""
        return cls(None, None, dp_accounting.NonPrivateDpEvent())

    @classmethod
    def from_config(cls, config: DPESConfig) -> "RunPlan":
        """Calibrate the free parameter so the whole run fits (epsilon, delta).

        Calibration takes seconds (many PLD evaluations); the result depends only on the
        schedule, so it is memoised per schedule within the process.
        """
        return _calibrated_plan(cls, _schedule_key(config))

    @classmethod
    def _calibrate(cls, config: DPESConfig) -> "RunPlan":
        try:
            if config.selection == "gaussian":
                z = calibrate_noise_multiplier(
                    lambda z: cls.whole_run_event(config, noise_multiplier=z), config.epsilon, config.delta
                )
                return cls(z, None, cls.whole_run_event(config, noise_multiplier=z))
            eps0 = calibrate_pure_epsilon(
                lambda e: cls.whole_run_event(config, selection_epsilon=e), config.epsilon, config.delta
            )
            return cls(None, eps0, cls.whole_run_event(config, selection_epsilon=eps0))
        except BudgetExceeded:
            raise
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"epsilon: cannot fit the planned schedule into epsilon={config.epsilon}, delta={config.delta} "
                f"({exc}); raise epsilon or lower generations/final_epsilon"
            ) from None


def _length_tools(engine: Any) -> tuple[Callable[[str], int], Callable[[str, int], str]]:
    """The engine's token counter and truncation; a byte-based estimate for engines without them."""
    from dp_textgrad.engines.base import estimated_tokens, truncate_estimated

    count = getattr(engine, "count_tokens", None)
    truncate = getattr(engine, "truncate_to_tokens", None)
    if callable(count) and callable(truncate):
        return count, truncate
    return estimated_tokens, truncate_estimated


_SCHEDULE_FIELDS = ("epsilon", "delta", "generations", "population", "parents", "sampling_rate", "selection",
                    "final_selection", "final_epsilon", "feedback", "feedback_noise_ratio")


def _schedule_key(config: DPESConfig) -> tuple:
    return tuple((name, getattr(config, name)) for name in _SCHEDULE_FIELDS)


@functools.lru_cache(maxsize=64)
def _calibrated_plan(cls: type[RunPlan], key: tuple) -> RunPlan:
    return cls._calibrate(DPESConfig(**dict(key)))
