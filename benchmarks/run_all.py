"""Rerun the benchmarks listed below, one after the other, with the settings the docs report
(the other scripts in ``benchmarks/`` are run by the command their docs table names).

    python benchmarks/run_all.py            # everything (several hours on 2 cores)
    python benchmarks/run_all.py --only accounting,engine_throughput

Each benchmark writes its own ``benchmarks/results/<name>.json`` (and the
privacy-utility plots in ``docs/img``). Data come from ``$DP_TEXTGRAD_DATA`` or
``../shared/data``. The privacy-utility grid resumes from
``runs/benchmarks/privacy_utility_powered/runs.jsonl``: delete that file for a fresh grid.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> arguments; the order puts the cheap, machine-only benchmarks first.
BENCHMARKS: dict[str, list[str]] = {
    "accounting": [],
    "calibration_time": [],
    "import_time": [],
    "engine_throughput": ["--threads", "1"],
    "scoring_speedups": [],
    "openai_concurrency": [],
    "ray_scaling": [],
    "paper_scale": [],
    "peak_rss": [],
    "fault_injection": [],
    "privacy_utility": [],
    "federated": [],  # after privacy_utility: its simulated part fits the measured accuracies
    "voting_cost": ["--threads", "2"],
    # after privacy_utility: its public_dpes reference reuses privacy_utility_powered.json's runs
    "labelling_utility": ["--threads", "2"],
    "dspy_utility": ["--n-private", "300", "--n-test", "100", "--seeds", "0", "1", "2", "--epsilons", "4", "1",
                     "--threads", "2", "--output", str(HERE / "results" / "dspy_utility_support.json")],
    # Against DP-ES (issue 46): the fidelity pools first (the winner's-curse simulation reads them).
    "selection_fidelity": [],
    "winners_curse": [],
    "dp_es_protocol": ["--n-test", "200"],
    "record_formats": [],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rerun every benchmark.")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"--only: unknown benchmarks {unknown}; choose from {list(BENCHMARKS)}")
    failed = []
    for name in names:
        command = [sys.executable, str(HERE / f"{name}.py"), *BENCHMARKS[name]]
        print(f"== {name}: {' '.join(['python', f'benchmarks/{name}.py', *BENCHMARKS[name]])}", flush=True)
        started = time.perf_counter()
        code = subprocess.call(command, cwd=HERE.parent)
        print(f"== {name}: exit {code} after {time.perf_counter() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
