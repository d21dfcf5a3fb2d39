"""DP labels for public unlabelled inputs, voted by teachers on a real engine (classification).

The privacy core is :mod:`dp_textgrad.privacy.voting` (keyed partition, GNMax, the charge);
this module is the teachers: each teacher is the task's prompt with a few of its own group's
records as demonstrations, and it votes on every public input with ONE
``engine.score_choices_batch(teacher_prefix, public_records, label_words)`` call (the prefix is
decoded once and kept in the engine's KV cache; every public input after it costs only its own
tokens). The vote is the label with the highest log-probability.

Fixed public rules, each a function of one teacher's group (and public values) only, so that
one record more or less changes one teacher's prompt and votes and no other's (the sensitivity
of :mod:`~dp_textgrad.privacy.voting` holds: one teacher's vote moves per input):

- **which demonstrations** (:func:`teacher_demos`): up to ``max_demos`` records, spread evenly
  over the task's labels (a small model copies the label it saw most), each label's records
  taken in keyed-hash order (HMAC-SHA256 of the record under a key derived from the run's key),
  and shown in keyed-hash order (so the last demonstration's label is not always the same).
  The order is of the records' contents, not of their positions: adding a record to another
  teacher's group, or anywhere in the file, leaves this teacher's choice unchanged.
- **the context** (:func:`teacher_prompt`): a teacher's prefix may take at most
  ``max_prefix_tokens`` engine tokens, a public cap (the engine's context less the longest
  public input and the longest label word). A teacher over the cap drops demonstrations from
  the end of its list until it fits; a teacher left with none abstains on every input (a
  prompt with no demonstrations holds nothing of its group).
- **failures** (:func:`teacher_votes`): an engine error, a result of the wrong shape or a
  non-finite score makes that teacher abstain on every input. The error text may quote private
  records: it is dropped, never shown, logged or kept.

:func:`dp_labels` is the labelling step: partition, charge the plan's event (before the first
engine call), vote, release, and return the answered inputs with their DP labels
(:class:`DPLabelled`). The inputs are public; the labels and the count answered are DP outputs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.privacy.data import PrivateBatch
from dp_textgrad.privacy.validation import positive_int
from dp_textgrad.privacy.voting import LabellingPlan, Vote, label_by_vote, partition_teachers, record_bytes
from dp_textgrad.tasks.base import ClassificationTask, Example
from dp_textgrad.tasks.generation import GenerationTask
from dp_textgrad.tasks.loaders import DEFAULT_ENCODING, MAX_RECORD_CHARS, load_classification_file
from dp_textgrad.tasks.record_format import split_record_format
from dp_textgrad.tasks.text_files import LimitedLines, decoding_errors

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine
    from dp_textgrad.privacy.noise import NoiseSource

DEFAULT_MAX_DEMOS = 4
LEDGER_LABEL = "labelling"
_DEMO_ORDER_DOMAIN = b"dp-textgrad-teacher-demo-order-v1"
_UNLABELLED_EXTENSIONS = (".txt", ".jsonl", ".csv", ".tsv")


# -- public unlabelled inputs ------------------------------------------------------------------


def load_unlabelled(
    path: str | os.PathLike[str],
    column: str | None = None,
    *,
    encoding: str = DEFAULT_ENCODING,
    max_record_chars: int = MAX_RECORD_CHARS,
) -> list[str]:
    """The public unlabelled inputs of a file, in file order, stripped of surrounding white space.

    ``.txt``: one input per line (blank lines skipped; ``column`` must be None). ``.jsonl``,
    ``.csv``, ``.tsv``: the text column ``column`` (default ``"text"``), read with the task
    loaders' readers (an empty or non-text cell is an error naming its line). An empty pool is
    an error naming the file. The pool is public: its inputs may be shown and stored.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"public_inputs: no file at {path}")
    suffix = path.suffix.lower()
    if suffix not in _UNLABELLED_EXTENSIONS:
        raise ValueError(
            f"public_inputs: cannot read {path.name}; use a .txt file (one input per line) or a "
            ".jsonl, .csv or .tsv file with a text column"
        )
    if suffix == ".txt":
        if column is not None:
            raise ValueError(f"column: {path.name} is a .txt file (one input per line); it has no columns")
        with path.open(encoding=encoding) as handle, decoding_errors(path, encoding):
            inputs = [line.strip() for line in LimitedLines(handle, path, max_record_chars)]
        inputs = [text for text in inputs if text]
    else:
        if not _has_content(path):
            inputs = []
        else:
            # The loaders' reader for labelled files, with the text column as its own label: the
            # same parsing, limits and error messages (line numbers, never text).
            column = "text" if column is None else column
            examples = load_classification_file(
                path,
                text_column=column,
                label_column=column,
                warn_imbalance=False,
                encoding=encoding,
                max_record_chars=max_record_chars,
            )
            inputs = [example.text for example in examples]
    if not inputs:
        raise ValueError(
            f"public_inputs: {path} holds no inputs; give at least one public unlabelled input "
            "(one per line in a .txt file, or one per row of the text column)"
        )
    return inputs


