"""``DPES``: a DSPy optimizer (teleprompter) that compiles a program with DP-ES.

Swap one line of a DSPy script (``MIPROv2(metric=...)`` -> ``DPES(metric=...)``) and the
compiled program's instruction comes with an (epsilon, delta) guarantee for the examples of
``trainset``: they reach only DP-ES's scorer, one example at a time, through the user's
program and metric, sealed off from DSPy's history, callbacks, caches and logs
(:mod:`.program_task`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad.dp_es.config import ConfigError, config_with
from dp_textgrad.integrations.dspy._env import import_dspy
from dp_textgrad.integrations.dspy.guarantee import DPGuarantee, attach_guarantee
from dp_textgrad.integrations.dspy.program_task import (
    SilencedPrivateCalls,
    check_examples,
    check_no_demos,
    check_program,
    choose_predictor,
    metric_caller,
    program_as_task,
)
from dp_textgrad.integrations.engine_checks import refuse_disk_cache

if TYPE_CHECKING:
    from dp_textgrad.workflow import RunOutcome

dspy = import_dspy()
Teleprompter: Any = import_dspy("dspy.teleprompt").Teleprompter

#: The schedules ``auto`` names: DPESConfig settings, which explicit keywords override.
AUTO_PRESETS: dict[str, dict[str, int]] = {
    "light": {"generations": 3, "population": 4, "parents": 2},
    "medium": {"generations": 6, "population": 6, "parents": 2},
    "heavy": {"generations": 10, "population": 8, "parents": 3},
}


class DPES(Teleprompter):
    """Compile a DSPy program with DP-ES: its instruction is released with an (epsilon, delta)
    guarantee with respect to adding or removing one example of the private ``trainset``.

    ``metric``: the program's DSPy metric, unchanged: ``metric(example, prediction, trace=None)``
    or ``metric(example, prediction)``, returning a bool, a number or an object with ``.score``
    (``dspy.Prediction(score=..., feedback=...)``; feedback is never read). Scores are clipped to
    [0, 1]; a prediction that does not parse, or a metric that raises, scores 0.

    ``epsilon``, ``delta``: the budget of a compile (``delta=None``: the project's default rule,
    see ``DPESConfig``). ``auto``: ``"light"``, ``"medium"`` or ``"heavy"`` (``AUTO_PRESETS``:
    generations, population, parents), or None for DPESConfig's defaults; any DPESConfig field
    given as a keyword (``generations=2, population=3, dataset_size=500, ...``) overrides the
    preset. A bad value raises ``ConfigError`` naming the field.

    ``public_trainset``: PUBLIC labelled ``dspy.Example``s, the only source of demonstrations:
    DP-ES's demo operators write them into the instruction text (the compiled predictor's
    ``demos`` stay empty). ``predictor``: the name (as in ``program.named_predictors()``) of the
    predictor to optimize, needed when the program has several; the others are left as they are.

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
    model). ``num_threads``: examples scored at once.

    ``run_dir`` / ``runs_root`` / ``observers``: as for :func:`dp_textgrad.optimize` (each
    compile writes a run directory: its ``ledger.jsonl`` is the proof of the guarantee;
    observers get each generation's released report). After ``compile``, ``self.outcome`` is
    the run's :class:`~dp_textgrad.workflow.RunOutcome`.

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
        predictor: str | None = None,
        lm: Any = None,
        engine: Any = None,
        adapter: Any = None,
        instruction_following: bool | None = None,
        num_threads: int = 1,
        run_dir: str | Path | None = None,
        runs_root: str | Path = "runs",
        observers: Iterable[Any] = (),
        **settings: Any,
    ) -> None:
        super().__init__()
        metric_caller(metric)  # refuses a metric that is not callable, naming the field
        if auto is not None and auto not in AUTO_PRESETS:
            raise ConfigError(f"auto: use one of {', '.join(map(repr, AUTO_PRESETS))} or None, got {auto!r}")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ConfigError(f"num_threads: must be an int >= 1, got {num_threads!r}")
        if predictor is not None and not isinstance(predictor, str):
            raise ConfigError("predictor: give the predictor's name, as in program.named_predictors()")
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
        self.predictor = predictor
        self.lm = lm
        self.engine = engine
        self.adapter = adapter
        self.instruction_following = instruction_following
        self.num_threads = num_threads
        self.run_dir = run_dir
        self.runs_root = runs_root
        self.observers = tuple(observers)
        self.auto = auto
        self.settings = {**(AUTO_PRESETS[auto] if auto else {}), **settings, "epsilon": epsilon, "delta": delta}
        if engine is not None and instruction_following is not None:  # the user's engine is left as it is
            self.settings.setdefault("llm_operators", bool(instruction_following))
        self.config = config_with(None, self.settings)  # every field checked now, before any compile
        self.outcome: RunOutcome | None = None

    def get_params(self) -> dict[str, Any]:
        """The optimizer's public settings (DSPy's ``Teleprompter.get_params``): never the last
        run's outcome, whose optimizer holds the private records."""
        return {name: value for name, value in self.__dict__.items() if name != "outcome"}

    def _compile(
        self,
        student: Any,
        *,
        trainset: list[Any],
        valset: list[Any] | None = None,
        teacher: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Return a copy of ``student`` whose predictor's instruction is the DP-released prompt.

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
        if kwargs:
            raise ConfigError(f"{', '.join(sorted(kwargs))}: not a DPES.compile setting (trainset, valset)")
        check_program(student)
        predictor_name, _ = choose_predictor(student, self.predictor)
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

        import dp_textgrad

        with SilencedPrivateCalls() as silencer:
            task = program_as_task(
                student,
                self.metric,
                private,
                predictor_name=predictor_name,
                lm=program_lm,
                adapter=adapter,
                public_trainset=self.public_trainset,
                valset=test,
                threads=self.num_threads,
                silencer=silencer,
            )
            outcome = dp_textgrad.optimize(
                task,
                mutation_engine,
                self.config,
                run_dir=self.run_dir,
                runs_root=self.runs_root,
                observers=self.observers,
                evaluate=bool(test),
            )
        self.outcome = outcome
        return compiled_program(student, predictor_name, outcome)


def compiled_program(student: Any, predictor_name: str, outcome: RunOutcome) -> Any:
    """A copy of ``student`` with the released prompt as ``predictor_name``'s instruction and the
    run's guarantee attached (:func:`~.guarantee.attach_guarantee`)."""
    result = outcome.result
    guarantee = DPGuarantee.of_run(outcome, predictor_name)
    program = student.deepcopy()
    target = dict(program.named_predictors())[predictor_name]
    target.signature = target.signature.with_instructions(result.prompt)
    attach_guarantee(program, target, guarantee)
    program._compiled = True
    return program


# Bound after the class is made: DSPy wraps a ``compile`` defined in a Teleprompter's class body
# with its compile callbacks, which would hand them the private trainset.
DPES.compile = DPES._compile

__all__ = ["AUTO_PRESETS", "DPES", "compiled_program"]
