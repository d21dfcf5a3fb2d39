"""Fault injection for whole runs: kill -9 at random points, engine failures at random calls,
a full disk, concurrent runs on one dataset. Used by ``tests/test_fault_injection.py`` and
``benchmarks/fault_injection.py``.

Each run is the real ``dp-textgrad optimize`` (scripted engine) in a forked child: the
parent imports and calibrates once, so a child starts in milliseconds and a hundred runs
take a minute or two. After every fault the harness checks the invariants the lifetime
budget promises:

- the run's ledger file is a prefix of the store's record of the run, at most one charge
  behind it (the store is written first, so a kill between the two writes leaves it ahead);
- after the run is resumed to its end, ledger and store hold the same entries, every entry
  recorded before the resume is still there, and epsilon is not lower than before;
- the dataset's lifetime epsilon never goes down from one trial to the next;
- a run killed before its first charge left no charge behind.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dp_textgrad import cli
from dp_textgrad.dp_es.size_count import SIZE_COUNT_LABEL
from dp_textgrad.engines.base import EngineError
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget
from dp_textgrad.settings import EngineSection
from tests.test_cli import scripted, write_csv

FLAGS = ["--epsilon", "4", "--generations", "3", "--population", "3", "--parents", "2", "--sampling-rate", "0.3",
         "--seed", "1"]
RESUME_CODES = {0, 3}  # finished, or stopped early with a prompt released
NOTHING_RELEASED = 1   # the budget left after an interrupted generation 0 fits no generation


class FaultCheckFailed(AssertionError):
    """An invariant of the lifetime budget did not hold after a fault."""


@dataclass
class Tally:
    runs: int = 0
    kills: int = 0
    ended_before_first_charge: int = 0
    engine_failures: int = 0
    disk_failures: int = 0
    concurrent_runs: int = 0
    refused_by_cap: int = 0
    store_ahead: int = 0  # faults that left the store one charge ahead of the ledger file
    resumes: int = 0
    entries_checked: int = 0
    losses: int = 0
    exit_codes: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {**self.__dict__, "exit_codes": dict(sorted(self.exit_codes.items()))}


# -- children ------------------------------------------------------------------------------
def _child(argv: list[str], engine_factory: Callable[[], object], setup: Callable[[], None] | None) -> None:
    """Run the CLI in this (forked) process and leave with its exit code, whatever happens."""
    code = 99
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w", encoding="utf-8")
        EngineSection.build = lambda section: engine_factory()
        if setup is not None:
            setup()
        try:
            cli.app(argv, prog_name="dp-textgrad")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - any escape is a failed child, reported by its code
        code = 98
    finally:
        os._exit(code)


def start(argv: list[str], engine_factory: Callable[[], object] = scripted,
          setup: Callable[[], None] | None = None) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child leaves through os._exit
        _child(argv, engine_factory, setup)
    return pid


def wait(pid: int) -> int | None:
    """The child's exit code, or None when a signal ended it."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None


def run_to_end(argv: list[str], engine_factory: Callable[[], object] = scripted,
               setup: Callable[[], None] | None = None) -> int | None:
    return wait(start(argv, engine_factory, setup))