def _has_content(path: Path) -> bool:
    with path.open("rb") as handle:
        while chunk := handle.read(65_536):
            if chunk.strip():
                return True
    return False


# -- teachers ------------------------------------------------------------------------------------


def _order_key(key: bytes | None) -> bytes:
    """The key of the demonstration order, derived from the run's partition key (None: unkeyed)."""
    if key is None:
        return b""
    return hmac.new(key, _DEMO_ORDER_DOMAIN, hashlib.sha256).digest()


def _demo_rank(record: Example, order_key: bytes) -> bytes:
    data = record_bytes(record)
    if order_key:
        return hmac.new(order_key, data, hashlib.sha256).digest()
    return hashlib.sha256(_DEMO_ORDER_DOMAIN + data).digest()


def teacher_demos(
    task: ClassificationTask | GenerationTask, group: PrivateBatch[Example], max_demos: int, key: bytes | None = None
) -> list[Example]:
    """The demonstrations of one teacher: up to ``max_demos`` of its records, spread evenly over
    ``task.labels`` (round robin in label order, each label's records in keyed-hash order), shown
    in keyed-hash order; for a generation task (no labels), its first records in keyed-hash
    order. A function of the group's records (a set) and ``key`` alone.
    Call only from a DP mechanism (it reads private records)."""
    max_demos = positive_int(max_demos, "max_demos")
    order_key = _order_key(key)
    ranked = sorted(((_demo_rank(rec.unwrap(), order_key), rec.unwrap()) for rec in group), key=lambda p: p[0])
    if not task.labels:  # a generation task: no labels to balance, the first records in keyed-hash order
        return [record for _, record in ranked[:max_demos]]
    queues: dict[str, list[tuple[bytes, Example]]] = {label: [] for label in task.labels}
    for rank, record in ranked:
        if record.label in queues:
            queues[record.label].append((rank, record))
    chosen: list[tuple[bytes, Example]] = []
    while len(chosen) < max_demos and any(queues.values()):
        for label in task.labels:
            if queues[label] and len(chosen) < max_demos:
                chosen.append(queues[label].pop(0))
    return [record for _, record in sorted(chosen, key=lambda p: p[0])]


def compose_prompt(task: ClassificationTask | GenerationTask, prompt: str, demos: Sequence[Example]) -> str:
    """``prompt`` followed by ``demos`` rendered as demonstrations, blank lines between. A
    generation prompt's own record format is left out: teachers read records and demonstrations
    in the task's ``record_template``, as their prefixes are rendered."""
    if getattr(task, "kind", "classify") == "generate":
        prompt = split_record_format(prompt)[0]
    parts = [prompt.strip()] if prompt.strip() else []
    parts += [task.render_demo(example) for example in demos]
    return "\n\n".join(parts)


