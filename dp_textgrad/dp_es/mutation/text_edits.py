"""Pure string work of mutation: parsing LLM answers, sentences, the prompt layout, and
what an operator answers (:class:`Edit`, :class:`FailedLLMEdit`).

Nothing here draws random numbers or calls an LLM. A candidate prompt is laid out
as an ``instruction`` followed by demo blocks, separated by blank lines; demo blocks
are recognised by matching the rendered demo pool (:func:`parse_layout`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dp_textgrad.dp_es.mutation.phrase_bank import VERBALISER_HINTS
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.tasks.record_format import split_record_format, with_record_format

PROMPT_OPEN = "<PROMPT>"
PROMPT_CLOSE = "</PROMPT>"


# -- parsing LLM output ---------------------------------------------------------------
_CONTINUATION_MARKERS = (
    "\nTask:",
    "\nInstruction:",
    "\nInstruction A:",
    "\nInstruction B:",
    "\nFeedback:",
    "\nImproved instruction:",
    "\nCombined instruction:",
    "\nExamples:",
)
_LEADING_LABEL = re.compile(r"^(?:improved|combined|new)?\s*instruction\s*:\s*", re.IGNORECASE)


def extract_prompt(raw: str) -> str:
    """The instruction inside an LLM answer; robust to missing tags and run-on continuations.

    The prompt already opened ``<PROMPT>``, so text before a ``</PROMPT>`` is the answer;
    a model that repeats the tag (chat models) is handled too.
    """
    text = str(raw).replace("\r", "")
    open_at, close_at = text.find(PROMPT_OPEN), text.find(PROMPT_CLOSE)
    if close_at >= 0 and (open_at < 0 or close_at < open_at):
        text = text[:close_at]
    elif open_at >= 0:
        before, after = text[:open_at], text[open_at + len(PROMPT_OPEN) :]
        close_at = after.find(PROMPT_CLOSE)
        if close_at >= 0:
            after = after[:close_at]
        text = after if after.strip() else before  # a dangling opening tag ends the answer
    for marker in _CONTINUATION_MARKERS:
        at = text.find(marker)
        if at >= 0:
            text = text[:at]
    text = text.replace(PROMPT_OPEN, " ").replace(PROMPT_CLOSE, " ")
    text = re.sub(r"\s+", " ", text).strip()
    text = _LEADING_LABEL.sub("", text).strip().strip('"').strip()
    return text


def is_degenerate(text: str) -> bool:
    """Looping or junk output of a small model."""
    words = text.split()
    if len(words) >= 8 and len(set(w.casefold() for w in words)) / len(words) < 0.35:
        return True
    if re.search(r"(.)\1{15,}", text):
        return True
    letters = sum(ch.isalpha() for ch in text)
    return letters < 0.5 * len(text)


def word_ngrams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.casefold())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def copies_worked_example(text: str, worked: Sequence[str], inputs: Sequence[str], n: int = 5) -> bool:
    """True if ``text`` repeats a run of ``n`` words from a few-shot worked example that
    was not in the real inputs (a small model copying the pattern instead of the task)."""
    borrowed = set().union(*(word_ngrams(w, n) for w in worked)) if worked else set()
    allowed = set().union(*(word_ngrams(i, n) for i in inputs)) if inputs else set()
    return bool((word_ngrams(text, n) & borrowed) - allowed)


# -- sentences ------------------------------------------------------------------------
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\s*\n+\s*")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s and s.strip()]


def dedupe_sentences(text: str) -> str:
    """``text`` with repeated sentences removed (first occurrence kept)."""
    kept: list[str] = []
    seen: set[str] = set()
    for sentence in split_sentences(text):
        if normalise_text(sentence) not in seen:
            seen.add(normalise_text(sentence))
            kept.append(sentence)
    return " ".join(kept)


def truncate_sentences(text: str, max_chars: int) -> str:
    """Whole sentences of ``text`` that fit in ``max_chars`` (may be empty)."""
    if len(text) <= max_chars:
        return text
    kept: list[str] = []
    for sentence in split_sentences(text):
        if len(" ".join(kept + [sentence])) > max_chars:
            break
        kept.append(sentence)
    return " ".join(kept)


_HINT_PREFIXES = tuple(normalise_text(t.split("{labels}")[0]) for t in VERBALISER_HINTS)


def is_verbaliser_hint(sentence: str) -> bool:
    """True for a sentence written from one of the phrase bank's verbaliser hints."""
    return normalise_text(sentence).startswith(_HINT_PREFIXES)


# -- prompt layout --------------------------------------------------------------------
def norm_block(text: str) -> str:
    """A demo block without blank lines inside (a blank line would end the block)."""
    return re.sub(r"\n\s*\n+", "\n", str(text)).strip()


@dataclass
class PromptLayout:
    """A candidate prompt split into its instruction, its demo blocks and, for a generation
    prompt with one, its own record format (the last paragraph, holding ``{text}``;
    :mod:`dp_textgrad.tasks.record_format`). ``record_format`` None: the task's template."""

    instruction: str
    demos: list[str] = field(default_factory=list)
    record_format: str | None = None

    def compose(self) -> str:
        blocks = ([self.instruction.strip()] if self.instruction.strip() else []) + list(self.demos)
        return with_record_format("\n\n".join(blocks), self.record_format)


@dataclass(frozen=True)
class Edit:
    """What one operator proposes: the edited layout of its primary parent, the operator's
    name and metadata, whether unsafe text went in, and the ``partners`` (other parents)
    whose text it used. The MutationEngine accepts or refuses it and records the child."""

    layout: PromptLayout
    operator: str
    meta: dict[str, Any]
    used_unsafe: bool = False
    partners: tuple[Candidate, ...] = ()

    @property
    def text(self) -> str:
        """The child's prompt."""
        return self.layout.compose()


@dataclass(frozen=True)
class FailedLLMEdit:
    """An LLM operator's call failed or its answer was unusable: a rule edit replaces it.

    ``reason`` and ``meta`` are recorded in the replacement child's ``operator_meta``;
    ``partners``: the second parent an LLM crossover tried (rule crossovers come first then).
    """

    operator: str
    reason: str
    meta: dict[str, Any]
    used_unsafe: bool = False
    partners: tuple[Candidate, ...] = ()


def parse_layout(text: str, known_demos: Sequence[str], record_format: bool = False) -> PromptLayout:
    """Blocks (separated by blank lines) that equal a known demo are demos; the rest is
    instruction. ``record_format``: a generation prompt's own record format (its paragraph
    holding ``{text}``, to the end) is split off first."""
    fmt = None
    if record_format:
        text, fmt = split_record_format(text)
    known = {normalise_text(d) for d in known_demos}
    instruction: list[str] = []
    demos: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        if not block.strip():
            continue
        (demos if normalise_text(block) in known else instruction).append(block.strip())
    return PromptLayout("\n\n".join(instruction), demos, fmt)


def merge_demos(first: Sequence[str], second: Sequence[str], limit: int) -> list[str]:
    """The demos of two parents, repeats dropped, at most ``limit``."""
    merged: list[str] = []
    for demo in list(first) + list(second):
        if normalise_text(demo) not in {normalise_text(m) for m in merged}:
            merged.append(demo)
    return merged[:limit]
