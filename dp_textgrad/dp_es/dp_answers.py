"""DP answers for public unlabelled inputs of a generation task, voted token by token by teachers.

The privacy core is :mod:`dp_textgrad.privacy.token_voting` (subsample, keyed partition, the
per-token GNMax, the one charge); this module is the teachers and the public candidates on a
real engine:

- **a teacher** is the task's prompt with up to ``max_demos`` records of its group as
  demonstrations (:func:`~dp_textgrad.dp_es.labelling.teacher_prompt`: keyed-hash order, a public
  cap on the prefix's tokens), followed by the public input. At each step it scores the public
  candidates after the answer released so far (``engine.score_choices_batch``; the teacher's
  prompt and the input are one prefix, decoded once and kept by the engine) and votes for the
  most likely one. A teacher without a prompt, or whose call fails or returns scores of the
  wrong shape, abstains for the rest of the query (the error text may quote its records: it is
  dropped).
- **the candidates** of a step are public: the ``candidates`` most likely next tokens of the
  public model (the task's prompt and its public demonstrations, if any, then the public input
  and the answer so far: ``engine.top_next_pieces``), the public input's own tokens when
  ``copy_input`` (extraction copies spans of the input), and the end marker (the task's first
  stop string). No private record reaches them.
- **a span vote** (``vote="span"``, for extraction) replaces the steps by one: each teacher
  generates its whole answer and votes for the span of the public input it equals (or for "no
  span"), the candidates being every span of the input up to the token cap
  (:class:`SpanTeacherAnswers`). One GNMax per answer instead of one per token: at the same
  epsilon the noise is about sqrt(max tokens) times smaller, and answers are always spans.
- **the answer** grows by the released token; it is complete when it holds one of the task's
  stop strings (cut there) or after ``max_tokens`` steps. Leading and trailing white space is
  removed; an empty answer gives no demonstration.

:func:`dp_answers` returns the answered inputs as :class:`~dp_textgrad.tasks.generation.GenerationExample`
demonstrations (inputs public, answers DP outputs) in a
:class:`~dp_textgrad.dp_es.labelling.DPLabelled`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.dp_es.labelling import (
    DEFAULT_MAX_DEMOS,
    LEDGER_LABEL,
    DPLabelled,
    checked_inputs,
    teacher_prompt,
    token_counter,
)
from dp_textgrad.privacy.token_voting import AnsweringPlan, answer_by_vote
from dp_textgrad.privacy.validation import positive_int
from dp_textgrad.privacy.voting import TeacherPartition, Vote
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask
from dp_textgrad.tasks.record_format import split_record_format

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine
    from dp_textgrad.privacy.noise import NoiseSource

DEFAULT_CANDIDATES = 16


def end_marker(task: GenerationTask) -> str:
    """The candidate that ends an answer: the task's first stop string (a newline without one)."""
    return task.stop[0] if task.stop else "\n"


def public_prompt(task: GenerationTask, prompt: str, max_demos: int) -> str:
    """The prompt the public model proposes candidates with: ``prompt`` and up to ``max_demos``
    of the task's public examples (public values only), in the task's ``record_template`` (a
    prompt's own record format is left out, as in :func:`labelling.compose_prompt`)."""
    prompt = split_record_format(prompt)[0]
    parts = [prompt.strip()] if prompt.strip() else []
    parts += [task.render_demo(example) for example in task.public_examples[:max_demos]]
    return "\n\n".join(parts)


def answer_prefix_cap(
    engine: Engine,
    task: GenerationTask,
    public_inputs: Sequence[str],
    prompt: str,
    max_tokens: int,
    *,
    input_tokens: int | None = None,
) -> int | None:
    """The public cap on a teacher's prompt (``task.render_prefix``): the engine's context less the
    longest rendered public input (a synthetic one: the template and ``input_tokens``), the
    answer's ``max_tokens`` and a BOS token; None for an engine that does not know its context.
    Raises ``ValueError`` (public values only, before any charge) when ``prompt`` alone leaves no
    room for a demonstration."""
    context = getattr(engine, "context_tokens", None)
    if context is None:
        return None
    count = token_counter(engine)
    if input_tokens is not None:
        longest_input = count(task.render_record("")) + int(input_tokens)
    else:
        longest_input = max(count(task.render_record(text)) for text in public_inputs)
    cap = int(context) - longest_input - int(max_tokens) - 1
    base = count(task.render_prefix(prompt)) if prompt.strip() else 0
    if cap <= base:
        raise ValueError(
            f"public_inputs: the prompt ({base} tokens), the longest public input ({longest_input} tokens) and "
            f"the answer ({max_tokens} tokens) leave no room for demonstrations in the engine's context "
            f"({context} tokens); shorten them, lower dp.labelling.max_answer_tokens, or raise the engine's "
            "context (n_ctx)"
        )
    return cap


