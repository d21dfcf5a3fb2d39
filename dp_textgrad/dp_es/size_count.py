"""The dataset size N of a run: declared public by its owner, or released by a DP count first.

Under add/remove neighbours N is private. When ``dataset_size`` is not declared, a run is
two stages (``docs/privacy.md``, "The dataset size"): stage 1 charges and releases a
``LaplaceCountMechanism`` count of the records at ``size_epsilon_share * epsilon`` and closes
its ledger stage; stage 2, the search, is planned from the noisy count (q, delta, every
denominator and displayed size) and calibrated to the rest of the budget. The noisy count
is kept in the configuration (``counted_dataset_size``), so a resumed run reuses it and is
never charged for it again. The real record count is used for nothing released.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dp_textgrad import runs
from dp_textgrad.dp_es.config import DEFAULT_DELTA, ConfigError, DPESConfig
from dp_textgrad.dp_es.plan import resolve_sampling_rate
from dp_textgrad.dp_es.preflight import length_tools, preflight
from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
from dp_textgrad.privacy.mechanisms import LaplaceCountMechanism
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.tasks.base import Task

SIZE_COUNT_LABEL = "dataset size: DP count"


def stage_one(
    config: DPESConfig,
    task: Task,
    engine: Any,
    parameters: Sequence[Any],
    ledger: PrivacyLedger | None,
    plan: Any | None = None,
    checkpoint_dir: str | Path | None = None,
) -> tuple[PrivacyLedger | None, DPESConfig, NoiseSource, bool]:
    """(ledger, resolved configuration, the run's noise source, whether N was counted now).

    A fresh run whose N is not declared counts it (:func:`count_dataset_size`) on a ledger
    whose delta is fixed before the count (it must not depend on N), after the checks that
    come before any charge; a resumed one brings its count in the configuration and the
    count's completed stage in its ledger, and nothing is charged. With N declared (or
    privacy off) nothing happens here.
    """
    noise = NoiseSource(insecure_seed=config.insecure_noise_seed)
    counted = config.counts_dataset_size and config.counted_dataset_size is None
    if config.counts_dataset_size and not counted and (ledger is None or not ledger.completed_stage_epsilon):
        raise ConfigError(
            "counted_dataset_size: only a run sets it (its DP count of N, kept on resume); "
            "to give a public N set dataset_size instead"
        )
    if counted:
        delta = config.delta if config.delta is not None else DEFAULT_DELTA
        # Bad input is refused before the count is charged, as before any other charge.
        if len(parameters) != 1:
            raise ConfigError("parameters: DP-ES optimizes exactly one prompt Variable; pass [prompt]")
        if plan is not None:
            raise ConfigError("plan: a run whose N is not declared plans after its DP count of N; omit plan")
        if ledger is not None and (ledger.epsilon_budget, ledger.delta) != (config.epsilon, delta):
            raise ConfigError("ledger: its budget differs from the configuration's epsilon/delta")
        ledger = ledger if ledger is not None else PrivacyLedger(config.epsilon, delta)
        preflight(engine, task, str(parameters[0].value), config.max_record_tokens)
        config = count_dataset_size(config, task, engine, ledger, noise, checkpoint_dir)
    return ledger, resolved_for_run(config, task), noise, counted


def count_dataset_size(
    config: DPESConfig,
    task: Task,
    engine: Any,
    ledger: PrivacyLedger,
    noise: NoiseSource,
    checkpoint_dir: str | Path | None = None,
) -> DPESConfig:
    """Stage 1: charge, close the stage, then release the DP count; ``config`` with the count in it.

    The charge is on disk (when there is a run directory) before the records are counted.
    """
    # Records over the public length cap may be rejected: that is decided before any charge. ('truncate'
    # never refuses; the optimizer bounds the records itself, so they are measured once on that path.)
    if config.long_records == "reject":
        task.with_bounded_records(*length_tools(engine), config.max_record_tokens, config.long_records)
    mechanism = LaplaceCountMechanism(config.size_epsilon)
    if checkpoint_dir is not None:
        run_dir = runs.RunDir(checkpoint_dir)
        run_dir.path.mkdir(parents=True, exist_ok=True)
        ledger.persist_to(run_dir.ledger, runs.RELEASED_FILE_TIME)
    ledger.declare_noise(noise.sampler)
    ledger.spend(mechanism.event(), SIZE_COUNT_LABEL, mechanism.metadata())
    ledger.complete_stage()
    noisy = mechanism.release(len(task.private_train), noise)
    return config.model_copy(update={"counted_dataset_size": noisy})


def resolved_for_run(config: DPESConfig, task: Task) -> DPESConfig:
    """``config`` with q and delta filled in from the declared or counted N (q planned where it is
    ``auto``: :func:`~dp_textgrad.dp_es.plan.resolve_sampling_rate`).

    Only the non-private baseline (``privacy = "off"``, which claims no guarantee) takes
    the record count as N.
    """
    if config.public_dataset_size is None and config.privacy == "off":
        return resolve_sampling_rate(config.resolved(len(task.private_train)))
    return resolve_sampling_rate(config.resolved())


__all__ = ["SIZE_COUNT_LABEL", "count_dataset_size", "resolved_for_run", "stage_one"]
