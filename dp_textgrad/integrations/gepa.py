"""GEPA's call shape, run by DP-ES: :func:`optimize` takes what ``gepa.optimize`` takes (a seed
candidate, a private ``trainset``, the user's ``GEPAAdapter``) and releases the candidate's
optimized components with an (epsilon, delta) guarantee.

Why not GEPA's own loop. Two parts of it read private records in ways no noise can bound.
(1) Reflection: each proposal evaluates a trainset minibatch with ``capture_traces=True``, turns
the raw inputs, outputs and feedback (gold answers included) into a reflective dataset with the
adapter's ``make_reflective_dataset``, and hands that text to the reflection LM, whose answer IS
the next candidate; one record's text can move the released text arbitrarily (it is copied
verbatim), so the proposal has no finite sensitivity. (2) Selection: a proposal is accepted on
the exact sum of its minibatch scores, and parents are drawn from per-instance Pareto fronts of
exact validation scores (the trainset itself when ``valset`` is None); whether a candidate
survives can hinge on one record's score, and merge, the perfect-score skip and the stop rules
read the same exact scores. Making that DP means proposing from public or DP-released text only
and choosing from noisy aggregate scores with an accountant, which is DP-ES. So this module keeps
GEPA's interface and replaces the loop: the adapter's ``evaluate`` becomes the per-record score of
a :class:`~dp_textgrad.tasks.scored.ScoredTask`, called on ONE private record at a time with
``capture_traces=False``; only ``scores[0]`` is read. GEPA's ``gepa`` package is imported only
when :func:`optimize` builds GEPA's default adapter or an adapter of this module evaluates.

Before anything is charged, a public probe runs the task: with GEPA's default adapter (or
:class:`CompletionAdapter`, the default for a base model served by :func:`task_lm_from_engine`)
on a public input, so that a broken task LM fails for free; and, where the task LM's messages
can be watched (:class:`WatchedLM`), with the optimized component's text replaced by a marker,
so that a component the adapter never shows to the model is refused by name instead of being
"optimized" at full price with no effect.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import secrets
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad.dp_es.config import DEFAULT_EXPECTED_BATCH, ConfigError, DPESConfig, config_with
from dp_textgrad.integrations.engine_checks import refuse_disk_cache
from dp_textgrad.integrations.guarantee import DPGuarantee
from dp_textgrad.tasks.components import PromptComponent, join_components, split_components

if TYPE_CHECKING:
    from dp_textgrad.tasks.scored import RecordScore, ScoredTask
    from dp_textgrad.workflow import RunOutcome

_READS_TRACES = (
    "it builds proposals from raw trainset traces (inputs, outputs, feedback) read by an LLM whose "
    "answer is released; DP-ES proposes from public text only: pass engine= for the rewrite model"
)
_EXACT_SCORES = (
    "it chooses candidates from exact per-record scores (minibatch sums, per-instance Pareto fronts); "
    "DP-ES chooses from noisy aggregate scores (settings: selection=, parents=, population=)"
)
_PER_RECORD_OUTPUT = (
    "it sends per-record scores, outputs or metric-call counts of private records to a logger, "
    "tracker or cache; a DP-ES run reports released values only: pass observers= for its events"
)
#: ``gepa.optimize`` arguments this function refuses, with why: name -> (values that ask for
#: nothing and are accepted, the reason). They read private traces or exact private scores, or
#: send per-record values to loggers, trackers and caches. An empty hook list or keyword dict
#: (``stop_callbacks=[]``, ``callbacks=()``, ``reflection_lm_kwargs={}``) asks for nothing too
#: and is accepted (:data:`EMPTY_ACCEPTED`).
GEPA_REFUSED_ARGUMENTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "reflection_lm": ((None,), _READS_TRACES),
    "reflection_lm_kwargs": ((None,), _READS_TRACES),
    "reflection_prompt_template": ((None,), _READS_TRACES),
    "reflection_strategy": ((None,), _READS_TRACES),
    "custom_candidate_proposer": ((None,), _READS_TRACES),
    "reflection_minibatch_size": ((None,), _READS_TRACES),
    "batch_sampler": ((None,), _READS_TRACES),
    "module_selector": (
        (None, "round_robin"),
        "DP-ES edits one component per child, the components taking turns (GEPA's 'round_robin'); a "
        "selector that reads scores would read exact private ones (component= chooses which are optimized)",
    ),
    "sampling_strategy": ((None,), _READS_TRACES),
    "candidate_selection_strategy": ((None,), _EXACT_SCORES),
    "frontier_type": ((None,), _EXACT_SCORES),
    "acceptance_criterion": ((None,), _EXACT_SCORES),
    "selection_strategy": ((None,), _EXACT_SCORES),
    "val_evaluation_policy": ((None,), _EXACT_SCORES),
    "skip_perfect_score": ((None, False), _EXACT_SCORES),
    "use_merge": ((None, False), _EXACT_SCORES),
    "max_merge_invocations": ((None,), _EXACT_SCORES),
    "merge_val_overlap_floor": ((None,), _EXACT_SCORES),
    "stop_callbacks": (
        (None,),
        "a stop rule that reads the run's scores or costs makes the schedule depend on private data; "
        "DP-ES runs its planned schedule (generations=, or max_metric_calls=)",
    ),
    "max_reflection_cost": ((None,), _READS_TRACES),
    "logger": ((None,), _PER_RECORD_OUTPUT),
    "callbacks": ((None,), _PER_RECORD_OUTPUT),
    "use_wandb": ((None, False), _PER_RECORD_OUTPUT),
    "wandb_api_key": ((None,), _PER_RECORD_OUTPUT),
    "wandb_init_kwargs": ((None,), _PER_RECORD_OUTPUT),
    "wandb_attach_existing": ((None, False), _PER_RECORD_OUTPUT),
    "use_mlflow": ((None, False), _PER_RECORD_OUTPUT),
    "mlflow_tracking_uri": ((None,), _PER_RECORD_OUTPUT),
    "mlflow_experiment_name": ((None,), _PER_RECORD_OUTPUT),
    "mlflow_attach_existing": ((None, False), _PER_RECORD_OUTPUT),
    "tracking_key_prefix": ((None, ""), _PER_RECORD_OUTPUT),
    "track_best_outputs": ((None, False), _PER_RECORD_OUTPUT),
    "cache_evaluation": ((None, False), _PER_RECORD_OUTPUT),
    "use_cloudpickle": (
        (None, False),
        "GEPA checkpoints pickle its state, private scores included; a DP-ES run directory holds released "
        "values (and operator/ files)",
    ),
    "raise_on_exception": (
        (None, True),
        "GEPA's graceful stop on an exception would let one private record decide whether the run stops; "
        "in DP-ES a record whose evaluation raises scores 0 in the public 'error' category and the run "
        "goes on (max_error_share= stops on the DP share of such records)",
    ),
}

#: Refused arguments whose empty value (an empty list, tuple or dict) asks for nothing: hook lists
#: and keyword dicts. ``None`` and the other harmless values of :data:`GEPA_REFUSED_ARGUMENTS`
#: are accepted as well.
EMPTY_ACCEPTED = ("callbacks", "reflection_lm_kwargs", "stop_callbacks", "wandb_init_kwargs")  # a tuple: a stable repr

_MAX_GENERATIONS = 10_000  # DPESConfig's own bound on generations
#: ``max_metric_calls`` without a sampling rate: the fewest generations planned at the default
#: rate before the rate is lowered instead (a search of one or two generations barely searches).
MIN_PLANNED_GENERATIONS = 3
#: ``max_metric_calls`` without a sampling rate: the smallest expected batch q N (records scored
#: per candidate and generation) the rate is lowered to. Below it the noise of a candidate's
#: estimate, about sigma / (q N), swamps the differences between candidates at usual budgets.
MIN_EXPECTED_BATCH = 20

#: The default ``max_tokens`` of :func:`task_lm_from_engine`: a short answer (a label, a name, a
#: number, a sentence) fits, and a model that writes on stops soon. 256 tokens with no stop made
#: the bundled base model's calls 5.1 s against 0.14 s here (docs/integrations.md, "Base
#: models"); raise it for long answers.
DEFAULT_TASK_MAX_TOKENS = 32
#: The stop sequences :func:`task_lm_from_engine` gives a completion (base) engine by default:
#: a blank line, or the next example's input line of :class:`CompletionAdapter`'s layout (the
#: rule of dp-textgrad's own generation tasks). A chat engine ends its turn itself: no stop.
COMPLETION_STOP = ("\n\n", "\ninput:")
#: The public probe input of the default adapter when no ``public_input`` or ``public_trainset``
#: is given and no ``task_description`` either.
PROBE_INPUT = "This is a public test input. Reply briefly."

logger = logging.getLogger(__name__)

#: DP-ES settings refused here: this integration promises that private records reach only the
#: DP scorer (mode='unsafe' shows raw records to the mutator) and releases a DP candidate.
_REFUSED_SETTINGS: dict[str, tuple[Any, str]] = {
    "mode": (
        "unsafe",
        "mode='unsafe' shows raw private records to the mutator; for a non-private baseline run gepa.optimize itself",
    ),
    "privacy": ("off", "privacy='off' releases exact scores; for a non-private baseline run gepa.optimize itself"),
}


@dataclass(frozen=True)
class DPGEPAResult:
    """What :func:`optimize` returns: GEPA's fields a user reads, plus the DP guarantee.

    ``candidates``: the seed candidate first, then the released candidate's ancestors in the
    order DP-ES made them, the released candidate last (``best_idx``); each is the full
    candidate dict, only ``component`` differing from the seed. ``best_candidate`` is the DP
    release, not the candidate with the best validation score (choosing by ``valset`` would
    spend it). ``val_aggregate_scores``: the mean adapter score of each candidate on ``valset``
    (GEPA's scale, unclipped), None without a ``valset``: research evaluation, NOT covered by
    the guarantee. ``expected_metric_calls``: the planned (public) expected number of adapter
    calls on private records; the realised number is private and not reported. ``outcome``:
    the DP-ES run (:class:`~dp_textgrad.workflow.RunOutcome`; its ``seconds`` and
    ``optimizer`` are OPERATOR-ONLY).
    """

    candidates: list[dict[str, str]]
    best_idx: int
    component: str  # the optimized components' names, joined by ", "
    dp_guarantee: DPGuarantee
    outcome: RunOutcome
    val_aggregate_scores: list[float] | None = None
    expected_metric_calls: float = 0.0

    @property
    def best_candidate(self) -> dict[str, str]:
        """The released candidate: the seed's components with ``component`` optimized."""
        return dict(self.candidates[self.best_idx])

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)


