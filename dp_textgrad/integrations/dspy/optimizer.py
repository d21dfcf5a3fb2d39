"""``DPES``: a DSPy optimizer (teleprompter) that compiles a program with DP-ES.

Swap one line of a DSPy script (``MIPROv2(metric=...)`` -> ``DPES(metric=...)``) and the
compiled program's instruction comes with an (epsilon, delta) guarantee for the examples of
``trainset``: they reach only DP-ES's scorer, one example at a time, through the user's
program and metric, sealed off from DSPy's history, callbacks, caches and logs
(:mod:`.program_task`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad import runs
from dp_textgrad.dp_es.config import ConfigError, config_with
from dp_textgrad.integrations.dspy._env import import_dspy
from dp_textgrad.integrations.dspy.guarantee import DPGuarantee, attach_guarantee
from dp_textgrad.integrations.dspy.program_task import (
    PromptParts,
    SilencedPrivateCalls,
    check_examples,
    check_no_demos,
    check_program,
    choose_predictors,
    copy_sharing,
    metric_caller,
    parts_of,
    predictor_components,
    program_as_task,
)
from dp_textgrad.integrations.dspy.retrieval import check_retrieval, retrieval_parts
from dp_textgrad.integrations.engine_checks import refuse_disk_cache
from dp_textgrad.integrations.progress import RunProgress

if TYPE_CHECKING:
    from dp_textgrad.workflow import RunOutcome

dspy = import_dspy()
Teleprompter: Any = import_dspy("dspy.teleprompt").Teleprompter

#: The schedules ``auto`` names: DPESConfig settings, which explicit keywords override. The
#: sampling rate is a share of the trainset, so a compile's private program calls (about
#: q N K T) grow with the trainset and a smaller one costs less; pass ``sampling_rate=`` (or
#: ``sampling_rate="auto", max_private_evaluations=...``) to bound a large trainset's cost.
AUTO_PRESETS: dict[str, dict[str, Any]] = {
    "light": {"generations": 3, "population": 4, "parents": 2, "sampling_rate": 0.25},
    "medium": {"generations": 6, "population": 6, "parents": 2, "sampling_rate": 0.35},
    "heavy": {"generations": 10, "population": 8, "parents": 3, "sampling_rate": 0.5},
}

#: Arguments of DSPy's other optimizers (MIPROv2, SIMBA, BootstrapFewShot, dspy.GEPA) that DPES
#: does not take, with what to use instead: a DSPy user's habits get a pointer, not "extra inputs".
FOREIGN_ARGUMENTS: dict[str, str] = {
    "prompt_model": "engine= (the model that rewrites instructions; it sees public text and DP outputs only)",
    "reflection_lm": "engine= (DP-ES rewrites from public text and DP feedback, never from private traces)",
    "task_model": "lm= (the model that runs the program on the private examples)",
    "teacher_settings": "nothing: a teacher's traces on private examples would be released; "
    "give public demonstrations as public_trainset=",
    "max_bootstrapped_demos": "public_trainset= (bootstrapped demos are private examples copied into the "
    "program; DPES takes demonstrations from public examples only, up to 4 per predictor)",
    "max_labeled_demos": "public_trainset= (demonstrations come from public examples only, up to 4 per predictor)",
    "max_demos": "public_trainset= (demonstrations come from public examples only, up to 4 per predictor)",
    "num_candidates": "population= (candidates scored in each generation)",
    "num_trials": "generations= (each generation scores population= candidates)",
    "max_steps": "generations= (each generation scores population= candidates)",
    "max_rounds": "generations=",
    "max_full_evals": "generations=",
    "max_metric_calls": "max_private_evaluations= with sampling_rate='auto' (the cap on q N K T)",
    "minibatch": "sampling_rate= (each generation scores a Poisson sample of about sampling_rate x N examples)",
    "minibatch_size": "sampling_rate= (each generation scores a Poisson sample of about sampling_rate x N examples)",
    "minibatch_full_eval_steps": "sampling_rate= and generations=",
    "bsize": "sampling_rate= (each generation scores a Poisson sample of about sampling_rate x N examples)",
    "init_temperature": "nothing: the rewrite model's temperature is the engine's",
    "temperature_for_sampling": "nothing: the rewrite model's temperature is the engine's",
    "temperature_for_candidates": "nothing: the rewrite model's temperature is the engine's",
    "verbose": "progress= (a progress bar and a log line per generation) or observers=[...]",
    "track_stats": "observers=[...] (each generation's released report) and compiled.dp_guarantee",
    "log_dir": "run_dir= or runs_root=",
    "metric_threshold": "nothing: a threshold on exact private scores would release them",
    "max_errors": "max_error_share= (the DP share of failing examples that stops a run)",
    "requires_permission_to_run": "DPES(...).plan(student, trainset), which states the cost before compile",
    "program_aware_proposer": "engine= (the rewrite model reads the task's public description)",
    "data_aware_proposer": "nothing: a proposer that reads the trainset would release it",
    "view_data_batch_size": "nothing: a proposer that reads the trainset would release it",
    "tip_aware_proposer": "engine=",
    "fewshot_aware_proposer": "public_trainset=",
    "use_merge": "nothing: DP-ES's crossover runs on public text already",
    "provide_traceback": "nothing: a failing example scores 0; its error is written to the run's operator/errors.log",
}


def refuse_foreign(arguments: Iterable[str], where: str) -> None:
    """ConfigError for the first argument of another DSPy optimizer, naming DPES's equivalent."""
    for name in arguments:
        if name in FOREIGN_ARGUMENTS:
            raise ConfigError(
                f"{name}: not a {where} setting (it is another DSPy optimizer's); use {FOREIGN_ARGUMENTS[name]}"
            )


