"""The run's event stream: typed events that carry released values only, and what observes them.

A run (:func:`dp_textgrad.optimize`, :func:`dp_textgrad.resume`) sends, in order: one
:class:`LifetimeChecked` (the dataset's lifetime budget, before any charge), one
:class:`RunStarted` (the budget and the calibrated plan), one
:class:`~dp_textgrad.dp_es.reports.GenerationReport` per generation once its checkpoint is on
disk, then :class:`RunFinished` (the release) or :class:`RunFailed` (the error's class only).

An observer is an object with any of ``on_lifetime``, ``on_start``, ``on_generation``,
``on_finish`` and ``on_fail`` (each takes the event), or a plain callable, which gets each
``GenerationReport``. The console display, ``optimize --json``, MLflow and user callbacks are
all observers. Each event's ``as_dict()`` is the release-safe dict ``optimize --json`` prints:
it goes through :func:`dp_textgrad.privacy.release.split`, so only fields the release table
classes as public or DP output leave the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_textgrad.privacy import release

EventSink = Callable[[dict[str, Any]], None]

#: The methods an observer may have, one per kind of event.
OBSERVER_METHODS = ("on_lifetime", "on_start", "on_generation", "on_finish", "on_fail")


def stopped_early(stopped_because: str) -> bool:
    """Whether a released run ended before its planned generations (public: budget and user events)."""
    return bool(stopped_because) and stopped_because != "all generations done"


def _released(channel: str, payload: dict[str, Any]) -> dict[str, Any]:
    public, _operator_only = release.split(channel, payload)
    return public


@dataclass(frozen=True)
class RunStarted:
    """The budget and the plan, before the first charge of this invocation (public parameters and
    the ledger's released totals)."""

    config: Any  # the run's DPESConfig: the user's public settings
    mechanism: str  # the plan, in words
    noise_multiplier: float | None
    selection_epsilon: float | None
    dataset_size: int  # the public N: declared, or the DP count's released value
    noise_secure: bool
    noise_sampler: str  # which sampler draws the noise (public; config.json's "noise")
    resumed: bool
    generation: int  # the generation the run starts at (0, or where a resumed run goes on)
    epsilon_spent: float  # the ledger's epsilon so far (released: ledger.jsonl)
    charges: int  # the ledger's entries so far (released: ledger.jsonl)
    interrupted_charges: int  # charges of an interrupted generation (resume)
    task_kind: str = "classify"  # the task family: classify or generate (public)
    metric: str = "accuracy"  # the task's metric name (public: the run file's)

    @classmethod
    def of(cls, optimizer: Any, *, resumed: bool) -> RunStarted:
        plan = optimizer.plan
        return cls(
            config=optimizer.config,
            mechanism=plan.describe(),
            noise_multiplier=plan.noise_multiplier,
            selection_epsilon=plan.selection_epsilon,
            dataset_size=optimizer.public_dataset_size,
            noise_secure=bool(optimizer.noise.secure),
            noise_sampler=str(optimizer.noise.sampler),
            resumed=resumed,
            generation=optimizer.generation,
            epsilon_spent=optimizer.ledger.epsilon(),
            charges=len(optimizer.ledger.entries),
            interrupted_charges=optimizer.interrupted_charges,
            task_kind=str(getattr(optimizer.task, "kind", "classify")),
            metric=str(getattr(optimizer.task, "metric_name", "accuracy")),
        )

    def as_dict(self) -> dict[str, Any]:
        config = self.config
        return _released(
            "events",
            {
                "event": "start",
                "epsilon": config.epsilon,
                "delta": config.delta,
                "generations": config.generations,
                "population": config.population,
                "parents": config.parents,
                "sampling_rate": config.sampling_rate,
                "dataset_size": self.dataset_size,
                "selection": config.selection,
                "mechanism": self.mechanism,
                "noise_multiplier": self.noise_multiplier,
                "selection_epsilon": self.selection_epsilon,
                "noise_secure": self.noise_secure,
                "privacy": config.privacy,
                "mode": config.mode,
                "resumed": self.resumed,
                "generation": self.generation,
                "epsilon_spent": self.epsilon_spent,
                "interrupted_charges": self.interrupted_charges,
                "task_kind": self.task_kind,
                "metric": self.metric,
            },
        )


@dataclass(frozen=True)
class LifetimeChecked:
    """The dataset's lifetime budget (``dp_textgrad.lifetime_link.LifetimeStatus``), before any charge.

    The status holds sums of earlier charges (public parameters) and the store's path: the path
    is shown on the operator's console but is operator-only in the release table, so
    :meth:`as_dict` (``--json``, trackers) leaves it out.
    """

    status: Any

    def describe(self) -> str:
        return str(self.status.describe())

    def as_dict(self) -> dict[str, Any]:
        status = self.status
        return _released(
            "events",
            {
                "event": "lifetime",
                "lifetime_epsilon": status.before.epsilon,
                "lifetime_epsilon_with_plan": status.with_plan,
                "lifetime_accountant": status.before.accountant,
                "lifetime_cap": status.cap,
                "lifetime_cap_overridden": status.overridden,
                "store": str(status.store),
                "lifetime_delta": status.before.delta,
                "lifetime_filter_epsilon": status.before.filter_epsilon,
                "lifetime_filter_epsilon_with_plan": status.with_plan_filter,
                "dataset_key": status.dataset_key,
            },
        )


@dataclass(frozen=True)
class RunFinished:
    """The release: ``result.json``'s released fields, the evaluation and the run directory.

    Built from a ``RunOutcome`` without its operator-only parts (the wall time, the optimizer).
    """

    run_dir: Path
    result: Any  # the SearchResult: prompt, epsilon, delta, history (all released)
    evaluation: Any  # the test-split Evaluation (public split; not covered by DP) or None
    config: Any  # the run's DPESConfig

    @classmethod
    def of(cls, outcome: Any) -> RunFinished:
        return cls(
            run_dir=Path(outcome.run_dir),
            result=outcome.result,
            evaluation=getattr(outcome, "evaluation", None),
            config=outcome.optimizer.config,
        )

    @property
    def stopped_early(self) -> bool:
        """Whether the run released before its planned generations."""
        return stopped_early(self.result.stopped_because)

    def as_dict(self) -> dict[str, Any]:
        evaluation = self.evaluation
        result = _released(
            "result", {**self.result.as_dict(), "evaluation": dict(evaluation.__dict__) if evaluation else None}
        )
        return {
            "event": "finished",
            **result,
            **_released("events", {"run_dir": str(self.run_dir), "stopped_early": self.stopped_early}),
        }


@dataclass(frozen=True)
class RunFailed:
    """The run stopped on an error (or an interrupt): the error's class only, never its text,
    which may describe private data."""

    error: str


def start_event(optimizer: Any, *, resumed: bool) -> dict[str, Any]:
    """The start event's dict (:class:`RunStarted`)."""
    return RunStarted.of(optimizer, resumed=resumed).as_dict()


def lifetime_event(status: Any) -> dict[str, Any]:
    """The lifetime event's dict (:class:`LifetimeChecked`)."""
    return LifetimeChecked(status).as_dict()


def generation_event(report: Any) -> dict[str, Any]:
    """One generation's released statistics (a ``GenerationReport``: channel ``metrics``)."""
    return {"event": "generation", **_released("metrics", report.as_dict())}


def finished_event(outcome: Any) -> dict[str, Any]:
    """The finished event's dict (:class:`RunFinished`) of a ``RunOutcome``."""
    return RunFinished.of(outcome).as_dict()


class EventDicts:
    """An observer that hands each event's release-safe dict to ``sink`` (``optimize --json``)."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink

    def on_lifetime(self, event: LifetimeChecked) -> None:
        self.sink(event.as_dict())

    def on_start(self, event: RunStarted) -> None:
        self.sink(event.as_dict())

    def on_generation(self, report: Any) -> None:
        self.sink(generation_event(report))

    def on_finish(self, event: RunFinished) -> None:
        self.sink(event.as_dict())


__all__ = [
    "EventDicts",
    "EventSink",
    "LifetimeChecked",
    "OBSERVER_METHODS",
    "RunFailed",
    "RunFinished",
    "RunStarted",
    "finished_event",
    "generation_event",
    "lifetime_event",
    "start_event",
    "stopped_early",
]
