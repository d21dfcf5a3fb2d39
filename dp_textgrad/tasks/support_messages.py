"""Composition of one support message, and of a list of labelled messages.

``compose_message`` picks a request for the label, maybe makes it a hard case (see
``support_templates``), adds framing, typos and lower case by the split's ``Style``,
and fills the slots. ``generate_messages`` balances the labels and never repeats a
text across splits. Every draw comes from the ``random.Random`` it is given, in a
fixed order, so a seed fixes the messages.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from dp_textgrad.tasks.base import Example
from dp_textgrad.tasks.support_slots import SlotFiller
from dp_textgrad.tasks.support_templates import (
    ASIDE_FOR,
    ASIDES,
    BACKGROUND,
    CLOSINGS,
    DIRECT_REQUESTS,
    GREETINGS,
    IDENTITY_LINES,
    INDIRECT_REQUESTS,
    INTROS,
    MISSPELLINGS,
    NEGATIONS,
    SIGNOFFS,
    SUPPORT_LABELS,
)


@dataclass(frozen=True)
class Style:
    """Generator settings for one split."""

    with_pii: bool
    hard_fraction: float
    typo_rate: float
    lowercase_rate: float
    framing_rate: float  # scales the chance of greetings, introductions, closings and sign-offs


def private_style(hard_fraction: float) -> Style:
    """Private and test splits: fake personal data, typos, some all-lower-case messages."""
    return Style(with_pii=True, hard_fraction=hard_fraction, typo_rate=0.25, lowercase_rate=0.12, framing_rate=1.0)


def public_style(hard_fraction: float) -> Style:
    # Public records are curated: placeholders instead of personal data, rare typos, and
    # mostly just the request (short demonstrations suit a small model's context).
    return Style(with_pii=False, hard_fraction=hard_fraction, typo_rate=0.05, lowercase_rate=0.0, framing_rate=0.2)


def _typo(word: str, rng: random.Random) -> str:
    lower = word.lower()
    if lower in MISSPELLINGS and word.islower():
        return MISSPELLINGS[lower]
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:  # swap two neighbours
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if kind == 1:  # drop a letter
        return word[:i] + word[i + 1 :]
    return word[:i] + word[i] + word[i:]  # double a letter


def _add_typos(template: str, rng: random.Random, n: int) -> str:
    """Misspell ``n`` plain words of a template (never a ``{slot}``, so no personal data is altered)."""
    tokens = template.split(" ")
    plain = [i for i, tok in enumerate(tokens) if tok.isalpha() and len(tok) >= 4]
    for i in rng.sample(plain, min(n, len(plain))):
        tokens[i] = _typo(tokens[i], rng)
    return " ".join(tokens)


def _other(label: str, rng: random.Random) -> str:
    return rng.choice([lab for lab in SUPPORT_LABELS if lab != label])


def compose_message(label: str, rng: random.Random, style: Style) -> str:
    """One message whose main request is ``label``."""
    filler = SlotFiller(rng, style.with_pii)
    hard = rng.random() < style.hard_fraction
    hard_kind = rng.choice(("negation", "background", "indirect", "aside")) if hard else None

    request = rng.choice(INDIRECT_REQUESTS[label] if hard_kind == "indirect" else DIRECT_REQUESTS[label])
    if rng.random() < 0.2:  # a second sentence of the same intent makes longer messages
        request += " " + rng.choice([t for t in DIRECT_REQUESTS[label] + INDIRECT_REQUESTS[label] if t != request])
    if style.typo_rate and rng.random() < style.typo_rate:
        request = _add_typos(request, rng, rng.choice((1, 1, 2)))

    before: list[str] = []
    after: list[str] = []
    if hard_kind == "negation":
        before.append(rng.choice(NEGATIONS[_other(label, rng)]))
    elif hard_kind == "background":
        before.append(rng.choice(BACKGROUND[_other(label, rng)]))
    elif hard_kind == "aside":
        after.append(rng.choice(ASIDES[rng.choice(ASIDE_FOR[label])]))
    elif hard_kind == "indirect" and rng.random() < 0.3:
        before.append(rng.choice(BACKGROUND[_other(label, rng)]))

    parts: list[str] = []
    framing = style.framing_rate
    if rng.random() < 0.55 * framing:
        parts.append(rng.choice(GREETINGS))
    if rng.random() < 0.4 * framing:
        parts.append(rng.choice(INTROS))
    parts += before + [request] + after
    if rng.random() < 0.5 * framing:
        parts.append(rng.choice(CLOSINGS))
    if rng.random() < 0.35 * framing:
        parts.append(rng.choice(SIGNOFFS))
    text = _join(parts).format_map(filler)
    if style.with_pii and not filler.used_pii:  # every private message identifies its sender somehow
        text += " " + rng.choice(IDENTITY_LINES).format_map(filler)
    if rng.random() < style.lowercase_rate:
        text = text.lower()
    return re.sub(r"\s+", " ", text).strip()


def _join(parts: Sequence[str]) -> str:
    """Join sentences; after a trailing comma the next sentence continues in lower case."""
    out = ""
    for part in parts:
        if out.endswith(",") and part[:1].isupper() and not re.match(r"(I\b|I'|\{)", part):
            part = part[0].lower() + part[1:]
        out = f"{out} {part}" if out else part
    return out


def _balanced_labels(n: int, rng: random.Random) -> list[str]:
    labels = [SUPPORT_LABELS[i % len(SUPPORT_LABELS)] for i in range(n)]
    rng.shuffle(labels)
    return labels


def generate_messages(n: int, rng: random.Random, style: Style, avoid: set[str]) -> list[Example]:
    """``n`` examples with labels balanced to within one, no text repeated across splits."""
    examples: list[Example] = []
    for label in _balanced_labels(n, rng):
        for _ in range(50):
            text = compose_message(label, rng, style)
            if text not in avoid:
                break
        avoid.add(text)
        examples.append(Example(text=text, label=label))
    return examples
