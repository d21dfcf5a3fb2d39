"""The lifetime budget of a dataset: every charge of every run on it, in one SQLite store.

A run's ledger bounds one run. Rerunning on the same data spends again, and a run that
crashed before its run directory was usable still read data. The store (an odometer in
the sense of OpenDP's odometers and Tumult's sessions) keeps every charge keyed by the
dataset, written in one transaction BEFORE the mechanism reads data.

Each dataset has ONE lifetime delta (declared, or fixed by the first run registered on
it), and every total is stated at it. The cap is a privacy filter over adaptively chosen
runs: a charge is recorded only if the Renyi filter bound of all the dataset's events,
:func:`filter_epsilon`, stays within the cap at the lifetime delta (Feldman and Zrnic
2021 for one order; the several-order rule and its proof are in docs/privacy.md). The
tightest composed epsilon (PLD, RDP, ...: the smallest valid bound) is also kept, as
information: it is valid for runs fixed in advance, not as a stopping rule.

The dataset key is either a keyed hash (HMAC-SHA256 with a random key kept in the
store) of the records' content, independent of their order, or a name the data's owner
declares (``output.dataset_key``) so that the versions of a dataset (more records, a
subset, a re-split) share one lifetime. The hash is a function of private data, so it
stays in the store, which is operator-only like ``operator/``: it never appears in a
released file. A declared name is public (the owner chose it).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_textgrad.privacy.accounting.accountants import Accountant
from dp_textgrad.privacy.accounting.bounds import all_bounds, default_accountants, format_epsilon
from dp_textgrad.privacy.accounting.filter import FILTER_ORDERS, filter_epsilon
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded
from dp_textgrad.privacy.accounting.serialize import event_from_dict

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    label TEXT NOT NULL,
    started REAL NOT NULL,
    epsilon_budget REAL NOT NULL,
    delta REAL NOT NULL,
    cap REAL,
    cap_overridden INTEGER NOT NULL DEFAULT 0,
    unsafe INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS charges (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    idx INTEGER NOT NULL,
    dataset TEXT NOT NULL,
    recorded REAL NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX IF NOT EXISTS charges_by_dataset ON charges(dataset);
CREATE TABLE IF NOT EXISTS datasets (
    dataset TEXT PRIMARY KEY,
    delta REAL NOT NULL,
    declared INTEGER NOT NULL
);
"""
# A declared dataset key is stored as this prefix plus the owner's name; a fingerprint is
# 64 hex digits, so the two never collide.
_DECLARED = "declared:"
_MAX_KEY_LENGTH = 200


class LifetimeCapExceeded(BudgetExceeded):
    """A run or a charge would push the dataset's lifetime epsilon past its cap; nothing was recorded.

    A kind of :class:`BudgetExceeded`: refused mid-run (another run on the same data spent
    the room), the run stops early like one whose own budget ran out.
    """

    def __init__(
        self,
        epsilon: float,
        cap: float,
        delta: float,
        what: str,
        label: str | None = None,
        charged: str = "nothing was charged",
    ) -> None:
        RuntimeError.__init__(
            self,
            f"lifetime budget: {what} would raise this dataset's lifetime epsilon (Renyi filter bound) to "
            f"{format_epsilon(epsilon)} at its lifetime delta {delta:g}, over its cap {cap:g}; {charged}. Raise "
            "output.lifetime_cap (--lifetime-cap), or pass --override-lifetime-cap to run anyway (the ledger "
            "records the override)",
        )
        self.label = label if label is not None else what
        self.epsilon, self.budget, self.cap, self.delta = epsilon, cap, cap, delta


@dataclass(frozen=True)
class LifetimeRun:
    """One run on a dataset as the store knows it (all public except the dataset key)."""

    run_id: str
    label: str
    started: float
    epsilon_budget: float
    delta: float
    charges: int
    cap: float | None
    cap_overridden: bool
    unsafe: bool


@dataclass(frozen=True)
class LifetimeTotal:
    """The composed epsilon of every charge recorded for a dataset, under every accountant.

    ``epsilon`` is the tightest (smallest valid) bound, shown as information;
    ``filter_epsilon`` is the Renyi filter bound the cap is checked against.
    """

    epsilon: float
    delta: float
    by_accountant: dict[str, float]
    accountant: str
    runs: int
    charges: int
    unsafe_runs: int
    filter_epsilon: float = 0.0


