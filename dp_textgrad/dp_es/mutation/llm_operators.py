"""The LLM operators: few-shot rewrite and crossover of a parent's instruction.

``llm_rewrite``   "improved instruction" completion from the parent and its feedback
``llm_crossover`` merge of two parents' instructions

Both prompts are few-shot patterns (worked examples from the phrase bank) that a
small base model can continue, assembled through the barrier
(:func:`~dp_textgrad.dp_es.mutation.barrier.build_llm_prompt`) from public text and
DP releases only. Only the instruction is rewritten; demos are kept. When the engine
fails or its answer is unusable, the operator says why (a ``FailedLLMEdit``), and the
MutationEngine makes a rule edit instead and records the reason; it does the same when it
refuses the rewritten prompt ("rejected").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dp_textgrad.dp_es.mutation.barrier import (
    Scaffold,
    build_llm_prompt,
    candidate_text,
    oneline,
)
from dp_textgrad.dp_es.mutation.context import MutationContext
from dp_textgrad.dp_es.mutation.phrase_bank import (
    CROSSOVER_EXAMPLES,
    FORMAT_INSTRUCTIONS,
    GENERATION_CROSSOVER_EXAMPLES,
    GENERATION_FORMATS,
    GENERATION_PHRASES,
    GENERATION_REWRITE_EXAMPLES,
    INSTRUCTION_PHRASES,
    REWRITE_EXAMPLES,
)
from dp_textgrad.dp_es.mutation.text_edits import (
    PROMPT_CLOSE,
    PROMPT_OPEN,
    Edit,
    FailedLLMEdit,
    PromptLayout,
    copies_worked_example,
    dedupe_sentences,
    extract_prompt,
    is_degenerate,
    merge_demos,
    truncate_sentences,
)
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.privacy.data import PrivateDataError, PublicText

_WORKED_INSTRUCTIONS = tuple(
    ex[3] for ex in REWRITE_EXAMPLES + CROSSOVER_EXAMPLES + GENERATION_REWRITE_EXAMPLES + GENERATION_CROSSOVER_EXAMPLES
)
_PUBLIC_PHRASES = INSTRUCTION_PHRASES + FORMAT_INSTRUCTIONS + GENERATION_PHRASES + GENERATION_FORMATS


def llm_rewrite(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | FailedLLMEdit:
    layout = ctx.layout(primary)
    instruction = PublicText(layout.instruction, candidate_text(primary).source)
    chosen = _pick_feedback(ctx, feedback)
    examples, unsafe_examples_used = _examples_for_prompt(ctx)
    parts: list[Scaffold | PublicText] = [
        Scaffold("Each instruction below was rewritten to fix the problems named in the feedback.\n\n")
    ]
    # The worked examples of the task's family: a generation task never sees a labelling pattern.
    for task, before, fb, after in REWRITE_EXAMPLES if ctx.labels else GENERATION_REWRITE_EXAMPLES:
        parts.append(
            Scaffold(
                f"Task: {task}\nInstruction: {PROMPT_OPEN}{before}{PROMPT_CLOSE}\n"
                f"Feedback: {fb}\nImproved instruction: {PROMPT_OPEN}{after}{PROMPT_CLOSE}\n\n"
            )
        )
    parts += [Scaffold("Task: "), oneline(ctx.task_description, 400), Scaffold("\n")]
    if examples:
        parts.append(Scaffold("Examples:"))
        for ex in examples:
            parts += [Scaffold(" "), ex, Scaffold(";")]
        parts.append(Scaffold("\n"))
    parts += [
        Scaffold(f"Instruction: {PROMPT_OPEN}"),
        oneline(instruction),
        Scaffold(f"{PROMPT_CLOSE}\n"),
        Scaffold("Feedback:"),
    ]
    if chosen:
        for fb in chosen:
            parts += [Scaffold(" "), oneline(fb, 300)]
    else:
        parts.append(Scaffold(" Make the instruction clearer and more specific."))
    parts.append(Scaffold(f"\nImproved instruction: {PROMPT_OPEN}"))
    raw, error, seed = _ask(ctx, parts)
    meta: dict[str, Any] = {
        "llm_seed": seed,
        "feedback_sources": sorted({f.source for f in chosen}),
        "n_feedback": len(chosen),
    }
    used_unsafe = unsafe_examples_used or instruction.source == "unsafe"
    if unsafe_examples_used:
        meta["unsafe_examples_in_prompt"] = len(examples)
    if raw is not None:
        room = ctx.max_prompt_chars - len(PromptLayout("", layout.demos, layout.record_format).compose()) - 2
        text, reason = _accept_instruction(ctx, raw, layout.instruction, room, [str(f) for f in chosen])
        if text is not None:
            meta["output_chars"] = len(raw)
            return Edit(PromptLayout(text, layout.demos, layout.record_format), "llm_rewrite", meta, used_unsafe)
        error = reason
    return FailedLLMEdit("llm_rewrite", error or "unknown", meta, used_unsafe)


def llm_crossover(
    ctx: MutationContext, primary: Candidate, partners: Sequence[Candidate], feedback: Sequence[PublicText]
) -> Edit | FailedLLMEdit:
    partner = partners[int(ctx.rng.integers(len(partners)))]
    a, b = ctx.layout(primary), ctx.layout(partner)
    ia = PublicText(a.instruction, candidate_text(primary).source)
    ib = PublicText(b.instruction, candidate_text(partner).source)
    parts: list[Scaffold | PublicText] = [
        Scaffold("Each pair of instructions below was merged into one that keeps the best parts of both.\n\n")
    ]
    for task, first, second, merged in CROSSOVER_EXAMPLES if ctx.labels else GENERATION_CROSSOVER_EXAMPLES:
        parts.append(
            Scaffold(
                f"Task: {task}\nInstruction A: {PROMPT_OPEN}{first}{PROMPT_CLOSE}\n"
                f"Instruction B: {PROMPT_OPEN}{second}{PROMPT_CLOSE}\n"
                f"Combined instruction: {PROMPT_OPEN}{merged}{PROMPT_CLOSE}\n\n"
            )
        )
    parts += [
        Scaffold("Task: "),
        oneline(ctx.task_description, 400),
        Scaffold(f"\nInstruction A: {PROMPT_OPEN}"),
        oneline(ia),
        Scaffold(f"{PROMPT_CLOSE}\n"),
        Scaffold(f"Instruction B: {PROMPT_OPEN}"),
        oneline(ib),
        Scaffold(f"{PROMPT_CLOSE}\n"),
        Scaffold(f"Combined instruction: {PROMPT_OPEN}"),
    ]
    raw, error, seed = _ask(ctx, parts)
    meta: dict[str, Any] = {"llm_seed": seed, "partner_ids": [partner.id]}
    used_unsafe = "unsafe" in (ia.source, ib.source)
    if raw is not None:
        demos = merge_demos(a.demos, ctx.demos_in_format(b.demos, a.record_format), ctx.max_demos)
        room = ctx.max_prompt_chars - len(PromptLayout("", demos, a.record_format).compose()) - 2
        text, reason = _accept_instruction(ctx, raw, a.instruction, room, [b.instruction])
        if text is not None and normalise_text(text) == normalise_text(b.instruction):
            text, reason = None, "unchanged"
        if text is not None:
            meta["output_chars"] = len(raw)
            return Edit(
                PromptLayout(text, demos, a.record_format), "llm_crossover", meta, used_unsafe, partners=(partner,)
            )
        error = reason
    return FailedLLMEdit("llm_crossover", error or "unknown", meta, used_unsafe, partners=(partner,))


def _pick_feedback(ctx: MutationContext, feedback: Sequence[PublicText]) -> list[PublicText]:
    if len(feedback) <= ctx.max_feedback_items:
        return list(feedback)
    picks = sorted(ctx.rng.choice(len(feedback), size=ctx.max_feedback_items, replace=False).tolist())
    return [feedback[i] for i in picks]


def _examples_for_prompt(ctx: MutationContext) -> tuple[list[PublicText], bool]:
    """Labelled examples for the rewrite prompt; raw private ones only in mode='unsafe'."""
    pool = ctx.unsafe_examples + ctx.public_examples if ctx.mode == "unsafe" else ctx.public_examples
    k = min(ctx.examples_in_prompt, len(pool))
    if k <= 0:
        return [], False
    picks = sorted(ctx.rng.choice(len(pool), size=k, replace=False).tolist())
    n_unsafe = len(ctx.unsafe_examples) if ctx.mode == "unsafe" else 0
    out = []
    for i in picks:
        source = "unsafe" if i < n_unsafe else "public_example"
        out.append(oneline(PublicText(f"{pool[i].text} -> {pool[i].label}", source), 240))
    return out, any(p.source == "unsafe" for p in out)


def _ask(ctx: MutationContext, parts: Sequence[Scaffold | PublicText]) -> tuple[str | None, str | None, int]:
    """Build (through the barrier), call the engine; (raw output, error reason, seed)."""
    prompt = build_llm_prompt(parts, mode=ctx.mode)
    seed = int(ctx.rng.integers(2**31 - 1))
    engine = ctx.engine
    if engine is None:  # not reached: the MutationEngine draws LLM operators only with an engine
        return None, "no_engine", seed
    try:
        raw = engine.generate(
            prompt, temperature=ctx.temperature, max_tokens=ctx.max_tokens, seed=seed, stop=[PROMPT_CLOSE, "\n\nTask:"]
        )
    except PrivateDataError:
        raise
    except Exception as exc:  # an engine failure must not end the run: fall back to a rule edit
        return None, f"engine_error:{type(exc).__name__}", seed
    if not isinstance(raw, str):
        return None, "not_text", seed
    return raw, None, seed


def _accept_instruction(
    ctx: MutationContext, raw: str, parent_instruction: str, room: int, inputs: Sequence[str] = ()
) -> tuple[str | None, str]:
    """The usable instruction in ``raw`` and "ok", or None and why it was rejected."""
    text = dedupe_sentences(extract_prompt(raw))  # small models often loop on one sentence
    known = [parent_instruction, *inputs, str(ctx.task_description), *_PUBLIC_PHRASES]
    if copies_worked_example(text, _WORKED_INSTRUCTIONS, known):
        return None, "copied_example"
    if len(text) > room:
        text = truncate_sentences(text, room)
        if len(text) < ctx.min_instruction_chars:
            return None, "too_long"
    if len(text) < ctx.min_instruction_chars:
        return None, "too_short"
    if is_degenerate(text):
        return None, "degenerate"
    if normalise_text(text) == normalise_text(parent_instruction):
        return None, "unchanged"
    return text, "ok"
