"""Calibration time over the supported budgets, on the library's default schedule.

    python benchmarks/calibration_time.py
    python benchmarks/calibration_time.py --epsilons 0.01,4,100 --selections gaussian

For each selection mechanism and each epsilon, the process-wide memos (calibration, PLD
and RDP curves) are cleared, ``RunPlan.calibrated`` is timed, and the result is checked:
the whole plan's smallest bound under the ledger's accountants is at most epsilon, and
the share of the budget used is reported. Then ``dp-textgrad budget --epsilon 4`` is timed
end to end in a fresh process (imports included), the command the issue measured.
Writes ``benchmarks/results/calibration_time.json``; exits 1 if a plan exceeds its target
or a calibration takes 1 s or more.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "calibration_time.json"
EPSILONS = (0.001, 0.01, 0.1, 1.0, 4.0, 10.0, 100.0, 1000.0, 10000.0)
SCHEDULE = dict(delta=1e-5, generations=6, population=6, sampling_rate=0.1)  # DPESConfig defaults
TARGET_SECONDS = 1.0


def clear_memos() -> None:
    from dp_textgrad.dp_es import plan
    from dp_textgrad.privacy.accounting.accountants import PldAccountant, RdpAccountant

    plan._calibrated_value.cache_clear()
    PldAccountant._shared.clear()
    RdpAccountant._curves.clear()


def time_one(selection: str, epsilon: float) -> dict:
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.plan import RunPlan
    from dp_textgrad.privacy.accounting import default_accountants
    from dp_textgrad.privacy.accounting.bounds import all_bounds

    extra = {} if selection == "gaussian" else {"selection": selection, "feedback": "none"}
    config = DPESConfig(epsilon=epsilon, **SCHEDULE, **extra)
    clear_memos()
    started = time.perf_counter()
    plan = RunPlan.calibrated(config)
    seconds = time.perf_counter() - started
    bounds = all_bounds(default_accountants(), [plan.event], SCHEDULE["delta"])
    spent = min(bounds.values())
    return {"selection": selection, "epsilon": epsilon, "value": plan.value, "seconds": round(seconds, 3),
            "spent": spent, "used_share": spent / epsilon, "bound": min(bounds, key=bounds.__getitem__),
            "fits": spent <= epsilon}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--selections", default="gaussian,exponential,permute_and_flip")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)  # dp-accounting's overflow warnings near the PLD's limit
    load = os.getloadavg()[0]
    import dp_textgrad.dp_es.plan  # noqa: F401 - imports are not part of a calibration's time

    rows = []
    for selection in [s.strip() for s in args.selections.split(",") if s.strip()]:
        for epsilon in [float(e) for e in args.epsilons.split(",") if e.strip()]:
            row = time_one(selection, epsilon)
            rows.append(row)
            print(f"{selection:>16} eps {epsilon:>8g}: {row['seconds']:.2f} s, value {row['value']:.6g}, "
                  f"spent {row['spent']:.6g} ({100 * row['used_share']:.2f}% of the budget, {row['bound']})",
                  flush=True)
    command = [shutil.which("dp-textgrad") or "dp-textgrad", "budget", "--epsilon", "4", "--generations", "6",
               "--population", "6", "--sampling-rate", "0.1"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    cli_seconds = time.perf_counter() - started
    print(f"`dp-textgrad budget --epsilon 4 --generations 6 --population 6 --sampling-rate 0.1`: "
          f"{cli_seconds:.2f} s end to end (exit {done.returncode}); load average before: {load:.2f}")
    slow = [r for r in rows if r["seconds"] >= TARGET_SECONDS]
    over = [r for r in rows if not r["fits"]]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "command": "python benchmarks/calibration_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.date.today().isoformat(), "machine": platform.platform(), "cpus": os.cpu_count(),
        "load_average_before": load, "schedule": SCHEDULE, "rows": rows,
        "cli_budget_seconds": cli_seconds, "max_seconds": max(r["seconds"] for r in rows),
    }, indent=2) + "\n", encoding="utf-8")
    if over:
        print(f"OVER THE TARGET: {over}", file=sys.stderr)
    if slow:
        print(f"{len(slow)} calibration(s) took {TARGET_SECONDS} s or more", file=sys.stderr)
    return 1 if over or slow or done.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
