"""A DSPy program, its metric and its private trainset as a :class:`~dp_textgrad.tasks.scored.ScoredTask`.

``score_record(prompt, example)`` runs a copy of the program whose optimized predictor has
``prompt`` as its instruction on ``example.inputs()`` and scores the prediction with the user's
metric. Each call is sealed off from DSPy's side channels, so nothing computed from the private
example leaves it except the score: DSPy's history is disabled, global callbacks and those of
the program's modules, its adapter and its LMs are removed, the LMs are copies with DSPy's
response cache off (no memory or disk entry holds the record), usage tracking and the trace
are off, the type-mismatch warning (it quotes the input value) is off, and log records and
Python warnings raised in the scoring thread are dropped (:class:`SilencedPrivateCalls`). A parse
failure or a failing metric is a score of 0 in the ``unparsed`` category; a failing LM or
transport propagates (the DP scorer stops the run with a message quoting no record).

Limits, said plainly: threads a program starts itself (``dspy.Parallel``) get DSPy's sealed
settings (DSPy copies them over) but not the log silencing; text a program prints, and what
its own code writes, are the program's business.
"""

from __future__ import annotations

import copy
import inspect
import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dp_textgrad.dp_es.config import ConfigError
from dp_textgrad.integrations.dspy._env import import_dspy
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.scored import RecordScore, ScoredExample, ScoredTask

#: Modules a DPES program may not contain, and why (the check names the one it finds).
UNSUPPORTED_PARTS = {
    "Retrieve": "its queries (built from private records) go to a retrieval server and DSPy's disk cache",
    "ColBERTv2": "its queries (built from private records) go to a retrieval server and DSPy's disk cache",
    "Embeddings": "it embeds text through DSPy's disk-cached embedding calls",
    "Embedder": "it embeds text through DSPy's disk-cached embedding calls",
    "ReAct": "its tools act outside the program (they may send a private record anywhere)",
    "ReActV2": "its tools act outside the program (they may send a private record anywhere)",
    "CodeAct": "it runs generated code with tools outside the program",
    "ProgramOfThought": "it runs generated code in an interpreter outside the program",
    "RLM": "it runs generated code in an interpreter outside the program",
    "Tool": "a tool acts outside the program (it may send a private record anywhere)",
    "KNN": "it retrieves demonstrations from its own trainset by embedding the input",
    "PythonInterpreter": "it runs generated code outside the program",
    "LocalInterpreter": "it runs generated code outside the program",
}


# -- validation of what the user passes (messages name fields and positions, never values) --
def check_examples(examples: Any, field: str, *, private: bool) -> list[Any]:
    """``examples`` as a list of ``dspy.Example`` with inputs marked, or :class:`ConfigError`.

    Messages name ``field`` and row positions only: for the private trainset they never show a
    value (and say how many rows are bad only by listing the first few positions)."""
    dspy = import_dspy()
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise ConfigError(f"{field}: expected a list of dspy.Example, got {type(examples).__name__}")
    rows = list(examples)
    if not rows:
        raise ConfigError(f"{field}: empty; give at least one dspy.Example")
    not_examples = [i for i, row in enumerate(rows) if not isinstance(row, dspy.Example)]
    if not_examples:
        raise ConfigError(
            f"{field}: rows {_positions(not_examples)} are not dspy.Example; build each with "
            "dspy.Example(...).with_inputs('input field', ...)"
        )
    unmarked = [i for i, row in enumerate(rows) if not getattr(row, "_input_keys", None)]
    if unmarked:
        raise ConfigError(
            f"{field}: rows {_positions(unmarked)} have no input fields marked; call "
            ".with_inputs('input field', ...) on each example"
        )
    del private  # the same rule for both: positions and field names are public, values are never quoted
    first = set(rows[0]._input_keys)
    other = [i for i, row in enumerate(rows) if set(row._input_keys) != first]
    if other:
        raise ConfigError(
            f"{field}: rows {_positions(other)} mark other input fields than row 0 ({', '.join(sorted(first))}); "
            "mark the same fields on every example with .with_inputs(...)"
        )
    return rows


def _positions(positions: list[int]) -> str:
    shown = ", ".join(str(i) for i in positions[:5])
    return shown + (", ..." if len(positions) > 5 else "")


