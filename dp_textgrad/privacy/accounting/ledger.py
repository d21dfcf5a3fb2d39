"""The privacy ledger of a run: charge before read, every bound reported, the smallest used.

The ledger is the only writer of its file (``persist_to``): it rewrites the file
atomically after every charge, before the mechanism reads any data.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dp_accounting import dp_event as dpe

from dp_textgrad.privacy import release
from dp_textgrad.privacy.accounting.accountants import Accountant
from dp_textgrad.privacy.accounting.bounds import (
    accountants_from_configs,
    all_bounds,
    default_accountants,
    format_epsilon,
)
from dp_textgrad.privacy.accounting.events import (
    UnsupportedEventError,
    check_delta,
    group_events,
    validate_event,
)
from dp_textgrad.privacy.accounting.serialize import (
    decode_float,
    encode_float,
    event_from_dict,
    event_to_dict,
)
from dp_textgrad.privacy.accounting.stages import CompletedStages


class BudgetExceeded(RuntimeError):
    """A mechanism would exceed the privacy budget; it was not run and nothing was recorded."""

    def __init__(self, label: str, epsilon: float, budget: float, delta: float, detail: str = "") -> None:
        self.label = label
        self.epsilon = epsilon
        self.budget = budget
        self.delta = delta
        super().__init__(
            f"privacy budget exceeded: {label!r} would raise epsilon to {format_epsilon(epsilon, 6)} "
            f"(at delta={delta:g}), over the budget epsilon={budget:.6g}; the mechanism "
            "was not run and nothing was recorded (give a larger budget, more noise or fewer steps)" + detail
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One charged mechanism. ``epsilons``/``epsilon`` are the totals after this entry."""

    index: int
    label: str
    event: dpe.DpEvent
    event_dict: dict[str, Any]
    epsilons: dict[str, float]
    epsilon: float
    metadata: dict[str, Any] = field(default_factory=dict)
    differentially_private: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "label": self.label,
            "event": self.event_dict,
            "epsilons": {k: encode_float(v) for k, v in self.epsilons.items()},
            "epsilon": encode_float(self.epsilon),
            "metadata": self.metadata,
            "differentially_private": self.differentially_private,
            "note": None if self.differentially_private else "NOT differentially private (unsafe mode)",
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerEntry:
        event_dict = dict(data["event"])
        return cls(
            index=int(data["index"]),
            label=str(data["label"]),
            event=event_from_dict(event_dict),
            event_dict=event_dict,
            epsilons={k: decode_float(v) for k, v in data["epsilons"].items()},
            epsilon=decode_float(data["epsilon"]),
            metadata=dict(data.get("metadata") or {}),
            differentially_private=bool(data.get("differentially_private", True)),
        )


_LEDGER_FORMAT = "dp-textgrad-ledger"
_LEDGER_VERSION = 2  # 2: completed stages in the header; version 1 files (one stage) are still read