def teacher_prompt(
    task: ClassificationTask | GenerationTask,
    group: PrivateBatch[Example],
    prompt: str,
    max_demos: int,
    *,
    key: bytes | None = None,
    count_tokens: Callable[[str], int] | None = None,
    max_prefix_tokens: int | None = None,
) -> str | None:
    """The prompt of one teacher (its group's :func:`teacher_demos` after ``prompt``), or None:
    the teacher abstains.

    With ``max_prefix_tokens`` (a public cap) and ``count_tokens`` (the engine's tokenizer), a
    prompt whose prefix (``task.render_prefix``) is over the cap drops demonstrations from the
    end until it fits; with none left the teacher abstains. A group with no records abstains.
    Call only from a DP mechanism (it reads private records).
    """
    demos = teacher_demos(task, group, max_demos, key)
    if max_prefix_tokens is not None:
        if count_tokens is None:
            raise ValueError("count_tokens: a token cap needs the engine's token counter")
        while demos and count_tokens(task.render_prefix(compose_prompt(task, prompt, demos))) > max_prefix_tokens:
            demos = demos[:-1]
    if not demos:
        return None
    return compose_prompt(task, prompt, demos)


def token_counter(engine: Engine) -> Callable[[str], int]:
    """The engine's token counter (the preflight's length tools): public caps on prompts use it."""
    from dp_textgrad.dp_es.preflight import length_tools

    return length_tools(engine)[0]


def prefix_token_cap(engine: Engine, task: ClassificationTask, public_inputs: Sequence[str], prompt: str) -> int | None:
    """The public cap on a teacher's prefix: the engine's context less the longest rendered public
    input, the longest label word (+1) and a BOS token; None for an engine that does not know its
    context (an API: its errors then make a teacher abstain). Raises ``ValueError`` (public values
    only, before any charge) when ``prompt`` alone leaves no room for a demonstration."""
    context = getattr(engine, "context_tokens", None)
    if context is None:
        return None
    count = token_counter(engine)
    longest_input = max(count(task.render_record(text)) for text in public_inputs)
    longest_label = max(count(task.verbalizers[label]) for label in task.labels)
    cap = int(context) - longest_input - (longest_label + 1) - 1
    base = count(task.render_prefix(prompt)) if prompt.strip() else 0
    if cap <= base:
        raise ValueError(
            f"public_inputs: the prompt ({base} tokens) and the longest public input ({longest_input} tokens) "
            f"leave no room for demonstrations in the engine's context ({context} tokens); shorten the "
            "prompt or the public inputs, or raise the engine's context (n_ctx)"
        )
    return cap


def teacher_votes(
    engine: Engine,
    task: ClassificationTask,
    partition: Any,
    public_inputs: Sequence[str],
    prompt: str,
    max_demos: int,
    *,
    key: bytes | None = None,
    max_prefix_tokens: int | None = None,
) -> Callable[[PrivateBatch[Example]], list[Vote]]:
    """The ``vote`` callable of :func:`~dp_textgrad.privacy.voting.label_by_vote`: per teacher, one
    ``engine.score_choices_batch(teacher_prefix, [task.render_record(x) for x in public_inputs],
    label_words)`` call; the vote on each input is the label of highest log-probability.

    A teacher without a prompt (:func:`teacher_prompt` returns None), or whose call raises or
    returns scores of the wrong shape or not finite, abstains on every input (the same rule for
    every teacher). The error is dropped: its text may quote the teacher's records.
    ``partition`` is accepted for the caller's symmetry (the votes need only each group).

    The engine's scores for one call must depend on that call's text alone, not on what it
    scored before (true of the llama.cpp engine: its cached and saved prefixes give the same
    numbers as a fresh decode), so that a teacher's votes are a function of its own group.
    The engine's usage and time while the teachers vote depend on the private records: they
    are private-phase usage (operator-only), like the scorer's.
    """
    del partition  # label_by_vote hands each group to the callable
    max_demos = positive_int(max_demos, "max_demos")
    suffixes = [task.render_record(text) for text in public_inputs]
    choices = [task.verbalizers[label] for label in task.labels]
    queries = len(suffixes)
    count = token_counter(engine) if max_prefix_tokens is not None else None

    def vote(group: PrivateBatch[Example]) -> list[Vote]:
        abstain: list[Vote] = [None] * queries
        text = teacher_prompt(
            task, group, prompt, max_demos, key=key, count_tokens=count, max_prefix_tokens=max_prefix_tokens
        )
        if text is None:
            return abstain
        try:
            scores = np.asarray(engine.score_choices_batch(task.render_prefix(text), suffixes, choices), dtype=float)
        except Exception:  # noqa: BLE001 - the teacher abstains; the error text may quote its records
            return abstain
        if scores.shape != (queries, len(choices)) or not np.all(np.isfinite(scores)):
            return abstain
        return [int(i) for i in np.argmax(scores, axis=1)]

    return vote


