"""The mutation operators: the rule edits, and the registry of every operator.

An operator is a function ``(context, primary, partners, feedback) -> Edit | None``
(None: it does not apply) plus a default weight and when it applies. It reads only the
:class:`~dp_textgrad.dp_es.mutation.context.MutationContext` and proposes an ``Edit``;
the MutationEngine accepts or refuses it (length, novelty, readability) and records the
child. To add one, write the function and add one line to :data:`OPERATORS`; an edit of
the instruction's sentences is shorter as ``(context, sentences) -> (sentences, meta)``
decorated with :func:`instruction_edit`. The LLM operators live in
``llm_operators.py``; the rule edits below use only the parents, the public phrase
bank and the public demo pool.

Rule edits:
  ``sentence_crossover`` sentences drawn from both parents
  ``reorder_sentences`` / ``drop_sentence`` / ``insert_phrase`` (public phrase bank)
  ``format_change``     output-format instruction from the phrase bank
  ``verbaliser_hint``   "Answer with exactly one of: a, b, c."
  ``demo_insert`` / ``demo_swap`` / ``demo_remove`` / ``demo_set``  few-shot demos from PUBLIC examples
  ``record_format_change``  a generation prompt's record format (public; demos rewritten in it)

All randomness comes from the context's seeded ``rng``; the order of the draws is part
of the behaviour (runs are reproducible from a seed), so keep it when editing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dp_textgrad.dp_es.mutation.context import MutationContext
from dp_textgrad.dp_es.mutation.llm_operators import llm_crossover, llm_rewrite
from dp_textgrad.dp_es.mutation.phrase_bank import VERBALISER_HINTS
from dp_textgrad.dp_es.mutation.text_edits import (
    Edit,
    FailedLLMEdit,
    PromptLayout,
    is_verbaliser_hint,
    merge_demos,
    split_sentences,
)
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.privacy.data import PublicText

OperatorFn = Callable[
    [MutationContext, Candidate, Sequence[Candidate], Sequence[PublicText]], "Edit | FailedLLMEdit | None"
]


# -- sentence edits -------------------------------------------------------------------
SentenceEdit = Callable[[MutationContext, list[str]], "tuple[list[str], dict[str, Any]] | None"]


def instruction_edit(name: str) -> Callable[[SentenceEdit], OperatorFn]:
    """Make an operator ``name`` of a function that edits the instruction's sentences.

    The function gets the context and the primary's sentences and returns the new
    sentences and the operator metadata (or None); the primary's demos are kept.
    """

    def wrap(edit: SentenceEdit) -> OperatorFn:
        def run(
            ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
        ) -> Edit | None:
            layout = ctx.layout(primary)
            edited = edit(ctx, split_sentences(layout.instruction))
            if edited is None:
                return None
            sentences, meta = edited
            return Edit(PromptLayout(" ".join(sentences), list(layout.demos), layout.record_format), name, meta)

        run.__doc__ = edit.__doc__
        return run

    return wrap


@instruction_edit("reorder_sentences")
def reorder_sentences(ctx: MutationContext, sentences: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    if len(sentences) < 2:
        return None
    src = int(ctx.rng.integers(len(sentences)))
    dst = int(ctx.rng.choice([i for i in range(len(sentences)) if i != src]))
    sentences.insert(dst, sentences.pop(src))
    return sentences, {"moved_from": src, "moved_to": dst}


@instruction_edit("drop_sentence")
def drop_sentence(ctx: MutationContext, sentences: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    if len(sentences) < 2:
        return None
    index = int(ctx.rng.integers(len(sentences)))
    sentences.pop(index)
    return sentences, {"dropped_index": index}


@instruction_edit("insert_phrase")
def insert_phrase(ctx: MutationContext, sentences: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    """A phrase-bank sentence the instruction does not have yet, at a random position."""
    present = {normalise_text(s) for s in sentences}
    options = [p for p in ctx.phrases if normalise_text(p) not in present]
    if not options:
        return None
    phrase = options[int(ctx.rng.integers(len(options)))]
    position = int(ctx.rng.integers(len(sentences) + 1))
    sentences.insert(position, str(phrase))
    return sentences, {"phrase": str(phrase), "position": position}


@instruction_edit("format_change")
def format_change(ctx: MutationContext, sentences: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    """Replace the output-format sentences (if any) with another one: they are never stacked."""
    known = {normalise_text(f) for f in ctx.formats}
    current = [i for i, s in enumerate(sentences) if normalise_text(s) in known]
    current_keys = {normalise_text(sentences[i]) for i in current}
    options = [f for f in ctx.formats if normalise_text(f) not in current_keys]
    if not options:
        return None
    fmt = str(options[int(ctx.rng.integers(len(options)))])
    return [s for i, s in enumerate(sentences) if i not in current] + [fmt], {"format": fmt, "replaced": len(current)}


@instruction_edit("verbaliser_hint")
def verbaliser_hint(ctx: MutationContext, sentences: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    """A hint listing the public labels in random order, replacing any earlier hint."""
    order = ctx.rng.permutation(len(ctx.labels))
    label_list = ", ".join(str(ctx.labels[i]) for i in order)
    hint = VERBALISER_HINTS[int(ctx.rng.integers(len(VERBALISER_HINTS)))].format(labels=label_list)
    return [s for s in sentences if not is_verbaliser_hint(s)] + [hint], {"hint": hint}


def sentence_crossover(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | None:
    partner = partners[int(ctx.rng.integers(len(partners)))]
    a, b = ctx.layout(primary), ctx.layout(partner)
    sa, sb = split_sentences(a.instruction), split_sentences(b.instruction)
    mixed: list[str] = []
    for i in range(max(len(sa), len(sb))):
        options = [s for s in (sa[i] if i < len(sa) else None, sb[i] if i < len(sb) else None) if s]
        take = options[int(ctx.rng.integers(len(options)))]
        if normalise_text(take) not in {normalise_text(x) for x in mixed}:
            mixed.append(take)
    if normalise_text(" ".join(mixed)) in (normalise_text(a.instruction), normalise_text(b.instruction)):
        # uniform choice reproduced a parent: splice halves instead
        mixed = sa[: (len(sa) + 1) // 2] + [
            s for s in sb[len(sb) // 2 :] if normalise_text(s) not in {normalise_text(x) for x in sa}
        ]
    demos = merge_demos(a.demos, ctx.demos_in_format(b.demos, a.record_format), ctx.max_demos)
    edited = PromptLayout(" ".join(mixed), demos, a.record_format)
    if normalise_text(edited.compose()) == partner.key:  # the partner itself: no child
        return None
    return Edit(edited, "sentence_crossover", {"partner_ids": [partner.id]}, partners=(partner,))


# -- demo edits -----------------------------------------------------------------------
def _demo_edit(
    ctx: MutationContext, name: str, layout: PromptLayout, demos: list[str], pick: PublicText, index: int
) -> Edit:
    meta = {"demo_pool_index": ctx.demo_pool.index(pick), "position": index, "demo_source": pick.source}
    return Edit(PromptLayout(layout.instruction, demos, layout.record_format), name, meta, pick.source == "unsafe")


def demo_insert(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | None:
    layout = ctx.layout(primary)
    demos, unused = list(layout.demos), ctx.unused_demos(layout)
    if not unused:
        return None
    pick = unused[int(ctx.rng.integers(len(unused)))]
    if len(demos) >= ctx.max_demos:
        return None
    index = int(ctx.rng.integers(len(demos) + 1))
    demos.insert(index, str(pick))
    return _demo_edit(ctx, "demo_insert", layout, demos, pick, index)


def demo_swap(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | None:
    layout = ctx.layout(primary)
    demos, unused = list(layout.demos), ctx.unused_demos(layout)
    if not unused or not demos:
        return None
    pick = unused[int(ctx.rng.integers(len(unused)))]
    index = int(ctx.rng.integers(len(demos)))
    demos[index] = str(pick)
    return _demo_edit(ctx, "demo_swap", layout, demos, pick, index)


def demo_remove(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | None:
    layout = ctx.layout(primary)
    demos = list(layout.demos)
    if not demos:
        return None
    index = int(ctx.rng.integers(len(demos)))
    demos.pop(index)
    return Edit(PromptLayout(layout.instruction, demos, layout.record_format), "demo_remove", {"removed_index": index})


def demo_set(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | None:
    """Replace the demonstrations with a balanced set: the same number per label, shuffled
    (a generation task's demos are one group: two to six of them).

    A small base model copies the label of a lone demonstration; one to three per label,
    in random order, is what makes few-shot prompting work for it. The largest set that
    fits ``max_prompt_chars`` is kept.
    """
    layout = ctx.layout(primary)
    by_label: dict[str, list[int]] = {}
    for index in ctx.demo_indices(layout.record_format):
        by_label.setdefault(ctx.demo_labels[index], []).append(index)
    # A generation task's demos are one group; its outputs copy their format, so sets are larger.
    per_label = int(ctx.rng.integers(1, 4)) if ctx.labels else int(ctx.rng.integers(2, 7))
    for size in range(per_label, 0, -1):
        picks: list[int] = []
        for label in sorted(by_label):
            pool = by_label[label]
            chosen = ctx.rng.choice(len(pool), size=min(size, len(pool)), replace=False)
            picks += [pool[int(j)] for j in chosen]
        picks = [picks[int(j)] for j in ctx.rng.permutation(len(picks))]
        edited = PromptLayout(layout.instruction, [str(ctx.demo_pool[i]) for i in picks], layout.record_format)
        if len(edited.compose()) <= ctx.max_prompt_chars:
            used_unsafe = any(ctx.demo_pool[i].source == "unsafe" for i in picks)
            return Edit(edited, "demo_set", {"per_label": size, "demo_pool_indices": picks}, used_unsafe)
    return None


def record_format_change(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | None:
    """Another public record format for a generation prompt (the task's own or one of
    ``ctx.record_formats``), its demonstrations rewritten in it: how the model reads the input
    and writes the answer is part of what the search varies."""
    layout = ctx.layout(primary)
    options: list[str | None] = [None, *(str(f) for f in ctx.record_formats or ())]
    options = [f for f in options if f != layout.record_format]
    if not options:
        return None
    choice = options[int(ctx.rng.integers(len(options)))]
    demos = ctx.demos_in_format(list(layout.demos), choice)
    meta = {"record_format": choice if choice is not None else "task", "replaced": layout.record_format or "task"}
    return Edit(PromptLayout(layout.instruction, demos, choice), "record_format_change", meta)


# -- the registry ---------------------------------------------------------------------
def _demo_groups(ctx: MutationContext, layout: PromptLayout) -> bool:
    """Balanced sets need two labels; a generation task (no labels) needs two demos of its one group."""
    pool = ctx.demo_indices(layout.record_format)
    return len({ctx.demo_labels[i] for i in pool}) >= 2 if ctx.labels else len(pool) >= 2


def _always(ctx: MutationContext, layout: PromptLayout) -> bool:
    return True


def _two_sentences(ctx: MutationContext, layout: PromptLayout) -> bool:
    return len(split_sentences(layout.instruction)) >= 2


@dataclass(frozen=True)
class Operator:
    """One registered operator.

    ``applies`` says, from the primary's layout, whether the operator can change it;
    ``uses_llm`` operators need an engine; ``needs_partner`` operators a second parent.
    """

    run: OperatorFn
    weight: float
    applies: Callable[[MutationContext, PromptLayout], bool] = _always
    uses_llm: bool = False
    needs_partner: bool = False


# The order is part of the behaviour: weighted draws walk the operators in this order.
OPERATORS: Mapping[str, Operator] = MappingProxyType(
    {
        "llm_rewrite": Operator(llm_rewrite, 3.0, uses_llm=True),
        "llm_crossover": Operator(llm_crossover, 1.5, uses_llm=True, needs_partner=True),
        "sentence_crossover": Operator(sentence_crossover, 0.5, needs_partner=True),
        "reorder_sentences": Operator(reorder_sentences, 0.5, _two_sentences),
        "drop_sentence": Operator(drop_sentence, 0.5, _two_sentences),
        "insert_phrase": Operator(insert_phrase, 1.0),
        "format_change": Operator(format_change, 0.75),
        "verbaliser_hint": Operator(verbaliser_hint, 0.75, lambda ctx, lay: len(ctx.labels) >= 2),
        "demo_insert": Operator(
            demo_insert, 0.75, lambda ctx, lay: len(lay.demos) < ctx.max_demos and bool(ctx.unused_demos(lay))
        ),
        "demo_swap": Operator(demo_swap, 0.5, lambda ctx, lay: bool(lay.demos) and bool(ctx.unused_demos(lay))),
        "demo_remove": Operator(demo_remove, 0.5, lambda ctx, lay: bool(lay.demos)),
        "demo_set": Operator(demo_set, 2.0, _demo_groups),
        # Last: a task without record formats draws the other operators as before.
        "record_format_change": Operator(record_format_change, 0.75, lambda ctx, lay: bool(ctx.record_formats)),
    }
)

LLM_OPERATORS: tuple[str, ...] = tuple(name for name, op in OPERATORS.items() if op.uses_llm)
RULE_OPERATORS: tuple[str, ...] = tuple(name for name, op in OPERATORS.items() if not op.uses_llm)
DEFAULT_WEIGHTS: dict[str, float] = {name: op.weight for name, op in OPERATORS.items()}
# Operators that call an LLM to write text: off for engines that cannot follow instructions
# (a small base model answers a rewrite request with noise).
NO_LLM_WEIGHTS: dict[str, float] = {name: 0.0 for name in LLM_OPERATORS}
