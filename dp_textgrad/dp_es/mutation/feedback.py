"""Feedback text for the MutationEngine: sanitising it, and rendering DP statistics as sentences.

``FeedbackSanitiser`` is HYGIENE ONLY. Its length limit, PII scrubbing and
provenance check catch accidents (an LLM echoing an e-mail address from a public
example, an over-long critique, a plain string that was never declared public).
It is never counted as a privacy protection: the guarantee comes only from the DP
mechanisms and from the rule that mutation prompts are built from public text and
DP releases. Regexes miss names and many formats; do not rely on them.

``render_confusion`` turns a DP-released noisy confusion matrix into short public
sentences, ``render_failures`` a noisy histogram of a generation task's public failure
categories. Both are post-processing of a DP release, so they cost no budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np

from dp_textgrad.dp_es.mutation.barrier import FeedbackMode, check_mode
from dp_textgrad.privacy.data import (
    Private,
    PrivateBatch,
    PrivateDataError,
    PrivateDataset,
    PublicText,
)

PUBLIC_FEEDBACK_SOURCES = frozenset({"dp", "llm", "phrase_bank", "user", "public_example", "candidate"})

# Order matters: e-mails and URLs before the generic token rules that would split them.
_PII_PATTERNS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), "[email]"),
    ("url", re.compile(r"\b(?:https?://|www\.)[^\s<>\"]+", re.IGNORECASE), "[url]"),
    (
        "address",
        re.compile(
            r"\b\d{1,5}[A-Za-z]?\s+(?:[A-Za-z][\w'.-]*\s+){1,3}"
            r"(?:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|way|place|pl|"
            r"terrace|close|crescent|square|sq|highway|hwy)\b\.?"
            r"(?:,?\s*(?:apt|apartment|suite|unit|flat)\.?\s*#?\w+)?",
            re.IGNORECASE,
        ),
        "[address]",
    ),
    (
        "phone",
        re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]\d{2,4}){1,4}(?![\w])"),
        "[phone]",
    ),
    ("account", re.compile(r"(?<![\w-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*(?![\w-])"), "[id]"),
    ("ticket", re.compile(r"#\s?\d{3,}\b"), "[id]"),
    ("digits", re.compile(r"\d{5,}"), "[number]"),
)
_PHONE_MIN_DIGITS = 7
_ACCOUNT_MIN_LENGTH = 6
_ACCOUNT_MIN_DIGITS = 2
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_TAG = re.compile(r"</?\s*[A-Za-z_][\w-]*\s*>")  # keeps feedback from faking prompt delimiters
_WHITESPACE = re.compile(r"\s+")


def scrub_pii(text: str, keep_terms: Iterable[str] = ()) -> tuple[str, dict[str, int]]:
    """Replace e-mails, URLs, street addresses, phone numbers, account-like tokens and
    long digit runs with placeholders. ``keep_terms`` (e.g. label names) are left alone.

    Returns the scrubbed text and how many replacements of each kind were made.
    """
    keep = {t.casefold() for t in keep_terms if t}
    counts: dict[str, int] = {}
    for kind, pattern, placeholder in _PII_PATTERNS:

        def replace(match: re.Match[str], kind: str = kind, placeholder: str = placeholder) -> str:
            found = match.group(0)
            if found.casefold() in keep:
                return found
            if kind == "phone" and sum(ch.isdigit() for ch in found) < _PHONE_MIN_DIGITS:
                return found
            if kind == "account" and (
                len(found) < _ACCOUNT_MIN_LENGTH or sum(ch.isdigit() for ch in found) < _ACCOUNT_MIN_DIGITS
            ):
                return found
            counts[kind] = counts.get(kind, 0) + 1
            return placeholder

        text = pattern.sub(replace, text)
    return text, counts


def truncate_text(text: str, max_chars: int) -> str:
    """Cut ``text`` to at most ``max_chars`` characters, at a word boundary when possible."""
    if len(text) <= max_chars:
        return text
    cut = text[: max(0, max_chars - 3)]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "..."


class FeedbackSanitiser:
    """Length limit, PII scrubbing and provenance check for feedback text (hygiene only).

    Only :class:`PublicText` whose ``source`` is allowed passes; anything else raises
    :class:`PrivateDataError`. In ``mode="public"`` the source ``"unsafe"`` is never
    allowed; ``mode="unsafe"`` allows it (research baselines, audit positive controls).
    This is NOT a privacy mechanism and is never counted as one.
    """

    def __init__(
        self,
        max_chars: int = 300,
        *,
        mode: FeedbackMode = "public",
        allowed_sources: Iterable[str] | None = None,
        keep_terms: Iterable[str] = (),
        min_chars: int = 3,
    ) -> None:
        check_mode(mode)
        if max_chars < 10:
            raise ValueError(f"max_chars: must be at least 10, got {max_chars}")
        sources = set(PUBLIC_FEEDBACK_SOURCES if allowed_sources is None else allowed_sources)
        unknown = sources - PublicText.SOURCES
        if unknown:
            raise ValueError(f"allowed_sources: unknown sources {sorted(unknown)}; use {sorted(PublicText.SOURCES)}")
        if mode == "unsafe" and allowed_sources is None:
            sources.add("unsafe")
        if mode == "public" and "unsafe" in sources:
            raise ValueError("allowed_sources: 'unsafe' text is only allowed with mode='unsafe'")
        self.mode = mode
        self.max_chars = max_chars
        self.min_chars = min_chars
        self.allowed_sources = frozenset(sources)
        self.keep_terms = tuple(keep_terms)

    def check_provenance(self, text: object) -> PublicText:
        """Return ``text`` if it is PublicText of an allowed source; raise otherwise."""
        if isinstance(text, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError("feedback: private data cannot be used as feedback")
        if not isinstance(text, PublicText):
            raise PrivateDataError(
                f"feedback: got {type(text).__name__}, which is not declared public; "
                "wrap public text as PublicText(text, source=...)"
            )
        if text.source not in self.allowed_sources:
            raise PrivateDataError(
                f"feedback: source {text.source!r} is not allowed here (allowed: {sorted(self.allowed_sources)})"
            )
        return text

    def sanitise(self, text: PublicText) -> PublicText | None:
        """The cleaned text with the same source, or None if nothing useful is left."""
        text = self.check_provenance(text)
        cleaned = _CONTROL.sub(" ", str(text))
        cleaned = _TAG.sub(" ", cleaned)
        cleaned, _ = scrub_pii(cleaned, self.keep_terms)
        cleaned = _WHITESPACE.sub(" ", cleaned).strip()
        cleaned = truncate_text(cleaned, self.max_chars)
        if len(cleaned) < self.min_chars:
            return None
        return PublicText(cleaned, text.source)

    def sanitise_all(self, texts: Iterable[PublicText]) -> list[PublicText]:
        """Sanitise each text, dropping empty results and repeats (order kept)."""
        out: list[PublicText] = []
        seen: set[str] = set()
        for text in texts:
            cleaned = self.sanitise(text)
            if cleaned is None:
                continue
            key = cleaned.casefold()
            if key not in seen:
                seen.add(key)
                out.append(cleaned)
        return out


def _percent(fraction: float) -> str:
    return f"{round(100 * fraction)}%"


def render_confusion(
    noisy_confusion: np.ndarray,
    labels: Sequence[str],
    expected_batch_size: float | None = None,
    *,
    noise_std: float | None = None,
    threshold_stds: float = 2.0,
    min_count: float = 1.0,
    min_fraction: float = 0.05,
    max_sentences: int = 6,
    item_noun: str = "messages",
) -> list[PublicText]:
    """Short public sentences about a DP-released noisy confusion matrix.

    ``noisy_confusion[g, p]``: noisy count of records with gold label ``g`` predicted
    as ``p``. Negative counts are clipped to 0. A cell is used only if it exceeds
    ``max(min_count, threshold_stds * noise_std)``, so pure noise is rarely reported.
    ``expected_batch_size`` (public q*N) is the denominator of the overall accuracy;
    without it the noisy total is used. Post-processing only: no budget is spent.
    """
    matrix = np.asarray(noisy_confusion, dtype=float)
    n_labels = len(labels)
    if matrix.ndim != 2 or matrix.shape != (n_labels, n_labels):
        raise ValueError(
            f"noisy_confusion: expected shape ({n_labels}, {n_labels}) for {n_labels} labels, got {matrix.shape}"
        )
    if not np.all(np.isfinite(matrix)):
        raise ValueError("noisy_confusion: contains nan or inf; pass the released matrix unchanged")
    if noise_std is not None and (not math.isfinite(noise_std) or noise_std < 0):
        raise ValueError(f"noise_std: must be a finite number >= 0, got {noise_std}")
    if expected_batch_size is not None and not expected_batch_size > 0:
        raise ValueError(f"expected_batch_size: must be > 0 (it is q*N), got {expected_batch_size}")
    threshold = max(min_count, threshold_stds * (noise_std or 0.0))

    counts = np.clip(matrix, 0.0, None)
    counts[counts < threshold] = 0.0  # below the noise floor: treat as unknown, say nothing
    row_totals = counts.sum(axis=1)
    col_totals = counts.sum(axis=0)
    total = float(counts.sum())
    # A row's rates are only stated when its total is clearly above the noise of L cells.
    row_floor = max(min_count, threshold_stds * (noise_std or 0.0) * math.sqrt(n_labels))
    sentences: list[str] = []

    if total > 0:
        denominator = float(expected_batch_size) if expected_batch_size is not None else total
        overall = min(1.0, float(np.trace(counts)) / denominator)
        sentences.append(f"Overall, about {_percent(overall)} of {item_noun} get the right label.")

    # Over-predicted labels: predicted far more often than they occur.
    if total > 0:
        for p in range(n_labels):
            share_pred = col_totals[p] / total
            share_gold = row_totals[p] / total
            if col_totals[p] >= row_floor and share_pred >= 1.5 * share_gold + min_fraction:
                sentences.append(
                    f"'{labels[p]}' is predicted much more often than it occurs "
                    f"(about {_percent(share_pred)} of answers, {_percent(share_gold)} of {item_noun})."
                )

    confusions = []
    for g in range(n_labels):
        if row_totals[g] < row_floor:
            continue
        for p in range(n_labels):
            if p == g or counts[g, p] <= 0:
                continue
            fraction = counts[g, p] / row_totals[g]
            if fraction >= min_fraction:
                confusions.append((counts[g, p], g, p, fraction))
    confusions.sort(key=lambda item: (-item[0], item[1], item[2]))
    for _, g, p, fraction in confusions:
        sentences.append(f"About {_percent(fraction)} of '{labels[g]}' {item_noun} are labelled '{labels[p]}'.")

    return [PublicText(s, "dp") for s in sentences[:max_sentences]]


def render_failures(
    noisy_histogram: np.ndarray,
    categories: Sequence[str],
    descriptions: Sequence[str],
    expected_batch_size: float | None = None,
    *,
    noise_std: float | None = None,
    threshold_stds: float = 2.0,
    min_count: float = 1.0,
    max_sentences: int = 4,
    correct: str = "correct",
) -> list[PublicText]:
    """Short public sentences about a DP-released noisy histogram of failure categories.

    ``noisy_histogram[c]``: noisy count of outputs in ``categories[c]`` (public names, with
    one-line public ``descriptions``). Counts below ``max(min_count, threshold_stds *
    noise_std)`` are treated as unknown; the rest are stated as shares of the public q*N
    (``expected_batch_size``; else the noisy total), most frequent failures first. The text is
    built from the release and the public descriptions only: no private output is quoted.
    Post-processing only: no budget is spent.
    """
    counts = np.asarray(noisy_histogram, dtype=float)
    if counts.ndim != 1 or counts.shape[0] != len(categories) or len(descriptions) != len(categories):
        raise ValueError(
            f"noisy_histogram: expected shape ({len(categories)},) with one description per category, "
            f"got {counts.shape} and {len(descriptions)} descriptions"
        )
    if not np.all(np.isfinite(counts)):
        raise ValueError("noisy_histogram: contains nan or inf; pass the released histogram unchanged")
    if noise_std is not None and (not math.isfinite(noise_std) or noise_std < 0):
        raise ValueError(f"noise_std: must be a finite number >= 0, got {noise_std}")
    if expected_batch_size is not None and not expected_batch_size > 0:
        raise ValueError(f"expected_batch_size: must be > 0 (it is q*N), got {expected_batch_size}")
    threshold = max(min_count, threshold_stds * (noise_std or 0.0))
    kept = np.clip(counts, 0.0, None)
    kept[kept < threshold] = 0.0
    total = float(kept.sum())
    if total <= 0:
        return []
    denominator = float(expected_batch_size) if expected_batch_size is not None else total
    sentences: list[str] = []
    if correct in categories:
        share = min(1.0, kept[list(categories).index(correct)] / denominator)
        sentences.append(f"Overall, about {_percent(share)} of outputs get full marks.")
    failures = sorted(
        ((kept[c], c) for c, name in enumerate(categories) if name != correct and kept[c] > 0),
        key=lambda item: (-item[0], item[1]),
    )
    for count, c in failures:
        share = min(1.0, count / denominator)
        sentences.append(f"About {_percent(share)} of outputs fail this way: {descriptions[c]}.")
    return [PublicText(s, "dp") for s in sentences[:max_sentences]]