def check_program(program: Any) -> None:
    """Refuse a program with parts DPES cannot keep private (``UNSUPPORTED_PARTS``), naming them."""
    dspy = import_dspy()
    if not isinstance(program, dspy.Module):
        raise ConfigError(
            f"student: expected a dspy.Module (a program or a dspy.Predict), got {type(program).__name__}"
        )
    kinds = tuple(getattr(dspy, name) for name in UNSUPPORTED_PARTS if hasattr(dspy, name))
    for path, part in program.named_sub_modules(type_=object):
        if isinstance(part, kinds):
            name = next(n for n in UNSUPPORTED_PARTS if isinstance(part, getattr(dspy, n, ())))
            where = path.removeprefix("self.") if path != "self" else "the program itself"
            raise ConfigError(
                f"student: {where} is a dspy.{name}, which DPES does not support: {UNSUPPORTED_PARTS[name]}; "
                "optimize a program made of Predict / ChainOfThought modules"
            )


def choose_predictor(program: Any, name: str | None) -> tuple[str, Any]:
    """The predictor to optimize: the only one, or the one called ``name``."""
    predictors = list(program.named_predictors())
    if not predictors:
        raise ConfigError("student: the program has no dspy.Predict to optimize (or all its modules are compiled)")
    names = [n for n, _ in predictors]
    if name is None:
        if len(predictors) > 1:
            raise ConfigError(
                f"predictor: the program has {len(predictors)} predictors ({', '.join(names)}); "
                "say which one to optimize, e.g. DPES(..., predictor='" + names[0] + "')"
            )
        return predictors[0]
    for found, predictor in predictors:
        if found == name:
            return found, predictor
    raise ConfigError(f"predictor: no predictor named {name!r}; the program has {', '.join(names)}")


def check_no_demos(program: Any) -> None:
    """Refuse predictors that hold demonstrations: they may come from private data."""
    holding = [name for name, predictor in program.named_predictors() if getattr(predictor, "demos", None)]
    if holding:
        raise ConfigError(
            f"student: predictor(s) {', '.join(holding)} already hold demos, which may come from private data "
            "and would be released with the program; start from student.reset_copy(), or pass public "
            "demonstrations as DPES(..., public_trainset=[...])"
        )


def metric_caller(metric: Any) -> Callable[[Any, Any], Any]:
    """Call a DSPy metric with DSPy's conventions: ``metric(example, prediction, trace=None)``,
    or ``metric(example, prediction)`` for a two-argument metric."""
    if not callable(metric):
        raise ConfigError(
            f"metric: expected a callable metric(example, prediction, trace=None), got {type(metric).__name__}"
        )
    try:
        signature = inspect.signature(metric)
    except (TypeError, ValueError):  # a builtin or C callable: DSPy's Evaluate passes two arguments
        return lambda example, prediction: metric(example, prediction)
    try:
        signature.bind(None, None, None)
    except TypeError:
        return lambda example, prediction: metric(example, prediction)
    return lambda example, prediction: metric(example, prediction, None)


def metric_score(value: Any) -> RecordScore:
    """A metric's result as a score: a bool, a number, or an object with ``.score`` (a
    ``dspy.Prediction(score=..., feedback=...)``; its feedback text is never read)."""
    if hasattr(value, "score") and not isinstance(value, (int, float)):
        value = value.score
    if isinstance(value, (str, bytes)) or value is None:
        return (0.0, "unparsed")
    try:
        return float(value)  # bool, int, float and numpy numbers; NaN becomes "unparsed" in the task
    except (TypeError, ValueError):
        return (0.0, "unparsed")


