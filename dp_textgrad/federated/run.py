"""A federated DP-ES run end to end: silos, coordinator, release, and what it guarantees to whom.

:func:`run_federated` builds the silos (from their files, or dealt from the task's records
by Dirichlet label skew for a simulation), runs the coordinator's DP-ES loop over Flower's
simulation engine (or in-process), and writes into a run directory what a single-machine
run writes (ledger, checkpoints, result.json, metrics.jsonl, released_prompt.txt) plus
``federation.json``: the placement, the public silo sizes and the guarantee per adversary.

A killed run resumes (``resume=True`` on its run directory, ``dp-textgrad federated
--resume RUN_DIR``) from its last checkpoint with the settings it saved in
``federation_settings.json``: the coordinator's ledger keeps every charge, and every
silo keeps its own account in a file (``federation.silo_accounts``, by default the run
directory's ``silo_accounts/``), so neither budget restarts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad import runs
from dp_textgrad.dp_es.plan import resolve_sampling_rate
from dp_textgrad.dp_es.reports import GenerationReport
from dp_textgrad.federated.config import FederatedSettings
from dp_textgrad.federated.coordinator import FederatedScoring, InProcessSilos
from dp_textgrad.federated.placement import NoisePlacement, guarantees, total_noise_factor
from dp_textgrad.federated.remote import RemoteRecords
from dp_textgrad.federated.silo import Silo, SiloState
from dp_textgrad.federated.split import dirichlet_label_split
from dp_textgrad.privacy.data import PrivateDataset

if TYPE_CHECKING:
    from dp_textgrad.workflow import RunOutcome

EngineFactory = Callable[[], Any]


@dataclass
class SiloBuilder:
    """Builds silo ``i`` where it runs (a Flower worker): records and engine stay in that process.

    Each worker process builds one engine and shares it between the silos it serves (the
    engine holds only public state: model weights and a cache of public prompt prefixes).
    """

    shell: Any  # the task without records (public parts only)
    names: list[str]
    records: list[list[Any]]  # each silo's records; in a real deployment, read by the silo itself
    engine_factory: EngineFactory
    placement: NoisePlacement
    shrink: bool
    max_epsilon: list[float | None]
    delta: float
    max_record_tokens: int
    long_records: str
    insecure_seed: int | None
    sizes: list[int] | None = None
    accounts: Path | None = None  # where each silo keeps its account file
    secure_aggregation: bool = False  # distributed: each silo's noise share is calibrated to SecAgg+'s threshold
    _engine: Any = None

    def __call__(self, index: int) -> Silo:
        if self._engine is None:
            self._engine = self.engine_factory()
        task = dataclasses.replace(self.shell, private_train=PrivateDataset(self.records[index]))
        seed = None if self.insecure_seed is None else self.insecure_seed * 1009 + index + 1
        return Silo.build(
            self.names[index],
            task,
            self._engine,
            self.placement,
            len(self.records),
            max_record_tokens=self.max_record_tokens,
            long_records=self.long_records,
            insecure_seed=seed,
            shrink=self.shrink,
            max_epsilon=self.max_epsilon[index],
            delta=self.delta,
            declared_size=None if self.sizes is None else self.sizes[index],
            account_path=None
            if self.accounts is None
            else self.accounts / runs.silo_account_name(index, self.names[index]),
            secure_aggregation=self.secure_aggregation,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_engine"] = None  # each process builds its own
        return state


def silo_records(settings: FederatedSettings, task: Any) -> tuple[list[str], list[list[Any]], list[float | None]]:
    """Each silo's name, records and own epsilon cap: from the silo files, or a Dirichlet split of the task.

    Runs before anything is charged: a file error names the silo's file and rows (for the data's owner)."""
    from dp_textgrad.tasks.loaders import load_classification_file

    federation = settings.federation
    if federation.silos is not None:
        records = [
            load_classification_file(
                s.train, s.text_column, s.label_column, labels=task.labels, warn_imbalance=False, encoding=s.encoding
            )
            for s in federation.silos
        ]
        caps = [s.max_epsilon if s.max_epsilon is not None else federation.silo_max_epsilon for s in federation.silos]
        return [s.name for s in federation.silos], records, caps
    pooled = [record.unwrap() for record in task.private_train]
    split = federation.split
    parts = dirichlet_label_split(
        [r.label for r in pooled], split.silos, split.alpha, np.random.default_rng(split.seed)
    )
    names = [f"silo-{i + 1:0{len(str(split.silos))}d}" for i in range(split.silos)]
    return names, [[pooled[int(j)] for j in part] for part in parts], [federation.silo_max_epsilon] * split.silos


def saved_settings(run_dir: Path) -> FederatedSettings:
    """The settings a federated run saved when it started (what ``--resume`` continues with)."""
    path = runs.RunDir(run_dir).federation_settings
    if not path.is_file():
        raise ValueError(f"resume: no {path.name} in {run_dir}; is this a federated run directory?")
    return FederatedSettings.model_validate(runs.read_json(path))


def run_federated(
    settings: FederatedSettings,
    *,
    engine_factory: EngineFactory | None = None,
    task: Any = None,
    progress: Callable[[GenerationReport], None] | None = None,
    run_dir: Path | None = None,
    resume: bool = False,
) -> RunOutcome:
    """Run one federated DP-ES optimisation on this machine (or, with ``resume``, continue the one
    in ``run_dir``): silos in process or as a Flower simulation; ``engine_factory`` and ``task``
    default to the settings' (``settings.engine.build``, ``settings.task.build()``). Returns the
    run's :class:`~dp_textgrad.workflow.RunOutcome`, with ``federation`` set (see
    :func:`coordinate_federated`)."""
    federation = settings.federation
    task = task if task is not None else settings.task.build()
    if getattr(task, "kind", "classify") != "classify":
        raise ValueError(
            "task.kind: federated runs take classification tasks only; run a generation task with "
            "dp_textgrad.optimize (one data holder)"
        )
    engine_factory = engine_factory or settings.engine.factory()
    names, records, caps = silo_records(settings, task)
    declared: list[int | None] = (
        [s.size for s in federation.silos] if federation.silos is not None else [None] * len(records)
    )
    if resume and run_dir is None:
        raise ValueError("resume: name the run directory to continue")
    run_dir = Path(run_dir) if run_dir is not None else runs.new_run_dir(settings.output.runs_root, prefix="federated")
    accounts = (
        Path(federation.silo_accounts) if federation.silo_accounts is not None else runs.RunDir(run_dir).silo_accounts
    )
    sizes, config, ledger = public_sizes(settings, names, records, caps, declared, accounts, run_dir, resume)
    resolved = resolve_sampling_rate(config.resolved())
    builder = SiloBuilder(
        public_task(task, sizes),
        names,
        records,
        engine_factory,
        federation.placement,
        federation.jse == "silo",
        caps,
        resolved.resolved_delta,
        resolved.max_record_tokens,
        resolved.long_records,
        resolved.insecure_noise_seed,
        sizes,
        accounts,
        secure_aggregation=federation.secure_aggregation,
    )

    def transport(coordinate: Callable[[Any], Any]) -> Any:
        if federation.transport == "in_process":
            return coordinate(InProcessSilos([builder(i) for i in range(len(sizes))]))
        from dp_textgrad.federated.flower_app import run_flower_simulation

        return run_flower_simulation(builder, len(sizes), coordinate, cpus_per_silo=federation.cpus_per_silo)

    return coordinate_federated(
        settings,
        names,
        sizes,
        transport,
        engine_factory=engine_factory,
        task=task,
        progress=progress,
        run_dir=run_dir,
        resume=resume,
        config=config,
        ledger=ledger,
    )


def resolved_config(settings: FederatedSettings, sizes: list[int]) -> Any:
    """The run's DP-ES settings when every silo's size is declared public (a deployment): N is the
    declared ``dp.dataset_size``, else the sum of the declared sizes; delta follows from it."""
    return resolve_sampling_rate(
        settings.dp.model_copy(update={"dataset_size": settings.dp.dataset_size or sum(sizes)}).resolved()
    )


def public_sizes(
    settings: FederatedSettings,
    names: list[str],
    records: list[list[Any]],
    caps: list[float | None],
    declared: list[int | None],
    accounts: Path,
    run_dir: Path,
    resume: bool,
) -> tuple[list[int], Any, Any]:
    """Each silo's public size, the run's DP-ES settings, and the coordinator's ledger of the counts.

    - N declared (``dp.dataset_size``): a silo without a declared size is given an equal share
      of N (public, no record read); nothing is counted.
    - Every silo's size declared: N is their sum (declared); nothing is counted.
    - Otherwise every silo without a declared size releases a DP count of its records
      (:class:`~dp_textgrad.privacy.mechanisms.LaplaceCountMechanism` at ``dp.size_epsilon``,
      charged in its own account first); N is the sum. A record lives in one silo, so the
      vector of counts is size_epsilon-DP (parallel composition) against everyone: the
      coordinator's ledger charges one count event and closes that stage, and the search is
      planned from the noisy N (q, delta, every displayed size).

    The non-private baseline (``dp.privacy`` off) takes the record counts, claiming nothing.
    Returns (sizes, configuration for the optimizer, ledger or None); a resumed run reads the
    counts it released (``silo_counts.json``) and is not charged again.
    """
    dp = settings.dp
    if dp.privacy != "dp":
        sizes = [d if d is not None else len(r) for d, r in zip(declared, records)]
        return sizes, dp.model_copy(update={"dataset_size": dp.dataset_size or sum(sizes)}), None
    if dp.dataset_size is not None:
        share = max(1, round(dp.dataset_size / len(records)))
        return [d if d is not None else share for d in declared], dp, None
    if all(d is not None for d in declared):
        total = sum(int(d) for d in declared if d is not None)
        return [int(d) for d in declared if d is not None], dp.model_copy(update={"dataset_size": total}), None
    counts_path = runs.RunDir(run_dir).silo_counts
    if resume:
        if not counts_path.is_file():
            raise ValueError(
                f"resume: no {counts_path.name} in {run_dir}: the silos' counts were not released, so "
                "there is nothing to continue; start a new run"
            )
        sizes = [int(n) for n in runs.read_json(counts_path)["silo_sizes"]]
        return sizes, dp.model_copy(update={"counted_dataset_size": sum(sizes)}), None
    from dp_textgrad.dp_es.config import DEFAULT_DELTA
    from dp_textgrad.dp_es.size_count import SIZE_COUNT_LABEL
    from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
    from dp_textgrad.privacy.mechanisms import LaplaceCountMechanism
    from dp_textgrad.privacy.noise import NoiseSource

    mechanism = LaplaceCountMechanism(dp.size_epsilon)
    delta = dp.delta if dp.delta is not None else DEFAULT_DELTA  # fixed before the count: not from N
    ledger = PrivacyLedger(dp.epsilon, delta)
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger.persist_to(runs.RunDir(run_dir).ledger, runs.RELEASED_FILE_TIME)
    ledger.declare_noise(NoiseSource(insecure_seed=dp.insecure_noise_seed).sampler)
    ledger.spend(
        mechanism.event(),
        SIZE_COUNT_LABEL + " (each silo counts its own records)",
        {**mechanism.metadata(), "silos": sum(d is None for d in declared)},
    )
    ledger.complete_stage()
    sizes = []
    for index, (name, part, cap, size) in enumerate(zip(names, records, caps, declared)):
        if size is not None:
            sizes.append(int(size))
            continue
        # The silo's own noise (a seed apart from its scoring noise) and account; it charges, then counts.
        seed = None if dp.insecure_noise_seed is None else dp.insecure_noise_seed * 1013 + 7 * index + 5
        silo = Silo(
            name,
            _RecordsOnly(PrivateDataset(part)),
            None,
            settings.federation.placement,
            len(records),
            NoiseSource(seed),
            max_epsilon=cap,
            delta=delta,
            account_path=accounts / runs.silo_account_name(index, name),
            size_epsilon=mechanism.epsilon,
        )
        sizes.append(int(silo.handle({"kind": "size_count"}, SiloState())["size"]))
    runs.write_json(
        counts_path, {"silo_sizes": sizes, "counted": [d is None for d in declared], "size_epsilon": mechanism.epsilon}
    )
    runs.stamp_released(run_dir)  # the silos' lock files: their times would time each silo's count
    return sizes, dp.model_copy(update={"counted_dataset_size": sum(sizes)}), ledger


@dataclass
class _RecordsOnly:
    """What a silo needs to count its records: the records (no engine, no template)."""

    private_train: Any


def public_task(task: Any, sizes: list[int]) -> Any:
    """``task`` without records: each silo's size is declared public (as N is on a single machine)."""
    return dataclasses.replace(task, private_train=RemoteRecords(sum(sizes)))


