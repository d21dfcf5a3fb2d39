"""Fault injection at scale: kill -9, engine failures, a full disk and concurrent runs, with
every invariant of the lifetime budget checked after each fault (see ``tests/faults.py``).

    python benchmarks/fault_injection.py                 # 2 lanes x 150 trials + 8 concurrent runs
    python benchmarks/fault_injection.py --trials 30     # quicker

Each trial is one ``dp-textgrad optimize`` run (scripted engine, so it measures the
bookkeeping, not a model) hit by one fault: kill -9 at a random moment, at a random crash
point between two writes, or right after a charge reached the store (70%); the engine failing
from a random call on (15%); the disk filling at a random write (15%). The run is then
resumed to its end (a resume is itself killed once in three) and the checks run: ledger and
store agree, no entry is lost, epsilon never goes down, and at the end every charge in the
store belongs to a run directory whose ledger holds exactly the same entries. Prints the
counts and writes ``benchmarks/results/fault_injection.json``; exits 1 on any failed check.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # the harness lives with the tests

from tests.faults import FaultCheckFailed, FaultLab, run_lanes  # noqa: E402

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "fault_injection.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=150, help="faulty runs per lane")
    parser.add_argument("--lanes", type=int, default=2, help="lanes at once (one per core)")
    parser.add_argument("--concurrent", type=int, default=8, help="runs started at once under a lifetime cap")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.trials < 1 or args.lanes < 1 or args.concurrent < 2:
        parser.error("--trials and --lanes must be >= 1 and --concurrent >= 2")

    def trial(lab: FaultLab) -> None:
        for _ in range(args.trials):
            draw = lab.rng.random()
            if draw < 0.15:
                lab.engine_failure_trial()
            elif draw < 0.30:
                lab.full_disk_trial()
            else:
                lab.kill_trial()

    started = time.perf_counter()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dp-textgrad-faults-") as scratch:
        try:
            tally = run_lanes(Path(scratch) / "lanes", args.lanes, trial, seed=args.seed)
            lab = FaultLab(Path(scratch) / "concurrent", seed=args.seed)
            lab.measure()
            cap = lab.lifetime() + 1.02 * lab.run_increment  # room for about one more whole run
            before = dict(lab.tally.exit_codes)
            lab.concurrent_trial(args.concurrent, cap=cap)
        except FaultCheckFailed as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
    seconds = time.perf_counter() - started
    concurrent = lab.tally
    codes = {k: v - before.get(k, 0) for k, v in sorted(concurrent.exit_codes.items()) if v > before.get(k, 0)}
    summary = {
        "runs": tally.runs + concurrent.runs,
        "kills": tally.kills,
        "kills_between_store_and_ledger": tally.store_ahead,
        "engine_failures": tally.engine_failures,
        "disk_failures": tally.disk_failures,
        "ended_before_first_charge": tally.ended_before_first_charge,
        "resumes": tally.resumes,
        "entries_checked": tally.entries_checked + concurrent.entries_checked,
        "losses": tally.losses + concurrent.losses,
        "concurrent_runs": concurrent.concurrent_runs,
        "concurrent_exit_codes": codes,
        "exit_codes": tally.exit_codes,
    }
    print(f"fault injection: {args.lanes} lane(s) x {args.trials} trials, {args.concurrent} concurrent runs, "
          f"{seconds:.0f} s (load average before: {load:.2f})")
    for name, value in summary.items():
        print(f"  {name:>32}: {value}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "command": "python benchmarks/fault_injection.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.date.today().isoformat(), "machine": platform.platform(), "cpus": os.cpu_count(),
        "load_average_before": load, "seconds": seconds, **summary,
    }, indent=2, default=str) + "\n", encoding="utf-8")
    return 0 if summary["losses"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
