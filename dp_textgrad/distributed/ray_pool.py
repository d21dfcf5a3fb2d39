"""Score private records spread over Ray actors; noise and accounting stay on the driver.

Each actor holds one contiguous partition of the private records and its own engine
(an in-process llama.cpp, or a client of an OpenAI-compatible server such as vLLM). Per
generation it draws its share of the Poisson subsample with its own secure generator
and returns only per-candidate sums of clipped scores (and confusion counts when the
mechanism releases feedback): Poisson sampling is independent per record, so the union
of the shares is a Poisson subsample of the whole set, and the sums add up to the
single-process sums. The driver's :class:`~dp_textgrad.dp_es.scorer.DPScorer` charges
the ledger before it asks, and adds the noise once to the total.

Which records were sampled, how many, and how long an actor took stay on the actors.
A failure while scoring reaches the driver as an error that the scorer rewrites into a
``PrivateScoringError``: the charge stays, nothing is released over part of the data.

With an insecure test seed (``dp.insecure_noise_seed``) the driver draws the subsample
from its seeded generator exactly as the single-process path does and sends each actor
its indices, so a distributed test run equals a single-process one draw for draw.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dp_textgrad.dp_es.scoring_backends import SubsampleTotals, batch_totals
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset
from dp_textgrad.privacy.noise import NoiseSource

EngineFactory = Callable[[], Any]


def partition_bounds(num_records: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) slices of ``num_records`` records over ``parts`` actors, sizes within one."""
    if parts < 1:
        raise ValueError(f"actors: must be >= 1, got {parts}")
    if num_records < parts:
        raise ValueError(f"actors: {parts} actors need at least {parts} private records; use fewer actors")
    edges = np.linspace(0, num_records, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


class PartitionScorer:
    """One actor's state: a partition of the records (raw, in memory only), an engine, a secure sampler."""

    def __init__(self, task_shell: Any, records: list[Any], engine_factory: EngineFactory) -> None:
        task = copy.copy(task_shell)
        task.private_train = PrivateDataset(records)
        self.task = task
        self.engine = engine_factory()
        self.sampling_rng = NoiseSource().sampling_generator  # secure: seeded from the OS CSPRNG

    def totals(
        self,
        prompts: Sequence[str],
        sampling_rate: float,
        clip_bound: float,
        with_confusion: bool,
        indices: np.ndarray | None = None,
    ) -> SubsampleTotals:
        """Totals over this actor's share of the subsample; ``indices``: drawn by the driver (test seed only)."""
        records = self.task.private_train
        if indices is None:
            batch = records.poisson_subsample(sampling_rate, self.sampling_rng)
        else:
            batch = PrivateBatch([records[int(i)] for i in indices])
        return batch_totals(self.task, self.engine, prompts, batch, clip_bound, with_confusion)

    def ready(self) -> bool:
        return True


def _public_shell(task: Any) -> Any:
    """The task without its private records (public labels, templates, test split): safe to ship."""
    shell = copy.copy(task)
    shell.private_train = None
    return shell


class RayScoring:
    """The backend of one run: actors over the partitions; sums are added on the driver."""

    def __init__(
        self, actors: list[Any], bounds: list[tuple[int, int]], sampling_rng: np.random.Generator, secure: bool
    ) -> None:
        self.actors, self.bounds = actors, bounds
        self.sampling_rng, self.secure = sampling_rng, secure

    @property
    def subsample_from_seed(self) -> bool:
        """Only with a test seed is the subsample drawn here (secure: by each actor's own CSPRNG),
        so only then can a charge's subsample be redrawn from its seed (dp_textgrad.dp_es.replay)."""
        return not self.secure

    def totals(
        self,
        prompts: Sequence[str],
        sampling_rate: float,
        clip_bound: float,
        with_confusion: bool,
        sampling_rng: np.random.Generator | None = None,
    ) -> SubsampleTotals:
        import ray

        prompts = [str(p) for p in prompts]
        shares: list[np.ndarray | None] = [None] * len(self.actors)
        if not self.secure:  # test seed: the same draw as the single-process path
            rng = self.sampling_rng if sampling_rng is None else sampling_rng
            mask = rng.random(self.bounds[-1][1]) < sampling_rate
            shares = [np.flatnonzero(mask[start:end]) for start, end in self.bounds]
        refs = [
            actor.totals.remote(prompts, sampling_rate, clip_bound, with_confusion, share)
            for actor, share in zip(self.actors, shares)
        ]
        # Fetch every result, failed ones included, so that Ray never prints an "unhandled
        # error" (whose text could describe a record); the first failure is raised for the
        # scorer, which rewrites it without its text.
        parts, failure = [], None
        for ref in refs:
            try:
                parts.append(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - rewritten by DPScorer._read_private
                failure = failure or exc
        if failure is not None:
            raise failure
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total


class RayScoringPool:
    """A scoring factory (see :mod:`dp_textgrad.dp_es.scoring_backends`) that runs on Ray actors.

    ``engine_factory`` builds each actor's engine in the actor's process (it must be
    picklable: a module-level function or a ``functools.partial``). ``address`` names a
    running cluster (``ray://...`` or ``auto``); None starts a local Ray instance with
    ``num_cpus`` CPUs (default: all). An actor that dies is restarted by Ray (up to
    ``max_restarts`` times) with its partition, and its share is scored again.
    ``cpus_per_actor`` (default: the cluster's CPUs shared out, at most 1 each) is
    what Ray reserves per actor; actors that cannot all be placed fail with a clear error.
    """

    def __init__(
        self,
        engine_factory: EngineFactory,
        *,
        actors: int = 2,
        address: str | None = None,
        num_cpus: int | None = None,
        cpus_per_actor: float | None = None,
        max_restarts: int = 3,
        startup_timeout: float = 600.0,
    ) -> None:
        if actors < 1:
            raise ValueError(f"distributed.actors: must be >= 1, got {actors}")
        if max_restarts < 0:
            raise ValueError(f"distributed.max_restarts: must be >= 0, got {max_restarts}")
        if not callable(engine_factory):
            raise TypeError("engine_factory: must build an engine (a picklable callable)")
        self.engine_factory = engine_factory
        self.actors, self.address, self.num_cpus = int(actors), address, num_cpus
        self.cpus_per_actor, self.max_restarts = cpus_per_actor, int(max_restarts)
        self.startup_timeout = float(startup_timeout)
        self._handles: list[Any] = []
        self._started_ray = False

    def __call__(self, task: Any, engine: Any, sampling_rng: np.random.Generator, secure: bool) -> RayScoring:
        if getattr(getattr(task, "metric", None), "engine", None) is not None:
            # A judge holds the driver's engine: shipped to the actors it would be copied (or not
            # picklable at all); each actor would need a judge of its own.
            raise ValueError(
                "task.metric: a metric that asks an engine (an LLM judge) cannot score on Ray actors; "
                "score in this process (no scoring pool) or choose a metric that needs no model"
            )
        ray = _import_ray()
        if not ray.is_initialized():
            with warnings.catch_warnings():
                # ray.init's tip about accelerator variables says nothing about this run (the console shows ours only).
                warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
                ray.init(**self._init_options())
            self._started_ray = True
        bounds = partition_bounds(len(task.private_train), self.actors)
        self._kill_actors()  # a pool reused for another run starts fresh actors, never piles them up
        records = [record.unwrap() for record in task.private_train]
        shell = _public_shell(task)
        total_cpus = float(ray.cluster_resources().get("CPU", 1.0))
        cpus = self.cpus_per_actor if self.cpus_per_actor is not None else min(1.0, total_cpus / self.actors)
        actor_class = ray.remote(num_cpus=cpus, max_restarts=self.max_restarts, max_task_retries=self.max_restarts)(
            PartitionScorer
        )
        self._handles = [actor_class.remote(shell, records[start:end], self.engine_factory) for start, end in bounds]
        del records
        try:  # engines loaded before any charge
            ray.get([actor.ready.remote() for actor in self._handles], timeout=self.startup_timeout)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(
                f"distributed.actors: {self.actors} actors of {cpus:g} CPU each did not start "
                f"within {self.startup_timeout:g} s on a Ray cluster with {total_cpus:g} CPUs; "
                "use fewer actors or lower cpus_per_actor"
            ) from None
        return RayScoring(self._handles, bounds, sampling_rng, secure)

    def _init_options(self) -> dict[str, Any]:
        if self.address is not None:
            return {"address": self.address, "log_to_driver": False, "logging_level": logging.WARNING}
        return {
            "num_cpus": self.num_cpus or os.cpu_count() or 1,
            "include_dashboard": False,
            # Actors' stdout/stderr stay in Ray's session logs (operator-only), never on our console.
            "log_to_driver": False,
            "logging_level": logging.WARNING,
            # Records travel to the actors through Ray's in-memory object store: never spill them to disk.
            "_system_config": {"automatic_object_spilling_enabled": False},
        }

    def close(self) -> None:
        """Stop the actors (and the local Ray instance this pool started)."""
        if not self._handles and not self._started_ray:
            return
        ray = _import_ray()
        self._kill_actors()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def _kill_actors(self) -> None:
        if self._handles:
            ray = _import_ray()
            for actor in self._handles:
                ray.kill(actor, no_restart=True)
        self._handles = []

    def __enter__(self) -> RayScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("distributed scoring needs Ray: pip install 'dp-textgrad[ray]'") from None
    return ray


__all__ = ["PartitionScorer", "RayScoring", "RayScoringPool", "partition_bounds"]
