"""The structural barrier: the only way text reaches a mutation or critique LLM.

Every prompt the mutation package sends to an LLM is assembled by
:func:`build_llm_prompt`, which accepts only :class:`Scaffold` (fixed text written
into this library) and :class:`PublicText`. ``Private`` values, private datasets and
batches, and plain strings that were never declared public raise
:class:`PrivateDataError`. In ``mode="public"`` PublicText with source ``"unsafe"``
(raw private examples) is refused too; ``mode="unsafe"`` accepts it for research
baselines and audit positive controls, and the run is then NOT DP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from dp_textgrad.dp_es.config import FeedbackMode
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.privacy.data import (
    Private,
    PrivateBatch,
    PrivateDataError,
    PrivateDataset,
    PublicText,
)

# Feedback for all parents, or parent id -> that parent's feedback.
Feedback = Sequence[PublicText] | Mapping[str, Sequence[PublicText]]


class Scaffold(str):
    """Fixed text of this library's LLM prompts (instructions, worked examples).

    Only constants written into the code are Scaffold; data never is.
    """

    def __new__(cls, text: str) -> Scaffold:
        if isinstance(text, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError("private data cannot be used as prompt scaffolding")
        if isinstance(text, PublicText):
            raise TypeError("Scaffold: PublicText keeps its provenance; pass it to the builder as is")
        return super().__new__(cls, text)


def check_mode(mode: str) -> None:
    """Raise ValueError unless ``mode`` is ``"public"`` or ``"unsafe"``."""
    if mode not in ("public", "unsafe"):
        raise ValueError(f"mode: use 'public' or 'unsafe', got {mode!r}")


def check_public(value: object, *, mode: FeedbackMode, field_name: str = "text") -> PublicText:
    """Return ``value`` if it may reach a mutation LLM in ``mode``; raise PrivateDataError otherwise."""
    if isinstance(value, (Private, PrivateDataset, PrivateBatch)):
        raise PrivateDataError(f"{field_name}: private data cannot be put into a mutation prompt")
    if not isinstance(value, PublicText):
        raise PrivateDataError(
            f"{field_name}: {type(value).__name__} is not declared public; "
            "wrap public text as PublicText(text, source=...) (candidates: candidate_text(c))"
        )
    if value.source == "unsafe" and mode != "unsafe":
        raise PrivateDataError(
            f"{field_name}: raw private text (source 'unsafe') is refused in mode='public'; "
            "use mode='unsafe' only for non-private baselines"
        )
    return value


def candidate_text(candidate: Candidate) -> PublicText:
    """A candidate's prompt as PublicText; candidates built from raw private text stay 'unsafe'."""
    return PublicText(candidate.text, "unsafe" if candidate.unsafe else "candidate")


def build_llm_prompt(parts: Sequence[Scaffold | PublicText], *, mode: FeedbackMode) -> str:
    """The ONLY way to assemble text for a mutation or critique LLM call."""
    check_mode(mode)
    pieces: list[str] = []
    for index, part in enumerate(parts):
        if isinstance(part, Scaffold):
            pieces.append(str(part))
        else:
            pieces.append(str(check_public(part, mode=mode, field_name=f"prompt part {index}")))
    return "".join(pieces)


def oneline(text: PublicText, max_chars: int | None = None) -> PublicText:
    """``text`` on one line (few-shot patterns are line-based), provenance kept."""
    flat = re.sub(r"\s+", " ", str(text)).strip()
    if max_chars is not None and len(flat) > max_chars:
        flat = flat[: max_chars - 3].rstrip() + "..."
    return PublicText(flat, text.source)