def kill_after(pid: int, seconds: float) -> bool:
    """SIGKILL ``pid`` after ``seconds`` unless it ended first; True when the kill landed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _reaped[pid] = status
            return False
        time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


_reaped: dict[int, int] = {}  # children that ended before their kill: pid -> wait status


def reap(pid: int) -> int | None:
    """Like :func:`wait`, also for a child that :func:`kill_after` already collected."""
    if pid in _reaped:
        status = _reaped.pop(pid)
        return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None
    return wait(pid)


# -- faults injected into a child ----------------------------------------------------------
class FailingEngine:
    """The scripted engine, failing from its ``fail_at``-th call on (an unreachable server)."""

    def __new__(cls, fail_at: int):
        engine = scripted()
        calls = {"n": 0}

        def failing(method):
            def wrapper(*args, **kwargs):
                calls["n"] += 1
                if calls["n"] >= fail_at:
                    raise EngineError("connection refused (injected)")
                return method(*args, **kwargs)
            return wrapper

        for name in ("score_choices_batch", "_generate"):
            setattr(engine, name, failing(getattr(engine, name)))
        return engine


def instrument(on_point: Callable[[str], None]) -> Callable[[], None]:
    """Call ``on_point(kind)`` at every point where a crash matters: before and after each
    durable write (fsync), before each store transaction and after each store record, and at
    each engine call. Returns a function that undoes the patches (for the parent's own use)."""
    from dp_textgrad.engines.scripted import ScriptedEngine

    real = {"fsync": os.fsync, "write": LifetimeBudget._write, "record": LifetimeBudget.record,
            "score": ScriptedEngine.score_choices_batch, "generate": ScriptedEngine._generate}

    def fsync(fd):
        on_point("before fsync")
        real["fsync"](fd)
        on_point("after fsync")

    @contextmanager
    def write(self):
        with real["write"](self) as db:  # inside the transaction: its errors are the store's own
            on_point("store transaction")
            yield db

    def record(self, *args, **kwargs):
        real["record"](self, *args, **kwargs)
        on_point("after store record")

    def score(self, *args, **kwargs):
        on_point("engine call")
        return real["score"](self, *args, **kwargs)

    def generate(self, *args, **kwargs):
        on_point("engine call")
        return real["generate"](self, *args, **kwargs)

    os.fsync = fsync
    LifetimeBudget._write, LifetimeBudget.record = write, record
    ScriptedEngine.score_choices_batch, ScriptedEngine._generate = score, generate

    def undo() -> None:
        os.fsync = real["fsync"]
        LifetimeBudget._write, LifetimeBudget.record = real["write"], real["record"]
        ScriptedEngine.score_choices_batch, ScriptedEngine._generate = real["score"], real["generate"]

    return undo


def kill_at_point(point: int, only: str | None = None) -> Callable[[], None]:
    """A child setup: SIGKILL itself at the ``point``-th crash point (see :func:`instrument`),
    counting only points of kind ``only`` when given."""

    def setup() -> None:
        count = {"n": 0}

        def on_point(kind: str) -> None:
            if only is not None and kind != only:
                return
            count["n"] += 1
            if count["n"] == point:
                os.kill(os.getpid(), signal.SIGKILL)

        instrument(on_point)

    return setup


def full_disk_after(writes: int) -> Callable[[], None]:
    """A child setup: the disk fills after ``writes`` durable writes or store transactions, and
    stays full (every later fsync fails with ENOSPC, every store transaction with SQLite's
    "database or disk is full")."""

    def setup() -> None:
        count = {"n": 0}

        def on_point(kind: str) -> None:
            if kind not in ("before fsync", "store transaction"):
                return
            count["n"] += 1
            if count["n"] > writes:
                if kind == "store transaction":
                    raise sqlite3.OperationalError("database or disk is full")
                raise OSError(errno.ENOSPC, "No space left on device (injected)")

        instrument(on_point)

    return setup


# -- the invariants ------------------------------------------------------------------------
def _entry_key(entry: dict) -> tuple:
    return entry["index"], entry["label"], json.dumps(entry["event"], sort_keys=True)


def ledger_entries(run_dir: Path) -> list[dict]:
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        return []
    return [e.to_dict() for e in PrivacyLedger.from_jsonl(path).entries]


class FaultLab:
    """One shared store, one private file, fresh runs roots; checks after every fault."""

    def __init__(self, root: Path, seed: int = 0, records: int = 60) -> None:
        self.root = Path(root)
        self.rng = random.Random(seed)
        self.train, self.test = self.root / "train.csv", self.root / "test.csv"
        self.root.mkdir(parents=True, exist_ok=True)
        write_csv(self.train, records)
        write_csv(self.test, 5)
        self.store_path = self.root / "store" / "lifetime.sqlite"
        self.tally = Tally()
        self._roots = 0
        self._lifetime = 0.0
        self.duration = 0.0       # an undisturbed child run, seconds
        self.first_charge = 0.0   # until its first ledger entry (before: loading, calibration, preflight)
        self.charged_part = 0.0   # until its result.json (the rest is the report)
        self.engine_calls = 0     # engine calls of an undisturbed run
        self.crash_points = 0     # its crash points (see instrument())
        self.writes = 0           # its durable writes and store transactions
        self.records = 0          # its charges recorded in the store
        self.run_increment = 0.0  # lifetime epsilon one more whole run adds

    # -- runs
    def new_root(self) -> Path:
        self._roots += 1
        return self.root / "runs" / f"r{self._roots:04d}"

    def argv(self, runs_root: Path, *extra: str) -> list[str]:
        return ["optimize", "--train", str(self.train), "--test", str(self.test), "--runs-root", str(runs_root), "--lifetime-store",
                str(self.store_path), *FLAGS, *extra]

    def store(self) -> LifetimeBudget:
        return LifetimeBudget(self.store_path)

    def lifetime(self) -> float:
        """The dataset's lifetime filter bound (at its lifetime delta): what the cap is checked against."""
        store = self.store()
        return max((store.total(d).filter_epsilon for d in store.datasets()), default=0.0)

    def charges(self) -> int:
        store = self.store()
        return sum(r.charges for d in store.datasets() for r in store.runs(d))

    def count(self, code: int | None) -> None:
        key = -9 if code is None else code
        self.tally.exit_codes[key] = self.tally.exit_codes.get(key, 0) + 1

    def measure(self) -> None:
        """One run in this process (it warms the calibration cache the children inherit) that
        counts the crash points, writes, charges and engine calls faults are drawn among; then
        one undisturbed child for the timings."""
        from typer.testing import CliRunner

        points: dict[str, int] = {}

        def on_point(kind: str) -> None:
            points[kind] = points.get(kind, 0) + 1

        real = EngineSection.build
        EngineSection.build = lambda section: scripted()
        undo = instrument(on_point)
        try:
            result = CliRunner().invoke(cli.app, self.argv(self.new_root()))
        finally:
            undo()
            EngineSection.build = real
        if result.exit_code != 0:
            raise FaultCheckFailed(f"an undisturbed run exited {result.exit_code}: {result.output[-500:]}")
        self.crash_points = sum(points.values())
        self.writes = points.get("before fsync", 0) + points.get("store transaction", 0)
        self.records = points.get("after store record", 0)
        self.engine_calls = points.get("engine call", 0)
        self.tally.runs += 1
        self.count(0)
        before = self.lifetime()
        self.time_child()
        self.run_increment = self.lifetime() - before  # what one more whole run adds (composed)

    def time_child(self) -> None:
        """One undisturbed child run: when its first charge lands, when result.json appears and
        when it ends (kill times are drawn from these; each lane measures under its own load)."""
        started = time.monotonic()
        runs_root = self.new_root()
        pid = start(self.argv(runs_root))

        def charged() -> bool:
            ledgers = list(runs_root.glob("run-*/ledger.jsonl"))
            return bool(ledgers) and len(ledgers[0].read_text().splitlines()) > 1

        for until, done in (("first_charge", charged),
                            ("charged_part", lambda: any(runs_root.glob("run-*/result.json")))):
            while not done():
                if os.waitpid(pid, os.WNOHANG)[0]:
                    raise FaultCheckFailed(f"an undisturbed child run ended before its {until}")
                time.sleep(0.002)
            setattr(self, until, time.monotonic() - started)
        code = wait(pid)
        self.duration = time.monotonic() - started
        self.tally.runs += 1
        self.count(code)
        if code != 0:
            raise FaultCheckFailed(f"an undisturbed child run exited {code}")
        self.check_lifetime()

    # -- checks
    def run_dir(self, runs_root: Path) -> Path | None:
        found = sorted(runs_root.glob("run-*")) if runs_root.exists() else []
        if len(found) > 1:
            raise FaultCheckFailed(f"{runs_root}: {len(found)} run directories for one run")
        return found[0] if found else None

    def check_prefix(self, run_dir: Path) -> list[dict]:
        """The ledger file is the store's record of the run, or one charge behind it."""
        recorded = self.store().entries(run_dir.name)
        held = ledger_entries(run_dir)
        self.tally.entries_checked += len(recorded)
        if [_entry_key(e) for e in held] != [_entry_key(e) for e in recorded[:len(held)]]:
            raise FaultCheckFailed(f"{run_dir.name}: the ledger disagrees with the store")
        if len(recorded) - len(held) not in (0, 1):
            raise FaultCheckFailed(f"{run_dir.name}: store {len(recorded)} entries, ledger {len(held)}")
        self.tally.store_ahead += len(recorded) - len(held)
        return recorded

    def check_complete(self, run_dir: Path, before: list[dict], code: int) -> None:
        """After a resume to the end: the two agree, nothing was lost, epsilon did not drop."""
        recorded = self.store().entries(run_dir.name)
        held = ledger_entries(run_dir)
        self.tally.entries_checked += len(recorded)
        if [_entry_key(e) for e in held] != [_entry_key(e) for e in recorded]:
            raise FaultCheckFailed(f"{run_dir.name}: after resuming, ledger {len(held)} vs store {len(recorded)}")
        kept = {_entry_key(e) for e in held}
        lost = [e for e in before if _entry_key(e) not in kept]
        self.tally.losses += len(lost)
        if lost:
            raise FaultCheckFailed(f"{run_dir.name}: {len(lost)} entries lost by the resume")
        if held:
            ledger = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
            spent_before = before[-1]["epsilon"] if before else 0.0
            if ledger.epsilon() < spent_before - 1e-9:
                raise FaultCheckFailed(f"{run_dir.name}: epsilon fell from {spent_before} to {ledger.epsilon()}")
        log = [json.loads(line) for line in (run_dir.parent / "run_metadata.jsonl").read_text().splitlines()
               if line.strip()]
        ends = [line for line in log if line.get("run_dir") == run_dir.name and line.get("event") in
                ("finished", "failed")]
        if not ends:
            raise FaultCheckFailed(f"{run_dir.name}: no finished/failed line in the run log")
        if code in RESUME_CODES and not (run_dir / "result.json").exists():
            raise FaultCheckFailed(f"{run_dir.name}: exit {code} without result.json")
        self.check_lifetime()

    def check_lifetime(self) -> None:
        now = self.lifetime()
        if now < self._lifetime - 1e-9:
            raise FaultCheckFailed(f"the dataset's lifetime epsilon fell from {self._lifetime} to {now}")
        self._lifetime = now

    def resume_to_end(self, run_dir: Path, *, kill_probability: float = 0.0) -> None:
        """Resume (perhaps killed once more on the way) until the run ends; then check it."""
        for _ in range(4):
            before = self.check_prefix(run_dir)
            finished = (run_dir / "result.json").exists()
            self.tally.resumes += 1
            pid = start(["optimize", "--resume", str(run_dir)])
            if self.rng.random() < kill_probability and kill_after(pid, self.kill_time()):
                self.tally.kills += 1
                self.count(reap(pid))
                kill_probability = 0.0
                continue
            code = reap(pid)
            self.count(code)
            if finished:
                if code != 2:
                    raise FaultCheckFailed(f"{run_dir.name}: resuming a finished run exited {code}")
                code = 0
            elif code not in RESUME_CODES | {NOTHING_RELEASED}:
                raise FaultCheckFailed(f"{run_dir.name}: resume exited {code}")
            self.check_complete(run_dir, before, code)
            return
        raise FaultCheckFailed(f"{run_dir.name}: did not end after four resumes")

    def settle(self, runs_root: Path) -> None:
        """After a fault: a run directory resumes to its end; none means nothing was charged
        (:meth:`reconcile` checks at the end that no charge in the store lacks a run directory)."""
        run_dir = self.run_dir(runs_root)
        if run_dir is None or not (run_dir / "checkpoint.json").exists():
            charged = self.store().entries(run_dir.name) if run_dir is not None else []
            # Only the DP count of N may come before the first checkpoint (the checkpoint holds the plan
            # made from it): a run killed there keeps that charge, released nothing, and is started again.
            if any(entry["label"] != SIZE_COUNT_LABEL for entry in charged):
                raise FaultCheckFailed(f"{run_dir.name}: charged without a checkpoint to resume from")
            self.tally.ended_before_first_charge += 1
            self.check_lifetime()
            return
        self.resume_to_end(run_dir, kill_probability=0.3)

    # -- the four kinds of fault
    def kill_time(self) -> float:
        """Mostly while charges happen; sometimes before them, or while the report is written."""
        draw = self.rng.random()
        if draw < 0.15:
            return self.rng.uniform(0.0, self.first_charge)
        if draw < 0.85:
            return self.rng.uniform(self.first_charge, self.charged_part)
        return self.rng.uniform(self.charged_part, 1.1 * self.duration)

    def kill_trial(self) -> None:
        """kill -9 at a random point: at a random moment from outside (35%), at a random crash
        point between two writes (35%), or right after a random charge reached the store and
        before the ledger file has it (30%: the window the store's write-ahead order is for)."""
        runs_root = self.new_root()
        self.tally.runs += 1
        draw = self.rng.random()
        if draw < 0.65:
            setup = kill_at_point(self.rng.randint(1, self.crash_points)) if draw < 0.35 else \
                kill_at_point(self.rng.randint(1, self.records), only="after store record")
            code = run_to_end(self.argv(runs_root), setup=setup)
            self.tally.kills += code is None
            self.count(code)
        else:
            pid = start(self.argv(runs_root))
            if kill_after(pid, self.kill_time()):
                self.tally.kills += 1
            self.count(reap(pid))
        self.settle(runs_root)

    def engine_failure_trial(self) -> None:
        runs_root = self.new_root()
        fail_at = self.rng.randint(1, self.engine_calls)
        code = run_to_end(self.argv(runs_root), lambda: FailingEngine(fail_at))
        self.tally.runs += 1
        self.tally.engine_failures += code != 0
        self.count(code)
        if code not in (0, 1):
            raise FaultCheckFailed(f"an engine failure at call {fail_at} exited {code}")
        self.settle(runs_root)

    def full_disk_trial(self) -> None:
        runs_root = self.new_root()
        after = self.rng.randint(0, self.writes)
        code = run_to_end(self.argv(runs_root), setup=full_disk_after(after))
        self.tally.runs += 1
        self.tally.disk_failures += code != 0
        self.count(code)
        if code not in (0, 1, 2):
            raise FaultCheckFailed(f"a full disk after {after} writes exited {code}")
        self.settle(runs_root)

    def concurrent_trial(self, runs: int, cap: float) -> None:
        """``runs`` runs at once on this dataset under a lifetime cap: the cap holds, nothing is lost."""
        roots = [self.new_root() for _ in range(runs)]
        pids = [start(self.argv(root, "--lifetime-cap", f"{cap:g}")) for root in roots]
        codes = [wait(pid) for pid in pids]
        self.tally.runs += runs
        self.tally.concurrent_runs += runs
        for root, code in zip(roots, codes):
            self.count(code)
            if code not in (0, 2, 3) and code != NOTHING_RELEASED:
                raise FaultCheckFailed(f"a concurrent run exited {code}")
            self.tally.refused_by_cap += code == 2
            run_dir = self.run_dir(root)
            if run_dir is not None and (run_dir / "checkpoint.json").exists():
                before = self.check_prefix(run_dir)
                if code != 2:
                    self.check_complete(run_dir, before, code)
        spent = self.lifetime()
        if spent > cap + 1e-9:
            raise FaultCheckFailed(f"concurrent runs pushed the lifetime epsilon to {spent} over the cap {cap}")
        self.check_lifetime()


def reconcile(root: Path, store_path: Path) -> int:
    """Every run the store knows has a run directory whose ledger holds exactly its entries
    (after every fault was settled). Returns the number of entries compared."""
    store = LifetimeBudget(store_path)
    run_dirs = {p.name: p for p in Path(root).glob("**/runs/r*/run-*") if p.is_dir()}
    compared = 0
    for dataset in store.datasets():
        for run in store.runs(dataset):
            recorded = store.entries(run.run_id)
            if not recorded:
                continue
            if run.run_id not in run_dirs:
                raise FaultCheckFailed(f"{run.run_id}: charged in the store but no run directory")
            held = ledger_entries(run_dirs[run.run_id])
            if not (run_dirs[run.run_id] / "checkpoint.json").exists() and not held \
                    and all(e["label"] == SIZE_COUNT_LABEL for e in recorded):
                # Killed after the store recorded the DP count of N and before the ledger file did, with
                # no checkpoint yet: the store keeps the charge (it is the lifetime's truth), nothing was
                # released and the run cannot be resumed (it is started again).
                compared += len(recorded)
                continue
            if [_entry_key(e) for e in held] != [_entry_key(e) for e in recorded]:
                raise FaultCheckFailed(f"{run.run_id}: ledger and store differ at the end")
            compared += len(recorded)
    return compared


def run_lanes(root: Path, lanes: int, trial: Callable[[FaultLab], None], *, seed: int = 0) -> Tally:
    """Run ``trial`` in ``lanes`` forked processes at once (one core each), all on one store and
    one dataset, then reconcile the store with every run directory. Returns the summed tally."""
    root = Path(root)
    template = FaultLab(root / "lane-0", seed=seed)
    template.measure()  # warms this process: the lanes inherit imports and the calibration
    pids = []
    for lane in range(1, lanes + 1):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - a lane leaves through os._exit
            outcome: dict[str, object] = {}
            try:
                lab = FaultLab(root / f"lane-{lane}", seed=seed * 100 + lane)
                lab.store_path, lab.train, lab.test = template.store_path, template.train, template.test
                lab.engine_calls, lab.crash_points, lab.writes, lab.records = (
                    template.engine_calls, template.crash_points, template.writes, template.records)
                lab.time_child()
                trial(lab)
                outcome = {"tally": lab.tally.as_dict()}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                outcome = {"failure": f"{type(exc).__name__}: {exc}"}
            finally:
                (root / f"lane-{lane}.json").write_text(json.dumps(outcome, default=str))
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    total = template.tally
    for lane in range(1, lanes + 1):
        outcome = json.loads((root / f"lane-{lane}.json").read_text())
        if "failure" in outcome:
            raise FaultCheckFailed(f"lane {lane}: {outcome['failure']}")
        for name, value in outcome["tally"].items():
            if name == "exit_codes":
                for code, n in value.items():
                    total.exit_codes[int(code)] = total.exit_codes.get(int(code), 0) + n
            else:
                setattr(total, name, getattr(total, name) + value)
    total.entries_checked += reconcile(root, template.store_path)
    return total


__all__ = ["FaultCheckFailed", "FaultLab", "Tally", "reconcile", "run_lanes"]


# -- kills at named points of a run (the replay tests of tests/test_fault_injection.py) ----------
def kill_at_call(owner: object, name: str, call: int = 1, *, after: bool = False,
                 when: Callable[..., bool] | None = None) -> Callable[[], None]:
    """A child setup: SIGKILL itself at the ``call``-th call of ``owner.name`` (counting only the
    calls whose arguments satisfy ``when``), before the call runs or (``after``) once it returned."""

    def setup() -> None:
        real = getattr(owner, name)
        count = {"n": 0}

        def wrapper(*args, **kwargs):
            counted = when is None or when(*args, **kwargs)
            count["n"] += counted
            if counted and count["n"] == call and not after:
                os.kill(os.getpid(), signal.SIGKILL)
            out = real(*args, **kwargs)
            if counted and count["n"] == call and after:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        setattr(owner, name, wrapper)

    return setup


def kill_before_any(*targets: tuple[object, str]) -> Callable[[], None]:
    """A child setup: SIGKILL itself at the first call of any of ``targets`` (before it runs)."""

    def setup() -> None:
        for owner, name in targets:
            kill_at_call(owner, name)()

    return setup


# Public costs: a resumed run repeats its preflight (public text), so they may differ.
PUBLIC_COSTS = ("public_calls", "public_prompt_tokens", "public_completion_tokens", "public_usage")


def _without_costs(payload: dict) -> dict:
    kept = {k: v for k, v in payload.items() if k not in PUBLIC_COSTS}
    if "history" in kept:
        kept["history"] = [_without_costs(line) for line in kept["history"]]
    return kept


def released_files(run_dir: Path) -> dict[str, object]:
    """What a run released that two runs under the same seeds must share: the prompt, result.json
    (released part, its wall time is operator-only), metrics.jsonl and the ledger's charges; the
    public costs left out (see ``PUBLIC_COSTS``)."""
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    charges = [(e["index"], e["label"], json.dumps(e["event"], sort_keys=True), json.dumps(e["metadata"], sort_keys=True),
                e["epsilon"]) for e in ledger_entries(run_dir)]
    return {"prompt": (run_dir / "released_prompt.txt").read_text(encoding="utf-8"), "result": _without_costs(result),
            "metrics": [_without_costs(line) for line in metrics], "ledger": charges}
