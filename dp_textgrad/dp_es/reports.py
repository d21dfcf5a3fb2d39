"""What a run reports: per-generation DP statistics, operator-only telemetry, the result.

Every field of :class:`GenerationReport` and :class:`SearchResult` is classified in
:mod:`dp_textgrad.privacy.release`; private-phase usage and time live only in
:class:`GenerationTelemetry`, which stays under the run's ``operator/`` folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dp_textgrad.privacy import release
from dp_textgrad.privacy.accounting.bounds import format_epsilon
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded
from dp_textgrad.privacy.accounting.lifetime import LifetimeCapExceeded


@dataclass(frozen=True)
class GenerationReport:
    """What one generation released: DP statistics, public parameters and public-phase costs.

    This is what callbacks and progress displays receive (channel ``metrics``).
    """

    generation: int
    best_candidate_id: str
    best_estimate: float
    mean_estimate: float  # over every candidate scored in this generation (the population's mean)
    noise_std_estimate: float
    epsilon_spent: float
    epsilons: dict[str, float]
    public_calls: int = 0
    public_prompt_tokens: int = 0
    public_completion_tokens: int = 0
    planned_private_evaluations: float = 0.0
    # dp.max_error_share: the noisy share of sampled records that failed to score, and its noise std
    error_share_estimate: float | None = None
    error_share_noise_std: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationReport:
        """Tolerant of older checkpoints (their usage fields were private: they are dropped)."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class GenerationTelemetry:
    """OPERATOR-ONLY: real usage and wall time of one generation, private phase included.

    Functions of the secret subsample (|B_t|, the length of the records in it): never
    released. Runs keep it under ``operator/``.
    """

    private_calls: int
    private_prompt_tokens: int
    private_completion_tokens: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class UsageMark:
    """An engine's cumulative usage at one moment; differences measure a phase."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, engine: Any) -> UsageMark:
        usage = getattr(engine, "usage", None)
        return cls(
            int(getattr(usage, "calls", 0)),
            int(getattr(usage, "prompt_tokens", 0)),
            int(getattr(usage, "completion_tokens", 0)),
        )

    def __sub__(self, other: UsageMark) -> UsageMark:
        return UsageMark(
            self.calls - other.calls,
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
        )

    def __add__(self, other: UsageMark) -> UsageMark:
        return UsageMark(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


@dataclass(frozen=True)
class FinalEstimate:
    """A fresh DP estimate of the released prompt's mean score (``dp.final_estimate``): one noisy
    sum over a fresh Poisson subsample, divided by the public q_f N. Neither its subsample nor its
    noise chose the prompt, so it carries no winner's curse; ``interval`` covers its noise and its
    subsampling (a public bound), clipped to the metric's range. It is a score on the private set,
    not on new data: for that, score the prompt on a public test split."""

    candidate_id: str
    estimate: float
    noise_std: float
    sampling_std_bound: float
    interval: tuple[float, float]
    sampling_rate: float
    expected_batch_size: float

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["interval"] = list(self.interval)
        return out


@dataclass
class SearchResult:
    """The released prompt with its guarantee and the run's public history."""

    prompt: str
    candidate_id: str
    estimate: float | None
    epsilon: float
    delta: float
    epsilons: dict[str, float]
    generations_run: int
    stopped_because: str
    unsafe: bool
    history: list[GenerationReport] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    noise: str | None = None
    public_usage: dict[str, int] = field(default_factory=dict)
    planned_private_evaluations: float = 0.0
    labelling: dict[str, Any] | None = None  # the labelling phase's release (labels.json), if the run had one
    final_estimate: FinalEstimate | None = None  # dp.final_estimate: the released prompt re-scored, if planned

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["history"] = [h.as_dict() for h in self.history]
        if self.final_estimate is not None:  # every field classified (channel `final_estimate`)
            out["final_estimate"] = release.released("final_estimate", self.final_estimate.as_dict())
        return out


# The start of stopped_because when the noisy share of failed records stopped a run (a DP decision).
FAILURES_STOP = "stopped on failures"


def failures_reason(report: GenerationReport, threshold: float | None) -> str:
    """Why a run stopped on failures (``dp.max_error_share``): DP outputs and public settings only."""
    return (
        f"{FAILURES_STOP}: after generation {report.generation + 1} the noisy share of sampled private "
        f"records that failed to score was {report.error_share_estimate:.3f} (noise std "
        f"{report.error_share_noise_std:.3f}), above max_error_share {threshold:g} by two standard "
        "deviations; the operator's errors log (operator/errors.log) has the errors"
    )


def refusal_reason(exc: BudgetExceeded, t: int, generations: int, spent: float, interrupted: int) -> str:
    """Why a run stopped when generation ``t``'s charge was refused (its own budget, or the
    dataset's lifetime cap that other runs on the same data used up)."""
    lost = (
        (
            f"; {interrupted} charge(s) of an interrupted generation were spent without a result, which is why "
            "the plan no longer fits"
        )
        if interrupted
        else ""
    )
    if isinstance(exc, LifetimeCapExceeded):
        return (
            f"the dataset's lifetime cap {exc.cap:g} was reached before generation {t + 1} of {generations}: "
            f"its charge {exc.label!r} would raise the dataset's lifetime filter bound to "
            f"{format_epsilon(exc.epsilon)} (this run spent {format_epsilon(spent)}){lost}"
        )
    return (
        f"budget exhausted before generation {t + 1} of {generations}: its charge {exc.label!r} would raise "
        f"epsilon to {format_epsilon(exc.epsilon)} over the budget {exc.budget:g} (spent {format_epsilon(spent)}){lost}"
    )


def nothing_released(refusal: BudgetExceeded | None, ledger: Any, interrupted: int) -> BudgetExceeded:
    """The error of a run whose first generation's charge was refused (nothing to release)."""
    if isinstance(refusal, LifetimeCapExceeded):
        return LifetimeCapExceeded(
            refusal.epsilon,
            refusal.cap,
            refusal.delta,
            f"generation 0's charge {refusal.label!r} (nothing was released)",
            refusal.label,
        )
    lost = (
        (
            f"; {interrupted} charge(s) of an interrupted generation were spent without a result, so the plan "
            "no longer fits; nothing was released"
        )
        if interrupted
        else ""
    )
    epsilon = refusal.epsilon if refusal is not None else math.inf
    return BudgetExceeded("generation 0", epsilon, ledger.epsilon_budget, ledger.delta, lost)


__all__ = ["GenerationReport", "GenerationTelemetry", "SearchResult", "UsageMark", "nothing_released", "refusal_reason"]
