"""The labelling phase of a run (``dp.labelling``): DP labels for the task's public inputs, then the search.

A run with ``DPESConfig.labelling`` spends one ledger entry before its first generation: the
teachers' noisy vote of :mod:`dp_textgrad.dp_es.labelling` on the first ``queries`` public inputs
(``task.public_inputs``). The answered inputs with their DP labels join the task's public
examples, so the structured start and the demonstration operators build prompts from them
(post-processing of the release). The phase is planned with the search
(:meth:`~dp_textgrad.dp_es.plan.RunPlan.stage_event`: one stage, the two composed by the
ledger's accountants) and released in ``labels.json``.

The teacher partition's key is 32 random bytes (``secrets``) used once and kept nowhere: a
resumed run never labels again (the ledger holds the phase's charge; the labels are read back
from ``labels.json``), so nothing needs it afterwards. Only a run with the INSECURE
``insecure_noise_seed`` derives the key from that seed (reproducible research and tests).
"""

from __future__ import annotations

import hashlib
import secrets
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad import runs
from dp_textgrad.dp_es.config import ConfigError, DPESConfig, LabellingConfig
from dp_textgrad.dp_es.dp_answers import dp_answers
from dp_textgrad.dp_es.labelling import LEDGER_LABEL, DPLabelled, dp_labels
from dp_textgrad.privacy.token_voting import AnsweringPlan
from dp_textgrad.tasks.base import ClassificationTask, Example, Task
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask

if TYPE_CHECKING:
    from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
    from dp_textgrad.privacy.noise import NoiseSource
    from dp_textgrad.privacy.voting import LabellingPlan

LABELS_NAME = "labels.json"
USAGE_NAME = "labelling_usage.json"  # under operator/: the teachers' real usage and time (private)
CHANNEL = "labelling"
_INSECURE_KEY_DOMAIN = b"dp-textgrad-insecure-teacher-partition-key-v1"


def charge_index(ledger: PrivacyLedger | None) -> int | None:
    """The ledger index of the labelling phase's charge, or None (not charged, or no ledger yet)."""
    return next((e.index for e in (ledger.entries if ledger is not None else ()) if e.label == LEDGER_LABEL), None)


def check_task(config: DPESConfig, task: Task) -> None:
    """Refuse, before any charge (the count of N's included), a labelling phase this task cannot
    have: not a classification task, or fewer public inputs than the phase labels."""
    settings = config.labelling
    if settings is None:
        return
    if not isinstance(task, ClassificationTask) and answering_view(task) is None:
        raise ConfigError(
            "labelling: teachers vote labels of a classification task or answers of a generation task; "
            f"{type(task).__name__} is neither (remove dp.labelling)"
        )
    try:  # its checks of the pool and of the keys (N only sets the teachers)
        settings.resolved(len(getattr(task, "public_inputs", ())), 1, generation_tokens=_generation_tokens(task))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def answering_view(task: Any) -> GenerationTask | None:
    """The generation task the teachers of DP answers work on: the task itself, the teachers' view
    a task carries (``answering``: a DSPy program's predictor), or None (a classification task)."""
    if isinstance(task, GenerationTask):
        return task
    view = getattr(task, "answering", None)
    return view if isinstance(view, GenerationTask) else None


def _generation_tokens(task: Task) -> int | None:
    view = answering_view(task)
    return int(view.max_new_tokens) if view is not None else None


def check_engine(config: DPESConfig, engine: Any, task: Task | None = None) -> None:
    """Refuse, before any charge, a labelling phase on an engine that does not declare that its
    scores are independent of its earlier calls (``deterministic_scores``).

    The vote's sensitivity assumes that a teacher's vote depends on its own group of records
    alone. An engine whose answer can depend on what it scored before (a server that caches
    prompt prefixes across requests or batches them together, where floating-point results
    follow the batch) would let one record move several teachers' votes. The local llama.cpp
    engine declares the property and its tests check it bit for bit."""
    if config.labelling is None:
        return
    if bool(getattr(engine, "deterministic_scores", False)):
        if config.labelling.answers or answering_view(task) is not None:
            _check_token_views(engine, config.labelling.vote)
        return
    raise ConfigError(
        f"labelling: the engine {type(engine).__name__} does not declare that its scores are independent of "
        "its earlier calls (deterministic_scores), and a teacher's vote must depend on its own records only "
        "(a server's prefix cache or batching could couple teachers); run the labelling phase on the local "
        "llama.cpp engine (engine.kind: llama_cpp in a run file, DPES(engine=LlamaCppEngine()) in DSPy), or "
        "remove dp.labelling"
    )


