"""Canary insertion: canaries spread evenly among private records, and the twin datasets.

Exported by :mod:`dp_textgrad.audit`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from dp_textgrad.audit.canaries.canary_set import CanarySet, IncludeMode
from dp_textgrad.audit.canaries.generation import STREAM_INSERT, check_positive_int, seeded_stream
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example

DEFAULT_WARN_SHARE = 0.008
DEFAULT_MAX_SHARE = 0.01


@dataclass(frozen=True)
class CanaryInsertion:
    """A dataset with canaries inserted, and where they went.

    ``positions[j]`` is the index in ``records`` of the canary ``canary_ids[j]``.
    ``interval`` = len(original records) // number of canaries; ``share`` is the
    fraction of ``records`` that are canaries.
    """

    records: tuple[Example, ...]
    positions: tuple[int, ...]
    canary_ids: tuple[str, ...]
    interval: int
    share: float


def insertion_slots(n_records: int, n_canaries: int, seed: int) -> list[int]:
    """For each canary, the index of the original record it is inserted before.

    Canary j goes before record ``j * interval + offset`` with ``interval =
    n_records // n_canaries`` and a seeded ``offset`` in [0, interval): evenly spread.
    """
    n_canaries = check_positive_int("n_canaries", n_canaries)
    interval = n_records // n_canaries
    if interval < 1:
        raise ValueError(
            f"records: {n_canaries} canaries need at least {n_canaries} records to spread over, "
            f"got {n_records}; use fewer canaries or more records"
        )
    offset = int(seeded_stream(seed, STREAM_INSERT).integers(interval))
    return [j * interval + offset for j in range(n_canaries)]


def insert_canaries(
    records: Sequence[Example],
    canary_set: CanarySet,
    *,
    include: IncludeMode = "all",
    warn_share: float = DEFAULT_WARN_SHARE,
    max_share: float = DEFAULT_MAX_SHARE,
    seed: int | None = None,
) -> CanaryInsertion:
    """Insert the canaries evenly among ``records`` (which must hold no canaries).

    ``include="all"`` inserts every canary (many-run audits); ``"mask"`` only those
    with the inclusion bit set (one-run audits). Slots are computed for all canaries
    either way, so the mask changes nothing else. A canary share above
    ``warn_share`` warns, above ``max_share`` raises. ``seed`` (default: the canary
    set's seed) fixes the offset of the slots.
    """
    if include not in ("all", "mask"):
        raise ValueError(f"include: use 'all' or 'mask', got {include!r}")
    if not 0 < warn_share <= max_share <= 1:
        raise ValueError(f"warn_share, max_share: need 0 < warn_share <= max_share <= 1, got {warn_share}, {max_share}")
    records = list(records)
    slots = insertion_slots(len(records), len(canary_set), canary_set.seed if seed is None else seed)
    chosen = [(slot, c) for slot, c in zip(slots, canary_set) if include == "all" or c.included]
    share = len(chosen) / (len(records) + len(chosen)) if chosen else 0.0
    if share > max_share:
        raise ValueError(
            f"max_share: {len(chosen)} canaries would be {share:.2%} of the {len(records) + len(chosen)} records, "
            f"above the limit of {max_share:.2%}; use fewer canaries, more records, or raise max_share"
        )
    if share > warn_share:
        warnings.warn(
            f"canaries are {share:.2%} of the private set (warning threshold {warn_share:.2%}); they may "
            "change what the optimiser learns",
            stacklevel=2,
        )
    merged: list[Example] = []
    positions: list[int] = []
    ids: list[str] = []
    pending = iter(chosen)
    nxt = next(pending, None)
    for index, record in enumerate(records):
        while nxt is not None and nxt[0] == index:
            positions.append(len(merged))
            ids.append(nxt[1].canary_id)
            merged.append(nxt[1].example)
            nxt = next(pending, None)
        merged.append(record)
    return CanaryInsertion(tuple(merged), tuple(positions), tuple(ids), len(records) // len(canary_set), share)


def remove_canaries(insertion: CanaryInsertion) -> list[Example]:
    """The records of ``insertion`` without its canaries, in order."""
    drop = set(insertion.positions)
    return [r for i, r in enumerate(insertion.records) if i not in drop]


@dataclass(frozen=True)
class TwinDatasets:
    """The same private records with and without canaries."""

    with_canaries: CanaryInsertion
    without_canaries: tuple[Example, ...]


def twin_datasets(records: Sequence[Example], canary_set: CanarySet, **insert_options) -> TwinDatasets:
    """A with-canary dataset and its canary-free twin (identical otherwise)."""
    insertion = insert_canaries(records, canary_set, **insert_options)
    return TwinDatasets(insertion, tuple(records))


def with_private_records(task: ClassificationTask, records: Sequence[Example]) -> ClassificationTask:
    """A copy of ``task`` whose private set is ``records`` (e.g. one side of a twin pair).

    The auditor supplies the records (the same list the task was built from), so the
    audit never has to read the task's private set.
    """
    return dataclasses.replace(task, private_train=PrivateDataset(list(records)))