# -- the seal around each private call ------------------------------------------------------
class SilencedPrivateCalls:
    """While active (a ``with`` block around a compile), drops the log records and Python
    warnings raised in a thread that is running a private call (:meth:`private_call`): DSPy's,
    litellm's, the HTTP clients', the user's program's own.

    Log records are dropped by a filter on every logger (loggers made since are covered at the
    start of each call; one first made in the middle of a call is covered from the next);
    warnings by a wrapper of ``warnings.showwarning`` that passes other threads' warnings on.
    Both are taken away when the block ends. Text a program prints is not caught."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._filtered: list[logging.Logger] = []
        self._known = 0
        self._lock = threading.Lock()
        self._previous_showwarning: Any = None
        self._active = False

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter: False (drop) for a record made in a thread running a private call."""
        return not getattr(self._local, "depth", 0)

    def _show_warning(self, *args: Any, **kwargs: Any) -> None:
        if getattr(self._local, "depth", 0):
            return
        self._previous_showwarning(*args, **kwargs)

    def _cover_new_loggers(self) -> None:
        registry = logging.root.manager.loggerDict
        if len(registry) == self._known:
            return
        with self._lock:
            loggers = [logging.root, *(item for item in list(registry.values()) if isinstance(item, logging.Logger))]
            for logger in loggers:
                if logger not in self._filtered:
                    logger.addFilter(self)
                    self._filtered.append(logger)
            self._known = len(registry)

    def __enter__(self) -> SilencedPrivateCalls:
        self._cover_new_loggers()
        self._previous_showwarning = warnings.showwarning
        warnings.showwarning = self._show_warning
        self._active = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._active = False
        if warnings.showwarning == self._show_warning:
            warnings.showwarning = self._previous_showwarning
        with self._lock:
            for logger in self._filtered:
                logger.removeFilter(self)
            self._filtered.clear()
            self._known = 0

    @contextmanager
    def private_call(self) -> Iterator[None]:
        """Mark this thread as running a private call for the duration of the block."""
        if self._active:
            self._cover_new_loggers()
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1


def private_lm(lm: Any) -> Any:
    """A copy of a DSPy LM for private calls: DSPy's response cache off, no callbacks, no history."""
    copy_lm = getattr(lm, "copy", None)
    copied = copy_lm(cache=False) if callable(copy_lm) else copy.copy(lm)
    if hasattr(copied, "cache"):
        copied.cache = False
    if hasattr(copied, "callbacks"):
        copied.callbacks = []
    if hasattr(copied, "history"):
        copied.history = []
    return copied


def private_adapter(adapter: Any) -> Any:
    """A copy of the DSPy adapter without its callbacks (None: DSPy's default, ChatAdapter)."""
    if adapter is None:
        return None
    copied = copy.copy(adapter)
    if hasattr(copied, "callbacks"):
        copied.callbacks = []
    return copied


class SealedProgram:
    """A template of the user's program for private calls, and how to run one.

    ``run(prompt, inputs)`` runs a fresh copy of the template whose predictor ``predictor_name``
    has ``prompt`` as its instruction, inside a DSPy context with every side channel off (module
    docstring). The template holds no LM, so that the per-call copies share one sealed copy of
    each LM (the default one and each predictor's own) instead of copying it per call."""

    def __init__(
        self,
        program: Any,
        predictor_name: str,
        lm: Any,
        adapter: Any,
        silencer: SilencedPrivateCalls,
    ) -> None:
        dspy = import_dspy()
        self._dspy = dspy
        self.predictor_name = predictor_name
        self.silencer = silencer
        self.lm = private_lm(lm)
        self.adapter = private_adapter(adapter)
        own_lms: dict[str, Any] = {}
        for name, predictor in program.named_predictors():
            if getattr(predictor, "lm", None) is not None:
                own_lms[name] = predictor.lm
        stripped = program.deepcopy() if own_lms else program
        if own_lms:
            for _, predictor in stripped.named_predictors():
                predictor.lm = None
        self.template = stripped.deepcopy()
        for _, module in self.template.named_sub_modules():
            module.callbacks = []
            module.history = []
        for _, predictor in self.template.named_predictors():
            config = getattr(predictor, "config", None)
            if isinstance(config, dict):
                config.pop("cache", None)  # a per-call cache=True would override the LM's setting
        self.own_lms = {name: private_lm(lm_) for name, lm_ in own_lms.items()}

    def copy_with(self, prompt: str) -> Any:
        """A copy of the template with ``prompt`` as the optimized predictor's instruction."""
        candidate = self.template.deepcopy()
        for name, predictor in candidate.named_predictors():
            if name == self.predictor_name:
                predictor.signature = predictor.signature.with_instructions(prompt)
            if name in self.own_lms:
                predictor.lm = self.own_lms[name]
        return candidate

    @contextmanager
    def sealed(self) -> Iterator[None]:
        """A DSPy context with every side channel of a call off, in this thread."""
        settings: dict[str, Any] = dict(
            lm=self.lm,
            callbacks=[],
            disable_history=True,
            track_usage=False,
            usage_tracker=None,
            trace=None,
            send_stream=None,
            stream_listeners=[],
            warn_on_type_mismatch=False,
            provide_traceback=False,
            _decision_evidence=None,
        )
        if self.adapter is not None:
            settings["adapter"] = self.adapter
        with self.silencer.private_call(), self._dspy.context(**settings):
            yield

    def run(self, prompt: str, inputs: dict[str, Any]) -> Any:
        """The program's prediction on ``inputs`` with ``prompt`` as the instruction, sealed."""
        candidate = self.copy_with(prompt)
        with self.sealed():
            return candidate(**inputs)