def _check_token_views(engine: Any, vote: str = "token") -> None:
    """The token vote asks the engine for its next-token candidates and the input's tokens; the
    span vote for the input's tokens only."""
    from dp_textgrad.engines.base import Engine

    for name in ("top_next_pieces", "text_pieces") if vote == "token" else ("text_pieces",):
        method = getattr(type(engine), name, None)
        if method is None or method is getattr(Engine, name, None):
            what = "next tokens" if name == "top_next_pieces" else "a text's tokens"
            raise ConfigError(
                f"labelling: DP answers are voted over tokens and the engine {type(engine).__name__} cannot "
                f"list {what} ({name}); run the labelling phase on the local llama.cpp engine "
                "(engine.kind: llama_cpp in a run file, DPES(engine=LlamaCppEngine()) in DSPy), or remove "
                "dp.labelling"
            )


def describe_answers(settings: LabellingConfig) -> str:
    """The answering phase of a generation task in one clause, from its public settings (the
    console's start and ``budget`` print it)."""
    if settings.vote == "span":
        return (
            f"{settings.queries} public inputs answered by one noisy vote each (GNMax over the input's spans of at "
            f"most {settings.max_answer_tokens} tokens) of {settings.teachers} teachers, each writing its answer "
            f"with up to {settings.max_demos} private records of its own from a {settings.sampling_rate:.3g} "
            "subsample per demonstration; one charged vote per answer"
        )
    if settings.synthetic_inputs is not None:
        what = f"{settings.queries} demonstrations generated whole, input then answer,"
        tokens = f"{settings.max_input_tokens} + {settings.max_answer_tokens}"
    else:
        what = f"{settings.queries} public inputs answered"
        tokens = f"{settings.max_answer_tokens}"
    copied = " and the input's own" if settings.copy_input else ""
    return (
        f"{what} token by token by a noisy vote (GNMax over the public model's top {settings.candidates} "
        f"tokens{copied}) of {settings.teachers} teachers, each showing up to {settings.max_demos} private records "
        f"of its own from a {settings.sampling_rate:.3g} subsample per demonstration; at most {tokens} tokens "
        "each, every one charged"
    )


def resolved_config(config: DPESConfig, task: Task) -> DPESConfig:
    """``config`` with its labelling phase's ``queries`` and ``teachers`` filled in from public
    values (the number of public inputs, the declared or counted N); unchanged without a phase or
    when already filled in (a resumed run, whose phase may be done: then no public input is needed).
    The caller has checked the task (:func:`check_task`, before any charge)."""
    settings = config.labelling
    if settings is None:
        return config
    filled = settings.queries is not None and settings.teachers is not None and settings.max_demos is not None
    if answering_view(task) is not None:
        filled = filled and settings.max_answer_tokens is not None and settings.sampling_rate is not None
    if filled:
        return config
    size = config.public_dataset_size
    if size is None:
        raise ConfigError("labelling: resolve the configuration's N (declared, or the DP count) first")
    inputs = len(getattr(task, "public_inputs", ()))
    try:
        resolved = settings.resolved(inputs, size, generation_tokens=_generation_tokens(task))
        return config.model_copy(update={"labelling": resolved})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def noise_warning(sigma: float | None, teachers: int | None) -> str | None:
    """A public warning when the vote's noise swamps the votes: sigma at least half the number of
    teachers (even a unanimous vote then loses to the noise on another label often), else None."""
    if sigma is None or teachers is None or sigma < teachers / 2:
        return None
    return (
        f"the vote's noise (sigma {sigma:.3g} votes) is large against {teachers} teachers: many DP labels will "
        "be noise; give a larger labelling.epsilon_share, fewer labelling.queries or more teachers (more "
        "private records)"
    )


def partition_key(noise: NoiseSource) -> bytes:
    """The teacher partition's key: fresh random bytes, or (INSECURE seeded noise only) a function
    of the seed, so that a seeded run is reproducible."""
    seed = noise.replay_secret()
    if seed is None:
        return secrets.token_bytes(32)
    return hashlib.sha256(_INSECURE_KEY_DOMAIN + seed).digest()


