"""GEPA's call shape, run by DP-ES: :func:`optimize` takes what ``gepa.optimize`` takes (a seed
candidate, a private ``trainset``, the user's ``GEPAAdapter``) and releases one component with an
(epsilon, delta) guarantee.

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
when :func:`optimize` builds GEPA's default adapter.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad.dp_es.config import DEFAULT_EXPECTED_BATCH, ConfigError, DPESConfig, config_with
from dp_textgrad.integrations.engine_checks import refuse_disk_cache
from dp_textgrad.integrations.guarantee import DPGuarantee

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
#: send per-record values to loggers, trackers and caches.
GEPA_REFUSED_ARGUMENTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "reflection_lm": ((None,), _READS_TRACES),
    "reflection_lm_kwargs": ((None,), _READS_TRACES),
    "reflection_prompt_template": ((None,), _READS_TRACES),
    "reflection_strategy": ((None,), _READS_TRACES),
    "custom_candidate_proposer": ((None,), _READS_TRACES),
    "reflection_minibatch_size": ((None,), _READS_TRACES),
    "batch_sampler": ((None,), _READS_TRACES),
    "module_selector": ((None,), "DP-ES optimizes one component (component=); the others stay fixed"),
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
    "display_progress_bar": ((None, False), _PER_RECORD_OUTPUT),
    "cache_evaluation": ((None, False), _PER_RECORD_OUTPUT),
    "use_cloudpickle": (
        (None, False),
        "GEPA checkpoints pickle its state, private scores included; a DP-ES run directory holds released "
        "values (and operator/ files)",
    ),
    "raise_on_exception": (
        (None, True),
        "a DP-ES run always stops on a machinery fault (with a message quoting no record); GEPA's "
        "graceful stop would make the schedule depend on private records",
    ),
}

_MAX_GENERATIONS = 10_000  # DPESConfig's own bound on generations

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
    component: str
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


def task_lm_from_engine(engine: Any, *, max_tokens: int = 256, temperature: float = 0.0) -> Callable[..., str]:
    """A GEPA ``task_lm`` callable (``messages -> str``) served by a dp-textgrad engine.

    System messages become the engine's system prompt, the other messages' contents (joined by
    blank lines) its prompt; greedy by default. Use it with :func:`optimize`'s default adapter
    (``task_lm=task_lm_from_engine(OpenAIEngine(...))``) or inside your own adapter. The engine
    counts its usage: when it scores private records, that count is OPERATOR-ONLY.
    """
    if not callable(getattr(engine, "generate", None)):
        raise TypeError(f"engine: expected a dp-textgrad engine with generate(), got {type(engine).__name__}")
    refuse_disk_cache(engine, "engine")

    def complete(messages: Sequence[Mapping[str, Any]]) -> str:
        system = [str(m.get("content", "")) for m in messages if m.get("role") == "system"]
        rest = [str(m.get("content", "")) for m in messages if m.get("role") != "system"]
        return str(
            engine.generate(
                "\n\n".join(rest),
                system_prompt="\n\n".join(system) if system else None,
                temperature=temperature,
                max_tokens=max_tokens,
            )
        )

    return complete


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
    adapter stops the run (a machinery fault, GEPA's own contract), quoting no record.
    """

    def __init__(self, adapter: Any, seed_candidate: Mapping[str, str], component: str, perfect_score: float) -> None:
        self.adapter = adapter
        self.seed_candidate = dict(seed_candidate)
        self.component = component
        self.perfect_score = perfect_score

    def candidate(self, prompt: str) -> dict[str, str]:
        """The full candidate with ``component`` set to ``prompt``."""
        return {**self.seed_candidate, self.component: prompt}

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
    render_example: Callable[[Any], str] | None = None,
    engine: Any = None,
    max_metric_calls: int | None = None,
    perfect_score: float = 1.0,
    task_description: str | None = None,
    threads: int = 1,
    run_dir: str | Path | None = None,
    runs_root: str | Path = "runs",
    observers: Iterable[Any] = (),
    **settings: Any,
) -> DPGEPAResult:
    """Optimize one component of ``seed_candidate`` on the private ``trainset`` with DP-ES, GEPA's call shape.

    Before (GEPA, not private: reflection copies trainset text into the candidate)::

        result = gepa.optimize(seed_candidate={"instructions": "..."}, trainset=private, adapter=my_adapter,
                               reflection_lm="openai/gpt-4.1", max_metric_calls=2000)

    After (a released candidate with an (epsilon, delta) guarantee)::

        from dp_textgrad.integrations import gepa as dp_gepa
        result = dp_gepa.optimize(seed_candidate={"instructions": "..."}, trainset=private, adapter=my_adapter,
                                  epsilon=4.0, dataset_size=len(private), max_metric_calls=20_000)
        result.best_candidate, result.dp_guarantee

    ``trainset``: the private records (a list, or a GEPA ``DataLoader``). They reach only the
    DP scorer: ``adapter.evaluate([record], candidate, capture_traces=False)``, one record per
    call, of which only ``scores[0]`` is read. Scores are divided by ``perfect_score`` (GEPA's
    name for the best score) and clipped to [0, 1]. Your adapter must keep the rule every DP
    scorer keeps: write nothing computed from a record anywhere (no logs, caches, trackers).
    ``valset``: research evaluation of the candidates (``val_aggregate_scores``), NOT covered.
    ``adapter``: your ``GEPAAdapter`` (``make_reflective_dataset`` and ``propose_new_texts`` are
    never called). Without one, ``task_lm`` (a callable ``messages -> str``, e.g.
    :func:`task_lm_from_engine`) and ``evaluator`` build GEPA's ``DefaultAdapter``: the
    component is the system message, the record's ``input`` the user message, the score
    ``evaluator(record, response).score`` (default: 1 when the record's ``answer`` is in the
    response). A model string for ``task_lm`` is refused: GEPA's litellm wrapper logs warnings
    about individual responses and litellm's global callbacks and cache may record them.

    ``component``: the component to optimize; needed when the candidate has several (the others
    stay fixed). ``public_trainset``: public instances, the only source of demonstrations (each
    rendered by ``render_example``, default :func:`render_instance`); the first is also the
    public preflight probe of the adapter. ``engine``: the dp-textgrad engine of DP-ES's
    mutation operators (an instruction-following one enables LLM rewrites and critiques that
    see public text and DP statistics only); default: no model, rule edits and public
    demonstrations only. ``task_description``: public text telling the rewrite model what the
    component is for. ``threads``: records scored at once (your adapter must be thread-safe).

    ``max_metric_calls``: mapped to ``generations`` so that the EXPECTED number of adapter calls
    on private records (Poisson subsamples: population x q N per generation, plus the final
    selection when charged) stays within it; the realised count is random and private. It
    needs a public expected batch q N: a declared ``dataset_size`` or the default sampling rate
    (about 150 records per generation); refused when one generation does not fit, or with
    ``generations``. ``**settings``: :class:`~dp_textgrad.dp_es.config.DPESConfig` fields
    (``generations``, ``population``, ``dataset_size``, ``selection``, ``seed``, ...).
    ``run_dir``, ``runs_root``, ``observers``: as for :func:`dp_textgrad.optimize`.

    Refused by name, with why: GEPA's reflection, selection, merge, stop-rule, logging and
    tracking arguments (:data:`GEPA_REFUSED_ARGUMENTS`; a value that asks for nothing, such as
    ``use_merge=False``, is accepted), ``mode='unsafe'`` and ``privacy='off'``.
    """
    settings = dict(settings)
    _refuse_gepa_arguments(settings)
    for name, (value, why) in _REFUSED_SETTINGS.items():
        if settings.get(name) == value:
            raise ConfigError(f"{name}: refused: {why}")
    chosen = _component(seed_candidate, component)
    if not (isinstance(perfect_score, (int, float)) and math.isfinite(perfect_score) and perfect_score > 0):
        raise ConfigError(
            f"perfect_score: must be a finite number > 0 (the best score of your metric), got {perfect_score!r}"
        )
    active = _adapter(adapter, task_lm, evaluator)
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
        settings["generations"] = _generations_for(max_metric_calls, config)

    from dp_textgrad import front
    from dp_textgrad.privacy.data import PrivateDataset
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

    def probe(prompt: str) -> None:
        if public:  # a public instance only: the probe's errors may be shown as they are
            score.check(prompt, public[0])

    task: ScoredTask = ScoredTask(
        name=f"gepa:{chosen}",
        description=task_description
        or f"Improve the text of the component '{chosen}' of a system: the system follows it on every input.",
        private_train=PrivateDataset(private_records),
        test=[],
        score_record=score,
        public_examples=examples,
        render_example=render,
        seed_prompt=seed_candidate[chosen],
        threads=threads,
        probe=probe,
    )
    outcome = front.optimize(
        task,
        engine if engine is not None else _RuleEditsOnly(),
        run_dir=run_dir,
        runs_root=runs_root,
        observers=observers,
        evaluate=False,
        task_name=task.name,
        epsilon=epsilon,
        delta=delta,
        **settings,
    )
    candidates = _released_candidates(outcome, score)
    return DPGEPAResult(
        candidates=candidates,
        best_idx=len(candidates) - 1,
        component=chosen,
        dp_guarantee=DPGuarantee.of_run(outcome, chosen),
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
            if not any(
                value is accepted or (type(value) is type(accepted) and value == accepted) for accepted in harmless
            ):
                raise ConfigError(f"{name}: refused: {why}")


def _component(seed_candidate: Any, component: str | None) -> str:
    if not isinstance(seed_candidate, Mapping) or not seed_candidate:
        raise ConfigError("seed_candidate: must be a non-empty dict of component name -> text")
    for name, text in seed_candidate.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise ConfigError(f"seed_candidate: component {name!r} must map a str name to str text")
    names = list(seed_candidate)
    if component is None:
        if len(names) > 1:
            raise ConfigError(
                f"component: the seed candidate has {len(names)} components ({', '.join(names)}); "
                "DP-ES optimizes one per run: name it with component=, the others stay fixed"
            )
        component = names[0]
    elif component not in seed_candidate:
        raise ConfigError(f"component: {component!r} is not in seed_candidate (components: {', '.join(names)})")
    if not seed_candidate[component].strip():
        raise ConfigError(f"seed_candidate: component {component!r} is empty; DP-ES starts from a non-empty text")
    return component


def _adapter(adapter: Any, task_lm: Any, evaluator: Any) -> Any:
    """The user's adapter, or GEPA's DefaultAdapter around a callable ``task_lm``."""
    if adapter is not None:
        if task_lm is not None or evaluator is not None:
            raise ConfigError(
                "task_lm: with an adapter, the adapter runs the task; remove task_lm and evaluator "
                "(as gepa.optimize requires)"
            )
        if not callable(getattr(adapter, "evaluate", None)):
            raise ConfigError(
                f"adapter: expected a GEPAAdapter with evaluate(batch, candidate, capture_traces), "
                f"got {type(adapter).__name__}"
            )
        return adapter
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
    from gepa.adapters.default_adapter.default_adapter import DefaultAdapter

    return DefaultAdapter(model=task_lm, evaluator=evaluator)


def _generations_for(max_metric_calls: Any, config: DPESConfig) -> int:
    """The number of generations whose EXPECTED private adapter calls fit ``max_metric_calls``."""
    if isinstance(max_metric_calls, bool) or not isinstance(max_metric_calls, int) or max_metric_calls < 1:
        raise ConfigError(f"max_metric_calls: must be an int >= 1, got {max_metric_calls!r}")
    size, rate = config.dataset_size, config.sampling_rate
    if rate == "auto":  # the planner needs the generations this function derives: a circle
        raise ConfigError(
            "sampling_rate: 'auto' plans q for a given number of generations; with max_metric_calls give a "
            "number for sampling_rate (or give generations instead of max_metric_calls)"
        )
    if size is not None:
        batch = (rate if rate is not None else min(1.0, DEFAULT_EXPECTED_BATCH / size)) * size
    elif rate is None:
        batch = float(DEFAULT_EXPECTED_BATCH)  # q N ~ min(N, 150) with q from the DP count of N
    else:
        raise ConfigError(
            "max_metric_calls: with sampling_rate set and no dataset_size, the expected batch q N is "
            "private; declare dataset_size (a public N) or give generations instead"
        )
    per_generation = config.population * batch
    final = per_generation if config.final_selection != "last" else 0.0
    generations = int((max_metric_calls - final) // per_generation)
    if generations < 1:
        raise ConfigError(
            f"max_metric_calls: {max_metric_calls} cannot pay for one generation: population {config.population} x "
            f"an expected batch of {batch:g} records = {per_generation:g} calls"
            + (f" (plus {final:g} for the final selection)" if final else "")
            + "; raise max_metric_calls, or lower population or sampling_rate (with dataset_size declared)"
        )
    return min(generations, _MAX_GENERATIONS)


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
    seed = score.seed_candidate[score.component]
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
    config = outcome.optimizer.config
    charged_rounds = config.generations + (0 if config.final_selection == "last" else 1)
    return float(outcome.result.planned_private_evaluations) * charged_rounds


def _val_scores(adapter: Any, candidates: Sequence[dict[str, str]], valset: list[Any]) -> list[float]:
    """Each candidate's mean adapter score on ``valset`` (research evaluation, not covered)."""
    scores = []
    for candidate in candidates:
        batch = adapter.evaluate(valset, candidate, capture_traces=False)
        scores.append(float(sum(batch.scores)) / len(valset))
    return scores


__all__ = [
    "GEPA_REFUSED_ARGUMENTS",
    "AdapterScore",
    "DPGEPAResult",
    "DPGuarantee",
    "optimize",
    "render_instance",
    "task_lm_from_engine",
]
