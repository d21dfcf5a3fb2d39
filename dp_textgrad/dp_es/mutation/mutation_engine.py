"""The MutationEngine: makes children of candidate prompts from public information only.

It validates its inputs at the barrier (public text, public examples, DP feedback;
raw private examples only in ``mode="unsafe"``) into a frozen
:class:`~dp_textgrad.dp_es.mutation.context.MutationContext`, the only thing the
operators see; draws an operator by weight from the registry in ``operators.py``;
accepts or refuses the edit the operator proposes, and turns it into a
:class:`~dp_textgrad.dp_es.population.Candidate`. A failed or refused LLM edit falls back
to a rule edit here, recorded in the child's ``operator_meta``. All non-private
randomness comes from the seeded ``rng`` given to the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dp_textgrad.dp_es.mutation.barrier import (
    Feedback,
    FeedbackMode,
    candidate_text,
    check_mode,
    check_public,
)
from dp_textgrad.dp_es.mutation.context import MutationContext
from dp_textgrad.dp_es.mutation.critique import CritiquePipeline
from dp_textgrad.dp_es.mutation.feedback import FeedbackSanitiser
from dp_textgrad.dp_es.mutation.operators import (
    DEFAULT_WEIGHTS,
    OPERATORS,
    RULE_OPERATORS,
)
from dp_textgrad.dp_es.mutation.phrase_bank import phrase_banks
from dp_textgrad.dp_es.mutation.readable import foreign_words, instruction_problems, task_vocabulary
from dp_textgrad.dp_es.mutation.text_edits import Edit, FailedLLMEdit, norm_block
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.privacy.data import (
    Private,
    PrivateBatch,
    PrivateDataError,
    PrivateDataset,
    PublicText,
)
from dp_textgrad.tasks.base import Example
from dp_textgrad.tasks.record_format import check_record_format

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine


def _default_render_demo(example: Example) -> str:
    return f"Text: {example.text}\nLabel: {example.label}"


class MutationEngine:
    """Makes children from parents using only public information.

    ``task_description`` must be PublicText; ``labels`` are the public label names (none for
    a generation task: its demos form one group and the label hint is off);
    ``public_examples`` feed demo operators (rendered with ``render_demo``, e.g.
    ``task.render_demo``). ``unsafe_examples`` (raw private records the caller
    unwrapped on purpose) are accepted only with ``mode="unsafe"``.
    ``engine=None`` disables the LLM operators; ``weights`` override the operators'
    default weights (see ``operators.OPERATORS``; ``NO_LLM_WEIGHTS`` turns the LLM off).
    ``structured_start``: the initial variants are balanced demonstration sets (see
    :meth:`variants`). ``sanitiser`` cleans the DP feedback before it is used (default: one
    for this ``mode`` that keeps the label names); ``critique``, when given, asks the LLM
    for advice on each parent from that feedback (:meth:`offspring`).
    ``record_formats``: a generation task's public record formats besides its own (its
    ``record_formats``; None for a task whose prompts have no record format), with
    ``render_demo_as(example, format)`` writing a demo in one; the ``record_format_change``
    operator moves a prompt between them.
    """

    def __init__(
        self,
        engine: Engine | None,
        task_description: PublicText,
        labels: Sequence[str],
        public_examples: Sequence[Example],
        rng: np.random.Generator,
        mode: FeedbackMode = "public",
        render_demo: Callable[[Example], str] | None = None,
        *,
        unsafe_examples: Sequence[Example] = (),
        weights: Mapping[str, float] | None = None,
        max_prompt_chars: int = 1500,
        min_instruction_chars: int = 12,
        max_demos: int = 4,
        structured_start: bool = True,
        max_feedback_items: int = 3,
        examples_in_prompt: int | None = None,
        temperature: float = 0.8,
        max_tokens: int = 120,
        sanitiser: FeedbackSanitiser | None = None,
        critique: CritiquePipeline | None = None,
        record_formats: Sequence[str] | None = None,
        render_demo_as: Callable[[Example, str], str] | None = None,
    ) -> None:
        check_mode(mode)
        task_description = check_public(task_description, mode=mode, field_name="task_description")
        if len(labels) == 1:
            raise ValueError("labels: give the public label names (at least two), or none for a generation task")
        public_labels = tuple(check_public(PublicText(str(lab), "user"), mode=mode) for lab in labels)
        if unsafe_examples and mode != "unsafe":
            raise PrivateDataError("unsafe_examples: raw private examples are only allowed with mode='unsafe'")
        render_demo = render_demo or _default_render_demo
        public = tuple(self._public_example(ex, "public_examples") for ex in public_examples)
        unsafe = tuple(self._public_example(ex, "unsafe_examples") for ex in unsafe_examples)
        # The task family decides the phrase banks: a prompt that generates never gets a label phrase.
        self.family = "classify" if public_labels else "generate"
        phrases, formats = phrase_banks(self.family)
        # Words of the task's public text: phrase-bank sentences and rule edits stay within them.
        vocabulary = task_vocabulary(
            str(task_description), [str(lab) for lab in public_labels], [ex.text for ex in public], formats=formats
        )
        self.weights = self._resolve_weights(weights)
        if max_prompt_chars < 50:
            raise ValueError(f"max_prompt_chars: must be at least 50, got {max_prompt_chars}")
        self.structured_start = structured_start
        self.sanitiser = sanitiser or FeedbackSanitiser(mode=mode, keep_terms=[str(lab) for lab in public_labels])
        self.critique = critique
        examples = [(ex, "public_example") for ex in public] + [(ex, "unsafe") for ex in unsafe]
        formats_checked = self._record_formats(record_formats, render_demo_as)
        # The demo pool: every example in the task's own format, then in each other format.
        pool: list[tuple[Example, str, str | None, int]] = [
            (ex, source, None, i) for i, (ex, source) in enumerate(examples)
        ]
        for fmt in formats_checked or ():
            pool += [(ex, source, str(fmt), i) for i, (ex, source) in enumerate(examples)]

        def rendered(example: Example, fmt: str | None) -> str:
            return render_demo(example) if fmt is None or render_demo_as is None else render_demo_as(example, fmt)

        self.context = MutationContext(
            engine=engine,
            rng=rng,
            mode=mode,
            task_description=task_description,
            labels=public_labels,
            public_examples=public,
            unsafe_examples=unsafe,
            # The demo pool: rendered text with provenance, and the labels of its demos.
            demo_pool=tuple(PublicText(norm_block(rendered(ex, fmt)), source) for ex, source, fmt, _ in pool),
            demo_labels=tuple(ex.label for ex, _, _, _ in pool),
            vocabulary=vocabulary,
            phrases=tuple(PublicText(p, "phrase_bank") for p in phrases if not foreign_words(p, vocabulary)),
            formats=tuple(PublicText(p, "phrase_bank") for p in formats),
            max_prompt_chars=max_prompt_chars,
            min_instruction_chars=min_instruction_chars,
            max_demos=max_demos,
            max_feedback_items=max_feedback_items,
            examples_in_prompt=(2 if mode == "unsafe" else 0) if examples_in_prompt is None else examples_in_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            record_formats=formats_checked,
            demo_formats=tuple(fmt for _, _, fmt, _ in pool),
            demo_examples=tuple(i for _, _, _, i in pool),
        )

    # The public generator and validated inputs the operators share (the audit's replay of variants reads them).
    rng = property(lambda self: self.context.rng)
    mode = property(lambda self: self.context.mode)
    task_description = property(lambda self: self.context.task_description)
    labels = property(lambda self: self.context.labels)

    # -- construction helpers ---------------------------------------------------------
    @staticmethod
    def _public_example(example: object, field_name: str) -> Example:
        if isinstance(example, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError(
                f"{field_name}: got a Private record; only the controller may unwrap "
                "records, and only for unsafe_examples in mode='unsafe'"
            )
        if not isinstance(example, Example):
            raise TypeError(f"{field_name}: expected Example objects, got {type(example).__name__}")
        return example

    @staticmethod
    def _record_formats(
        record_formats: Sequence[str] | None, render_demo_as: Callable[[Example, str], str] | None
    ) -> tuple[PublicText, ...] | None:
        if record_formats is None:
            return None
        if record_formats and render_demo_as is None:
            raise ValueError("render_demo_as: record formats need a way to write a demo in one (task.render_demo)")
        checked = [check_record_format(f, f"record_formats[{i}]") for i, f in enumerate(record_formats)]
        return tuple(PublicText(f, "user") for f in dict.fromkeys(checked))

    @staticmethod
    def _resolve_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
        resolved = dict(DEFAULT_WEIGHTS)
        for name, value in (weights or {}).items():
            if name not in resolved:
                raise ValueError(f"weights: unknown operator {name!r}; known: {sorted(resolved)}")
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"weights[{name!r}]: must be a finite number >= 0, got {value}")
            resolved[name] = float(value)
        if not any(resolved[name] > 0 for name in RULE_OPERATORS):
            raise ValueError("weights: give at least one rule operator a weight > 0 (LLM operators fall back to them)")
        return resolved

    # -- public API -------------------------------------------------------------------
    def variants(self, seed: Candidate, n: int, generation: int = 0) -> list[Candidate]:
        """``n`` distinct variants of the seed prompt (for the initial population).

        With ``structured_start`` (the default) they are balanced demonstration sets from
        the public pool, drawn afresh for each variant: for a small base model a few labelled
        demonstrations per label carry more than any instruction edit (random 2-per-label
        sets scored +0.11 over the bare seed on SST-2 dev, 5 draws, docs/benchmarks.md), so the
        private scoring starts by choosing among structures. Other edits fill what is left.
        """
        out: list[Candidate] = []
        seen = {seed.key}
        if self.structured_start and self.weights["demo_set"] > 0 and self._applicable("demo_set", seed, []):
            for _ in range(2 * n):
                if len(out) >= n:
                    break
                edit = self._apply(OPERATORS["demo_set"].run(self.context, seed, [], ()), seed)
                if edit is None:
                    break
                child = self._candidate(edit, [seed], generation)
                if child.key not in seen:
                    seen.add(child.key)
                    out.append(child)
        return out + self.children([seed], n - len(out), generation, exclude=seen)

    def offspring(
        self, parents: Sequence[Candidate], n: int, generation: int, dp_feedback: Mapping[str, Sequence[PublicText]]
    ) -> list[Candidate]:
        """Children of the chosen ``parents`` for generation ``generation``.

        ``dp_feedback``: parent id -> sentences rendered from DP releases. They are
        sanitised, the critique pipeline (if any) adds its advice per parent, and each
        parent's children are written from its feedback (:meth:`children`).
        """
        cleaned = {cid: self.sanitiser.sanitise_all(sentences) for cid, sentences in dp_feedback.items()}
        critiques: dict[str, list[PublicText]] = {}
        if self.critique is not None:
            critiques = self.critique.critiques_by_parent(parents, cleaned)
        feedback = {p.id: list(cleaned.get(p.id, [])) + list(critiques.get(p.id, [])) for p in parents}
        return self.children(parents, n, generation, feedback=feedback)

    def children(
        self,
        parents: Sequence[Candidate],
        n: int,
        generation: int,
        feedback: Feedback = (),
        exclude: Collection[str] = (),
    ) -> list[Candidate]:
        """Up to ``n`` distinct children (different from their parents, ``exclude`` and each other).

        ``feedback``: public/DP sentences for all parents, or a mapping parent id ->
        sentences. Parents are used round robin, best first.
        """
        parents = list(parents)
        if not parents:
            raise ValueError("parents: need at least one parent candidate")
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        for parent in parents:  # fail fast: an unsafe parent cannot be mutated in public mode
            check_public(candidate_text(parent), mode=self.mode, field_name=f"parent {parent.id}")
        feedback_by_parent = self._feedback_by_parent(parents, feedback)
        seen = {p.key for p in parents} | set(exclude)
        out: list[Candidate] = []
        attempts = 0
        while len(out) < n and attempts < 4 * n + 4:
            primary = parents[attempts % len(parents)]
            attempts += 1
            child = self.mutate(primary, parents, generation, feedback_by_parent.get(primary.id, ()))
            if child is None or child.key in seen:
                continue
            seen.add(child.key)
            out.append(child)
        return out

    def mutate(
        self, primary: Candidate, parents: Sequence[Candidate], generation: int, feedback: Sequence[PublicText] = ()
    ) -> Candidate | None:
        """One child of ``primary`` (``parents`` supply crossover partners); None if nothing applies."""
        check_public(candidate_text(primary), mode=self.mode, field_name=f"parent {primary.id}")
        feedback = [check_public(f, mode=self.mode, field_name="feedback") for f in feedback]
        partners = [p for p in parents if p.key != primary.key]
        weights = {name: w for name, w in self.weights.items() if w > 0 and self._applicable(name, primary, partners)}
        while weights:
            names = list(weights)
            probs = np.array([weights[name] for name in names]) / sum(weights.values())
            name = names[int(self.rng.choice(len(names), p=probs))]
            edit = self._apply(OPERATORS[name].run(self.context, primary, partners, feedback), primary)
            if edit is not None:
                used = [primary] + ([p for p in partners if p.id in edit.meta.get("partner_ids", ())])
                return self._candidate(edit, used, generation)
            del weights[name]
        return None

    @staticmethod
    def _candidate(edit: Edit, used: Sequence[Candidate], generation: int) -> Candidate:
        """The child an edit of ``used[0]`` (with partners ``used[1:]``) makes."""
        return Candidate.new(
            edit.text,
            generation=generation,
            operator=edit.operator,
            parent_ids=[p.id for p in used],
            operator_meta=edit.meta,
            unsafe=edit.used_unsafe or any(p.unsafe for p in used),
        )

    # -- accepting edits -------------------------------------------------------------
    def _apply(self, outcome: Edit | FailedLLMEdit | None, primary: Candidate) -> Edit | None:
        """The accepted edit an operator's outcome makes: its own, or a rule edit in place of a
        failed or refused LLM edit; None when there is none."""
        if isinstance(outcome, Edit):
            accepted = self.accept(outcome, primary)
            if accepted is not None or not OPERATORS[outcome.operator].uses_llm:
                return accepted
            outcome = FailedLLMEdit(outcome.operator, "rejected", outcome.meta, outcome.used_unsafe, outcome.partners)
        if isinstance(outcome, FailedLLMEdit):
            return self._fallback(primary, outcome)
        return None

    def accept(self, edit: Edit, primary: Candidate) -> Edit | None:
        """``edit`` if its prompt is non-empty, new, within the length limit and adds no fragment
        (or, for rule edits, no word foreign to the task) that no parent had; else None."""
        context, text = self.context, edit.text
        if not edit.layout.instruction.strip() and not edit.layout.demos:
            return None
        if len(text) > context.max_prompt_chars or normalise_text(text) == primary.key:
            return None
        vocabulary = None if getattr(OPERATORS.get(edit.operator), "uses_llm", False) else context.vocabulary
        before = {
            problem
            for parent in (primary, *edit.partners)
            for problem in instruction_problems(context.layout(parent).instruction, vocabulary)
        }
        if set(instruction_problems(edit.layout.instruction, vocabulary)) - before:
            return None
        return edit

    def _fallback(self, primary: Candidate, failed: FailedLLMEdit) -> Edit | None:
        """A rule edit in place of a failed LLM edit, recorded in operator_meta.

        With a partner, rule crossovers come first (whatever their weight); then the
        other applicable rule edits in a weighted random order.
        """
        names = [
            name
            for name in RULE_OPERATORS
            if not OPERATORS[name].needs_partner and self.weights[name] > 0 and self._applicable(name, primary, [])
        ]
        order = [name for name in RULE_OPERATORS if OPERATORS[name].needs_partner] if failed.partners else []
        if names:
            probs = np.array([self.weights[name] for name in names]) / sum(self.weights[name] for name in names)
            order += [names[i] for i in self.rng.choice(len(names), size=len(names), replace=False, p=probs)]
        for name in order:
            outcome = OPERATORS[name].run(self.context, primary, failed.partners, ())
            result = self.accept(outcome, primary) if isinstance(outcome, Edit) else None
            if result is None:
                continue
            merged = {**failed.meta, **result.meta, "fallback_from": failed.operator, "fallback_reason": failed.reason}
            if not OPERATORS[result.operator].needs_partner and "partner_ids" in failed.meta:
                merged["attempted_partner_ids"] = merged.pop("partner_ids")  # the child has one parent
            return replace(result, meta=merged, used_unsafe=failed.used_unsafe or result.used_unsafe)
        return None

    # -- helpers ----------------------------------------------------------------------
    def _applicable(self, name: str, primary: Candidate, partners: Sequence[Candidate]) -> bool:
        operator = OPERATORS[name]
        if operator.uses_llm and self.context.engine is None:
            return False
        if operator.needs_partner:
            return bool(partners)
        return operator.applies(self.context, self.context.layout(primary))

    def _feedback_by_parent(self, parents: Sequence[Candidate], feedback: Feedback) -> dict[str, list[PublicText]]:
        if isinstance(feedback, Mapping):
            out = {}
            for pid, items in feedback.items():
                if isinstance(items, (str, Private)):
                    raise TypeError(f"feedback[{pid!r}]: expected a sequence of PublicText, got one text")
                out[pid] = [check_public(f, mode=self.mode, field_name=f"feedback[{pid!r}]") for f in items]
            return out
        if isinstance(feedback, (str, Private)):
            raise TypeError("feedback: expected a sequence of PublicText, got a single text")
        checked = [check_public(f, mode=self.mode, field_name="feedback") for f in feedback]
        return {p.id: checked for p in parents}
