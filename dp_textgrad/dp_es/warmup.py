"""The public warm-up (``dp.warmup_generations``): a non-private search on the public labelled
examples alone, before the DP phase, whose best prompts seed generation 0.

It is free: it reads the task's public examples (given with the task, or DP-labelled by a
labelling phase: DP outputs, free to reuse) and the engine, never a private record, charges
nothing and leaves the ledger as the plan has it. Its numbers (public scores, how many examples
were held out, the engine usage) are computed from public text and DP outputs only, so they may
be released.

The loop is the DP loop with exact public scores in place of noisy private ones: the run's
MutationEngine (the same operators, the run's public generator) proposes the structured start
(the seed and balanced demonstration sets) and then, for each further warm-up generation, the
children of the ``parents`` best prompts; the parents stay in the next population (mu + lambda:
exact scores need no re-evaluation). Generation 0 of the DP phase is then the seed prompt and the
best warm-up prompts, best first.

Held-out scoring. The structured start and the demonstration operators put public examples into
the prompts as demonstrations; scoring a prompt on the examples it shows would reward copying
them. Each prompt is therefore scored only on the public examples whose input text it does not
contain (leave its demonstrations out), and the score is balanced: the mean over labels of the
mean score on that label's held-out examples. Balancing matters because the held-out set of a
prompt depends on which demonstrations it holds: a prompt holding every example of one label
would otherwise be scored on the other labels alone, where always answering them looks perfect.
A prompt that leaves no example of some label out is not ranked (it can still fill a slot).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.dp_es.reports import UsageMark
from dp_textgrad.privacy.data import Private, PrivateBatch, PrivateDataError, PrivateDataset
from dp_textgrad.tasks.base import Example

# Fewer than this many public examples of a label leave nothing to score a prompt that shows one.
MIN_EXAMPLES_PER_LABEL = 2

_WHITESPACE = re.compile(r"\s+")


def _fold(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip().casefold()


def public_examples_of(task: Any) -> list[Example]:
    """The task's public labelled examples, refused if one is a private record (never unwrapped)."""
    examples = list(getattr(task, "public_examples", ()) or ())
    for example in examples:
        if isinstance(example, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError("public_examples: holds a private record; the warm-up reads public examples only")
        if not isinstance(example, Example):
            raise TypeError(f"public_examples: expected Example objects, got {type(example).__name__}")
    return examples


def groups_of(task: Any) -> list[str]:
    """The groups the score is balanced over: a classification task's labels; a generation
    task's demonstrations form one group (the empty label)."""
    labels = [str(label) for label in getattr(task, "labels", ())]
    return labels if labels else [""]


def skip_reason(task: Any, examples: Sequence[Example]) -> str | None:
    """Why the warm-up cannot run on these public examples, or None. Public: the examples are
    public or DP-labelled, so their counts per label may be named."""
    counts = {group: 0 for group in groups_of(task)}
    for example in examples:
        if example.label in counts:
            counts[example.label] += 1
    short = {group or "(all)": n for group, n in counts.items() if n < MIN_EXAMPLES_PER_LABEL}
    if not short:
        return None
    listed = ", ".join(f"{group!r}: {n}" for group, n in short.items())
    return (
        f"the warm-up needs at least {MIN_EXAMPLES_PER_LABEL} public labelled examples of every label "
        f"(one to show, one to score on) and has fewer for {listed}; give more public examples, or more "
        "dp.labelling queries"
    )


@dataclass(frozen=True)
class HeldOutScore:
    """A prompt's balanced score on the public examples it does not show (None: not ranked)."""

    score: float | None
    held_out: int


def held_out_score(task: Any, engine: Any, prompt: str, examples: Sequence[Example]) -> HeldOutScore:
    """The mean over groups of the mean ``task.public_scores`` on the examples whose input text is
    not in ``prompt``; None when some group has no such example."""
    folded = _fold(prompt)
    held = [example for example in examples if _fold(example.text) not in folded]
    groups = groups_of(task)
    if not held or any(not any(example.label == group for example in held) for group in groups):
        return HeldOutScore(None, len(held))
    scores = np.asarray(task.public_scores(engine, prompt, held), dtype=float).reshape(-1)
    labels = np.array([example.label for example in held], dtype=object)
    per_group = [float(scores[labels == group].mean()) for group in groups]
    return HeldOutScore(float(np.mean(per_group)), len(held))


@dataclass
class WarmupResult:
    """What the warm-up found: every prompt it proposed, ranked ones best first.

    ``ranked``: prompts with a held-out score, best first (ties: the earlier made first);
    ``unranked``: the others, in the order made. ``skipped_because``: the public reason when it
    did not run (then ``ranked`` and ``unranked`` are empty and the public generator is untouched).
    """

    generations: int
    examples: int
    seed_id: str = ""
    ranked: list[Candidate] = field(default_factory=list)
    unranked: list[Candidate] = field(default_factory=list)
    scores: dict[str, HeldOutScore] = field(default_factory=dict)
    usage: UsageMark = field(default_factory=UsageMark)
    skipped_because: str | None = None

    def seeding_order(self) -> list[Candidate]:
        """Generation 0's order after the seed: the prompts scoring at least as well as the seed,
        best first; then the unranked ones (not judged: with a small pool, demonstration sets that
        show every example of a label); then the ranked rest (judged worse than the seed)."""
        seed_score = self.scores[self.seed_id].score if self.seed_id in self.scores else None
        if seed_score is None:
            return [*self.ranked, *self.unranked]
        better = [c for c in self.ranked if (self.scores[c.id].score or 0.0) >= seed_score]
        worse = [c for c in self.ranked if (self.scores[c.id].score or 0.0) < seed_score]
        return [*better, *self.unranked, *worse]

    def as_dict(self, top: int = 5) -> dict[str, Any]:
        """Releasable: public scores of public prompts, counts of public examples, public usage."""
        return {
            "generations": self.generations,
            "public_examples": self.examples,
            "skipped_because": self.skipped_because,
            "prompts_scored": len(self.scores),
            "best": [
                {
                    "candidate_id": c.id,
                    "public_score": self.scores[c.id].score,
                    "held_out": self.scores[c.id].held_out,
                }
                for c in self.ranked[:top]
            ],
            "public_usage": {
                "calls": self.usage.calls,
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
            },
        }


def run_warmup(
    seed: Candidate,
    *,
    task: Any,
    engine: Any,
    mutation: Any,
    generations: int,
    population: int,
    parents: int,
) -> WarmupResult:
    """``generations`` warm-up generations of ``population`` prompts from ``seed`` (see the module
    docstring). Every prompt is made at generation 0 (they are generation 0's candidates); its
    ``operator_meta["warmup"]`` records the warm-up generation and its public score."""
    examples = public_examples_of(task)
    if generations < 1:
        raise ValueError(f"generations: the warm-up needs at least 1 generation, got {generations}")
    reason = skip_reason(task, examples)
    if reason is not None:
        return WarmupResult(0, len(examples), seed.id, skipped_because=reason)
    start = UsageMark.of(engine)
    made: dict[str, Candidate] = {}  # by deduplication key, in the order made
    scores: dict[str, HeldOutScore] = {}
    current = [seed, *mutation.variants(seed, population - 1, generation=0)]
    for g in range(generations):
        for candidate in current:
            if candidate.key in made:
                continue
            made[candidate.key] = candidate
            scores[candidate.id] = held_out_score(task, engine, candidate.text, examples)
            candidate.operator_meta = {
                **candidate.operator_meta,
                "warmup": {"generation": g, "public_score": scores[candidate.id].score},
            }
        if g + 1 == generations:
            break
        best = _ranked(current, scores)[:parents] or current[:parents]
        children = mutation.children(best, population - len(best), 0, exclude=set(made))
        current = best + children
    every = list(made.values())
    return WarmupResult(
        generations=generations,
        examples=len(examples),
        seed_id=seed.id,
        ranked=_ranked(every, scores),
        unranked=[c for c in every if scores[c.id].score is None],
        scores=scores,
        usage=UsageMark.of(engine) - start,
    )


def _ranked(candidates: Sequence[Candidate], scores: dict[str, HeldOutScore]) -> list[Candidate]:
    """Candidates with a score, best first; a stable sort keeps the earlier made first on ties."""
    scored = [c for c in candidates if scores[c.id].score is not None]
    return sorted(scored, key=lambda c: -float(scores[c.id].score or 0.0))


__all__ = [
    "MIN_EXAMPLES_PER_LABEL",
    "HeldOutScore",
    "WarmupResult",
    "groups_of",
    "held_out_score",
    "public_examples_of",
    "run_warmup",
    "skip_reason",
]
