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

    def layout(self, candidate: Candidate) -> PromptLayout:
        """``candidate``'s prompt split into instruction and demos of the pool."""
        return parse_layout(candidate.text, self.demo_pool)

    def unused_demos(self, layout: PromptLayout) -> list[PublicText]:
        """Demos of the pool that ``layout`` does not hold yet."""
        present = {normalise_text(d) for d in layout.demos}
        return [d for d in self.demo_pool if normalise_text(d) not in present]


__all__ = ["MutationContext"]