class DPES(Teleprompter):
    """Compile a DSPy program with DP-ES: its predictors' instructions and demonstrations are
    released with an (epsilon, delta) guarantee with respect to adding or removing one example of
    the private ``trainset``.

    ``metric``: the program's DSPy metric, unchanged: ``metric(example, prediction, trace=None)``
    or ``metric(example, prediction)``, returning a bool, a number or an object with ``.score``
    (``dspy.Prediction(score=..., feedback=...)``; feedback is never read). It scores the
    program's final prediction; intermediate outputs stay inside the private call. Scores are
    clipped to [0, 1]; a prediction that does not parse, or a metric that raises, scores 0.

    ``epsilon``, ``delta``: the budget of a compile (``delta=None``: the project's default rule,
    see ``DPESConfig``). ``auto``: ``"light"``, ``"medium"`` or ``"heavy"`` (``AUTO_PRESETS``:
    generations, population, parents and a sampling rate, so that a smaller trainset costs less),
    or None for DPESConfig's defaults; any DPESConfig field given as a keyword (``generations=2,
    population=3, sampling_rate=0.1, dataset_size=500, ...``) overrides the preset. A bad value
    raises ``ConfigError`` naming the field; another DSPy optimizer's argument (``num_trials``,
    ``max_bootstrapped_demos``, ...) names DPES's equivalent (``FOREIGN_ARGUMENTS``).

    ``predictor``: which predictors to optimize: None (default) for every predictor of the
    program, one name (as in ``program.named_predictors()``) or a list of names; the others are
    left as they are. With several, a candidate is one instruction (and demonstrations) per
    predictor and each child changes one of them, the predictors taking turns.

    ``public_retrievers``: the paths (as in ``program.named_sub_modules()``, e.g. ``["retrieve"]``)
    of the retrieval parts that search a corpus you declare public, in this process
    (``dspy.retrievers.Embeddings``, a ``dspy.Embedder``, a plain search function the program
    holds); a retriever not named is refused, and so, named or not, is one that calls out or keeps
    its index on disk, unless also named in ``remote_retrievers`` (its provider then sees every
    private query, as the LM's provider does). The declared parts run sealed: in the calling
    thread, with no cache (:mod:`.retrieval`; docs/integrations.md, "Retrieval over a public corpus").

    ``public_trainset``: PUBLIC labelled ``dspy.Example``s, the only source of demonstrations:
    a predictor's demonstrations are public examples that hold its fields, and the compiled
    predictors carry them in ``demos``, as DSPy's own optimizers leave them.

    ``lm``: the ``dspy.LM`` that runs the program on the private examples (default
    ``dspy.settings.lm``); ``engine``: a dp-textgrad engine (``LlamaCppEngine()``,
    ``OpenAIEngine(...)``) that does DP-ES's public work (mutations, preflight) and, without
    ``lm``, runs the program too, wrapped as an :class:`EngineLM`. With only ``lm``, DP-ES
    generates through it (:class:`DSPyLMEngine`). ``instruction_following``: whether the model
    follows instructions, so that LLM rewrites and critiques are worth asking for: with only
    ``lm``, default False (rule edits and public demonstrations only); with ``engine``, default
    the engine's own ``instruction_following`` (it also says whether :class:`EngineLM` sends
    the program's calls as chat or as one completion text; each call may write up to the engine's
    default cap of new tokens: a base model fills it, so for a classifier pass
    ``lm=EngineLM(engine, max_tokens=5)``). ``adapter``: the DSPy adapter the program runs with (default
    ``dspy.settings.adapter``, else DSPy's ChatAdapter; :class:`CompletionAdapter` for a base
    model). ``num_threads``: examples scored at once. ``batch_candidates``: run one private
    example under all of a generation's candidates at once, so that the engine decodes their
    calls together (:mod:`.batching`; default: where the program's LM is an :class:`EngineLM` on an
    engine that batches prompts, as llama.cpp's does).

    ``run_dir`` / ``runs_root`` / ``observers``: as for :func:`dp_textgrad.optimize`. Each compile
    writes a run directory (its ``ledger.jsonl`` is the proof of the guarantee) under ``runs_root``,
    by default NOT the working directory but ``runs.default_runs_root()``: ``$DP_TEXTGRAD_HOME/runs``,
    else the user's data folder (``~/.local/share/dp-textgrad/runs`` on Linux). It is a lasting
    folder because it holds the lifetime store, what each private dataset has spent over all its
    compiles. ``progress``: a tqdm bar and a log line per generation (logger
    ``dp_textgrad.integrations.dspy``), released values only. After ``compile``, ``self.outcome``
    is the run's :class:`~dp_textgrad.workflow.RunOutcome`. :meth:`plan` states the cost first.

    The model serving the program sees the private examples (a hosted API's provider does:
    serve locally to avoid it). DSPy's compile callbacks are not called: they would receive the
    private trainset.
    """

    def __init__(
        self,
        metric: Any,
        *,
        epsilon: float = 4.0,
        delta: float | None = None,
        auto: str | None = "light",
        public_trainset: Sequence[Any] | None = None,
        public_inputs: Sequence[Any] | None = None,
        answer_predictor: str | None = None,
        predictor: str | Sequence[str] | None = None,
        public_retrievers: Sequence[str] = (),
        remote_retrievers: Sequence[str] = (),
        lm: Any = None,
        engine: Any = None,
        adapter: Any = None,
        instruction_following: bool | None = None,
        num_threads: int = 1,
        batch_candidates: bool | None = None,
        run_dir: str | Path | None = None,
        runs_root: str | Path | None = None,
        observers: Iterable[Any] = (),
        progress: bool = True,
        **settings: Any,
    ) -> None:
        super().__init__()
        refuse_foreign(settings, "DPES")
        metric_caller(metric)  # refuses a metric that is not callable, naming the field
        if auto is not None and auto not in AUTO_PRESETS:
            raise ConfigError(f"auto: use one of {', '.join(map(repr, AUTO_PRESETS))} or None, got {auto!r}")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ConfigError(f"num_threads: must be an int >= 1, got {num_threads!r}")
        if predictor is not None and not (
            isinstance(predictor, str)
            or (isinstance(predictor, Sequence) and all(isinstance(name, str) for name in predictor))
        ):
            raise ConfigError(
                "predictor: give a predictor's name, or a list of names, as in program.named_predictors()"
            )
        if lm is not None and not isinstance(lm, dspy.BaseLM):
            raise ConfigError(f"lm: expected a dspy.LM (a dspy.BaseLM), got {type(lm).__name__}")
        if engine is not None and not callable(getattr(engine, "generate", None)):
            raise ConfigError(
                f"engine: expected a dp-textgrad engine (LlamaCppEngine, ...), got {type(engine).__name__}"
            )
        if adapter is not None and not isinstance(adapter, dspy.Adapter):
            raise ConfigError(f"adapter: expected a dspy.Adapter, got {type(adapter).__name__}")
        self.metric = metric
        self.public_trainset = (
            check_examples(public_trainset, "public_trainset", private=False) if public_trainset is not None else []
        )
        self.public_inputs = (
            check_examples(public_inputs, "public_inputs", private=False) if public_inputs is not None else []
        )
        if answer_predictor is not None and not isinstance(answer_predictor, str):
            raise ConfigError("answer_predictor: give a predictor's name, as in program.named_predictors()")
        self.answer_predictor = answer_predictor
        self.predictor = predictor
        self.public_retrievers = (
            tuple(public_retrievers) if not isinstance(public_retrievers, str) else public_retrievers
        )
        self.remote_retrievers = (
            tuple(remote_retrievers) if not isinstance(remote_retrievers, str) else remote_retrievers
        )
        self.lm = lm
        self.engine = engine
        self.adapter = adapter
        self.instruction_following = instruction_following
        self.num_threads = num_threads
        if batch_candidates is not None and not isinstance(batch_candidates, bool):
            raise ConfigError(f"batch_candidates: True, False or None (automatic), got {batch_candidates!r}")
        self.batch_candidates = batch_candidates
        self.run_dir = run_dir
        self.runs_root = runs_root
        self.observers = tuple(observers)
        self.progress = bool(progress)
        self.auto = auto
        self.settings = {**(AUTO_PRESETS[auto] if auto else {}), **settings, "epsilon": epsilon, "delta": delta}
        if engine is not None and instruction_following is not None:  # the user's engine is left as it is
            self.settings.setdefault("llm_operators", bool(instruction_following))
        self.config = config_with(None, self.settings)  # every field checked now, before any compile
        if self.config.labelling is not None and not self.public_inputs:
            raise ConfigError(
                "labelling: DP demonstrations are the teachers' answers to public inputs; give public_inputs="
                "[dspy.Example(question=...).with_inputs('question'), ...] (public examples without outputs)"
            )
        if self.public_inputs and self.config.labelling is None:
            raise ConfigError(
                "public_inputs: they are answered by a labelling phase; give labelling={} (or its settings: "
                "queries, teachers, epsilon_share, ...) or leave public_inputs out"
            )
        self.outcome: RunOutcome | None = None

    def get_params(self) -> dict[str, Any]:
        """The optimizer's public settings (DSPy's ``Teleprompter.get_params``): never the last
        run's outcome, whose optimizer holds the private records."""
        return {name: value for name, value in self.__dict__.items() if name != "outcome"}

    # -- what a compile needs, checked before anything runs ----------------------------------
    def _prepared(self, student: Any, trainset: Any, valset: Any) -> _Prepared:
        check_program(student)
        check_retrieval(student, self.public_retrievers, remote_retrievers=self.remote_retrievers)
        names = choose_predictors(student, self.predictor)
        check_no_demos(student)
        private = check_examples(trainset, "trainset", private=True)
        test = check_examples(valset, "valset", private=False) if valset is not None else []
        inputs = set(private[0]._input_keys)
        for name, rows in (("public_trainset", self.public_trainset), ("valset", test)):
            if rows and set(rows[0]._input_keys) != inputs:
                raise ConfigError(
                    f"{name}: its examples mark other input fields ({', '.join(sorted(rows[0]._input_keys))}) than "
                    f"trainset's ({', '.join(sorted(inputs))}); mark the same fields with .with_inputs(...)"
                )
        program_lm = self.lm
        if program_lm is None and self.engine is not None:
            from dp_textgrad.integrations.dspy.lm import EngineLM

            program_lm = EngineLM(self.engine, instruction_following=self.instruction_following)
        if program_lm is None:
            program_lm = dspy.settings.lm
        if program_lm is None:
            raise ConfigError(
                "lm: no LM to run the program; pass DPES(..., lm=dspy.LM(...)) or engine=..., or dspy.configure(lm=...)"
            )
        refuse_disk_cache(getattr(program_lm, "dp_engine", None), "engine")
        adapter = self.adapter if self.adapter is not None else dspy.settings.adapter
        mutation_engine = self.engine
        if mutation_engine is None:
            from dp_textgrad.integrations.dspy.lm import DSPyLMEngine

            mutation_engine = DSPyLMEngine(program_lm, instruction_following=bool(self.instruction_following))
        return _Prepared(names, private, test, program_lm, adapter, mutation_engine)

    def _task(self, student: Any, prepared: _Prepared, silencer: SilencedPrivateCalls) -> Any:
        from dp_textgrad.integrations.dspy.lm import batches_candidates

        batch = self.batch_candidates if self.batch_candidates is not None else batches_candidates(prepared.lm)
        return program_as_task(
            student,
            self.metric,
            prepared.private,
            predictor_names=prepared.names,
            lm=prepared.lm,
            adapter=prepared.adapter,
            public_trainset=self.public_trainset,
            valset=prepared.test,
            threads=self.num_threads,
            silencer=silencer,
            public_inputs=self.public_inputs,
            answer_predictor=self.answer_predictor,
            batch_candidates=batch,
        )

    def plan(
        self, student: Any, trainset: Sequence[Any], *, dataset_size: int | None = None, show: bool = True
    ) -> CompilePlan:
        """What :meth:`compile` would spend, stated before anything is charged (:class:`CompilePlan`):
        the schedule, the calibrated noise, epsilon under each accountant, the expected private
        program calls and the expected wall time, timed on one PUBLIC call (``public_trainset[0]``
        through the program; without public examples, the seed prompt on one public call of the LM).

        No private example is read and nothing is computed from how many ``trainset`` holds (that
        number is private: a run releases a DP count of it, or the N you declare); ``trainset`` is
        only checked, as compile checks it. The plan needs a public N: ``DPES(..., dataset_size=N)``
        (the run then spends nothing on counting N) or, for a run that counts N with DP, the N you
        expect, ``plan(..., dataset_size=N)``. ``show``: print it."""
        import time

        from dp_textgrad.dp_es.plan import RunPlan, final_evaluations, resolve_sampling_rate
        from dp_textgrad.privacy.accounting.bounds import default_accountants

        prepared = self._prepared(student, trainset, None)
        config = self.config
        size = config.dataset_size if config.dataset_size is not None else dataset_size
        if size is None:
            raise ConfigError(
                "dataset_size: the plan needs a public N and never reads how many private examples trainset "
                "holds; declare it, DPES(..., dataset_size=N) (the run then spends nothing on counting N), or "
                "pass plan(..., dataset_size=N) with the N you expect the run's DP count to give"
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"dataset_size: a whole number >= 1, got {size!r}")
        if config.dataset_size is None:  # as the run will: N from its DP count, here the expected one
            config = config.model_copy(update={"counted_dataset_size": size})
        config = resolve_sampling_rate(config.resolved())
        q, k, t = config.resolved_sampling_rate, config.population, config.generations
        calls = q * size * k * t
        final = 0.0
        with SilencedPrivateCalls() as silencer:
            task = self._task(student, prepared, silencer)
            started = time.perf_counter()
            if task.probe is not None:
                task.probe(task.seed_prompt)
            seconds = time.perf_counter() - started
        if config.labelling is not None:  # the DP demonstrations, planned as the run plans them
            from dp_textgrad.dp_es import labelling_phase

            labelling_phase.check_task(config, task)
            config = labelling_phase.resolved_config(config, task)
        if config.privacy == "off":
            epsilons: dict[str, float] = {}
            noise = None
        else:
            run_plan = RunPlan.calibrated(config)
            final = final_evaluations(run_plan)
            epsilons = run_plan.epsilons(config.resolved_delta, default_accountants())
            noise = run_plan.value
        plan = CompilePlan(
            predictors=tuple(prepared.names),
            generations=t,
            population=k,
            sampling_rate=q,
            examples=size,
            epsilon=min(epsilons.values()) if epsilons else float("inf"),
            delta=config.resolved_delta,
            epsilons=epsilons,
            noise=noise,
            private_calls=calls + final,
            seconds_per_call=seconds,
            threads=self.num_threads,
            batched=task.score_record_many is not None,
        )
        if show:
            print(plan)
        return plan

    def _compile(
        self,
        student: Any,
        trainset: list[Any] | None = None,
        *,
        valset: list[Any] | None = None,
        teacher: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Return a copy of ``student`` whose optimized predictors hold the DP-released
        instructions and demonstrations.

        ``trainset``: the PRIVATE examples (``dspy.Example`` with inputs marked). ``valset``:
        research evaluation only, the test split (scored with the seed and released prompts into
        the run's evaluation; not used for selection and not covered by the guarantee).
        ``teacher`` is not supported (a teacher's traces on private examples would become
        demonstrations). The compiled program carries ``dp_guarantee`` (:class:`DPGuarantee`),
        which ``save``/``load`` keep (:meth:`DPGuarantee.of` reads it from a loaded program).
        Everything is checked before anything is charged.
        """
        if teacher is not None:
            raise ConfigError("teacher: DPES does not use a teacher (its traces on private examples would be released)")
        refuse_foreign(kwargs, "DPES.compile")
        if kwargs:
            raise ConfigError(f"{', '.join(sorted(kwargs))}: not a DPES.compile setting (trainset, valset)")
        if trainset is None:
            raise ConfigError("trainset: give the private examples, DPES(...).compile(program, trainset=[...])")
        prepared = self._prepared(student, trainset, valset)
        observers = list(self.observers)
        if self.progress:
            observers.append(RunProgress("DPES compile", logging.getLogger("dp_textgrad.integrations.dspy")))

        import dp_textgrad

        with SilencedPrivateCalls() as silencer:
            task = self._task(student, prepared, silencer)
            outcome = dp_textgrad.optimize(
                task,
                prepared.mutation_engine,
                self.config,
                run_dir=self.run_dir,
                runs_root=self.runs_root if self.runs_root is not None else runs.default_runs_root(),
                observers=observers,
                evaluate=bool(prepared.test),
            )
        self.outcome = outcome
        # The demonstrations the search could show: the public examples, and the DP answers of a
        # labelling phase (they joined the searched task's demonstrations).
        searched = outcome.optimizer.task
        shown = [e.payload for part in searched.components for e in part.public_examples] or [
            e.payload for e in searched.public_examples
        ]
        examples = list({id(example): example for example in [*self.public_trainset, *shown]}.values())
        parts = parts_of(predictor_components(student, prepared.names, prepared.adapter, examples))
        return compiled_program(student, prepared.names, outcome, parts)


@dataclass(frozen=True)
class _Prepared:
    """What a compile (or a plan) checked and chose: the predictors, the examples, the models."""

    names: list[str]
    private: list[Any]
    test: list[Any]
    lm: Any
    adapter: Any
    mutation_engine: Any


@dataclass(frozen=True)
class CompilePlan:
    """What a compile will spend (:meth:`DPES.plan`): public settings, the calibrated plan, and
    ``private_calls``, the expected program calls on private examples (q N K T, plus the final
    selection's when it is charged; each call runs every predictor once), and the expected wall
    time from one timed public call. Mutations and the public probe add a few calls more."""

    predictors: tuple[str, ...]
    generations: int
    population: int
    sampling_rate: float
    examples: int
    epsilon: float
    delta: float
    epsilons: dict[str, float]
    noise: float | None
    private_calls: float
    seconds_per_call: float
    threads: int
    batched: bool = False  # an example's calls under a generation's candidates go to the engine together

    @property
    def expected_seconds(self) -> float:
        """The private calls' expected wall time at the timed public call's speed (with ``batched``,
        an upper bound: the engine decodes an example's calls under several candidates together)."""
        return self.private_calls * self.seconds_per_call / max(1, self.threads)

    def __str__(self) -> str:
        from dp_textgrad.privacy.accounting.bounds import format_epsilon

        minutes = self.expected_seconds / 60.0
        guarantee = (
            f"epsilon {format_epsilon(self.epsilon)}, delta {self.delta:g} (noise multiplier {self.noise:.3g})"
            if self.epsilons and self.noise is not None
            else "NOT differentially private (privacy off)"
        )
        return "\n".join(
            [
                f"DPES plan for predictor(s) {', '.join(self.predictors)}:",
                f"  {self.generations} generations x {self.population} candidates, sampling rate "
                f"{self.sampling_rate:.3g} of {self.examples} examples",
                f"  {guarantee}",
                f"  about {self.private_calls:.0f} program calls on private examples, "
                f"{self.seconds_per_call:.2f} s a call on a public example: about {minutes:.1f} min "
                f"on {self.threads} thread(s)"
                + (
                    " (less: an example's calls under the candidates go to the engine together)" if self.batched else ""
                ),
            ]
        )


def compiled_program(
    student: Any, predictor_names: Sequence[str] | str, outcome: RunOutcome, parts: PromptParts | None = None
) -> Any:
    """A copy of ``student`` with the released prompt's instructions and public demonstrations in
    its optimized predictors, and the run's guarantee attached (:func:`~.guarantee.attach_guarantee`)."""
    names = [predictor_names] if isinstance(predictor_names, str) else list(predictor_names)
    result = outcome.result
    guarantee = DPGuarantee.of_run(outcome, ", ".join(names))
    # Retrieval parts are shared with the user's program, not copied (DSPy's own deepcopy cannot copy
    # the search thread an Embeddings holds); everything else is a copy.
    program = copy_sharing(student, {id(part): part for _, part in retrieval_parts(student)})
    parts = PromptParts(names, {}) if parts is None else parts
    parts.apply(program, result.prompt)
    predictors = dict(program.named_predictors())
    for name in names:
        attach_guarantee(program, predictors[name], guarantee)
    program._compiled = True
    return program


# Bound after the class is made: DSPy wraps a ``compile`` defined in a Teleprompter's class body
# with its compile callbacks, which would hand them the private trainset.
DPES.compile = DPES._compile

__all__ = ["AUTO_PRESETS", "DPES", "FOREIGN_ARGUMENTS", "CompilePlan", "compiled_program"]