class TeacherAnswers:
    """One public input being answered (the :class:`~dp_textgrad.privacy.token_voting.AnswerQuery`
    of :func:`~dp_textgrad.privacy.token_voting.answer_by_vote`)."""

    def __init__(
        self,
        engine: Engine,
        task: GenerationTask,
        text: str,
        teacher_prompts: Sequence[str | None],
        proposal_prompt: str,
        candidates: int,
        copy_input: bool,
    ) -> None:
        self._engine = engine
        self._task = task
        record = task.render_record(text)
        # Each teacher's prompt and the public input form one prefix, which the engine keeps.
        self._prefixes: list[str | None] = [
            None if prompt is None else task.render_prefix(prompt) + record for prompt in teacher_prompts
        ]
        self._public_prefix = task.render_prefix(proposal_prompt) + record
        self._k = candidates
        self._input_pieces = _unique(engine.text_pieces(" " + text)) if copy_input else []
        self._end = end_marker(task)
        self.text = text
        self.ended = False  # whether a released token ended the answer (public: a function of releases)

    def candidates(self, answer: str) -> list[str]:
        proposed = self._engine.top_next_pieces(self._public_prefix, answer, self._k)
        return _unique([*proposed, *self._input_pieces, self._end])

    def votes(self, answer: str, candidates: Sequence[str]) -> list[Vote]:
        return _teacher_votes(self._engine, self._prefixes, answer, candidates)

    def extend(self, answer: str, token: str) -> tuple[str, bool]:
        answer += token
        cuts = [answer.find(stop) for stop in self._task.stop if stop in answer]
        if cuts:
            self.ended = True
            return answer[: min(cuts)], True
        return answer, False


def _teacher_votes(engine: Engine, prefixes: list[str | None], suffix: str, candidates: Sequence[str]) -> list[Vote]:
    """Each teacher's vote: the candidate it scores highest after its prefix and ``suffix``; None
    for a teacher without a prompt. A teacher whose call fails, or returns scores of the wrong
    shape or not finite, abstains, and its prefix is set to None: it abstains for the rest of the
    query (a fixed rule; the error text may quote its records and is dropped)."""
    votes: list[Vote] = []
    for teacher, prefix in enumerate(prefixes):
        if prefix is None:
            votes.append(None)
            continue
        try:
            scores = np.asarray(engine.score_choices_batch(prefix, [suffix], candidates), dtype=float)
        except Exception:  # noqa: BLE001 - the teacher abstains; the error text may quote its records
            scores = None
        if scores is None or scores.shape != (1, len(candidates)) or not np.all(np.isfinite(scores)):
            prefixes[teacher] = None
            votes.append(None)
            continue
        votes.append(int(np.argmax(scores[0])))
    return votes


# Separates a generated input from its answer in the running text of a synthetic demonstration
# (a control character: never a token's text).
INPUT_END = "\x1e"


