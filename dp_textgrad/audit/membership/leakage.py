"""Leakage of canary secrets through a released prompt.

Two channels:

- the prompt text itself: does a secret appear verbatim, or a long piece of it
  (longest common substring)?
- the model conditioned on the prompt: given the released prompt and a canary's
  prefix (rendered as a task record), does greedy decoding produce the secret
  (sequence-level extraction)? Are the secret's tokens in the model's top-k
  (token hit rate)? How highly does the model rank the true secret among
  never-inserted reference secrets of the same format (exposure)?

Results hold counts, ranks and lengths only, never the generated text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dp_textgrad.audit._asdict import AsDict
from dp_textgrad.audit.canaries.canary_set import Canary, CanarySet
from dp_textgrad.tasks.base import ClassificationTask

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

DEFAULT_TOP_KS = (5, 10, 50)
_WHITESPACE = re.compile(r"\s+")


def record_context(task: ClassificationTask, prompt: str, record_prefix: str = "", *, before_record: str = "") -> str:
    """Model input up to ``record_prefix`` of a record, as the task renders records.

    ``render_prefix(prompt) + before_record + <template head> + record_prefix``, where
    the template head is the record template's text before ``{text}`` (a generation prompt's
    own record format's, where it has one: ``tasks.record_format``).
    """
    own_format = getattr(task, "record_format_of", None)
    record_format = own_format(prompt) if callable(own_format) else None
    if record_format is not None:
        head = record_format.split("{text}", 1)[0]
    else:
        head = task.record_template.split("{text}", 1)[0].replace("{{", "{").replace("}}", "}")
    return task.render_prefix(prompt) + before_record + head + record_prefix


def normalise(text: str) -> str:
    """Case-folded, whitespace-collapsed text (for tolerant matching)."""
    return _WHITESPACE.sub(" ", text.casefold()).strip()


def longest_common_substring(a: str, b: str) -> int:
    """Length of the longest common substring of ``a`` and ``b`` (dynamic programming).

    Iterates over the shorter string and vectorises over the longer one.
    """
    if not a or not b:
        return 0
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    codes = np.frombuffer(long_.encode("utf-32-le"), dtype=np.uint32)
    previous = np.zeros(len(long_) + 1, dtype=np.int64)
    best = 0
    for char in short:
        current = np.zeros_like(previous)
        match = codes == ord(char)
        current[1:] = np.where(match, previous[:-1] + 1, 0)
        best = max(best, int(current.max()))
        previous = current
    return best


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- through the prompt text --------------------------------------------------------------


@dataclass(frozen=True)
class PromptMatch:
    """How much of one secret the prompt text contains."""

    canary_id: str
    included: bool
    verbatim: bool  # exact substring
    verbatim_normalised: bool  # substring after case-folding and whitespace collapsing
    lcs_chars: int  # longest common substring with the prompt (normalised text)
    lcs_fraction: float  # lcs_chars / len(normalised secret)


@dataclass(frozen=True)
class PromptLeakage:
    matches: tuple[PromptMatch, ...]
    verbatim_rate: float
    max_lcs_fraction: float
    mean_lcs_fraction: float


def prompt_leakage(prompt: str, canaries: Sequence[Canary] | CanarySet) -> PromptLeakage:
    """Verbatim and fuzzy (longest common substring) matches of each secret in ``prompt``."""
    canaries = list(canaries)
    if not canaries:
        raise ValueError("canaries: need at least one canary")
    folded = normalise(prompt)
    matches = []
    for c in canaries:
        secret = normalise(c.secret)
        lcs = longest_common_substring(secret, folded)
        matches.append(
            PromptMatch(c.canary_id, c.included, c.secret in prompt, secret in folded, lcs, lcs / len(secret))
        )
    fractions = np.array([m.lcs_fraction for m in matches])
    return PromptLeakage(
        tuple(matches), float(np.mean([m.verbatim for m in matches])), float(fractions.max()), float(fractions.mean())
    )


# -- greedy extraction --------------------------------------------------------------------


@dataclass(frozen=True)
class ExtractionOutcome:
    canary_id: str
    included: bool
    extracted: bool  # the greedy continuation starts with the secret (normalised)
    matched_chars: int  # length of the common prefix of continuation and secret (normalised)
    secret_chars: int


@dataclass(frozen=True)
class ExtractionResult:
    outcomes: tuple[ExtractionOutcome, ...]
    rate: float  # sequence-level extraction rate
    mean_matched_fraction: float


def greedy_extraction(
    engine: Engine,
    task: ClassificationTask,
    prompt: str,
    canaries: Sequence[Canary] | CanarySet,
    *,
    max_tokens: int = 32,
) -> ExtractionResult:
    """Decode greedily (temperature 0) after the released prompt and each canary prefix.

    The engine is called with an empty system prompt so the input is the plain
    continuation context (chat-template engines still wrap it in their template).
    """
    canaries = list(canaries)
    if not canaries:
        raise ValueError("canaries: need at least one canary")
    outcomes = []
    for c in canaries:
        output = engine.generate(
            record_context(task, prompt, c.prefix), system_prompt="", temperature=0.0, max_tokens=max_tokens, seed=0
        )
        secret, produced = normalise(c.secret), normalise(output)
        matched = _common_prefix(produced, secret)
        outcomes.append(ExtractionOutcome(c.canary_id, c.included, matched == len(secret), matched, len(secret)))
    return ExtractionResult(
        tuple(outcomes),
        float(np.mean([o.extracted for o in outcomes])),
        float(np.mean([o.matched_chars / o.secret_chars for o in outcomes])),
    )


# -- token top-k hit rate -------------------------------------------------------------------


@dataclass(frozen=True)
class TopKHitRate:
    """Share of secret tokens that were among the model's top-k next tokens.

    ``token_rate``: over all secret tokens; ``sequence_rate``: share of canaries whose
    every secret token was a hit. Both are ``None`` when the engine's alternatives do
    not decide some position (it gives fewer than k and the token is not among them);
    then ``token_rate_lower_bound`` counts undecided positions as misses and ``note``
    says why.
    """

    k: int
    token_rate: float | None
    sequence_rate: float | None
    token_rate_lower_bound: float
    undecided_positions: int
    total_positions: int
    note: str = ""


def _token_rank(logprob: float, alternatives: Sequence[tuple[str, float]]) -> int | None:
    """1 + the number of alternatives strictly more likely; None if the list cannot tell.

    Ties count in the token's favour. The list cannot tell when every listed
    alternative is strictly more likely (the token is below the list).
    """
    above = sum(1 for _, alt in alternatives if alt > logprob + 1e-9)
    if above == len(alternatives):
        return None
    return above + 1


def topk_hit_rates(
    engine: Engine,
    task: ClassificationTask,
    prompt: str,
    canaries: Sequence[Canary] | CanarySet,
    ks: Sequence[int] = DEFAULT_TOP_KS,
) -> list[TopKHitRate]:
    """Top-k hit rates of the secrets' tokens given prompt and canary prefix."""
    canaries = list(canaries)
    if not canaries:
        raise ValueError("canaries: need at least one canary")
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks: need integers >= 1, got {list(ks)}")
    per_canary: list[list[tuple[int | None, int]]] = []  # (rank or None, number of alternatives)
    for c in canaries:
        result = engine.token_logprobs(c.continuation, record_context(task, prompt, c.prefix))
        alternatives = result.top_alternatives or [[] for _ in result.tokens]
        per_canary.append(
            [(_token_rank(float(lp), alts), len(alts)) for lp, alts in zip(result.logprobs, alternatives)]
        )
    total = sum(len(p) for p in per_canary)
    if total == 0:
        raise ValueError("canaries: the engine returned no tokens for the secrets")
    listed = min(n for p in per_canary for _, n in p)
    rates = []
    for k in ks:
        hits = undecided = 0
        sequence_hits: list[bool | None] = []
        for positions in per_canary:
            state: bool | None = True
            for rank, n_alts in positions:
                if rank is not None and rank <= k:
                    hits += 1
                elif rank is None and n_alts < k:
                    undecided += 1
                    state = None if state is not False else False
                else:
                    state = False
            sequence_hits.append(state)
        note = ""
        if listed < k:
            note = (
                f"the engine lists at most {listed} alternatives per position; ranks above that are unknown, "
                f"{undecided} of {total} positions undecided for k={k}"
            )
        decided = undecided == 0
        rates.append(
            TopKHitRate(
                k=k,
                token_rate=hits / total if decided else None,
                sequence_rate=float(np.mean([bool(s) for s in sequence_hits])) if None not in sequence_hits else None,
                token_rate_lower_bound=hits / total,
                undecided_positions=undecided,
                total_positions=total,
                note=note,
            )
        )
    return rates


