"""Critiques of parent prompts, written by an LLM from public and DP-released inputs only.

A critique prompt holds the public task description, a parent prompt (public
candidate text) and DP feedback sentences (e.g. from ``render_confusion``). It is
assembled by ``barrier.build_llm_prompt``, so private data cannot enter it. The
answer is sanitised (hygiene) and returned as ``PublicText(source="llm")`` for
``MutationEngine.children(feedback=...)``. Critiques of parents built from raw
private text (unsafe mode) keep the source ``"unsafe"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dp_textgrad.dp_es.mutation.barrier import (
    Feedback,
    Scaffold,
    build_llm_prompt,
    candidate_text,
    check_public,
    oneline,
)
from dp_textgrad.dp_es.mutation.feedback import FeedbackSanitiser
from dp_textgrad.dp_es.mutation.phrase_bank import CRITIQUE_EXAMPLES
from dp_textgrad.dp_es.mutation.text_edits import copies_worked_example, is_degenerate
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.privacy.data import PrivateDataError, PublicText

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

_LEADING_LABEL = re.compile(r"^(?:advice|critique|feedback)\s*:\s*", re.IGNORECASE)


def extract_critique(raw: str) -> str:
    """The first non-empty line of an LLM answer, without a leading 'Advice:' label."""
    for line in str(raw).replace("\r", "").split("\n"):
        line = _LEADING_LABEL.sub("", line.strip()).strip().strip('"').strip()
        if line:
            return line
    return ""


class CritiquePipeline:
    """Asks the LLM for one short piece of advice per parent (at most ``max_critiques``).

    ``sanitiser`` cleans the answers and decides the mode (public/unsafe) of the
    prompts; ``rng`` (seeded, non-private) draws the LLM sampling seeds.
    """

    def __init__(
        self,
        engine: Engine,
        sanitiser: FeedbackSanitiser,
        max_critiques: int = 3,
        *,
        task_description: PublicText | None = None,
        rng: np.random.Generator | None = None,
        temperature: float = 0.7,
        max_tokens: int = 60,
        max_feedback_items: int = 3,
        min_chars: int = 15,
    ) -> None:
        if max_critiques < 0:
            raise ValueError(f"max_critiques: must be >= 0, got {max_critiques}")
        self.engine = engine
        self.sanitiser = sanitiser
        self.mode = sanitiser.mode
        self.max_critiques = max_critiques
        self.task_description = (
            None
            if task_description is None
            else check_public(task_description, mode=self.mode, field_name="task_description")
        )
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_feedback_items = max_feedback_items
        self.min_chars = min_chars

    def critiques(self, parents: Sequence[Candidate], dp_feedback: Feedback = ()) -> list[PublicText]:
        """All critiques, parents in the given order (best first)."""
        by_parent = self.critiques_by_parent(parents, dp_feedback)
        return [c for p in parents for c in by_parent.get(p.id, [])]

    def critiques_by_parent(
        self, parents: Sequence[Candidate], dp_feedback: Feedback = ()
    ) -> dict[str, list[PublicText]]:
        """Parent id -> its critiques (empty where the LLM gave nothing usable).

        ``dp_feedback``: sentences for all parents, or a mapping parent id -> sentences.
        """
        out: dict[str, list[PublicText]] = {}
        for parent in list(parents)[: self.max_critiques]:
            if isinstance(dp_feedback, Mapping):
                items = dp_feedback.get(parent.id, ())
            else:
                items = dp_feedback
            critique = self.critique(parent, items)
            out[parent.id] = [critique] if critique is not None else []
        return out

    def critique(self, parent: Candidate, dp_feedback: Sequence[PublicText] = ()) -> PublicText | None:
        """One sanitised critique of ``parent``, or None if the LLM gave nothing usable."""
        if isinstance(dp_feedback, str):
            raise TypeError("dp_feedback: expected a sequence of PublicText, got a single text")
        prompt_text = check_public(candidate_text(parent), mode=self.mode, field_name=f"parent {parent.id}")
        stats = self.sanitiser.sanitise_all(
            check_public(f, mode=self.mode, field_name="dp_feedback") for f in dp_feedback
        )[: self.max_feedback_items]
        parts: list[Scaffold | PublicText] = [
            Scaffold(
                "A reviewer reads an instruction for a text classifier and statistics about its mistakes, "
                "then gives one piece of advice to improve the instruction.\n\n"
            )
        ]
        for task, instruction, statistics, advice in CRITIQUE_EXAMPLES:
            parts.append(
                Scaffold(f"Task: {task}\nInstruction: {instruction}\nStatistics: {statistics}\nAdvice: {advice}\n\n")
            )
        if self.task_description is not None:
            parts += [Scaffold("Task: "), oneline(self.task_description, 400), Scaffold("\n")]
        parts += [Scaffold("Instruction: "), oneline(prompt_text, 500), Scaffold("\nStatistics:")]
        if stats:
            for sentence in stats:
                parts += [Scaffold(" "), oneline(sentence, 300)]
        else:
            parts.append(Scaffold(" none available."))
        parts.append(Scaffold("\nAdvice:"))
        prompt = build_llm_prompt(parts, mode=self.mode)
        seed = int(self.rng.integers(2**31 - 1))
        try:
            raw = self.engine.generate(
                prompt, temperature=self.temperature, max_tokens=self.max_tokens, seed=seed, stop=["\n"]
            )
        except PrivateDataError:
            raise
        except Exception:  # a failed critique only means less advice, never a failed run
            return None
        if not isinstance(raw, str):
            return None
        text = extract_critique(raw)
        if len(text) < self.min_chars or is_degenerate(text):
            return None
        if normalise_text(text) == normalise_text(parent.text):
            return None
        worked = [ex[3] for ex in CRITIQUE_EXAMPLES]
        inputs = [parent.text, *(str(s) for s in stats), str(self.task_description or "")]
        if copies_worked_example(text, worked, inputs):
            return None
        tainted = parent.unsafe or prompt_text.source == "unsafe" or any(s.source == "unsafe" for s in stats)
        return self.sanitiser.sanitise(PublicText(text, "unsafe" if tainted else "llm"))