def coordinate_federated(
    settings: FederatedSettings,
    names: list[str],
    sizes: list[int],
    transport: Callable[[Callable[[Any], Any]], Any],
    *,
    engine_factory: EngineFactory,
    task: Any,
    run_dir: Path,
    progress: Callable[[GenerationReport], None] | None = None,
    resume: bool = False,
    config: Any = None,
    ledger: Any = None,
) -> RunOutcome:
    """The coordinator's side of a run: the DP-ES loop over ``transport`` (which calls ``coordinate``
    with a silo transport), then ``federation.json``. It holds the silos' names and public sizes only.

    Returns the coordinator's :class:`~dp_textgrad.workflow.RunOutcome` (its ``evaluation`` on the
    public test split, its optimizer without records) with ``federation``: the record written to
    ``federation.json``; ``seconds`` is the whole run's wall time (operator-only)."""
    from dp_textgrad import workflow
    from dp_textgrad.lifetime_link import LifetimeOptions

    started = time.perf_counter()
    federation = settings.federation
    shell = public_task(task, sizes)
    config = config if config is not None else resolved_config(settings, sizes)
    if not resume:
        runs.write_json(runs.RunDir(run_dir).federation_settings, settings.model_dump(mode="json"))
    engine = engine_factory()
    backends: list[FederatedScoring] = []

    def coordinate(silos: Any) -> Any:
        backend = FederatedScoring(
            silos,
            sizes,
            federation.placement,
            federation.jse,
            federation.control_variate,
            federation.secure_aggregation,
            coupling_path=runs.RunDir(run_dir).secure_sum_coupling,
            num_labels=len(task.labels),
        )
        backends.append(backend)
        # The lifetime store keys a dataset by its records, which the coordinator never holds: each
        # silo keeps its own account instead (max_epsilon, silo_accounts; docs/federated.md).
        return workflow.run(
            shell,
            engine,
            config,
            run_dir=run_dir,
            evaluate=settings.output.evaluate,
            on_generation=progress,
            task_name=f"federated:{settings.task.name or 'custom'}",
            engine_name=settings.engine.kind,
            lifetime=LifetimeOptions(enabled=False),
            scoring=lambda *_: backend,
            resume=resume,
            ledger=ledger,
        )

    outcome = transport(coordinate)
    threshold = backends[-1].unmask_threshold if backends else None
    coupling = backends[-1].coupling_error if backends else 0.0
    promised = guarantees(
        federation.placement,
        len(sizes),
        outcome.optimizer.ledger.events,
        float(outcome.optimizer.ledger.delta),
        _smallest_bound,
        federation.secure_aggregation,
        unmask_threshold=threshold,
        coupling_error=coupling,
    )
    seconds = time.perf_counter() - started
    federation_record = {
        "placement": federation.placement,
        "silos": len(sizes),
        "silo_names": names,
        "silo_sizes": sizes,
        "jse": federation.jse,
        "control_variate": federation.control_variate,
        "secure_aggregation": federation.secure_aggregation,
        "total_noise_factor": total_noise_factor(federation.placement, len(sizes), threshold),
        "unmask_threshold": threshold,
        "coupling_error": coupling,
        "size_source": size_source(settings, run_dir),
        "guarantees": [g.to_dict() for g in promised],
        "transport": federation.transport,
        "evaluation": dataclasses.asdict(outcome.evaluation) if outcome.evaluation is not None else None,
        "seconds": seconds,
    }
    runs.write_released_json(run_dir, runs.FEDERATION_NAME, "federation", federation_record)
    runs.stamp_released(run_dir)  # the silos' lock files and accounts too: no released file times the run
    return dataclasses.replace(outcome, seconds=seconds, federation=federation_record)


def size_source(settings: FederatedSettings, run_dir: Path) -> str:
    """Where a run's silo sizes come from (:func:`public_sizes`): dp_count, declared or equal_shares."""
    if runs.RunDir(run_dir).silo_counts.is_file():
        return "dp_count"
    silos = settings.federation.silos
    if (
        settings.dp.privacy == "dp"
        and settings.dp.dataset_size is not None
        and (silos is None or any(s.size is None for s in silos))
    ):
        return "equal_shares"
    return "declared" if settings.dp.privacy == "dp" else "record_counts (privacy off)"


def _smallest_bound(events: list[Any], delta: float) -> float:
    from dp_textgrad.privacy.accounting.bounds import smallest_bound

    return smallest_bound(events, delta)


__all__ = [
    "SiloBuilder",
    "coordinate_federated",
    "public_task",
    "resolved_config",
    "run_federated",
    "saved_settings",
    "silo_records",
]