class LifetimeBudget:
    """The store: one SQLite file, safe under concurrent runs (each write is one transaction)."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._write() as db:
                for statement in filter(str.strip, _SCHEMA.split(";")):  # executescript would commit early
                    db.execute(statement)
                if db.execute("SELECT value FROM meta WHERE key = 'key'").fetchone() is None:
                    db.execute("INSERT INTO meta VALUES ('key', ?)", (secrets.token_hex(32),))
                    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(_SCHEMA_VERSION),))
        except sqlite3.DatabaseError as exc:
            raise ValueError(
                f"lifetime_store: {self.path} is not a usable dp-textgrad lifetime store ({exc}); "
                "point output.lifetime_store elsewhere or move the file away"
            ) from None
        except OSError as exc:
            raise OSError(
                f"lifetime_store: cannot create {self.path} ({exc.strerror or exc}); choose a writable "
                "location with output.lifetime_store"
            ) from None
        with self._read() as db:
            schema = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            self._key = bytes.fromhex(db.execute("SELECT value FROM meta WHERE key = 'key'").fetchone()[0])
        if schema is None or int(schema[0]) != _SCHEMA_VERSION:
            raise ValueError(
                f"lifetime_store: {self.path} has schema {schema and schema[0]!r}; this version reads {_SCHEMA_VERSION}"
            )

    # -- connections: short-lived, one per operation, so a killed process holds no lock
    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        db.execute("PRAGMA synchronous = FULL")
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        try:
            db = self._connect()
        except sqlite3.OperationalError as exc:
            raise self._unwritable(exc) from None
        try:
            db.execute("BEGIN IMMEDIATE")  # the write lock first: read-check-write is one step
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.OperationalError as exc:  # disk full, read-only file, lock timeout: nothing recorded
            raise self._unwritable(exc) from None
        finally:
            db.close()

    def _unwritable(self, exc: sqlite3.OperationalError) -> OSError:
        return OSError(
            f"lifetime_store: cannot write {self.path} ({exc}); nothing was charged for this step. "
            "Free space or fix the file's permissions, then resume the run (--resume RUN_DIR)"
        )

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            yield db
        finally:
            db.close()

    # -- keys
    def fingerprint(self, dataset: Any) -> str:
        """The store's key for a :class:`~dp_textgrad.privacy.data.PrivateDataset` (keyed, operator-only)."""
        return dataset.fingerprint(self._key)

    @staticmethod
    def declared_key(name: str) -> str:
        """The store's key for a dataset its owner names (``output.dataset_key``): shared by its versions."""
        cleaned = name.strip() if isinstance(name, str) else ""
        if not cleaned or len(cleaned) > _MAX_KEY_LENGTH or not cleaned.isprintable():
            raise ValueError(
                f"dataset_key: must be a non-empty printable name of at most {_MAX_KEY_LENGTH} "
                f"characters, got {name!r}; name the dataset, e.g. --dataset-key support-tickets"
            )
        return _DECLARED + cleaned

    @staticmethod
    def declared_name(dataset: str) -> str | None:
        """The owner's name of a declared key (public); None for a fingerprint (operator-only)."""
        return dataset[len(_DECLARED) :] if dataset.startswith(_DECLARED) else None

    def find_declared(self, name: str) -> str | None:
        """The key of a declared dataset this store has runs for, or None."""
        try:
            key = self.declared_key(name)
        except ValueError:
            return None
        with self._read() as db:
            found = db.execute("SELECT 1 FROM runs WHERE dataset = ? LIMIT 1", (key,)).fetchone()
        return key if found else None

    # -- the lifetime delta
    def lifetime_delta(self, dataset: str) -> float | None:
        """The one delta every total and the cap of ``dataset`` are stated at; None before its first run."""
        with self._read() as db:
            row = db.execute("SELECT delta FROM datasets WHERE dataset = ?", (dataset,)).fetchone()
            if row is None:  # a store from before lifetime deltas: its smallest run delta (the strictest)
                row = db.execute("SELECT MIN(delta) FROM runs WHERE dataset = ?", (dataset,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    @staticmethod
    def _fix_delta(db: sqlite3.Connection, dataset: str, run_delta: float, declared: float | None) -> float:
        """Read, or fix on first use, ``dataset``'s lifetime delta (inside the caller's write transaction)."""
        row = db.execute("SELECT delta, declared FROM datasets WHERE dataset = ?", (dataset,)).fetchone()
        if row is not None:
            fixed, was_declared = float(row[0]), bool(row[1])
            if declared is not None and declared != fixed:
                how = "declared" if was_declared else "fixed by its first run"
                raise ValueError(
                    f"lifetime_delta: this dataset's lifetime delta is {fixed:g} ({how}); it cannot "
                    f"change to {declared:g} (its cap is a filter set before the first run). Drop "
                    f"output.lifetime_delta (--lifetime-delta) or set it to {fixed:g}"
                )
            return fixed
        legacy = db.execute("SELECT MIN(delta) FROM runs WHERE dataset = ?", (dataset,)).fetchone()[0]
        if declared is not None:
            fixed = float(declared)
        else:
            fixed = float(run_delta) if legacy is None else min(float(legacy), float(run_delta))
        db.execute("INSERT INTO datasets VALUES (?, ?, ?)", (dataset, fixed, int(declared is not None)))
        return fixed

    # -- runs and charges
    def open_run(
        self,
        run_id: str,
        dataset: str,
        *,
        label: str,
        epsilon_budget: float,
        delta: float,
        cap: float | None = None,
        cap_overridden: bool = False,
        lifetime_delta: float | None = None,
    ) -> float:
        """Register a run (idempotent: a resumed run keeps its row and its charges); its lifetime delta.

        The dataset's lifetime delta is ``lifetime_delta`` if declared, else fixed by its first
        run. Under a cap (not overridden) a run whose own ``delta`` is larger is refused: the
        owner's policy (cap, lifetime delta) bounds every release's failure probability.
        """
        if lifetime_delta is not None and not 0.0 < lifetime_delta < 1.0:
            raise ValueError(f"lifetime_delta: must be in (0, 1), got {lifetime_delta!r}")
        with self._write() as db:
            fixed = self._fix_delta(db, dataset, delta, lifetime_delta)
            if cap is not None and not cap_overridden and delta > fixed:
                raise ValueError(
                    f"dp.delta: this run's delta {delta:g} is larger than its dataset's lifetime delta {fixed:g} "
                    f"(output.lifetime_delta), and under a lifetime cap every run on the dataset is held to it; "
                    f"run with --delta {fixed:g} or smaller (dp.delta)"
                )
            row = db.execute("SELECT dataset FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is not None:
                if row[0] != dataset:
                    raise ValueError(
                        f"lifetime_store: run {run_id} was started on other data; resume it with the "
                        "same private records (and the same output.dataset_key)"
                    )
                db.execute(
                    "UPDATE runs SET cap = ?, cap_overridden = MAX(cap_overridden, ?) WHERE run_id = ?",
                    (cap, int(cap_overridden), run_id),
                )
                return fixed
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                (run_id, dataset, label, time.time(), float(epsilon_budget), float(delta), cap, int(cap_overridden)),
            )
        return fixed

    def mark_unsafe(self, run_id: str) -> None:
        with self._write() as db:
            db.execute("UPDATE runs SET unsafe = 1 WHERE run_id = ?", (run_id,))

    def record(self, run_id: str, entry: Mapping[str, Any], *, cap: float | None) -> None:
        """Record one ledger entry (its ``to_dict()``) in one transaction, before data is read.

        With a ``cap``, the Renyi filter bound (:func:`filter_epsilon`) of all the dataset's
        events with this entry, at the dataset's lifetime delta, must stay within it (checked
        under the write lock, so concurrent runs cannot both slip under it); otherwise
        :class:`LifetimeCapExceeded` and nothing is recorded. Recording the same (run, index)
        again is a no-op (a replay after a crash).
        """
        index = int(entry["index"])
        with self._write() as db:
            row = db.execute("SELECT dataset, cap_overridden, delta FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise ValueError(f"lifetime_store: run {run_id} was not opened in {self.path}")
            dataset, overridden = row[0], bool(row[1])
            if db.execute("SELECT 1 FROM charges WHERE run_id = ? AND idx = ?", (run_id, index)).fetchone():
                return
            if cap is not None and not overridden:
                delta = self._fix_delta(db, dataset, float(row[2]), None)
                events = [
                    event_from_dict(json.loads(text)["event"])
                    for (text,) in db.execute("SELECT entry FROM charges WHERE dataset = ?", (dataset,))
                ]
                events.append(event_from_dict(dict(entry["event"])))
                spent = filter_epsilon(events, delta)
                if spent > cap:
                    raise LifetimeCapExceeded(
                        spent, cap, delta, f"charge {entry.get('label')!r}", label=str(entry.get("label"))
                    )
            db.execute(
                "INSERT INTO charges VALUES (?, ?, ?, ?, ?)",
                (run_id, index, dataset, time.time(), json.dumps(dict(entry), allow_nan=False)),
            )

    def entries(self, run_id: str) -> list[dict[str, Any]]:
        """The recorded ledger entries of one run, in order."""
        with self._read() as db:
            return [
                json.loads(text)
                for (text,) in db.execute("SELECT entry FROM charges WHERE run_id = ? ORDER BY idx", (run_id,))
            ]

    def dataset_of(self, run_id: str) -> str | None:
        with self._read() as db:
            row = db.execute("SELECT dataset FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    def runs(self, dataset: str) -> list[LifetimeRun]:
        with self._read() as db:
            rows = db.execute(
                "SELECT r.run_id, r.label, r.started, r.epsilon_budget, r.delta, "
                "(SELECT COUNT(*) FROM charges c WHERE c.run_id = r.run_id), r.cap, r.cap_overridden, r.unsafe "
                "FROM runs r WHERE r.dataset = ? ORDER BY r.started",
                (dataset,),
            ).fetchall()
        return [LifetimeRun(r[0], r[1], r[2], r[3], r[4], int(r[5]), r[6], bool(r[7]), bool(r[8])) for r in rows]

    def datasets(self) -> list[str]:
        with self._read() as db:
            return [r[0] for r in db.execute("SELECT dataset FROM runs GROUP BY dataset ORDER BY MIN(started)")]

    def total(
        self,
        dataset: str,
        delta: float | None = None,
        *,
        extra: Sequence[Any] = (),
        accountants: Sequence[Accountant] | None = None,
        exclude_run: str | None = None,
    ) -> LifetimeTotal:
        """Compose every recorded charge of ``dataset`` (plus ``extra`` planned events).

        At ``delta``, by default the dataset's lifetime delta (1e-5 for a dataset with no run).
        ``exclude_run``: leave that run and its charges out (what came before it).
        """
        if delta is None:
            delta = self.lifetime_delta(dataset) or 1e-5
        with self._read() as db:
            events = [
                event_from_dict(json.loads(text)["event"])
                for (text,) in db.execute(
                    "SELECT entry FROM charges WHERE dataset = ? AND run_id IS NOT ? ORDER BY recorded",
                    (dataset, exclude_run),
                )
            ]
        runs = [r for r in self.runs(dataset) if r.run_id != exclude_run]
        unsafe = sum(r.unsafe for r in runs)
        events += list(extra)
        if not events:
            nothing = math.inf if unsafe else 0.0
            return LifetimeTotal(nothing, delta, {}, "none (no charges)", len(runs), 0, unsafe, nothing)
        bounds = all_bounds(list(accountants or default_accountants()), events, delta)
        name = min(bounds, key=bounds.__getitem__)
        epsilon = math.inf if unsafe else bounds[name]
        filtered = math.inf if unsafe else filter_epsilon(events, delta)
        return LifetimeTotal(epsilon, delta, bounds, name, len(runs), len(events) - len(extra), unsafe, filtered)


__all__ = ["FILTER_ORDERS", "LifetimeBudget", "LifetimeCapExceeded", "LifetimeRun", "LifetimeTotal", "filter_epsilon"]