def program_as_task(
    program: Any,
    metric: Any,
    trainset: list[Any],
    *,
    predictor_name: str,
    lm: Any,
    adapter: Any = None,
    public_trainset: Sequence[Any] = (),
    valset: Sequence[Any] = (),
    threads: int = 1,
    silencer: SilencedPrivateCalls | None = None,
) -> ScoredTask:
    """The ScoredTask of a DSPy program (module docstring): its private records are ``trainset``.

    ``public_trainset`` examples become the task's public examples (rendered as demonstrations
    for the demo operators, and the probe's input); ``valset`` is the test split (research
    evaluation only)."""
    dspy = import_dspy()
    sealed = SealedProgram(program, predictor_name, lm, adapter, silencer or SilencedPrivateCalls())
    call_metric = metric_caller(metric)
    predictor = dict(program.named_predictors())[predictor_name]
    signature = predictor.signature

    def score_record(prompt: str, example: Any) -> RecordScore:
        try:
            prediction = sealed.run(prompt, dict(example.inputs()))
        except dspy.AdapterParseError:
            return (0.0, "unparsed")
        try:
            with sealed.silencer.private_call():
                return metric_score(call_metric(example, prediction))
        except Exception:  # a metric failing on this output: the same category for every record
            return (0.0, "unparsed")

    own_render = getattr(adapter, "render_demo", None)  # an adapter's own layout (CompletionAdapter)

    def render(example: Any) -> str:
        if callable(own_render):
            return str(own_render(signature, example))
        return render_demo(signature, example)

    def probe(prompt: str) -> None:
        if public_trainset:  # one public example through the whole pipeline, metric included
            example = public_trainset[0]
            try:
                prediction = sealed.run(prompt, dict(example.inputs()))
            except dspy.AdapterParseError:
                return  # the LM answered; a model that does not follow the format scores 0, not an error
            call_metric(example, prediction)
            return
        with sealed.sealed():  # no public example: a public call that checks the LM answers at all
            sealed.lm("Reply with the word OK.")

    public = [ScoredExample(text=render(example), payload=example) for example in public_trainset]
    return ScoredTask(
        name=f"dspy:{type(program).__name__}",
        description=(signature.instructions or "").strip() or f"The DSPy predictor {predictor_name}.",
        private_train=PrivateDataset(list(trainset)),
        test=list(valset),
        score_record=score_record,
        public_examples=public,
        render_example=render,
        seed_prompt=signature.instructions or "",
        threads=threads,
        probe=probe,
        deterministic=False,
    )


def render_demo(signature: Any, example: Any) -> str:
    """A public example as demonstration text: ``field: value`` for each of the signature's
    fields the example has (inputs first, then outputs), one per line."""
    lines = []
    for name in (*signature.input_fields, *signature.output_fields):
        if name in example:
            value = example[name]
            lines.append(f"{name}: {value}")
    return "\n".join(lines)


__all__ = [
    "UNSUPPORTED_PARTS",
    "SealedProgram",
    "SilencedPrivateCalls",
    "check_examples",
    "check_no_demos",
    "check_program",
    "choose_predictor",
    "metric_caller",
    "metric_score",
    "private_adapter",
    "private_lm",
    "program_as_task",
    "render_demo",
]