def run_labelling(
    task: Any,
    engine: Any,
    plan: LabellingPlan | AnsweringPlan,
    ledger: PrivacyLedger,
    noise: NoiseSource,
    settings: LabellingConfig,
    epsilons: dict[str, float],
) -> DPLabelled:
    """The phase itself: the first ``plan.queries`` public inputs, labelled by
    :func:`~dp_textgrad.dp_es.labelling.dp_labels` (which checks public values, then charges,
    then lets the teachers vote). ``epsilons``: the phase's own bounds (public, for the record)."""
    if settings.max_demos is None:
        raise ConfigError("labelling.max_demos: not resolved yet (resolved_config fills it in for the task)")
    synthetic = settings.synthetic_inputs is not None  # demonstrations generated whole: no public input
    inputs = [] if synthetic else list(task.public_inputs)
    if not synthetic and len(inputs) < plan.queries:
        raise ConfigError(
            f"task.public_inputs: the plan labels {plan.queries} public inputs and the task has {len(inputs)}; "
            "give more public inputs or lower dp.labelling.queries"
        )
    if isinstance(plan, AnsweringPlan):
        view = answering_view(task)
        if view is None:
            raise ConfigError("labelling: DP answers need a generation task (or a task's answering view)")
        labelled = dp_answers(
            view,
            engine,
            inputs[: plan.queries],
            plan,
            ledger,
            noise.for_charge(LEDGER_LABEL),
            partition_key(noise),
            max_demos=settings.max_demos,
            candidates=settings.candidates,
            copy_input=settings.copy_input,
            max_input_tokens=settings.max_input_tokens if synthetic else None,
            answer_filter=settings.answer_filter,
            vote=settings.vote,
            max_answer_tokens=settings.max_answer_tokens,
        )
    else:
        labelled = dp_labels(
            task,
            engine,
            inputs[: plan.queries],
            plan,
            ledger,
            noise.for_charge(LEDGER_LABEL),
            partition_key(noise),
            max_demos=settings.max_demos,
        )
    metadata = {
        **labelled.metadata,
        "epsilon_share": settings.epsilon_share,
        "epsilon": min(epsilons.values()) if epsilons else None,
        "epsilons": dict(epsilons),
        "inputs": inputs[: plan.queries],
    }
    return DPLabelled(labelled.examples, labelled.labels, labelled.answered, labelled.queries, metadata)


def labels_payload(labelled: DPLabelled) -> dict[str, Any]:
    """What ``labels.json`` and ``result.json``'s ``labelling`` hold (channel ``labelling``)."""
    return {
        **labelled.metadata,
        "queries": labelled.queries,
        "answered": labelled.answered,
        "labels": list(labelled.labels),
        "examples": [_example_payload(e) for e in labelled.examples],
    }


def _example_payload(example: Example) -> dict[str, Any]:
    if isinstance(example, GenerationExample):  # a DP answer
        return {"text": example.text, "reference": example.reference}
    return {"text": example.text, "label": example.label}


def _example_of(entry: dict[str, Any]) -> Example:
    if "reference" in entry:
        return GenerationExample(text=str(entry["text"]), reference=str(entry["reference"]))
    return Example(str(entry["text"]), str(entry["label"]))


def write_labels(run_dir: runs.RunDir | None, labelled: DPLabelled) -> None:
    """Write the release (atomically) into the run directory, if there is one."""
    if run_dir is None:
        return
    runs.write_released_json(run_dir.path, LABELS_NAME, CHANNEL, labels_payload(labelled))
    runs.stamp_released(run_dir.path)  # the labelling phase's end must not be timed by any released file


def read_labels(run_dir: runs.RunDir | None) -> DPLabelled | None:
    """The labels a run released (resume), or None with a warning when the phase was charged but
    its labels never reached the disk (stopped between the two): the search then goes on without
    them, and the charge stays in the ledger."""
    path = None if run_dir is None else Path(run_dir.path) / LABELS_NAME
    if path is None or not path.is_file():
        warnings.warn(
            "labelling: the labelling phase was charged but its labels were not saved (the run stopped in "
            "between); the search continues without them and the charge stays in the ledger",
            stacklevel=3,
        )
        return None
    data = runs.read_json(path)
    examples = tuple(_example_of(e) for e in data.get("examples", []))
    labels = tuple(None if v is None else str(v) for v in data.get("labels", []))
    metadata = {k: v for k, v in data.items() if k not in ("examples", "labels")}
    return DPLabelled(examples, labels, int(data["answered"]), int(data["queries"]), metadata)


__all__ = [
    "LABELS_NAME",
    "answering_view",
    "charge_index",
    "check_task",
    "describe_answers",
    "labels_payload",
    "noise_warning",
    "partition_key",
    "read_labels",
    "resolved_config",
    "run_labelling",
    "write_labels",
]
