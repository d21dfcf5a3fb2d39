"""Parent selection: free selectors on released values, and the DPSelector strategies.

:class:`DPSelector` is the base of the selection strategies (noisy scores then top-k,
:class:`NoisyScoreTopK`; a charged exponential-mechanism or permute-and-flip pick,
:class:`ChargedSelection`), registered in ``SELECTION_STRATEGIES`` by name.

Free (post-processing, never charged): :func:`top_k` and :func:`tournament` act on
values that are already differentially private (noisy Gaussian scores, shrunk
estimates). Charging again for them would be double counting. The charged
selection mechanisms are in :mod:`dp_textgrad.privacy.mechanisms`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np

from dp_textgrad.dp_es.estimates import ReleasedScores
from dp_textgrad.privacy.mechanisms import (
    GaussianScoreMechanism,
    SelectionMechanism,
    selection_mechanism,
)
from dp_textgrad.privacy.validation import check_k, finite_values, positive_int

# -- free selectors (post-processing) -------------------------------------------------


def top_k(values: Sequence[float] | np.ndarray, k: int) -> list[int]:
    """Indices of the k largest values, best first (ties: lower index first). Free."""
    array = finite_values(values, "values")
    k = check_k(k, array.size)
    order = np.argsort(-array, kind="stable")
    return [int(i) for i in order[:k]]


def tournament(
    values: Sequence[float] | np.ndarray, k: int, size: int, rng: np.random.Generator, *, distinct: bool = True
) -> list[int]:
    """k tournament winners; each tournament draws ``size`` entrants without replacement. Free.

    ``rng`` is the NON-private seeded generator (selection on noisy values needs no
    secure randomness). With ``distinct`` a winner leaves the pool, so k <= number of
    candidates; otherwise winners may repeat.
    """
    array = finite_values(values, "values")
    k = check_k(k, array.size) if distinct else positive_int(k, "k")
    size = check_k(size, array.size, "size")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng: must be a numpy Generator (np.random.default_rng(seed))")
    pool = list(range(array.size))
    winners: list[int] = []
    for _ in range(k):
        entrants = rng.choice(len(pool), size=min(size, len(pool)), replace=False)
        best = max(entrants, key=lambda j: (array[pool[j]], -pool[j]))
        winners.append(pool[best])
        if distinct:
            pool.pop(best)
    return winners


# -- selection strategies: how a generation turns private scores into parents ------------------


@dataclass(frozen=True)
class GenerationMechanisms:
    """The mechanisms one generation runs on private data (None: that stage is not run)."""

    scores: GaussianScoreMechanism | None = None
    selection: SelectionMechanism | None = None
    exact_feedback: bool = False  # privacy 'off' only: exact confusion matrices, no mechanism

    def events(self, q: float) -> list[dp_accounting.DpEvent]:
        return [m.event(q) for m in (self.scores, self.selection) if m is not None]


@dataclass(frozen=True)
class Choice:
    """What a strategy chose: parents (best first) and the scores it released, if any."""

    parents: list[Any]
    released: ReleasedScores | None = None


class DPSelector(ABC):
    """One way of choosing parents from private scores; registered in :data:`SELECTION_STRATEGIES`.

    ``calibrates`` names the free parameter the budget decides ("noise_multiplier",
    "epsilon0", or None for the non-private baseline). :meth:`mechanisms` is asked by the
    planner and by the running generation alike, so what is planned is what runs.
    """

    name: str
    calibrates: str | None
    releases_scores: bool  # noisy estimates per candidate (ranking is then free post-processing)
    supports_feedback: bool  # DP confusion matrices can ride on its scoring

    @abstractmethod
    def mechanisms(
        self, config: Any, value: float | None, generation: int, num_candidates: int, clip_bound: float
    ) -> GenerationMechanisms: ...

    @abstractmethod
    def choose(
        self,
        scorer: Any,
        population: Any,
        candidates: list[Any],
        mechanisms: GenerationMechanisms,
        generation: int,
        parents: int,
    ) -> Choice: ...

    @abstractmethod
    def describe(self, value: float | None, parents: int) -> str:
        """One line for the console: the mechanism and its calibrated parameter."""

    def current_best(self, population: Any, parents: list[Any]) -> Any:
        return population.best(1)[0] if self.releases_scores else parents[0]


def _release_then_choose(
    release: Any, population: Any, candidates: list[Any], generation: int, parents: int, with_feedback: bool
) -> Choice:
    """Release the scores (``release(feedback_chooser)``), record them, keep the top ``parents``.

    With feedback, the chooser runs between the scores and the matrices: it sees the
    released scores only and names the top parent (the candidate whose critique is used).
    """
    chosen: list[Any] = []

    def choose(released: ReleasedScores) -> list[int]:
        population.record(released, generation)
        chosen.extend(population.best(parents))
        return [next(i for i, c in enumerate(candidates) if c.id == chosen[0].id)]

    released = release(choose if with_feedback else ())
    if not chosen:
        choose(released)
    return Choice(chosen, released)


def _feedback_name(scorer: Any) -> str:
    """What the task's feedback counts are called in a ledger label (public: the task's kind)."""
    spec = getattr(getattr(scorer, "task", None), "feedback", None)
    return "failure histogram" if getattr(spec, "kind", "confusion") == "failures" else "confusion matrix"


def feedback_is_used(config: Any, generation: int) -> bool:
    """Whether generation ``t`` releases a DP confusion matrix: asked for, followed by another
    generation, and read by an LLM operator (critiques, rewrites). A run decides ``llm_operators``
    before its plan (``plan.decide_llm_operators``); a bare plan of an undecided configuration
    (None) is planned as if the feedback were read, the conservative side."""
    return (
        config.feedback == "dp_confusion" and generation + 1 < config.generations and config.llm_operators is not False
    )


# The count of failed records (dp.max_error_share) rides on the scores' Gaussian with this multiple of
# their noise multiplier: z_eff = z / sqrt(1 + 1/3^2), 5% less than z (the calibration makes it up
# with 5% more noise), and the share's noise std is 3 z / (q N).
ERROR_NOISE_RATIO = 3.0


def error_stop(share: float | None, share_std: float | None, threshold: float | None) -> bool:
    """Whether a run stops on failures: the noisy share of failed records is above ``threshold`` by
    two noise standard deviations (post-processing of the DP count; never when not asked)."""
    if threshold is None or share is None or share_std is None:
        return False
    return bool(share - 2.0 * share_std > threshold)


class NoisyScoreTopK(DPSelector):
    """Release every candidate's noisy score (Gaussian); parents are the top-k of the
    shrunk estimates, free post-processing."""

    calibrates: str | None
    name, calibrates, releases_scores, supports_feedback = "gaussian", "noise_multiplier", True, True

    def mechanisms(
        self, config: Any, value: float | None, generation: int, num_candidates: int, clip_bound: float
    ) -> GenerationMechanisms:
        if value is None:
            raise ValueError("gaussian selection: the plan has no noise multiplier")
        # Feedback is charged only where it is read: never after the last generation, never
        # when no LLM operator reads it.
        z_fb = value * config.feedback_noise_ratio if feedback_is_used(config, generation) else None
        z_err = value * ERROR_NOISE_RATIO if getattr(config, "max_error_share", None) is not None else None
        return GenerationMechanisms(scores=GaussianScoreMechanism(value, clip_bound, num_candidates, z_fb, z_err))

    def choose(
        self,
        scorer: Any,
        population: Any,
        candidates: list[Any],
        mechanisms: GenerationMechanisms,
        generation: int,
        parents: int,
    ) -> Choice:
        scores = mechanisms.scores
        if scores is None:
            raise ValueError("gaussian selection: the generation's mechanisms have no score mechanism")
        label = f"generation {generation}: noisy scores of {len(candidates)} candidates" + (
            f" + DP {_feedback_name(scorer)} of the top parent" if scores.releases_feedback else ""
        )
        return _release_then_choose(
            lambda chooser: scorer.score(candidates, scores, label, feedback_candidates=chooser),
            population,
            candidates,
            generation,
            parents,
            scores.releases_feedback,
        )

    def describe(self, value: float | None, parents: int) -> str:
        return f"Gaussian noisy scores, noise multiplier z = {value:.4f}; parents: top-{parents} of the estimates"


class ExactScores(NoisyScoreTopK):
    """NOT PRIVATE: the ``privacy='off'`` baseline, same loop and subsample size, no noise."""

    name, calibrates = "exact", None

    def mechanisms(
        self, config: Any, value: float | None, generation: int, num_candidates: int, clip_bound: float
    ) -> GenerationMechanisms:
        return GenerationMechanisms(exact_feedback=feedback_is_used(config, generation))

    def choose(
        self,
        scorer: Any,
        population: Any,
        candidates: list[Any],
        mechanisms: GenerationMechanisms,
        generation: int,
        parents: int,
    ) -> Choice:
        return _release_then_choose(
            lambda chooser: scorer.score_exact(candidates, feedback_candidates=chooser),
            population,
            candidates,
            generation,
            parents,
            mechanisms.exact_feedback,
        )

    def describe(self, value: float | None, parents: int) -> str:
        return "NOT PRIVATE: exact scores (privacy 'off')"


class ChargedSelection(DPSelector):
    """Release indices only: a DP selection mechanism picks k parents on a fresh subsample."""

    calibrates, releases_scores, supports_feedback = "epsilon0", False, False

    def __init__(self, name: str, title: str) -> None:
        self.name, self.title = name, title

    def mechanisms(
        self, config: Any, value: float | None, generation: int, num_candidates: int, clip_bound: float
    ) -> GenerationMechanisms:
        if value is None:
            raise ValueError(f"{self.name} selection: the plan has no epsilon0")
        return GenerationMechanisms(selection=selection_mechanism(self.name, value, config.parents, clip_bound))

    def choose(
        self,
        scorer: Any,
        population: Any,
        candidates: list[Any],
        mechanisms: GenerationMechanisms,
        generation: int,
        parents: int,
    ) -> Choice:
        label = f"generation {generation}: {self.title} top-{parents}"
        chosen = scorer.select(candidates, mechanisms.selection, label)
        return Choice([candidates[i] for i in chosen])  # ordered: free to release its head

    def describe(self, value: float | None, parents: int) -> str:
        return f"{self.title} top-{parents}, epsilon0 = {value:.4f} per selection"


SELECTION_STRATEGIES: dict[str, DPSelector] = {
    "gaussian": NoisyScoreTopK(),
    "exponential": ChargedSelection("exponential", "exponential (Gumbel)"),
    "permute_and_flip": ChargedSelection("permute_and_flip", "permute-and-flip"),
}
NON_PRIVATE = ExactScores()


def strategy_for(config: Any) -> DPSelector:
    """The strategy a configuration names (the non-private baseline when privacy is 'off')."""
    if config.privacy == "off":
        return NON_PRIVATE
    try:
        return SELECTION_STRATEGIES[config.selection]
    except KeyError:
        raise ValueError(
            f"selection: unknown strategy {config.selection!r}; use one of {sorted(SELECTION_STRATEGIES)}"
        ) from None


__all__ = [
    "ERROR_NOISE_RATIO",
    "SELECTION_STRATEGIES",
    "Choice",
    "GenerationMechanisms",
    "DPSelector",
    "error_stop",
    "strategy_for",
    "top_k",
    "tournament",
]