class SyntheticTeacherAnswers(TeacherAnswers):
    """A demonstration generated whole, when the task has no public inputs (Tang et al.'s full
    synthetic demonstrations): first its input, token by token after the record template's text
    before ``{text}`` (the public model's candidates and the end of the input: no input to copy
    from), until the template's text after ``{text}`` begins or ``max_input_tokens`` steps; then
    its answer, as :class:`TeacherAnswers` does for a public input. The running text is the input,
    :data:`INPUT_END`, then the answer; both parts are DP outputs."""

    def __init__(
        self,
        engine: Engine,
        task: GenerationTask,
        teacher_prompts: Sequence[str | None],
        proposal_prompt: str,
        candidates: int,
        copy_input: bool,
        max_input_tokens: int,
    ) -> None:
        head, tail = task.record_template.split("{text}", 1)
        self._engine, self._task, self._k = engine, task, candidates
        self._copy_input, self._max_input = copy_input, max_input_tokens
        self._teacher_prompts, self._proposal_prompt = list(teacher_prompts), proposal_prompt
        self._input_end = "\n" if tail.startswith("\n") or not tail.strip() else tail.strip()
        self._input_prefixes: list[str | None] = [
            None if prompt is None else task.render_prefix(prompt) + head for prompt in teacher_prompts
        ]
        self._public_input_prefix = task.render_prefix(proposal_prompt) + head
        self._input_steps = 0
        self.text, self.ended = "", False

    def candidates(self, answer: str) -> list[str]:
        if INPUT_END in answer:
            return super().candidates(answer.split(INPUT_END, 1)[1])
        proposed = self._engine.top_next_pieces(self._public_input_prefix, answer, self._k)
        return _unique([*proposed, self._input_end])

    def votes(self, answer: str, candidates: Sequence[str]) -> list[Vote]:
        if INPUT_END in answer:
            return super().votes(answer.split(INPUT_END, 1)[1], candidates)
        return _teacher_votes(self._engine, self._input_prefixes, answer, candidates)

    def extend(self, answer: str, token: str) -> tuple[str, bool]:
        if INPUT_END in answer:
            text, written = answer.split(INPUT_END, 1)
            written, done = super().extend(written, token)
            return text + INPUT_END + written, done
        self._input_steps += 1
        text = answer + token
        ended = self._input_end in text
        if not ended and self._input_steps < self._max_input:
            return text, False
        text = (text.split(self._input_end, 1)[0] if ended else text).strip()
        if not text:
            return "", True  # no input: no demonstration (the steps left are charged and unused)
        # The answer's teachers: each prompt with the generated input (a DP output), as for a public one.
        failed = [prefix is None for prefix in self._input_prefixes]
        TeacherAnswers.__init__(
            self,
            self._engine,
            self._task,
            text,
            [None if gone else p for p, gone in zip(self._teacher_prompts, failed)],
            self._proposal_prompt,
            self._k,
            self._copy_input,
        )
        return text + INPUT_END, False


#: The candidate of a span vote that stands for "no span of the input": a teacher whose answer is
#: not a span votes for it, and when it is released the input gets no demonstration (a control
#: character: never a span's text).
NO_SPAN = "\x1f"


def input_spans(pieces: Sequence[str], max_pieces: int) -> list[str]:
    """The span vote's candidates for one public input: every run of at most ``max_pieces`` of its
    tokens (``pieces``, in order), stripped, that holds a letter or digit, first occurrence kept;
    then :data:`NO_SPAN`. Public: a function of the public input and the public cap."""
    spans: dict[str, None] = {}
    for start in range(len(pieces)):
        for end in range(start + 1, min(len(pieces), start + max_pieces) + 1):
            span = "".join(pieces[start:end]).strip()
            if span and any(c.isalnum() for c in span):
                spans.setdefault(span, None)
    return [*spans, NO_SPAN]


class SpanTeacherAnswers:
    """One public input answered by ONE vote over its spans (``dp.labelling.vote: span``, for
    extraction, whose answers copy a span of the input): each teacher generates its answer
    greedily (its prompt, then the input; up to ``max_tokens`` tokens, stopping at the task's
    stop strings) and votes for the span whose text equals its stripped answer, or for
    :data:`NO_SPAN` when there is none (or when its call fails: the error text, which may quote its
    records, is dropped); a teacher without a prompt abstains. The released candidate
    is the answer (NO_SPAN: none). The candidates are every span of the input of at most
    ``max_tokens`` tokens (:func:`input_spans`), so the vote is one GNMax step over a public set:
    the token vote's mechanism with one step per answer, charged as such.

    Each teacher generates alone (``generate_after_prefix``, one teacher per call): teachers
    generated in one batch could move each other's outputs through the engine's float rounding,
    and a teacher's vote must depend on its own records only."""

    def __init__(
        self, engine: Engine, task: GenerationTask, text: str, teacher_prompts: Sequence[str | None], max_tokens: int
    ) -> None:
        self._engine, self._task, self._max_tokens = engine, task, max_tokens
        self._record = task.render_record(text)
        self._prefixes = [None if prompt is None else task.render_prefix(prompt) for prompt in teacher_prompts]
        self._spans = input_spans(engine.text_pieces(" " + text), max_tokens)
        self.text = text
        self.ended = False  # whether a span (not NO_SPAN) was released

    def candidates(self, answer: str) -> list[str]:
        return list(self._spans)

    def votes(self, answer: str, candidates: Sequence[str]) -> list[Vote]:
        index = {candidate: k for k, candidate in enumerate(candidates)}
        none = index[NO_SPAN]
        votes: list[Vote] = []
        for prefix in self._prefixes:
            if prefix is None:
                votes.append(None)
                continue
            try:
                (output,) = self._engine.generate_after_prefix(
                    prefix, [self._record], max_tokens=self._max_tokens, stop=self._task.stop
                )
            except Exception:  # noqa: BLE001 - no span from this teacher; the error text may quote its records
                output = ""
            votes.append(index.get(str(output).strip(), none))
        return votes

    def extend(self, answer: str, token: str) -> tuple[str, bool]:
        if token == NO_SPAN:
            return "", True
        self.ended = True
        return token, True


