"""The LLM operators: few-shot rewrite and crossover of a parent's instruction.

``llm_rewrite``   "improved instruction" completion from the parent and its feedback
``llm_crossover`` merge of two parents' instructions

Both prompts are few-shot patterns (worked examples from the phrase bank) that a
small base model can continue, assembled through the barrier
(:func:`~dp_textgrad.dp_es.mutation.barrier.build_llm_prompt`) from public text and
DP releases only. Only the instruction is rewritten; demos are kept. When the engine
fails or its answer is unusable, the mutator falls back to a rule edit and records why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dp_textgrad.dp_es.mutation.barrier import (
    Scaffold,
    build_llm_prompt,
    candidate_text,
    oneline,
)
from dp_textgrad.dp_es.mutation.phrase_bank import (
    CROSSOVER_EXAMPLES,
    FORMAT_INSTRUCTIONS,
    INSTRUCTION_PHRASES,
    REWRITE_EXAMPLES,
)
from dp_textgrad.dp_es.mutation.text_edits import (
    PROMPT_CLOSE,
    PROMPT_OPEN,
    Edit,
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

if TYPE_CHECKING:
    from dp_textgrad.dp_es.mutation.mutation_engine import MutationEngine

_WORKED_INSTRUCTIONS = tuple(ex[3] for ex in REWRITE_EXAMPLES + CROSSOVER_EXAMPLES)
_PUBLIC_PHRASES = INSTRUCTION_PHRASES + FORMAT_INSTRUCTIONS


def llm_rewrite(m: MutationEngine, primary: Candidate, partners: Sequence[Candidate],
                feedback: Sequence[PublicText]) -> Edit | None:
    layout = m.layout(primary)
    instruction = PublicText(layout.instruction, candidate_text(primary).source)
    chosen = _pick_feedback(m, feedback)
    examples, unsafe_examples_used = _examples_for_prompt(m)
    parts: list[Scaffold | PublicText] = [
        Scaffold("Each instruction below was rewritten to fix the problems named in the feedback.\n\n")
    ]
    for task, before, fb, after in REWRITE_EXAMPLES:
        parts.append(Scaffold(f"Task: {task}\nInstruction: {PROMPT_OPEN}{before}{PROMPT_CLOSE}\n"
                              f"Feedback: {fb}\nImproved instruction: {PROMPT_OPEN}{after}{PROMPT_CLOSE}\n\n"))
    parts += [Scaffold("Task: "), oneline(m.task_description, 400), Scaffold("\n")]
    if examples:
        parts.append(Scaffold("Examples:"))
        for ex in examples:
            parts += [Scaffold(" "), ex, Scaffold(";")]
        parts.append(Scaffold("\n"))
    parts += [Scaffold(f"Instruction: {PROMPT_OPEN}"), oneline(instruction), Scaffold(f"{PROMPT_CLOSE}\n"),
              Scaffold("Feedback:")]
    if chosen:
        for fb in chosen:
            parts += [Scaffold(" "), oneline(fb, 300)]
    else:
        parts.append(Scaffold(" Make the instruction clearer and more specific."))
    parts.append(Scaffold(f"\nImproved instruction: {PROMPT_OPEN}"))
    raw, error, seed = _ask(m, parts)
    meta: dict[str, Any] = {"llm_seed": seed, "feedback_sources": sorted({f.source for f in chosen}),
                            "n_feedback": len(chosen)}
    used_unsafe = unsafe_examples_used or instruction.source == "unsafe"
    if unsafe_examples_used:
        meta["unsafe_examples_in_prompt"] = len(examples)
    if raw is not None:
        room = m.max_prompt_chars - len(PromptLayout("", layout.demos).compose()) - 2
        text, reason = _accept_instruction(m, raw, layout.instruction, room, [str(f) for f in chosen])
        if text is not None:
            meta["output_chars"] = len(raw)
            result = m.finish(PromptLayout(text, layout.demos), primary, "llm_rewrite", meta, used_unsafe)
            if result is not None:
                return result
            reason = "rejected"
        error = reason
    return m.fallback(primary, [], "llm_rewrite", error or "unknown", meta, used_unsafe)


def llm_crossover(m: MutationEngine, primary: Candidate, partners: Sequence[Candidate],
                  feedback: Sequence[PublicText]) -> Edit | None:
    partner = partners[int(m.rng.integers(len(partners)))]
    a, b = m.layout(primary), m.layout(partner)
    ia = PublicText(a.instruction, candidate_text(primary).source)
    ib = PublicText(b.instruction, candidate_text(partner).source)
    parts: list[Scaffold | PublicText] = [
        Scaffold("Each pair of instructions below was merged into one that keeps the best parts of both.\n\n")
    ]
    for task, first, second, merged in CROSSOVER_EXAMPLES:
        parts.append(Scaffold(
            f"Task: {task}\nInstruction A: {PROMPT_OPEN}{first}{PROMPT_CLOSE}\n"
            f"Instruction B: {PROMPT_OPEN}{second}{PROMPT_CLOSE}\n"
            f"Combined instruction: {PROMPT_OPEN}{merged}{PROMPT_CLOSE}\n\n"))
    parts += [Scaffold("Task: "), oneline(m.task_description, 400),
              Scaffold(f"\nInstruction A: {PROMPT_OPEN}"), oneline(ia), Scaffold(f"{PROMPT_CLOSE}\n"),
              Scaffold(f"Instruction B: {PROMPT_OPEN}"), oneline(ib), Scaffold(f"{PROMPT_CLOSE}\n"),
              Scaffold(f"Combined instruction: {PROMPT_OPEN}")]
    raw, error, seed = _ask(m, parts)
    meta: dict[str, Any] = {"llm_seed": seed, "partner_ids": [partner.id]}
    used_unsafe = "unsafe" in (ia.source, ib.source)
    if raw is not None:
        demos = merge_demos(a.demos, b.demos, m.max_demos)
        room = m.max_prompt_chars - len(PromptLayout("", demos).compose()) - 2
        text, reason = _accept_instruction(m, raw, a.instruction, room, [b.instruction])
        if text is not None and normalise_text(text) == normalise_text(b.instruction):
            text, reason = None, "unchanged"
        if text is not None:
            meta["output_chars"] = len(raw)
            result = m.finish(PromptLayout(text, demos), primary, "llm_crossover", meta, used_unsafe,
                              partners=[partner])
            if result is not None:
                return result
            reason = "rejected"
        error = reason
    return m.fallback(primary, [partner], "llm_crossover", error or "unknown", meta, used_unsafe)


def _pick_feedback(m: MutationEngine, feedback: Sequence[PublicText]) -> list[PublicText]:
    if len(feedback) <= m.max_feedback_items:
        return list(feedback)
    picks = sorted(m.rng.choice(len(feedback), size=m.max_feedback_items, replace=False).tolist())
    return [feedback[i] for i in picks]


def _examples_for_prompt(m: MutationEngine) -> tuple[list[PublicText], bool]:
    """Labelled examples for the rewrite prompt; raw private ones only in mode='unsafe'."""
    pool = m.unsafe_examples + m.public_examples if m.mode == "unsafe" else m.public_examples
    k = min(m.examples_in_prompt, len(pool))
    if k <= 0:
        return [], False
    picks = sorted(m.rng.choice(len(pool), size=k, replace=False).tolist())
    n_unsafe = len(m.unsafe_examples) if m.mode == "unsafe" else 0
    out = []
    for i in picks:
        source = "unsafe" if i < n_unsafe else "public_example"
        out.append(oneline(PublicText(f"{pool[i].text} -> {pool[i].label}", source), 240))
    return out, any(p.source == "unsafe" for p in out)


def _ask(m: MutationEngine, parts: Sequence[Scaffold | PublicText]) -> tuple[str | None, str | None, int]:
    """Build (through the barrier), call the engine; (raw output, error reason, seed)."""
    prompt = build_llm_prompt(parts, mode=m.mode)
    seed = int(m.rng.integers(2**31 - 1))
    try:
        raw = m.engine.generate(prompt, temperature=m.temperature, max_tokens=m.max_tokens,
                                seed=seed, stop=[PROMPT_CLOSE, "\n\nTask:"])
    except PrivateDataError:
        raise
    except Exception as exc:  # an engine failure must not end the run: fall back to a rule edit
        return None, f"engine_error:{type(exc).__name__}", seed
    if not isinstance(raw, str):
        return None, "not_text", seed
    return raw, None, seed


def _accept_instruction(m: MutationEngine, raw: str, parent_instruction: str, room: int,
                        inputs: Sequence[str] = ()) -> tuple[str | None, str]:
    """The usable instruction in ``raw`` and "ok", or None and why it was rejected."""
    text = dedupe_sentences(extract_prompt(raw))  # small models often loop on one sentence
    known = [parent_instruction, *inputs, str(m.task_description), *_PUBLIC_PHRASES]
    if copies_worked_example(text, _WORKED_INSTRUCTIONS, known):
        return None, "copied_example"
    if len(text) > room:
        text = truncate_sentences(text, room)
        if len(text) < m.min_instruction_chars:
            return None, "too_long"
    if len(text) < m.min_instruction_chars:
        return None, "too_short"
    if is_degenerate(text):
        return None, "degenerate"
    if normalise_text(text) == normalise_text(parent_instruction):
        return None, "unchanged"
    return text, "ok"