# -- the labelling step -------------------------------------------------------------------------


@dataclass(frozen=True)
class DPLabelled:
    """What the labelling step releases: public inputs with DP labels.

    ``examples``: the answered inputs with their labels (inputs public, labels DP outputs), in
    input order. ``labels``: per input, the label or None (confident GNMax did not answer).
    ``answered``: how many inputs got a label (a function of the DP outputs only). ``metadata``:
    the mechanism's public parameters, the queries, teachers and demonstrations per teacher.
    """

    examples: tuple[Example, ...]
    labels: tuple[str | None, ...]
    answered: int
    queries: int
    metadata: dict[str, Any] = field(default_factory=dict)


def checked_inputs(public_inputs: Sequence[str], queries: int) -> list[str]:
    """The public inputs of a teacher vote as texts, checked before any charge: at least one,
    each with text, as many as the plan asks (``queries``)."""
    inputs = [str(text) for text in public_inputs]
    if not inputs:
        raise ValueError("public_inputs: give at least one public unlabelled input")
    if any(not text.strip() for text in inputs):
        raise ValueError("public_inputs: every public input must have text")
    if queries != len(inputs):
        raise ValueError(f"plan: planned for {queries} public inputs, got {len(inputs)}")
    return inputs


def dp_labels(
    task: ClassificationTask,
    engine: Engine,
    public_inputs: Sequence[str],
    plan: LabellingPlan,
    ledger: Any,
    noise: NoiseSource,
    key: bytes,
    prompt: str | None = None,
    max_demos: int = DEFAULT_MAX_DEMOS,
    *,
    label: str = LEDGER_LABEL,
) -> DPLabelled:
    """DP labels for ``public_inputs`` by a noisy vote of ``plan.teachers`` teachers.

    Checks public values first (the plan matches the task and the inputs; the prompt leaves room
    in the engine's context), then splits ``task.private_train`` by ``key`` (32 random bytes per
    run, ``secrets.token_bytes(32)``, operator-only: the caller keeps it), charges
    ``plan.event`` to ``ledger`` as one entry (before the first engine call), lets every teacher
    vote (:func:`teacher_votes`) and releases the labels through ``plan.mechanism``. ``prompt``
    defaults to the task's seed prompt.
    """
    if not isinstance(task, ClassificationTask):
        raise TypeError("task: DP labels by a teacher vote need a classification task")
    inputs = checked_inputs(public_inputs, plan.queries)
    if plan.mechanism.num_labels != len(task.labels):
        raise ValueError(
            f"plan: the mechanism votes over {plan.mechanism.num_labels} labels, the task has {len(task.labels)}"
        )
    max_demos = positive_int(max_demos, "max_demos")
    prompt = task.seed_prompt if prompt is None else prompt
    cap = prefix_token_cap(engine, task, inputs, prompt)
    partition = partition_teachers(task.private_train, key, plan.teachers)
    vote = teacher_votes(engine, task, partition, inputs, prompt, max_demos, key=key, max_prefix_tokens=cap)
    released = label_by_vote(ledger, plan.mechanism, partition, vote, plan.queries, noise, label)
    labels = tuple(None if index is None else task.labels[index] for index in released)
    examples = tuple(Example(text, name) for text, name in zip(inputs, labels) if name is not None)
    metadata = {
        **plan.mechanism.metadata(),
        "queries": plan.queries,
        "teachers": plan.teachers,
        "max_demos": max_demos,
        "answered": len(examples),
        "ledger_label": label,
    }
    return DPLabelled(examples=examples, labels=labels, answered=len(examples), queries=plan.queries, metadata=metadata)


__all__ = [
    "DEFAULT_MAX_DEMOS",
    "DPLabelled",
    "checked_inputs",
    "compose_prompt",
    "dp_labels",
    "load_unlabelled",
    "prefix_token_cap",
    "teacher_demos",
    "teacher_prompt",
    "teacher_votes",
    "token_counter",
]