# -- exposure -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExposureResult:
    """Exposure = log2(universe size) - log2(rank of the secret in the universe).

    The universe is the canary's secret plus the reference secrets; rank 1 is the
    most likely under the model; ties count against the canary (conservative).
    """

    canary_id: str
    included: bool
    rank: int
    universe_size: int
    exposure: float
    max_exposure: float


def exposure(
    engine: Engine,
    task: ClassificationTask,
    prompt: str,
    canary_set: CanarySet,
    *,
    canaries: Sequence[Canary] | None = None,
    n_references: int | None = None,
) -> list[ExposureResult]:
    """Rank each secret among the reference secrets by log p(secret | prompt, prefix).

    ``n_references`` uses the first n reference secrets (fewer is cheaper; the
    largest measurable exposure is log2(n + 1)).
    """
    references = list(canary_set.reference_secrets)
    if n_references is not None:
        if isinstance(n_references, bool) or not isinstance(n_references, int) or not 1 <= n_references:
            raise ValueError(f"n_references: must be an integer >= 1, got {n_references!r}")
        references = references[:n_references]
    chosen = list(canary_set) if canaries is None else list(canaries)
    if not chosen:
        raise ValueError("canaries: need at least one canary")
    universe = len(references) + 1
    results = []
    for c in chosen:
        choices = [c.continuation] + [" " + s for s in references]
        scores = np.asarray(engine.score_choices(record_context(task, prompt, c.prefix), choices), dtype=float)
        rank = 1 + int(np.sum(scores[1:] >= scores[0]))
        results.append(
            ExposureResult(
                c.canary_id, c.included, rank, universe, math.log2(universe) - math.log2(rank), math.log2(universe)
            )
        )
    return results