class _RuleEditsOnly:
    """The default mutation 'engine': no model. DP-ES then mutates with rule edits only (public
    phrases, format hints, sentence crossover, reordering and dropping, public demonstrations);
    nothing generates text."""

    model_string = "rule-edits (no model)"
    instruction_following = False  # decides llm_operators=False before the plan is calibrated


class EngineTaskLM:
    """A GEPA ``task_lm`` (``messages -> str``) served by a dp-textgrad engine: what
    :func:`task_lm_from_engine` returns (its docstring says how messages become a prompt)."""

    def __init__(self, engine: Any, *, max_tokens: int, stop: Sequence[str] | None, temperature: float) -> None:
        self.engine = engine
        self.max_tokens = max_tokens
        self.stop = tuple(stop) if stop else None
        self.temperature = temperature

    @property
    def instruction_following(self) -> bool:
        """Whether the engine follows instructions (a chat model) rather than continuing text (a base model)."""
        return bool(getattr(self.engine, "instruction_following", True))

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> str:
        system = [str(m.get("content", "")) for m in messages if m.get("role") == "system"]
        rest = [str(m.get("content", "")) for m in messages if m.get("role") != "system"]
        if self.instruction_following:
            prompt, system_prompt = "\n\n".join(rest), ("\n\n".join(system) if system else None)
        else:  # a base model continues one text: the messages' contents in order
            prompt, system_prompt = "\n\n".join(part for part in system + rest if part), None
        options: dict[str, Any] = {"stop": list(self.stop)} if self.stop else {}
        return str(
            self.engine.generate(
                prompt, system_prompt=system_prompt, temperature=self.temperature, max_tokens=self.max_tokens, **options
            )
        )


