"""Run events for scripts and trackers: one dict per event, release-safe fields only.

``optimize --json`` prints them one per line; :func:`dp_textgrad.workflow.run` callers and
trackers (MLflow, Weights & Biases, ...) can build the same dicts from the objects their
callbacks receive. Each payload goes through :func:`dp_textgrad.privacy.release.split`,
so only fields the release table classes as public or DP output leave the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dp_textgrad.privacy import release

EventSink = Callable[[dict[str, Any]], None]


def _released(channel: str, payload: dict[str, Any]) -> dict[str, Any]:
    public, _operator_only = release.split(channel, payload)
    return public


def start_event(optimizer: Any, *, resumed: bool) -> dict[str, Any]:
    """The budget and plan, before the first charge of this invocation."""
    config, plan = optimizer.config, optimizer.plan
    return _released("events", {
        "event": "start", "epsilon": config.epsilon, "delta": config.delta, "generations": config.generations,
        "population": config.population, "parents": config.parents, "sampling_rate": config.sampling_rate,
        "dataset_size": optimizer.public_dataset_size, "selection": config.selection,
        "mechanism": plan.describe(), "noise_multiplier": plan.noise_multiplier,
        "selection_epsilon": plan.selection_epsilon, "noise_secure": bool(optimizer.noise.secure),
        "privacy": config.privacy, "mode": config.mode, "resumed": resumed, "generation": optimizer.generation,
        "epsilon_spent": optimizer.ledger.epsilon(), "interrupted_charges": optimizer.interrupted_charges,
    })


def lifetime_event(status: Any) -> dict[str, Any]:
    """The dataset's lifetime budget (``dp_textgrad.lifetime_link.LifetimeStatus``), before any charge."""
    return _released("events", {
        "event": "lifetime", "lifetime_epsilon": status.before.epsilon,
        "lifetime_epsilon_with_plan": status.with_plan, "lifetime_accountant": status.before.accountant,
        "lifetime_cap": status.cap, "lifetime_cap_overridden": status.overridden, "store": str(status.store),
        "lifetime_delta": status.before.delta, "lifetime_filter_epsilon": status.before.filter_epsilon,
        "lifetime_filter_epsilon_with_plan": status.with_plan_filter, "dataset_key": status.dataset_key,
    })


def generation_event(report: Any) -> dict[str, Any]:
    """One generation's released statistics (a ``GenerationReport``: channel ``metrics``)."""
    return {"event": "generation", **_released("metrics", report.as_dict())}


def finished_event(outcome: Any) -> dict[str, Any]:
    """The released result (``result.json``'s released fields, the run directory)."""
    from dp_textgrad.workflow import stopped_early

    evaluation = getattr(outcome, "evaluation", None)
    result = _released("result", {**outcome.result.as_dict(),
                                  "evaluation": dict(evaluation.__dict__) if evaluation else None})
    return {"event": "finished", **result, **_released("events", {
        "run_dir": str(outcome.run_dir), "stopped_early": stopped_early(outcome.result.stopped_because)})}


__all__ = ["EventSink", "finished_event", "generation_event", "lifetime_event", "start_event"]
