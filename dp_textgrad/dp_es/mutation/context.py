"""What a mutation operator may use: the :class:`MutationContext`.

An operator sees the public inputs the ``MutationEngine`` validated at the barrier (task
description, labels, public examples, the demo pool, the phrase bank kept for the task),
its limits, the engine for LLM operators, and the seeded non-private ``rng``; never the
MutationEngine itself. It answers with an ``Edit`` (a proposed child), a ``FailedLLMEdit``
(an LLM operator whose call or answer failed; both in ``text_edits.py``), or None (it does
not apply). The MutationEngine accepts or refuses the edit, makes the rule edit that
replaces a failed LLM call, and records the child.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dp_textgrad.dp_es.config import FeedbackMode
from dp_textgrad.dp_es.mutation.text_edits import PromptLayout, parse_layout
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.privacy.data import PublicText
from dp_textgrad.tasks.base import Example

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine


@dataclass(frozen=True)
class MutationContext:
    """The public inputs, limits and randomness of the operators (built by the MutationEngine).

    ``rng`` is the run's public generator (never DP noise): the order of its draws is part of
    the behaviour, so runs are reproducible from a seed. ``engine`` is None when the LLM
    operators are off. ``demo_pool`` and ``demo_labels`` are parallel: rendered demos with
    their provenance, and their labels. ``vocabulary``: the words of the task's public text.

    ``record_formats``: for a generation task, the public record formats a prompt may take
    besides the task's own (None: prompts have no record format of their own, as a
    classification task's). The demo pool then holds every public example in every format:
    ``demo_formats`` and ``demo_examples`` (parallel to ``demo_pool``) give each demo's format
    (None: the task's own) and the index of its example.
    """

    engine: Engine | None
    rng: np.random.Generator
    mode: FeedbackMode
    task_description: PublicText
    labels: tuple[PublicText, ...]
    public_examples: tuple[Example, ...]
    unsafe_examples: tuple[Example, ...]
    demo_pool: tuple[PublicText, ...]
    demo_labels: tuple[str, ...]
    vocabulary: frozenset[str]
    phrases: tuple[PublicText, ...]
    formats: tuple[PublicText, ...]
    max_prompt_chars: int
    min_instruction_chars: int
    max_demos: int
    max_feedback_items: int
    examples_in_prompt: int
    temperature: float
    max_tokens: int
    record_formats: tuple[PublicText, ...] | None = None
    demo_formats: tuple[str | None, ...] = ()
    demo_examples: tuple[int, ...] = ()

    def layout(self, candidate: Candidate) -> PromptLayout:
        """``candidate``'s prompt split into instruction, demos of the pool and record format."""
        return parse_layout(candidate.text, self.demo_pool, record_format=self.record_formats is not None)

    def demo_indices(self, record_format: str | None) -> list[int]:
        """Positions in the pool of the demos written in ``record_format`` (all, without formats)."""
        if self.record_formats is None:
            return list(range(len(self.demo_pool)))
        return [i for i, fmt in enumerate(self.demo_formats) if fmt == record_format]

    def unused_demos(self, layout: PromptLayout) -> list[PublicText]:
        """Demos of the pool, in ``layout``'s record format, that ``layout`` does not hold yet."""
        present = {normalise_text(d) for d in layout.demos}
        pool = [self.demo_pool[i] for i in self.demo_indices(layout.record_format)]
        return [d for d in pool if normalise_text(d) not in present]

    def demos_in_format(self, demos: list[str], target: str | None) -> list[str]:
        """``demos`` of the pool rewritten in ``target``: the same public examples."""
        if self.record_formats is None:
            return list(demos)
        by_text = {normalise_text(d): self.demo_examples[i] for i, d in enumerate(self.demo_pool)}
        by_example = {self.demo_examples[i]: str(self.demo_pool[i]) for i in self.demo_indices(target)}
        return [by_example.get(by_text.get(normalise_text(d), -1), d) for d in demos]


__all__ = ["MutationContext"]