# -- all of it --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeakageReport(AsDict):
    prompt: PromptLeakage
    extraction: ExtractionResult | None = None
    top_k: tuple[TopKHitRate, ...] = ()
    exposures: tuple[ExposureResult, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def mean_exposure(self, included: bool | None = None) -> float | None:
        values = [e.exposure for e in self.exposures if included is None or e.included == included]
        return float(np.mean(values)) if values else None


def leakage_report(
    engine: Engine | None,
    task: ClassificationTask,
    prompt: str,
    canary_set: CanarySet,
    *,
    max_tokens: int = 32,
    ks: Sequence[int] = DEFAULT_TOP_KS,
    n_references: int | None = None,
) -> LeakageReport:
    """Every leakage measure for ``prompt`` over all canaries (members and non-members).

    Without an engine only the prompt-text measures are computed.
    """
    text = prompt_leakage(prompt, canary_set)
    if engine is None:
        return LeakageReport(text, notes=("no engine: model-based measures skipped",))
    return LeakageReport(
        text,
        greedy_extraction(engine, task, prompt, canary_set, max_tokens=max_tokens),
        tuple(topk_hit_rates(engine, task, prompt, canary_set, ks)),
        tuple(exposure(engine, task, prompt, canary_set, n_references=n_references)),
    )