#: How a DP answer is voted: ``token`` (any generation task: one GNMax per token over the public
#: model's next tokens) or ``span`` (extraction: one GNMax per answer over the input's spans).
VOTES = ("token", "span")


#: Public rules that drop released answers (post-processing: no privacy cost). ``ended``: the
#: answer released its end (a stop string) before the token cap; ``span``: ended, holds a letter
#: or digit, and appears verbatim in its input (extraction copies a span of the input).
ANSWER_FILTERS = ("none", "ended", "span")


def kept_answer(answer: str, text: str, ended: bool, answer_filter: str) -> bool:
    """Whether ``answer`` (stripped, non-empty) survives ``answer_filter`` (:data:`ANSWER_FILTERS`)."""
    if answer_filter not in ANSWER_FILTERS:
        raise ValueError(f"answer_filter: use one of {', '.join(ANSWER_FILTERS)}, got {answer_filter!r}")
    if answer_filter == "none":
        return True
    if not ended:
        return False
    return answer_filter == "ended" or (any(c.isalnum() for c in answer) and answer in text)


def _unique(pieces: Sequence[str]) -> list[str]:
    """Non-empty pieces, first occurrence kept, in order."""
    seen: dict[str, None] = {}
    for piece in pieces:
        if piece and piece not in seen:
            seen[piece] = None
    return list(seen)