def task_lm_from_engine(
    engine: Any,
    *,
    max_tokens: int = DEFAULT_TASK_MAX_TOKENS,
    stop: str | Sequence[str] | None = "auto",
    temperature: float = 0.0,
) -> EngineTaskLM:
    """A GEPA ``task_lm`` callable (``messages -> str``) served by a dp-textgrad engine.

    For an instruction-following engine, system messages become the engine's system prompt and
    the other messages' contents (joined by blank lines) its prompt; for a completion (base)
    engine (``engine.instruction_following`` False) every message's content, in order, is one
    text. Greedy by default. :func:`optimize` lays a base model's prompt out as completion text
    (:class:`CompletionAdapter`) when its ``task_lm`` comes from here; a chat model gets GEPA's
    ``DefaultAdapter``. Use it there (``task_lm=task_lm_from_engine(OpenAIEngine(...))``) or
    inside your own adapter.

    ``max_tokens`` (default :data:`DEFAULT_TASK_MAX_TOKENS`, 32): the most tokens an answer has;
    raise it when answers are longer than a sentence. ``stop``: ``"auto"`` cuts a base model's
    answer at a blank line or at the next ``input:`` line (:data:`COMPLETION_STOP`) and sets no
    stop for a chat model, which ends its turn itself; a list of strings sets them; None sets
    none. Every call costs at most ``max_tokens`` of generation, so these two bound the time of a
    run: 256 tokens without a stop took a local base model 3.8 s a call, against 0.28 s at 16.
    The engine counts its usage: when it scores private records, that count is OPERATOR-ONLY.
    """
    if not callable(getattr(engine, "generate", None)):
        raise TypeError(f"engine: expected a dp-textgrad engine with generate(), got {type(engine).__name__}")
    refuse_disk_cache(engine, "engine")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: must be an int >= 1, got {max_tokens!r}")
    if stop == "auto":
        stops: tuple[str, ...] | None = None if getattr(engine, "instruction_following", True) else COMPLETION_STOP
    elif stop is None:
        stops = None
    elif isinstance(stop, str) or not all(isinstance(item, str) and item for item in stop):
        raise ValueError(f"stop: use 'auto', None, or a list of non-empty strings, got {stop!r}")
    else:
        stops = tuple(stop)
    return EngineTaskLM(engine, max_tokens=max_tokens, stop=stops, temperature=temperature)