class PrivacyLedger(CompletedStages):
    """The privacy budget of one run: charge-before-read, every bound reported, smallest used."""

    def __init__(
        self,
        epsilon_budget: float,
        delta: float,
        accountants: Sequence[Accountant] | None = None,
    ) -> None:
        if (
            isinstance(epsilon_budget, bool)
            or not isinstance(epsilon_budget, numbers.Real)
            or not math.isfinite(epsilon_budget)
            or epsilon_budget <= 0
        ):
            raise ValueError(f"epsilon_budget: must be a finite number > 0, got {epsilon_budget!r}")
        self.epsilon_budget: float = float(epsilon_budget)
        self.delta: float = check_delta(delta, allow_zero=False)
        accountants = default_accountants() if accountants is None else list(accountants)
        if not accountants:
            raise ValueError("accountants: give at least one accountant (or None for the defaults)")
        names = [a.name for a in accountants]
        if len(set(names)) != len(names):
            raise ValueError(f"accountants: names must be unique, got {names}")
        self.accountants: tuple[Accountant, ...] = tuple(accountants)
        self._entries: list[LedgerEntry] = []
        self._unsafe_reasons: list[str] = []
        # What draws the run's noise (set by the optimizer; the header says it, e.g. when insecure).
        self.noise: str | None = None
        self._cache_key: tuple | None = None
        self._cache_value: dict[str, float] | None = None
        # Where the ledger persists itself after every charge (None: in memory only).
        self.persist_path: str | None = None
        self.persist_file_time: float | None = None  # the file's public modification time (persist_to)
        # Called with each new entry before it is recorded (the lifetime store); may refuse it.
        self._charge_hooks: list[Callable[[LedgerEntry], None]] = []
        # The dataset's lifetime cap as this run saw it, and whether the user overrode it (public choices).
        self.lifetime: dict[str, Any] | None = None
        self._completed_stages: list[dict[str, Any]] = []  # pure-DP stages closed before (see stages.py)
        self._replay_next: int | None = None  # entries from here on: an interrupted attempt's (expect_replay)
        self.replayed: int = 0  # entries adopted by this process (not charged again)

    def add_charge_hook(self, hook: Callable[[LedgerEntry], None]) -> None:
        """Call ``hook(entry)`` at every charge, after the budget check and before the entry is
        recorded or the mechanism runs; an exception from it refuses the charge (nothing recorded)."""
        self._charge_hooks.append(hook)

    def set_lifetime(self, cap: float | None, overridden: bool) -> None:
        """State the lifetime cap of the dataset and any override in the ledger's header."""
        self.lifetime = {"cap": cap, "cap_overridden": bool(overridden)}
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    def persist_to(self, path: str | os.PathLike[str] | None, file_time: float | None = None) -> None:
        """Write the ledger to ``path`` now and again after every charge, before data is read.

        A crash or kill in the middle of a mechanism then never loses its charge, so a
        resumed run cannot spend the same budget twice. ``file_time``: the modification time
        of the file and its folder at every write (a released file's public time: the time of a
        charge would time the private phase); None keeps the one given before for this path.
        """
        path = None if path is None else os.fspath(path)
        if file_time is not None or path != self.persist_path:
            self.persist_file_time = file_time
        self.persist_path = path
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    # -- read-only views
    @property
    def events(self) -> list[dpe.DpEvent]:
        return [e.event for e in self._entries]

    @property
    def entries(self) -> list[LedgerEntry]:
        return list(self._entries)

    @property
    def unsafe(self) -> bool:
        return bool(self._unsafe_reasons)

    @property
    def unsafe_reasons(self) -> list[str]:
        return list(self._unsafe_reasons)

    # -- bounds
    def _bounds(self, events: Sequence[dpe.DpEvent]) -> dict[str, float]:
        # can_afford(e) followed by spend(e) asks the same question: remember the last answer.
        key = tuple((f"{type(ev).__module__}.{type(ev).__qualname__}", repr(ev), n) for ev, n in group_events(events))
        if key != self._cache_key or self._cache_value is None:
            self._cache_value = all_bounds(self.accountants, events, self.delta)
            self._cache_key = key
        return dict(self._cache_value)

    def epsilons(self) -> dict[str, float]:
        """Every accountant's bound for the recorded events at the ledger's delta (the completed
        stages' pure epsilon plus the current stage's bound)."""
        return self._with_completed(self._bounds(self._stage_events()))

    def mechanism_epsilon(self) -> float:
        """Smallest bound of the recorded mechanisms alone (ignores :meth:`mark_unsafe`)."""
        return min(self.epsilons().values())

    def epsilon(self) -> float:
        """The smallest valid bound at ``delta``; ``math.inf`` once the run was marked unsafe."""
        return math.inf if self.unsafe else self.mechanism_epsilon()

    def remaining(self) -> float:
        """Budget left for mechanisms (on the mechanism bound; see :meth:`mark_unsafe`)."""
        return max(0.0, self.epsilon_budget - self.mechanism_epsilon())

    def _check_event(self, event: dpe.DpEvent) -> None:
        validate_event(event)
        if not any(a.supports(event) for a in self.accountants):
            raise UnsupportedEventError(
                f"event: none of the ledger's accountants ({', '.join(a.name for a in self.accountants)}) "
                f"can interpret {type(event).__name__}"
            )

    def bounds_with(self, event: dpe.DpEvent) -> dict[str, float]:
        """Every bound if ``event`` were spent now (nothing is recorded)."""
        self._check_event(event)
        return self._with_completed(self._bounds(self._stage_events() + [event]))

    def can_afford(self, event: dpe.DpEvent) -> bool:
        """Whether spending ``event`` keeps the smallest bound within the budget."""
        try:
            bounds = self.bounds_with(event)
        except UnsupportedEventError:
            return False
        return min(bounds.values()) <= self.epsilon_budget

    def spend(self, event: dpe.DpEvent, label: str, metadata: Mapping[str, Any] | None = None) -> LedgerEntry:
        """Charge ``event`` BEFORE the mechanism reads any data.

        Raises :class:`BudgetExceeded` (and records nothing) if the smallest valid bound
        with the event would exceed the budget.
        """
        if not isinstance(label, str) or not label:
            raise ValueError("label: must be a non-empty string naming the mechanism")
        try:
            metadata_copy = json.loads(json.dumps(dict(metadata or {}), allow_nan=False))
        except (TypeError, ValueError) as err:
            raise ValueError(f"metadata: must be JSON-serialisable with finite numbers ({err})") from None
        event_dict = event_to_dict(event)
        bounds = self.bounds_with(event)
        smallest = min(bounds.values())
        if not smallest <= self.epsilon_budget:
            raise BudgetExceeded(label, smallest, self.epsilon_budget, self.delta)
        entry = LedgerEntry(
            index=len(self._entries),
            label=label,
            event=event,
            event_dict=event_dict,
            epsilons=bounds,
            epsilon=math.inf if self.unsafe else smallest,
            metadata=metadata_copy,
            differentially_private=not self.unsafe,
        )
        for hook in self._charge_hooks:
            hook(entry)
        self._replay_next = None  # a new charge: the interrupted attempt's later entries no longer line up
        self._entries.append(entry)
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)
        return entry

    def expect_replay(self, start: int) -> None:
        """Entries from ``start`` on are an interrupted attempt's: adoptable in order (dp_es/replay.py)."""
        self._replay_next = int(start)

    @property
    def pending_replays(self) -> int:
        """Entries of the interrupted attempt not adopted (yet); 0 after a new charge."""
        return 0 if self._replay_next is None else max(0, len(self._entries) - self._replay_next)

    def adopt_next(self) -> LedgerEntry:
        """Take the interrupted attempt's next entry as the charge being made (spent and recorded already)."""
        adopted = self._replay_next
        if adopted is None or not self.pending_replays:
            raise ValueError("adopt_next: no entry of an interrupted attempt is pending")
        self._replay_next, self.replayed = adopted + 1, self.replayed + 1
        return self._entries[adopted]

    def recover(self, recorded: Sequence[Mapping[str, Any]]) -> int:
        """Adopt charges recorded elsewhere (the lifetime store) that this ledger lost in a crash.

        ``recorded`` are entry dicts in index order; those past this ledger's end are appended
        as they were charged (a kill between the store's write and the ledger file's). Returns
        how many were adopted; an entry that disagrees with one held here is an error.
        """
        adopted = 0
        for data in recorded:
            entry = LedgerEntry.from_dict(data)
            if entry.index < len(self._entries):
                if self._entries[entry.index].event_dict != entry.event_dict:
                    raise ValueError(
                        f"ledger: entry {entry.index} differs from the lifetime store's record; "
                        "the run directory does not belong to this store's run"
                    )
                continue
            if entry.index != len(self._entries):
                raise ValueError(f"ledger: the lifetime store skips from entry {len(self._entries)} to {entry.index}")
            self._entries.append(entry)
            adopted += 1
        if adopted and self.persist_path is not None:
            self.to_jsonl(self.persist_path)
        return adopted

    def mark_unsafe(self, reason: str) -> None:
        """Void the guarantee (e.g. raw private text reached an LLM in unsafe mode).

        Afterwards :meth:`epsilon` is ``math.inf`` and new entries say they are NOT
        differentially private. Mechanisms are still charged against the budget on the
        mechanism bound, so the run keeps its noise schedule.
        """
        if not isinstance(reason, str) or not reason:
            raise ValueError("reason: must be a non-empty string saying why the run is unsafe")
        self._unsafe_reasons.append(reason)
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    # -- persistence
    def _header(self) -> dict[str, Any]:
        return {
            "format": _LEDGER_FORMAT,
            "version": _LEDGER_VERSION,
            "epsilon_budget": self.epsilon_budget,
            "delta": self.delta,
            "accountants": [a.config() for a in self.accountants],
            "unsafe": self.unsafe,
            "unsafe_reasons": list(self._unsafe_reasons),
            "differentially_private": not self.unsafe,
            "noise": self.noise,
            "lifetime": self.lifetime,
            "completed_stages": list(self._completed_stages),
        }

    def declare_noise(self, sampler: str) -> None:
        """Record what draws the noise (the ledger's header states it, insecure seeds included)."""
        self.noise = sampler
        if self.persist_path is not None:
            self.to_jsonl(self.persist_path)

    def to_jsonl(self, path: str | os.PathLike[str], file_time: float | None = None) -> None:
        """Write header + one line per entry, atomically (temp file, fsync, os.replace).

        ``file_time`` (default: :meth:`persist_to`'s, for its path) is set on the temporary file
        before the rename and on the folder after, so the file never shows the time of a charge.
        """
        path = os.fspath(path)
        if file_time is None and path == self.persist_path:
            file_time = self.persist_file_time
        lines = [json.dumps(self._header(), allow_nan=False)]
        lines += [json.dumps(release.released("ledger_entry", e.to_dict()), allow_nan=False) for e in self._entries]
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".ledger-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            if file_time is not None:
                os.utime(tmp, (file_time, file_time))
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        if file_time is not None:  # the temporary file and the rename changed the folder's time
            os.utime(directory, (file_time, file_time))
        try:  # make the rename itself durable where the platform allows it
            dir_fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> PrivacyLedger:
        """Rebuild a ledger (budget, delta, accountants, entries, unsafe marks) from :meth:`to_jsonl`."""
        with open(path, encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        if not records or records[0].get("format") != _LEDGER_FORMAT:
            raise ValueError(f"path: {os.fspath(path)!r} is not a dp-textgrad ledger file")
        header = records[0]
        if header.get("version") not in (1, _LEDGER_VERSION):
            raise ValueError(f"version: unsupported ledger version {header.get('version')!r}")
        ledger = cls(
            header["epsilon_budget"],
            header["delta"],
            accountants_from_configs(header["accountants"]),
        )
        ledger._unsafe_reasons = list(header.get("unsafe_reasons", []))
        ledger.noise = header.get("noise")
        ledger.lifetime = header.get("lifetime")
        ledger._completed_stages = [
            {"end": int(s["end"]), "epsilon": float(s["epsilon"])} for s in header.get("completed_stages") or []
        ]
        for i, record in enumerate(records[1:]):
            entry = LedgerEntry.from_dict(record)
            if entry.index != i:
                raise ValueError(f"index: ledger entry {i} has index {entry.index}; the file is out of order")
            ledger._entries.append(entry)
        return ledger

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(epsilon_budget={self.epsilon_budget}, delta={self.delta}, "
            f"entries={len(self._entries)}, unsafe={self.unsafe})"
        )