def dp_answers(
    task: GenerationTask,
    engine: Engine,
    public_inputs: Sequence[str],
    plan: AnsweringPlan,
    ledger: Any,
    noise: NoiseSource,
    key: bytes,
    prompt: str | None = None,
    max_demos: int = DEFAULT_MAX_DEMOS,
    *,
    candidates: int = DEFAULT_CANDIDATES,
    copy_input: bool = True,
    max_input_tokens: int | None = None,
    answer_filter: str = "none",
    vote: str = "token",
    max_answer_tokens: int | None = None,
    label: str = LEDGER_LABEL,
) -> DPLabelled:
    """DP answers for ``public_inputs`` by a noisy vote of ``plan.teachers`` teachers: token by
    token (``vote="token"``), or one vote per answer over the input's spans of at most
    ``max_answer_tokens`` tokens (``vote="span"``: ``plan``'s mechanism has one step).

    Checks public values first (the plan matches the inputs; the prompt, an input and an answer
    fit the engine's context), then charges ``plan.event`` to ``ledger`` as one entry (before the
    first engine call that reads a record) and answers every input
    (:func:`~dp_textgrad.privacy.token_voting.answer_by_vote`). ``key``: the partition key (32
    random bytes per run, operator-only). ``prompt`` defaults to the task's seed prompt.
    """
    if not isinstance(task, GenerationTask):
        raise TypeError("task: DP answers by a token vote need a generation task")
    if vote not in VOTES:
        raise ValueError(f"vote: use one of {', '.join(VOTES)}, got {vote!r}")
    span_tokens = 0
    if vote == "span":
        if max_answer_tokens is None:
            raise ValueError("max_answer_tokens: a span vote needs the public cap on a teacher's answer")
        span_tokens = positive_int(max_answer_tokens, "max_answer_tokens")
        if max_input_tokens is not None:
            raise ValueError("vote: a span vote answers public inputs; synthetic inputs are voted token by token")
        if plan.mechanism.max_tokens != 1:
            raise ValueError("plan: a span vote is one step per answer; plan it with max_tokens=1")
    synthetic = max_input_tokens is not None
    if max_input_tokens is not None:
        max_input_tokens = positive_int(max_input_tokens, "max_input_tokens")
        inputs = [str(text) for text in public_inputs]
        if inputs:
            raise ValueError("public_inputs: synthetic demonstrations generate their inputs; give none")
        if plan.mechanism.max_tokens <= max_input_tokens:
            raise ValueError("plan: its tokens per demonstration must leave room for an answer after the input")
    else:
        inputs = checked_inputs(public_inputs, plan.queries)
    max_demos = positive_int(max_demos, "max_demos")
    candidates = positive_int(candidates, "candidates")
    if answer_filter not in ANSWER_FILTERS:
        raise ValueError(f"answer_filter: use one of {', '.join(ANSWER_FILTERS)}, got {answer_filter!r}")
    prompt = task.seed_prompt if prompt is None else prompt
    # A synthetic input is at most max_input_tokens long: the cap reserves that much for it.
    answer_tokens = span_tokens or plan.mechanism.max_tokens - (max_input_tokens or 0)
    cap = answer_prefix_cap(engine, task, inputs, prompt, answer_tokens, input_tokens=max_input_tokens)
    count = token_counter(engine) if cap is not None else None
    proposal = public_prompt(task, prompt, max_demos)

    opened: list[TeacherAnswers | SpanTeacherAnswers] = []
    # The teachers' prompts of the last partition: without subsampling every answer has the same one.
    built: list[tuple[TeacherPartition[Any], list[str | None]]] = []

    def open_query(index: int, partition: TeacherPartition[Any]) -> TeacherAnswers | SpanTeacherAnswers:
        if built and built[0][0] is partition:
            prompts = built[0][1]
        else:
            prompts = [
                teacher_prompt(task, group, prompt, max_demos, key=key, count_tokens=count, max_prefix_tokens=cap)
                for group in partition.groups()
            ]
            built[:] = [(partition, prompts)]
        query: TeacherAnswers | SpanTeacherAnswers
        if vote == "span":
            query = SpanTeacherAnswers(engine, task, inputs[index], prompts, span_tokens)
        elif max_input_tokens is not None:
            query = SyntheticTeacherAnswers(engine, task, prompts, proposal, candidates, copy_input, max_input_tokens)
        else:
            query = TeacherAnswers(engine, task, inputs[index], prompts, proposal, candidates, copy_input)
        opened.append(query)
        return query

    # Every step asks each teacher's prefix in turn, and the public one: an engine that keeps
    # prefixes (the local one) must keep them all, or each call decodes its prefix again.
    hold = getattr(engine, "hold_prefixes", None)
    with hold(plan.teachers + 1) if callable(hold) else contextlib.nullcontext():
        raw = answer_by_vote(
            ledger, plan.mechanism, task.private_train, key, plan.teachers, plan.queries, open_query, noise, label
        )
    if synthetic:
        pairs = [text.split(INPUT_END, 1) if INPUT_END in text else ["", ""] for text in raw]
        inputs = [pair[0].strip() for pair in pairs]
        raw = [pair[1] if pair[0].strip() else "" for pair in pairs]
    answers = tuple(
        answer.strip() if answer.strip() and kept_answer(answer.strip(), text, query.ended, answer_filter) else None
        for answer, text, query in zip(raw, inputs, opened, strict=True)
    )
    examples = tuple(
        GenerationExample(text=text, reference=answer) for text, answer in zip(inputs, answers) if answer is not None
    )
    metadata = {
        **plan.mechanism.metadata(),
        "queries": plan.queries,
        "teachers": plan.teachers,
        "max_demos": max_demos,
        "vote": vote,
        **({"candidates": candidates, "copy_input": bool(copy_input)} if vote == "token" else {}),
        **({"max_answer_tokens": span_tokens} if vote == "span" else {}),
        "answer_filter": answer_filter,
        **({"max_input_tokens": max_input_tokens, "synthetic_inputs": inputs} if synthetic else {}),
        "answered": len(examples),
        "ledger_label": label,
    }
    return DPLabelled(
        examples=examples, labels=answers, answered=len(examples), queries=plan.queries, metadata=metadata
    )


__all__ = [
    "ANSWER_FILTERS",
    "DEFAULT_CANDIDATES",
    "INPUT_END",
    "NO_SPAN",
    "SpanTeacherAnswers",
    "SyntheticTeacherAnswers",
    "TeacherAnswers",
    "VOTES",
    "answer_prefix_cap",
    "dp_answers",
    "end_marker",
    "input_spans",
    "kept_answer",
    "public_prompt",
]