def _text_of(value: Any) -> str:
    """All the text in a call's arguments (messages, strings, nested lists and dicts), for the marker probe."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "\n".join(_text_of(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return "\n".join(_text_of(item) for item in value)
    return str(value)


class WatchedLM:
    """A task LM whose input :func:`optimize` reads during its public probes, and only then.

    :func:`optimize` wraps the ``task_lm`` of its default adapter in one itself. With your own
    adapter, build the adapter around a ``WatchedLM`` and pass the same object as ``task_lm``::

        lm = WatchedLM(my_task_lm)
        dp_gepa.optimize(seed, private, adapter=MyAdapter(lm), task_lm=lm, component="format", ...)

    Then the public probe checks that the optimized component reaches the model (``optimize``'s
    docstring). The wrapper calls ``lm`` unchanged; it keeps the text of a call only inside
    :meth:`watching`, which :func:`optimize` opens for public probe instances alone, so nothing of
    a private record is kept.
    """

    def __init__(self, lm: Callable[..., Any]) -> None:
        if not callable(lm):
            raise TypeError(f"lm: expected a callable task LM, got {type(lm).__name__}")
        self.lm = lm
        self._seen: list[str] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        seen = self._seen
        if seen is not None:
            seen.append(_text_of([list(args), kwargs]))
        return self.lm(*args, **kwargs)

    @contextmanager
    def watching(self) -> Iterator[list[str]]:
        """The text of every call made inside the block (use it on public inputs only)."""
        seen: list[str] = []
        self._seen = seen
        try:
            yield seen
        finally:
            self._seen = None


def _served_by(task_lm: Any) -> Any:
    return task_lm.lm if isinstance(task_lm, WatchedLM) else task_lm


class CompletionAdapter:
    """GEPA's default task laid out for a completion (base) model, which continues text.

    For each instance of GEPA's default data type (``{"input", "additional_context", "answer"}``)
    the model gets one user message::

        <every component of the candidate, in order, separated by blank lines>

        input: <the instance's input>
        answer:

    and its answer is the first non-empty line of what it writes (a base model writes on after
    the answer), scored by ``evaluator(instance, answer).score`` (default: GEPA's
    ``ContainsAnswerEvaluator``, 1 when the instance's ``answer`` is in it). Public
    demonstrations that :func:`render_instance` writes (``input: ...`` / ``answer: ...``) match
    the layout. Unlike GEPA's ``DefaultAdapter``, which sends only the first component, every
    component reaches the model. :func:`optimize` uses it when its ``task_lm`` is
    :func:`task_lm_from_engine` of an engine that does not follow instructions; pass
    ``adapter=CompletionAdapter(task_lm)`` to choose it yourself. ``make_reflective_dataset``
    raises: DP-ES never reflects on private traces.
    """

    def __init__(self, model: Callable[[list[dict[str, str]]], str], evaluator: Any = None) -> None:
        if not callable(model):
            raise TypeError(f"model: expected a callable messages -> str, got {type(model).__name__}")
        self.model = model
        self.evaluator = evaluator

    @staticmethod
    def render(candidate: Mapping[str, str], instance: Mapping[str, Any]) -> str:
        """The completion text of one instance under ``candidate`` (the class docstring's layout)."""
        blocks = [str(text).strip() for text in candidate.values() if str(text).strip()]
        blocks.append(f"input: {instance['input']}\nanswer:")
        return "\n\n".join(blocks)

    @staticmethod
    def answer(response: str) -> str:
        """The answer in a base model's continuation: its first non-empty line, stripped."""
        return next((line.strip() for line in str(response).splitlines() if line.strip()), "")

    def evaluate(self, batch: Sequence[Any], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa.adapters.default_adapter.default_adapter import ContainsAnswerEvaluator
        from gepa.core.adapter import EvaluationBatch

        evaluator: Any = self.evaluator if self.evaluator is not None else ContainsAnswerEvaluator()
        outputs: list[dict[str, str]] = []
        scores: list[float] = []
        trajectories: list[dict[str, Any]] | None = [] if capture_traces else None
        for instance in batch:
            if not isinstance(instance, Mapping) or "input" not in instance:
                raise TypeError(
                    "CompletionAdapter: expected instances of GEPA's default type, dicts with 'input' "
                    f"(and 'answer', 'additional_context'), got {type(instance).__name__}"
                )
            response = self.answer(self.model([{"role": "user", "content": self.render(candidate, instance)}]))
            result = evaluator(instance, response)
            outputs.append({"full_assistant_response": response})
            scores.append(float(result.score))
            if trajectories is not None:
                trajectories.append(
                    {"data": instance, "full_assistant_response": response, "feedback": result.feedback}
                )
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=trajectories)

    def make_reflective_dataset(self, candidate: Any, eval_batch: Any, components_to_update: Any) -> Any:
        raise NotImplementedError(
            "CompletionAdapter: no reflective dataset; DP-ES never shows private traces to a model "
            "(use it with dp_textgrad.integrations.gepa.optimize)"
        )


def render_instance(instance: Any) -> str:
    """A public data instance as demonstration text, whatever the adapter's data type.

    A mapping (GEPA's default ``{"input", "additional_context", "answer"}``) or a dataclass
    becomes one ``key: value`` line per non-empty field in its own order, values that are not
    text written as JSON; anything else is ``str(instance)``. Pass ``render_example=`` to
    :func:`optimize` to write demonstrations your own way.
    """
    if dataclasses.is_dataclass(instance) and not isinstance(instance, type):
        instance = dataclasses.asdict(instance)
    if not isinstance(instance, Mapping):
        return str(instance)
    lines = []
    for key, value in instance.items():
        if value is None or value == "" or (isinstance(value, (Mapping, list, tuple)) and not value):
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        lines.append(f"{key}: {text}")
    return "\n".join(lines)


class AdapterScore:
    """``score_record`` of the :class:`ScoredTask`: the user's adapter on ONE record.

    Calls ``adapter.evaluate([record], candidate, capture_traces=False)`` with the seed candidate
    whose ``component`` is the prompt under test, and reads ``scores[0]`` only (outputs and
    trajectories are never read), divided by ``perfect_score``. A batch without exactly one
    numeric score is a score of 0 in the ``unparsed`` category (the same rule for every record;
    the public probe catches such an adapter before anything is charged). An exception of the
    adapter on a record scores 0 in the public ``error`` category (``ScoredTask``), its text in
    the run's ``operator/errors.log`` only.
    """

    def __init__(
        self, adapter: Any, seed_candidate: Mapping[str, str], components: str | Sequence[str], perfect_score: float
    ) -> None:
        self.adapter = adapter
        self.seed_candidate = dict(seed_candidate)
        self.components = [components] if isinstance(components, str) else list(components)
        self.component = ", ".join(self.components)
        self.perfect_score = perfect_score

    @property
    def seed_prompt(self) -> str:
        """The seed's optimized text: the component's, or the components' under their headers."""
        if len(self.components) == 1:
            return self.seed_candidate[self.components[0]]
        return join_components({name: self.seed_candidate[name] for name in self.components}, self.components)

    def candidate(self, prompt: str) -> dict[str, str]:
        """The full candidate with the optimized components set by ``prompt`` (one component's
        text, or several under ``[[name]]`` headers: :mod:`dp_textgrad.tasks.components`)."""
        if len(self.components) == 1:
            return {**self.seed_candidate, self.components[0]: prompt}
        return {**self.seed_candidate, **split_components(prompt, self.components)}

    def __call__(self, prompt: str, record: Any) -> RecordScore:
        batch = self.adapter.evaluate([record], self.candidate(prompt), capture_traces=False)
        scores = getattr(batch, "scores", None)
        if not isinstance(scores, Sequence) or isinstance(scores, (str, bytes)) or len(scores) != 1:
            return 0.0, "unparsed"
        try:
            score = float(scores[0])
        except (TypeError, ValueError):
            return 0.0, "unparsed"
        return score / self.perfect_score

    def check(self, prompt: str, instance: Any) -> None:
        """The strict check of a PUBLIC instance (the preflight probe): raises on a malformed batch."""
        batch = self.adapter.evaluate([instance], self.candidate(prompt), capture_traces=False)
        scores = getattr(batch, "scores", None)
        if not isinstance(scores, Sequence) or isinstance(scores, (str, bytes)) or len(scores) != 1:
            raise ValueError(
                "adapter.evaluate: on a batch of one public instance it must return an EvaluationBatch "
                f"whose scores hold one number, got scores={scores!r}"
            )
        value = float(scores[0])
        if not math.isfinite(value):
            raise ValueError(f"adapter.evaluate: the score of a public instance is not finite ({value!r})")


def optimize(
    seed_candidate: dict[str, str],
    trainset: Any,
    valset: Any = None,
    adapter: Any = None,
    task_lm: Any = None,
    *,
    evaluator: Any = None,
    epsilon: float = 4.0,
    delta: float | None = None,
    component: str | None = None,
    public_trainset: Sequence[Any] | None = None,
    public_input: Any = None,
    render_example: Callable[[Any], str] | None = None,
    engine: Any = None,
    max_metric_calls: int | None = None,
    perfect_score: float = 1.0,
    task_description: str | None = None,
    threads: int = 1,
    run_dir: str | Path | None = None,
    runs_root: str | Path | None = None,
    observers: Iterable[Any] = (),
    display_progress_bar: bool = True,
    **settings: Any,
) -> DPGEPAResult:
    """Optimize the components of ``seed_candidate`` on the private ``trainset`` with DP-ES, GEPA's call shape.

    Before (GEPA, not private: reflection copies trainset text into the candidate)::

        result = gepa.optimize(seed_candidate={"instructions": "..."}, trainset=private, adapter=my_adapter,
                               reflection_lm="openai/gpt-4.1", max_metric_calls=500)

    After (a released candidate with an (epsilon, delta) guarantee)::

        from dp_textgrad.integrations import gepa as dp_gepa
        result = dp_gepa.optimize(seed_candidate={"instructions": "..."}, trainset=private, adapter=my_adapter,
                                  public_trainset=public, epsilon=4.0, dataset_size=len(private),
                                  max_metric_calls=500)
        result.best_candidate, result.dp_guarantee

    ``trainset``: the private records (a list, or a GEPA ``DataLoader``). They reach only the
    DP scorer: ``adapter.evaluate([record], candidate, capture_traces=False)``, one record per
    call, of which only ``scores[0]`` is read. Scores are divided by ``perfect_score`` (GEPA's
    name for the best score) and clipped to [0, 1]. Your adapter must keep the rule every DP
    scorer keeps: write nothing computed from a record anywhere (no logs, caches, trackers).
    ``valset``: research evaluation of the candidates (``val_aggregate_scores``), NOT covered.
    ``adapter``: your ``GEPAAdapter`` (``make_reflective_dataset`` and ``propose_new_texts`` are
    never called). Without one, ``task_lm`` (a callable ``messages -> str``, e.g.
    :func:`task_lm_from_engine`) and ``evaluator`` build the default adapter: GEPA's
    ``DefaultAdapter`` (the FIRST component is the system message, the record's ``input`` the
    user message, the score ``evaluator(record, response).score``, default 1 when the record's
    ``answer`` is in the response), or, when ``task_lm`` is :func:`task_lm_from_engine` of an
    engine that does not follow instructions (a base model), :class:`CompletionAdapter`
    (every component, then ``input: ...`` and ``answer:``, as text to continue). A model string
    for ``task_lm`` is refused: GEPA's litellm wrapper logs warnings about individual responses
    and litellm's global callbacks and cache may record them. With your own adapter, ``task_lm``
    may be the :class:`WatchedLM` your adapter calls, so that the probe below can watch it.

    ``component``: the component to optimize, a list of them, or None (default) for every
    component of the candidate; the others stay fixed. With several, one child edits one of
    them, the components taking turns (GEPA's round-robin selector), and the public probe first
    checks that the adapter shows each of them to the model (GEPA's ``DefaultAdapter`` shows only
    the first: a run that would optimize another is refused by name, before any charge).
    ``public_trainset``: public instances, the only source of demonstrations (each
    rendered by ``render_example``, default :func:`render_instance`). ``engine``: the
    dp-textgrad engine of DP-ES's mutation operators (an instruction-following one enables LLM
    rewrites and critiques that see public text and DP statistics only); default: no model, rule
    edits and public demonstrations only. ``task_description``: public text telling the rewrite
    model what the component is for. ``threads``: records scored at once (your adapter must be
    thread-safe).

    The public probe, before anything is charged (nothing private is read by it, so its errors
    are shown as they are): ``public_input`` (a public instance of your adapter's data type; for
    the default adapter, the input text will do), else ``public_trainset[0]``, else, for the
    default adapter, an instance whose input is ``task_description`` (or a fixed public text).
    (1) Where the task LM can be watched (the default adapter; your adapter with
    ``task_lm=WatchedLM``), the probe runs the candidate with the optimized component's text
    replaced by a marker: a task LM that raises fails here as :class:`PreflightError` with
    epsilon 0 spent, and a component whose marker never reaches the model's messages (GEPA's
    ``DefaultAdapter`` shows only the first component) is refused by name. (2) The preflight
    checks that the adapter returns one finite score for the probe instance. A user's adapter
    with no public instance cannot be probed: a warning says so, and a failing task then costs
    budget. Failures on private records are scores of 0 (category ``error``); their text goes
    only to the run's ``operator/errors.log`` (OPERATOR-ONLY: it may quote a record), never to a
    message. ``max_error_share=`` makes them stop a run through a DP decision.

    ``max_metric_calls``: the EXPECTED number of adapter calls on private records (Poisson
    subsamples: population K x q N per generation, plus a charged final selection) stays within
    it; the realised count is random and private, and not reported. With ``sampling_rate``
    given (and a declared ``dataset_size``), it sets ``generations``. Without one, the default
    rate (about 150 records per candidate and generation) is kept when it pays for at least
    :data:`MIN_PLANNED_GENERATIONS` generations; otherwise (a declared ``dataset_size``
    needed) the rate is lowered so that 3 generations fit, or 2, or 1, at no fewer than
    :data:`MIN_EXPECTED_BATCH` expected records per candidate: GEPA's usual 150 or 500 calls
    then run 1 or 3 generations of population 6. A smaller budget is refused with the smallest
    that fits. ``**settings``: :class:`~dp_textgrad.dp_es.config.DPESConfig` fields
    (``generations``, ``population``, ``dataset_size``, ``selection``, ``seed``, ...).

    ``run_dir``: a new run directory to write. ``runs_root``: where the run directories and the
    dataset's lifetime store (``<runs_root>/operator/``) live; default
    :func:`dp_textgrad.runs.default_runs_root` (``$DP_TEXTGRAD_HOME/runs``, else the user's data
    folder), never the working directory. Not a temporary folder: the lifetime store records
    what each private dataset has spent over all its runs and must outlive this call.
    ``observers``: the run's released events, as for :func:`dp_textgrad.optimize`.
    ``display_progress_bar`` (GEPA's name; default True): a tqdm bar on stderr with the
    generation, the best noisy estimate and the epsilon spent, released values only (no rate, no
    elapsed time: both would time the private phase); the same lines go to the
    ``dp_textgrad.integrations.gepa`` logger at INFO either way.

    Refused by name, with why: GEPA's reflection, selection, merge, stop-rule, logging and
    tracking arguments (:data:`GEPA_REFUSED_ARGUMENTS`; a value that asks for nothing, such as
    ``use_merge=False`` or ``stop_callbacks=[]``, is accepted), ``mode='unsafe'`` and
    ``privacy='off'``.
    """
    settings = dict(settings)
    _refuse_gepa_arguments(settings)
    for name, (value, why) in _REFUSED_SETTINGS.items():
        if settings.get(name) == value:
            raise ConfigError(f"{name}: refused: {why}")
    chosen = _components(seed_candidate, component)
    label = ", ".join(chosen)
    if not (isinstance(perfect_score, (int, float)) and math.isfinite(perfect_score) and perfect_score > 0):
        raise ConfigError(
            f"perfect_score: must be a finite number > 0 (the best score of your metric), got {perfect_score!r}"
        )
    if not isinstance(display_progress_bar, bool):
        raise ConfigError(f"display_progress_bar: True or False, got {display_progress_bar!r}")
    active, watched = _adapter(adapter, task_lm, evaluator)
    default_adapter = adapter is None
    if engine is None and settings.get("llm_operators") is True:
        raise ConfigError(
            "llm_operators: True needs a model that follows rewrite instructions; pass engine= "
            "(e.g. OpenAIEngine(...)) or leave llm_operators unset"
        )
    # Settings are checked (a typo is named) before anything is read or run.
    config = config_with(None, {"epsilon": epsilon, "delta": delta, **settings})
    if max_metric_calls is not None:
        if "generations" in settings:
            raise ConfigError("max_metric_calls: give it or generations, not both (it sets generations)")
        settings.update(_schedule_for(max_metric_calls, config))

    from dp_textgrad import front, runs
    from dp_textgrad.integrations.progress import RunProgress
    from dp_textgrad.privacy.data import PrivateDataset, PrivateScoringError
    from dp_textgrad.tasks.scored import ScoredExample, ScoredTask

    private_records = _records(trainset, "trainset")
    if not private_records:
        raise ConfigError("trainset: empty; give the private records to optimize on")
    val_records = None if valset is None else _records(valset, "valset")
    if val_records is not None and not val_records:
        raise ConfigError("valset: empty; give validation instances or None")
    score = AdapterScore(active, seed_candidate, chosen, float(perfect_score))
    render = render_example if render_example is not None else render_instance
    public = list(public_trainset or [])
    examples = [ScoredExample(text=str(render(instance)), payload=instance) for instance in public]
    probe_at = _probe_instance(public_input, public, default_adapter, task_description)
    if probe_at is None:
        warnings.warn(
            "public_input: no public instance to probe your adapter with before the first charge, so a "
            "task that fails costs budget (each private record then scores 0); pass public_input= (one "
            "public instance of your adapter's data type) or public_trainset=",
            UserWarning,
            stacklevel=2,
        )
    elif watched is not None:
        _check_components_reach_the_model(active, watched, probe_at, seed_candidate, chosen, default_adapter)
    elif len(chosen) > 1:
        warnings.warn(
            f"component: {label} are optimized together, but your adapter cannot be watched, so the public "
            "probe cannot check that it shows each of them to the model (a component it never renders gets "
            "edits that change nothing); build your adapter around a WatchedLM and pass it as task_lm too",
            UserWarning,
            stacklevel=2,
        )

    def probe(prompt: str) -> None:
        if probe_at is not None:  # a public instance only: the probe's errors may be shown as they are
            score.check(prompt, probe_at[0])

    def describe(name: str) -> str:
        return task_description or (
            f"Improve the text of the component '{name}' of a system: the system follows it on every input."
        )

    parts = (
        tuple(
            PromptComponent(
                name=name,
                seed=seed_candidate[name],
                description=describe(name),
                public_examples=tuple(examples),
                render_example=render,
            )
            for name in chosen
        )
        if len(chosen) > 1
        else ()
    )
    task: ScoredTask = ScoredTask(
        name=f"gepa:{label}",
        description=describe(chosen[0]) if len(chosen) == 1 else task_description or f"A system of {label}.",
        private_train=PrivateDataset(private_records),
        test=[],
        score_record=score,
        public_examples=examples,
        render_example=render,
        seed_prompt=score.seed_prompt,
        threads=threads,
        probe=probe,
        components=parts,
    )
    # The run's directory is made here, so that an error can name where its text was written.
    directory = (
        Path(run_dir)
        if run_dir is not None
        else runs.new_run_dir(Path(runs_root) if runs_root is not None else runs.default_runs_root())
    )
    watchers = list(observers)
    watchers.append(RunProgress(f"DP-ES on '{label}'", logger, bar=display_progress_bar))
    try:
        outcome = front.optimize(
            task,
            engine if engine is not None else _RuleEditsOnly(),
            run_dir=directory,
            observers=watchers,
            evaluate=False,
            task_name=task.name,
            epsilon=epsilon,
            delta=delta,
            **settings,
        )
    except PrivateScoringError as exc:
        # Fixed text and a public label; the error's own text (it may quote a record) is in the log.
        exc.args = (
            f"{exc}; the error's text is in {runs.RunDir(directory).errors_log} (OPERATOR-ONLY: it may "
            "quote a private record)",
        )
        raise
    candidates = _released_candidates(outcome, score)
    return DPGEPAResult(
        candidates=candidates,
        best_idx=len(candidates) - 1,
        component=label,
        dp_guarantee=DPGuarantee.of_run(outcome, label),
        outcome=outcome,
        val_aggregate_scores=None if val_records is None else _val_scores(active, candidates, val_records),
        expected_metric_calls=_expected_calls(outcome),
    )


# -- the pieces of optimize -------------------------------------------------------------------
def _refuse_gepa_arguments(settings: dict[str, Any]) -> None:
    """Raise naming the first GEPA argument that asks for something DP-ES cannot do privately."""
    for name, (harmless, why) in GEPA_REFUSED_ARGUMENTS.items():
        if name in settings:
            value = settings.pop(name)
            if name in EMPTY_ACCEPTED and isinstance(value, (list, tuple, dict)) and not value:
                continue  # an empty hook list or keyword dict asks for nothing
            if not any(
                value is accepted or (type(value) is type(accepted) and value == accepted) for accepted in harmless
            ):
                raise ConfigError(f"{name}: refused: {why}")


def _components(seed_candidate: Any, component: str | Sequence[str] | None) -> list[str]:
    """The components to optimize: the one named, those named (in the candidate's order), or, with
    ``None``, every component of the candidate (one child edits one of them, in turn)."""
    if not isinstance(seed_candidate, Mapping) or not seed_candidate:
        raise ConfigError("seed_candidate: must be a non-empty dict of component name -> text")
    for name, text in seed_candidate.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise ConfigError(f"seed_candidate: component {name!r} must map a str name to str text")
    names = list(seed_candidate)
    if component is None:
        wanted = names
    elif isinstance(component, str):
        wanted = [component]
    elif isinstance(component, Sequence) and component and all(isinstance(c, str) for c in component):
        wanted = list(component)
    else:
        raise ConfigError("component: a component's name, a list of names, or None for every component")
    unknown = [name for name in wanted if name not in seed_candidate]
    if unknown:
        raise ConfigError(
            f"component: {', '.join(map(repr, unknown))} not in seed_candidate (components: {', '.join(names)})"
        )
    for name in wanted:
        if not seed_candidate[name].strip():
            raise ConfigError(f"seed_candidate: component {name!r} is empty; DP-ES starts from a non-empty text")
    return [name for name in names if name in wanted]


def _adapter(adapter: Any, task_lm: Any, evaluator: Any) -> tuple[Any, WatchedLM | None]:
    """The adapter that scores a record, and the watched task LM it calls (None: not watchable).

    The user's adapter (watched when ``task_lm`` is the :class:`WatchedLM` it calls), or the
    default one around a callable ``task_lm``: :class:`CompletionAdapter` for a base model served
    by :func:`task_lm_from_engine`, GEPA's ``DefaultAdapter`` otherwise."""
    if adapter is not None:
        if evaluator is not None or (task_lm is not None and not isinstance(task_lm, WatchedLM)):
            raise ConfigError(
                "task_lm: with an adapter, the adapter runs the task; remove task_lm and evaluator "
                "(as gepa.optimize requires), or, so that the public probe can check which components "
                "reach the model, build your adapter around lm = WatchedLM(your_lm) and pass task_lm=lm"
            )
        if not callable(getattr(adapter, "evaluate", None)):
            raise ConfigError(
                f"adapter: expected a GEPAAdapter with evaluate(batch, candidate, capture_traces), "
                f"got {type(adapter).__name__}"
            )
        return adapter, task_lm
    if task_lm is None:
        raise ConfigError(
            "adapter: give your GEPAAdapter, or task_lm (a callable messages -> str) for GEPA's default one"
        )
    if isinstance(task_lm, str):
        raise ConfigError(
            f"task_lm: a model string ({task_lm!r}) is refused: GEPA's litellm wrapper logs warnings about "
            "individual responses to private records, and litellm's global callbacks and cache may record "
            "them; pass a callable messages -> str (dp_textgrad.integrations.gepa.task_lm_from_engine("
            "OpenAIEngine(...)) serves one from a dp-textgrad engine) or your own adapter"
        )
    if not callable(task_lm):
        raise ConfigError(f"task_lm: expected a callable messages -> str, got {type(task_lm).__name__}")
    watched = task_lm if isinstance(task_lm, WatchedLM) else WatchedLM(task_lm)
    served = _served_by(task_lm)
    if isinstance(served, EngineTaskLM) and not served.instruction_following:
        return CompletionAdapter(watched, evaluator), watched
    from gepa.adapters.default_adapter.default_adapter import DefaultAdapter

    return DefaultAdapter(model=watched, evaluator=evaluator), watched


def _probe_instance(
    public_input: Any, public: Sequence[Any], default_adapter: bool, task_description: str | None
) -> tuple[Any, str] | None:
    """The public instance of the probe and where it came from, or None when there is none."""
    if public_input is not None:
        if default_adapter and isinstance(public_input, str):
            return {"input": public_input, "additional_context": {}, "answer": ""}, "public_input"
        return public_input, "public_input"
    if public:
        return public[0], "public_trainset[0]"
    if default_adapter:
        text = (task_description or "").strip() or PROBE_INPUT
        return {"input": text, "additional_context": {}, "answer": ""}, "a probe input made of public text"
    return None


def _check_components_reach_the_model(
    adapter: Any,
    watched: WatchedLM,
    probe_at: tuple[Any, str],
    seed_candidate: Mapping[str, str],
    components: Sequence[str],
    default_adapter: bool,
) -> None:
    """The public probe with each optimized component's text replaced by a marker: raise
    :class:`PreflightError` when the task fails on it (its text is public), :class:`ConfigError`
    naming a component whose marker never reaches the task LM."""
    from dp_textgrad.dp_es.preflight import PreflightError

    instance, where = probe_at
    markers = {name: f"DPTGPROBE{secrets.token_hex(6).upper()}" for name in components}
    candidate = {**seed_candidate, **markers}
    try:
        with watched.watching() as seen:
            adapter.evaluate([instance], candidate, capture_traces=False)
    except Exception as exc:  # a public instance: nothing private was read, its text may be shown
        raise PreflightError(
            f"preflight: the task failed on a public probe ({where}) before anything was charged, epsilon 0 "
            f"spent ({type(exc).__name__}: {' '.join(str(exc).split())}); fix the task LM or adapter and run again"
        ) from exc
    if not seen:
        raise ConfigError(
            "task_lm: your adapter never called the WatchedLM passed as task_lm on a public probe "
            f"({where}); build the adapter around that same object, or leave task_lm out"
        )
    text = "\n".join(seen).upper()
    for name, marker in markers.items():
        if marker not in text:
            first = next(iter(seed_candidate))
            fix = (
                f"GEPA's DefaultAdapter sends only the first component ('{first}') to the model, as the "
                f"system message; put '{name}' first in seed_candidate, merge the components into one, or "
                "pass an adapter that renders every component"
                if default_adapter
                else f"check that your adapter puts candidate['{name}'] into what it sends to the task LM"
            )
            raise ConfigError(
                f"component: '{name}' never reaches the task LM: a public probe ({where}) with its text "
                f"replaced by a marker sent the model no such text, so optimizing it would spend the budget "
                f"and change nothing; {fix}"
            )


def _schedule_for(max_metric_calls: Any, config: DPESConfig) -> dict[str, Any]:
    """``generations`` (and, when it is not given, ``sampling_rate``) whose EXPECTED private adapter
    calls fit ``max_metric_calls`` (:func:`optimize`'s docstring has the rule)."""
    if isinstance(max_metric_calls, bool) or not isinstance(max_metric_calls, int) or max_metric_calls < 1:
        raise ConfigError(f"max_metric_calls: must be an int >= 1, got {max_metric_calls!r}")
    size, rate, population = config.dataset_size, config.sampling_rate, config.population
    # A charged final selection scores like a generation; so, at most, does the final estimate (its
    # default rate min(1, K q) reads one generation's records, on one prompt).
    final = (0 if config.final_selection == "last" else 1) + (0 if config.final_estimate is None else 1)
    if config.final_estimate is not None and config.final_estimate.sampling_rate is not None:
        raise ConfigError(
            "final_estimate.sampling_rate: with max_metric_calls the final estimate keeps its default rate, "
            "min(1, K q), one generation's calls; remove final_estimate.sampling_rate (or give generations "
            "instead of max_metric_calls)"
        )
    if rate == "auto":  # the planner needs the generations this function derives: a circle
        raise ConfigError(
            "sampling_rate: 'auto' plans q for a given number of generations; with max_metric_calls give a "
            "number for sampling_rate (or give generations instead of max_metric_calls)"
        )
    if rate is not None:
        if size is None:
            raise ConfigError(
                "max_metric_calls: with sampling_rate set and no dataset_size, the expected batch q N is "
                "private; declare dataset_size (a public N) or give generations instead"
            )
        batch = float(rate) * size
        per_generation = population * batch
        generations = int(max_metric_calls // per_generation) - final
        if generations < 1:
            raise ConfigError(
                f"max_metric_calls: {max_metric_calls} cannot pay for one generation: population {population} x "
                f"an expected batch of {batch:g} records = {per_generation:g} calls"
                + (f" (plus {per_generation * final:g} for the final selection or estimate)" if final else "")
                + f"; raise max_metric_calls to at least {math.ceil(per_generation * (1 + final))}, or lower "
                "population or sampling_rate"
            )
        return {"generations": min(generations, _MAX_GENERATIONS)}
    # The default rate q = min(1, 150 / N): q N = min(N, 150) with N declared (or the DP count's).
    default_batch = min(size, DEFAULT_EXPECTED_BATCH) if size is not None else DEFAULT_EXPECTED_BATCH
    generations = int(max_metric_calls // (population * default_batch)) - final
    if generations >= MIN_PLANNED_GENERATIONS or (size is None and generations >= 1):
        return {"generations": min(generations, _MAX_GENERATIONS)}
    smallest = population * MIN_EXPECTED_BATCH * (1 + final)
    if size is None:
        one_generation = population * DEFAULT_EXPECTED_BATCH * (1 + final)
        raise ConfigError(
            f"max_metric_calls: {max_metric_calls} cannot pay for one generation at the default sampling rate "
            f"(population {population} x about {DEFAULT_EXPECTED_BATCH} records"
            + (", plus as many for the final selection or estimate" if final else "")
            + f" = {one_generation} calls); declare dataset_size (a public N) so that the rate can be lowered "
            f"to fit (from {smallest} calls), or raise max_metric_calls to at least {one_generation}"
        )
    for planned in range(MIN_PLANNED_GENERATIONS, 0, -1):
        batch = max_metric_calls / (population * (planned + final))
        if batch >= min(MIN_EXPECTED_BATCH, size):
            # rounded down, so that the planned expected calls stay within the budget
            sampling_rate = min(1.0, math.floor(batch / size * 1e6) / 1e6)
            return {"generations": planned, "sampling_rate": sampling_rate}
    raise ConfigError(
        f"max_metric_calls: {max_metric_calls} is too few for DP-ES: one generation scores population "
        f"{population} candidates on at least {MIN_EXPECTED_BATCH} expected records each"
        + (", plus as many for the final selection or estimate" if final else "")
        + f" ({smallest} calls); raise max_metric_calls to at least {smallest}, or lower population "
        f"(population=2 needs {2 * MIN_EXPECTED_BATCH * (1 + final)})"
    )


def _records(data: Any, name: str) -> list[Any]:
    """The instances of a list or of a GEPA DataLoader (``all_ids`` / ``fetch``)."""
    if callable(getattr(data, "all_ids", None)) and callable(getattr(data, "fetch", None)):
        return list(data.fetch(list(data.all_ids())))
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise ConfigError(f"{name}: expected a list of data instances or a GEPA DataLoader, got {type(data).__name__}")
    return list(data)


def _released_candidates(outcome: RunOutcome, score: AdapterScore) -> list[dict[str, str]]:
    """The seed, the released prompt's ancestors by generation (public texts), the release last."""
    released = outcome.result.prompt
    seed = score.seed_prompt
    ancestors = sorted(outcome.result.lineage[1:], key=lambda c: int(c.get("generation", 0)))
    texts: list[str] = [seed]
    for text in [str(c["text"]) for c in ancestors] + [released]:
        if text in texts:
            texts.remove(text)  # each text once, at its latest place (the release stays last)
        texts.append(text)
    if texts[0] != seed:  # the seed was the release itself
        texts.insert(0, seed)
    return [score.candidate(text) for text in texts]


def _expected_calls(outcome: RunOutcome) -> float:
    """Planned expected adapter calls on private records: q N K per generation (N declared or DP-counted)."""
    from dp_textgrad.dp_es.plan import final_evaluations

    optimizer = outcome.optimizer
    search = float(outcome.result.planned_private_evaluations) * optimizer.config.generations
    return search + final_evaluations(optimizer.plan)


def _val_scores(adapter: Any, candidates: Sequence[dict[str, str]], valset: list[Any]) -> list[float]:
    """Each candidate's mean adapter score on ``valset`` (research evaluation, not covered)."""
    scores = []
    for candidate in candidates:
        batch = adapter.evaluate(valset, candidate, capture_traces=False)
        scores.append(float(sum(batch.scores)) / len(valset))
    return scores


__all__ = [
    "COMPLETION_STOP",
    "DEFAULT_TASK_MAX_TOKENS",
    "EMPTY_ACCEPTED",
    "GEPA_REFUSED_ARGUMENTS",
    "AdapterScore",
    "CompletionAdapter",
    "DPGEPAResult",
    "DPGuarantee",
    "EngineTaskLM",
    "WatchedLM",
    "optimize",
    "render_instance",
    "task_lm_from_engine",
]
