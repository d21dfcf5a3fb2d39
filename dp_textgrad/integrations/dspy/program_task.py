"""A DSPy program, its metric and its private trainset as a :class:`~dp_textgrad.tasks.scored.ScoredTask`.

``score_record(prompt, example)`` runs a copy of the program whose optimized predictor has
``prompt`` as its instruction on ``example.inputs()`` and scores the prediction with the user's
metric. Each call is sealed off from DSPy's side channels, so nothing computed from the private
example leaves it except the score: DSPy's history is disabled, global callbacks and those of
the program's modules, its adapter and its LMs are removed, every LM the program holds (a
predictor's ``lm``, an LM a module switches in with ``dspy.context``) runs as a copy with no
callbacks and no history, usage tracking and the trace are off, and the type-mismatch warning
(it quotes the input value) is off. Three channels are closed by the private call itself, not
by settings (:class:`PrivateCallGate`): DSPy's response cache, memory and disk, is a disabled one
for the call whatever the call, the predictor's config or the LM ask for, and log records and
Python warnings made in the call are dropped at every handler, those of loggers made during the
call included. A parse failure or a failing metric is a score of 0 in the ``unparsed``
category; a failing LM or transport propagates out of ``score_record``.

Limits, said plainly: a private call covers its own thread and what DSPy or asyncio start for it
with its context (``dspy.Parallel``, ``asyncio.to_thread``), not a thread the program starts
itself with ``threading``; an LM the program does not hold (a module-level global switched in
with ``dspy.context``) keeps its own callbacks; text a program prints, the global state it
changes and the files its own code writes are the program's business.
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from dp_textgrad.dp_es.config import ConfigError
from dp_textgrad.dp_es.mutation.text_edits import norm_block, parse_layout
from dp_textgrad.dp_es.population import normalise_text
from dp_textgrad.integrations.dspy._env import import_dspy
from dp_textgrad.integrations.dspy.batching import run_under_prompts
from dp_textgrad.integrations.dspy.retrieval import seal_retrieval, sealed_parts
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.components import PromptComponent, split_components
from dp_textgrad.tasks.scored import RecordScore, ScoredExample, ScoredTask

#: Modules a DPES program may not contain, and why (the check names the one it finds).
UNSUPPORTED_PARTS = {
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


def choose_predictors(program: Any, names: str | Sequence[str] | None) -> list[str]:
    """The names of the predictors to optimize: every predictor of the program (``None``), the
    one named, or those named (in the program's order)."""
    predictors = [n for n, _ in program.named_predictors()]
    if not predictors:
        raise ConfigError("student: the program has no dspy.Predict to optimize (or all its modules are compiled)")
    if names is None:
        return predictors
    wanted = [names] if isinstance(names, str) else list(names)
    if not wanted:
        raise ConfigError("predictor: name at least one predictor, or pass None to optimize them all")
    unknown = [n for n in wanted if n not in predictors]
    if unknown:
        raise ConfigError(
            f"predictor: no predictor named {', '.join(map(repr, unknown))}; the program has {', '.join(predictors)}"
        )
    return [n for n in predictors if n in wanted]


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
#: The DSPy setting that marks a private call (:func:`in_private_call`). DSPy copies its settings
#: into the threads it starts for a program (``dspy.Parallel``, ``asyncify``) and asyncio copies
#: them into tasks and ``asyncio.to_thread`` workers (where DSPy's async calls read the cache), so
#: what a private call runs there is marked too.
PRIVATE_CALL_SETTING = "dp_textgrad_private_call"

_calling = threading.local()  # .depth: private calls running in this thread


def in_private_call() -> bool:
    """Whether the running thread is inside a private call (:func:`private_call`), or runs in
    the DSPy context of one."""
    if getattr(_calling, "depth", 0):
        return True
    dspy = sys.modules.get("dspy")
    return dspy is not None and bool(dspy.settings.get(PRIVATE_CALL_SETTING, False))


class PrivateCallGate:
    """The process-wide hooks that close three channels to every private call, installed while
    at least one user holds the gate (a compile, a private call) and taken away after the last:

    - **logs**: ``logging.Handler.handle`` drops a record made in a private call, so every handler
      is covered, of every logger, those made later included (a library that makes its logger
      lazily, in the middle of a call);
    - **warnings**: ``warnings.showwarning`` drops a warning raised in a private call;
    - **DSPy's response cache**: ``dspy.cache``, read in a private call, is a disabled cache (no
      memory, no disk), whatever the call, the predictor's config or the LM ask for; read
      anywhere else it is DSPy's own, as configured (``dspy.configure_cache`` included). DSPy
      reads it on each call, through the module: its module class gets a ``cache`` property.

    Each hook is put back only if it is still the one installed (someone may have wrapped it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._dspy: Any = None
        self._handle: Any = None
        self._showwarning: Any = None
        self._module_class: Any = None
        self._gated_classes: dict[type, type] = {}  # DSPy's module class -> its subclass with the gated cache
        self._hooks: dict[str, Any] = {}

    def acquire(self) -> None:
        """Hold the gate (the hooks are installed by the first holder)."""
        with self._lock:
            if self._users == 0:
                self._install()
            self._users += 1

    def release(self) -> None:
        """Let go of the gate (the hooks are taken away by the last holder)."""
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._uninstall()

    def _install(self) -> None:
        dspy = self._dspy = import_dspy()
        module_class = self._module_class = type(dspy)
        gated_class = self._gated_classes.get(module_class)
        if gated_class is None:
            cache = property(_gated_cache, _set_cache, _del_cache)
            gated_class = self._gated_classes[module_class] = type(
                "DSPyModuleWithGatedCache", (module_class,), {"cache": cache}
            )
        dspy.__class__ = gated_class
        handle = self._handle = logging.Handler.handle
        show = self._showwarning = warnings.showwarning

        def gated_handle(handler: logging.Handler, record: logging.LogRecord) -> bool:
            return False if in_private_call() else handle(handler, record)

        def gated_showwarning(*args: Any, **kwargs: Any) -> None:
            if not in_private_call():
                show(*args, **kwargs)

        self._hooks = {"module": gated_class, "handle": gated_handle, "showwarning": gated_showwarning}
        logging.Handler.handle = gated_handle  # type: ignore[method-assign,assignment]
        warnings.showwarning = gated_showwarning

    def _uninstall(self) -> None:
        if logging.Handler.handle is self._hooks["handle"]:
            logging.Handler.handle = self._handle  # type: ignore[method-assign]
        if warnings.showwarning is self._hooks["showwarning"]:
            warnings.showwarning = self._showwarning
        if type(self._dspy) is self._hooks["module"]:
            self._dspy.__class__ = self._module_class
        self._hooks = {}


def _gated_cache(module: Any) -> Any:
    if in_private_call():  # a cache with both tiers off: every lookup misses, every store is dropped
        return module.clients.Cache(enable_disk_cache=False, enable_memory_cache=False, disk_cache_dir=None)
    found = vars(module).get("cache")
    if found is not None:
        return found
    build = vars(module).get("__getattr__")  # DSPy builds its default cache on first read
    if build is None:
        raise AttributeError("cache")
    return build("cache")


def _set_cache(module: Any, value: Any) -> None:
    vars(module)["cache"] = value


def _del_cache(module: Any) -> None:
    vars(module).pop("cache", None)


#: The one gate of the process (its hooks are process-wide).
PRIVATE_CALL_GATE = PrivateCallGate()


@contextmanager
def private_call() -> Iterator[None]:
    """Run the block as a private call: in this thread and in the DSPy context it runs in (module
    constant :data:`PRIVATE_CALL_SETTING`), log records and warnings are dropped and DSPy's
    response cache is closed (:class:`PrivateCallGate`, held for the block)."""
    dspy = import_dspy()
    PRIVATE_CALL_GATE.acquire()
    _calling.depth = getattr(_calling, "depth", 0) + 1
    try:
        with dspy.context(**{PRIVATE_CALL_SETTING: True}):
            yield
    finally:
        _calling.depth -= 1
        PRIVATE_CALL_GATE.release()


class SilencedPrivateCalls:
    """While active (a ``with`` block around a compile), holds the :class:`PrivateCallGate`: the
    log records, Python warnings and DSPy cache lookups of every private call (:meth:`private_call`)
    are dropped, in the thread that runs it and in the threads and tasks DSPy or asyncio start
    for it with its context; other threads keep their logs, warnings and cache. Everything is put
    back when the block ends. Text a program prints is not caught, nor what a thread it starts
    itself (``threading.Thread``) logs."""

    def __init__(self) -> None:
        self._held = 0

    def __enter__(self) -> SilencedPrivateCalls:
        PRIVATE_CALL_GATE.acquire()
        self._held += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._held:
            self._held -= 1
            PRIVATE_CALL_GATE.release()

    @contextmanager
    def private_call(self) -> Iterator[None]:
        """Mark the block as a private call (:func:`private_call`)."""
        with private_call():
            yield


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
    """A copy of the DSPy adapter without its callbacks (None: DSPy's default, ChatAdapter); an LM
    it holds (``TwoStepAdapter``'s extraction model) is a :func:`private_lm` copy."""
    if adapter is None:
        return None
    dspy = import_dspy()
    copied = copy.copy(adapter)
    if hasattr(copied, "callbacks"):
        copied.callbacks = []
    for name, value in list(getattr(copied, "__dict__", {}).items()):
        if isinstance(value, dspy.BaseLM):
            setattr(copied, name, private_lm(value))
    return copied


def with_lms_replaced(value: Any, replace: Callable[[Any], Any]) -> Any:
    """``value`` with ``replace(lm)`` in place of each DSPy LM it holds, through DSPy modules'
    attributes and the items of lists, tuples and dicts. What holds a replaced LM is copied
    (shallow), never changed in place: a part shared with the user's program stays as it is."""
    dspy = import_dspy()
    done: dict[int, Any] = {}

    def fixed(item: Any) -> Any:
        if isinstance(item, dspy.BaseLM):
            return replace(item)
        if not isinstance(item, (dspy.BaseModule, list, tuple, dict)) or id(item) in done:
            return done.get(id(item), item)
        done[id(item)] = item  # a cycle back to an item being fixed finds the item itself
        result = item
        if isinstance(item, dspy.BaseModule):
            changed = {name: new for name, part in vars(item).items() if (new := fixed(part)) is not part}
            if changed:
                result = copy.copy(item)
                for name, new in changed.items():
                    setattr(result, name, new)
        elif type(item) is dict:  # a subclass of dict, list or tuple is left as it is
            entries = {key: fixed(part) for key, part in item.items()}
            if any(entries[key] is not part for key, part in item.items()):
                result = entries
        elif type(item) in (list, tuple):
            parts = [fixed(part) for part in item]
            if any(new is not part for new, part in zip(parts, item)):
                result = type(item)(parts)
        done[id(item)] = result
        return result

    return fixed(value)


def copy_sharing(module: Any, shared: dict[int, Any]) -> Any:
    """A deep copy of ``module`` in which each object whose id is a key of ``shared`` is that key's
    value, not a copy; DSPy's own ``deepcopy`` (attribute by attribute) when something it holds
    cannot be deep-copied."""
    try:
        return copy.deepcopy(module, dict(shared))
    except Exception:  # noqa: BLE001 - a lock, a client: DSPy's copy shares what it cannot copy
        return module.deepcopy()


class PromptParts:
    """How a candidate prompt sets the optimized predictors of a program.

    A prompt of one predictor is its text; of several, their texts under ``[[name]]`` headers
    (:mod:`dp_textgrad.tasks.components`). Each predictor's text is laid out as the operators write
    it: an instruction, then demonstration blocks, each the rendering of one PUBLIC example of
    that predictor (:attr:`pools`). :meth:`settings` splits it back: the instruction becomes the
    signature's instructions and the demonstrations ``predictor.demos`` (the public examples
    themselves), so the program that is scored is the program that is released, and DSPy's tools
    see the demos where they look for them."""

    def __init__(self, names: Sequence[str], pools: dict[str, dict[str, Any]]) -> None:
        self.names = list(names)
        self.pools = pools  # predictor name -> normalised demo text -> the public example

    def texts(self, prompt: str) -> dict[str, str]:
        """Each optimized predictor's text in ``prompt``."""
        return split_components(prompt, self.names) if len(self.names) > 1 else {self.names[0]: prompt}

    def settings(self, prompt: str) -> dict[str, tuple[str, list[Any]]]:
        """Predictor name -> (instruction, demos) that ``prompt`` sets."""
        out: dict[str, tuple[str, list[Any]]] = {}
        for name, text in self.texts(prompt).items():
            pool = self.pools.get(name, {})
            layout = parse_layout(text, list(pool))
            out[name] = (layout.instruction, [pool[normalise_text(block)] for block in layout.demos])
        return out

    def apply(self, program: Any, prompt: str) -> None:
        """Set ``program``'s optimized predictors (in place) to what ``prompt`` says."""
        chosen = self.settings(prompt)
        for name, predictor in program.named_predictors():
            if name in chosen:
                instruction, demos = chosen[name]
                predictor.signature = predictor.signature.with_instructions(instruction)
                predictor.demos = list(demos)


class SealedProgram:
    """A template of the user's program for private calls, and how to run one.

    ``run(prompt, inputs)`` runs a fresh copy of the template whose optimized predictors are set
    by ``prompt`` (:class:`PromptParts`), inside a DSPy context with every side channel off (module
    docstring). Every LM the program holds (a predictor's ``lm``, an LM a module keeps to switch
    in with ``dspy.context``) is a sealed copy (:func:`private_lm`), one per LM, which the
    per-call copies share instead of copying it per call."""

    def __init__(
        self,
        program: Any,
        parts: PromptParts,
        lm: Any,
        adapter: Any,
        silencer: SilencedPrivateCalls,
    ) -> None:
        dspy = import_dspy()
        self._dspy = dspy
        self.parts = parts
        self.silencer = silencer
        self.lm = private_lm(lm)
        self.adapter = private_adapter(adapter)
        configured = dspy.settings.lm  # what the metric's own DSPy calls (an LLM judge) run on
        self.metric_lm = private_lm(configured) if configured is not None else None
        self.metric_adapter = private_adapter(dspy.settings.adapter)
        held = {id(lm_): private_lm(lm_) for _, lm_ in program.named_sub_modules(type_=dspy.BaseLM)}
        self._sealed_lms = {id(lm_): lm_ for lm_ in held.values()}
        # With DSPy's fallback copy (the program holds something that cannot be deep-copied), the
        # template may hold copies of the user's LMs: they are sealed too.
        # Retrieval parts (declared public, checked by check_retrieval) are sealed in the template:
        # searches in the calling thread, embedders without caches (retrieval.seal_retrieval).
        self.template = with_lms_replaced(copy_sharing(program, {**held, **sealed_parts(program)}), self._seal_lm)
        seal_retrieval(self.template)
        for _, module in self.template.named_sub_modules():
            module.callbacks = []
            module.history = []

    def _seal_lm(self, lm: Any) -> Any:
        """``lm`` if it is one of the sealed copies, else a new sealed copy of it."""
        if id(lm) not in self._sealed_lms:
            sealed = private_lm(lm)
            self._sealed_lms[id(sealed)] = sealed
            return sealed
        return lm

    def copy_with(self, prompt: str) -> Any:
        """A copy of the template with its optimized predictors set by ``prompt``."""
        candidate = copy_sharing(self.template, self._sealed_lms)
        self.parts.apply(candidate, prompt)
        return candidate

    @contextmanager
    def sealed(self, *, metric: bool = False) -> Iterator[None]:
        """A DSPy context with every side channel of a call off, as a private call, in this thread.
        ``metric``: the context of the user's metric, whose own DSPy calls (an LLM judge) run on
        sealed copies of DSPy's configured LM and adapter (as they were when the task was built),
        not the program's."""
        settings: dict[str, Any] = dict(
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
        lm, adapter = (self.metric_lm, self.metric_adapter) if metric else (self.lm, self.adapter)
        if lm is not None:
            settings["lm"] = lm
        if adapter is not None:
            settings["adapter"] = adapter
        with self.silencer.private_call(), self._dspy.context(**settings):
            yield

    def run(self, prompt: str, inputs: dict[str, Any]) -> Any:
        """The program's prediction on ``inputs`` with ``prompt`` setting its predictors, sealed."""
        candidate = self.copy_with(prompt)
        with self.sealed():
            return candidate(**inputs)


def demo_eligible(signature: Any, example: Any) -> bool:
    """Whether a public example can be a demonstration of a predictor: it holds at least one input
    field and one output field of the predictor's signature (rendered with the fields it holds, as
    DSPy's adapters render a demo; a retrieval program's public examples need not hold the
    retrieved context). One without any output field would show nothing to answer."""
    return any(name in example for name in signature.input_fields) and any(
        name in example for name in signature.output_fields
    )


def describe_predictor(name: str, signature: Any) -> str:
    """Public text on what a predictor does, for the mutation operators: its instructions and the
    descriptions of its fields that say more than the field's name."""
    lines = [(signature.instructions or "").strip() or f"The DSPy predictor {name}."]
    for field_name, field in (*signature.input_fields.items(), *signature.output_fields.items()):
        desc = str((field.json_schema_extra or {}).get("desc", "") or "").strip()
        if desc and desc != f"${{{field_name}}}":
            lines.append(f"{field_name}: {desc}")
    return "\n".join(lines)


def predictor_components(
    program: Any, names: Sequence[str], adapter: Any, public_trainset: Sequence[Any]
) -> list[PromptComponent]:
    """The optimized predictors as prompt parts: each with its seed instruction, its public
    description and the public examples that hold its fields, rendered as ``adapter`` lays out a
    demonstration (:class:`CompletionAdapter`) or as ``field: value`` lines."""
    predictors = dict(program.named_predictors())
    own_render = getattr(adapter, "render_demo", None)  # an adapter's own layout (CompletionAdapter)

    def renderer(signature: Any) -> Callable[[Any], str]:
        def render(example: Any) -> str:
            if callable(own_render):
                return str(own_render(signature, example))
            return render_demo(signature, example)

        return render

    components = []
    for name in names:
        signature = predictors[name].signature
        render = renderer(signature)
        examples = [example for example in public_trainset if demo_eligible(signature, example)]
        components.append(
            PromptComponent(
                name=name,
                seed=signature.instructions or "",
                description=describe_predictor(name, signature),
                public_examples=tuple(ScoredExample(text=render(example), payload=example) for example in examples),
                render_example=render,
            )
        )
    return components


def parts_of(components: Sequence[PromptComponent]) -> PromptParts:
    """How a candidate prompt sets the predictors of ``components``."""
    pools = {
        part.name: {
            normalise_text(norm_block(str(part.render_example(example.payload)))): example.payload
            for example in part.public_examples
        }
        for part in components
        if part.render_example is not None
    }
    return PromptParts([part.name for part in components], pools)


#: The public cap on a DP answer of a predictor (its teachers' view), in tokens.
ANSWER_MAX_TOKENS = 32


def answering_task(
    program: Any, predictor_name: str, trainset: Sequence[Any], public_inputs: Sequence[Any]
) -> tuple[Any, Callable[[Any], Any]]:
    """The teachers' view of one predictor for DP demonstrations (``dp.labelling``): a
    :class:`~dp_textgrad.tasks.generation.GenerationTask` whose records are the private examples'
    input fields (``field: value`` lines) and output, and whose public inputs are
    ``public_inputs``; and the map from a released answer back to a ``dspy.Example`` (the public
    input's fields and the DP answer). The predictor must have one output field, and every
    example its input fields (the private ones its output too); refusals name fields and
    positions of public examples, and only counts of private ones."""
    from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
    from dp_textgrad.tasks.metrics import metric_from_name

    signature = dict(program.named_predictors())[predictor_name].signature
    inputs, outputs = list(signature.input_fields), list(signature.output_fields)
    if len(outputs) != 1:
        raise ConfigError(
            f"answer_predictor: {predictor_name} has {len(outputs)} output fields ({', '.join(outputs)}); DP "
            "demonstrations answer one output field: choose a predictor with one (answer_predictor=...)"
        )
    output = outputs[0]
    for position, example in enumerate(public_inputs):
        missing = [name for name in inputs if name not in example]
        if missing:
            raise ConfigError(
                f"public_inputs[{position}]: lacks the input field(s) {', '.join(missing)} of predictor "
                f"{predictor_name}; give each public input every input field of the predictor"
            )
    lacking = sum(1 for example in trainset if any(name not in example for name in (*inputs, output)))
    if lacking:
        raise ConfigError(
            f"trainset: {lacking} example(s) lack the fields {', '.join((*inputs, output))} of predictor "
            f"{predictor_name}, which its DP demonstrations are voted from; choose another answer_predictor"
        )

    def text_of(example: Any) -> str:
        return "\n".join(f"{name}: {example[name]}" for name in inputs)

    view = GenerationTask(
        name=f"dspy:{predictor_name}",
        description=describe_predictor(predictor_name, signature),
        private_train=PrivateDataset([GenerationExample(text=text_of(e), reference=str(e[output])) for e in trainset]),
        test=[],
        metric=metric_from_name("exact"),
        record_template="{text}\n" + f"{output}:",
        max_new_tokens=ANSWER_MAX_TOKENS,
        stop=("\n",),
        seed_prompt=signature.instructions or "",
        public_inputs=[text_of(example) for example in public_inputs],
    )
    by_text = {text_of(example): example for example in public_inputs}
    dspy = import_dspy()

    def to_example(answered: Any) -> Any:
        base = by_text[answered.text]
        fields = {name: base[name] for name in inputs}
        return dspy.Example(**fields, **{output: str(answered.reference)}).with_inputs(*inputs)

    return view, to_example


def program_as_task(
    program: Any,
    metric: Any,
    trainset: list[Any],
    *,
    predictor_name: str | None = None,
    predictor_names: Sequence[str] | None = None,
    lm: Any,
    adapter: Any = None,
    public_trainset: Sequence[Any] = (),
    valset: Sequence[Any] = (),
    threads: int = 1,
    silencer: SilencedPrivateCalls | None = None,
    public_inputs: Sequence[Any] = (),
    answer_predictor: str | None = None,
    batch_candidates: bool = False,
) -> ScoredTask:
    """The ScoredTask of a DSPy program (module docstring): its private records are ``trainset``.

    ``predictor_names`` (or one ``predictor_name``): the predictors to optimize, default all of
    them; with several, a candidate prompt holds one text per predictor (:class:`PromptParts`) and
    a child edits one of them. ``public_trainset`` examples are the public demonstrations of each
    predictor whose fields they hold (and the probe's input); ``valset`` is the test split
    (research evaluation only). ``public_inputs`` (public ``dspy.Example``s without outputs) and
    ``answer_predictor``: a labelling phase's teachers answer them for that predictor
    (:func:`answering_task`); the answers then join the public demonstrations (``with_answers``).
    ``batch_candidates``: score one record under all of a generation's candidates at once, the
    runs' LM calls meeting so that the engine decodes them together (:mod:`.batching`)."""
    dspy = import_dspy()
    if predictor_names is None:
        predictor_names = [predictor_name] if predictor_name is not None else None
    names = choose_predictors(program, predictor_names)
    components = predictor_components(program, names, adapter, public_trainset)
    parts = parts_of(components)
    sealed = SealedProgram(program, parts, lm, adapter, silencer or SilencedPrivateCalls())
    call_metric = metric_caller(metric)

    def score_record(prompt: str, example: Any) -> RecordScore:
        try:
            prediction = sealed.run(prompt, dict(example.inputs()))
        except dspy.AdapterParseError:
            return (0.0, "unparsed")
        try:
            with sealed.sealed(metric=True):
                return metric_score(call_metric(example, prediction))
        except Exception:  # a metric failing on this output: the same category for every record
            return (0.0, "unparsed")

    def score_record_many(prompts: Sequence[str], example: Any) -> list[RecordScore | BaseException]:
        """ONE record under every prompt, each run in its own thread, their LM calls batched."""
        return run_under_prompts(prompts, lambda prompt: score_record(prompt, example))

    first = components[0]

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

    several = len(components) > 1
    answering, with_answers = None, None
    if public_inputs:
        target = answer_predictor if answer_predictor is not None else (names[0] if len(names) == 1 else None)
        if target is None or target not in names:
            raise ConfigError(
                f"answer_predictor: name the optimized predictor whose demonstrations the DP answers fill, one of "
                f"{', '.join(names)}"
            )
        answering, to_example = answering_task(program, target, trainset, public_inputs)

        def with_answers(task: ScoredTask, answered: Sequence[Any]) -> ScoredTask:
            """The task with the DP answers as public demonstrations, as public_trainset examples are."""
            examples = [*public_trainset, *(to_example(one) for one in answered)]
            renewed = predictor_components(program, names, adapter, examples)
            parts.pools.clear()
            parts.pools.update(parts_of(renewed).pools)  # the sealed program maps demo blocks with these
            return replace(
                task,
                public_examples=list(renewed[0].public_examples),
                components=tuple(renewed) if several else (),
            )

    return ScoredTask(
        name=f"dspy:{type(program).__name__}",
        description=first.description if not several else "\n".join(part.description for part in components),
        private_train=PrivateDataset(list(trainset)),
        test=list(valset),
        score_record=score_record,
        public_examples=list(first.public_examples),
        render_example=first.render_example,
        seed_prompt=first.seed if not several else "",
        threads=threads,
        probe=probe,
        deterministic=False,
        components=tuple(components) if several else (),
        answering=answering,
        with_answers=with_answers,
        score_record_many=score_record_many if batch_candidates else None,
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
    "PRIVATE_CALL_GATE",
    "PRIVATE_CALL_SETTING",
    "ANSWER_MAX_TOKENS",
    "UNSUPPORTED_PARTS",
    "PrivateCallGate",
    "PromptParts",
    "SealedProgram",
    "SilencedPrivateCalls",
    "check_examples",
    "check_no_demos",
    "check_program",
    "choose_predictor",
    "choose_predictors",
    "demo_eligible",
    "describe_predictor",
    "copy_sharing",
    "in_private_call",
    "metric_caller",
    "metric_score",
    "private_adapter",
    "private_call",
    "private_lm",
    "answering_task",
    "program_as_task",
    "render_demo",
    "with_lms_replaced",
]
