"""Start-up cost of TextGrad under dp-textgrad: litellm deferred (the library) against loaded.

    python benchmarks/import_time.py --repeats 5

Every command that optimizes imports TextGrad, and TextGrad imports litellm for an engine
dp-textgrad never uses. ``import_textgrad`` defers litellm to the first call of that
engine. Each repeat runs two fresh interpreters one after the other, so both see the
same machine load: ``import_textgrad()`` as the library does it, and the same after
``import litellm`` (what every start cost before). Reports the medians and their ratio,
with the load average; writes ``benchmarks/results/import_time.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "import_time.json"
TIMED = ("import time, sys\n"
         "started = time.perf_counter()\n"
         "{preload}"
         "from dp_textgrad._textgrad import import_textgrad\n"
         "import_textgrad()\n"
         "print(time.perf_counter() - started, 'litellm' in sys.modules)\n")
VARIANTS = {"deferred (the library)": "", "litellm loaded first (before)": "import litellm\n"}


def time_once(preload: str) -> tuple[float, bool]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run([sys.executable, "-c", TIMED.format(preload=preload)], capture_output=True, text=True,
                         check=True, cwd=REPO_ROOT, env=env).stdout.split()
    return float(out[0]), out[1] == "True"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats):
        for name, preload in VARIANTS.items():
            took, loaded = time_once(preload)
            if loaded != bool(preload):
                raise SystemExit(f"{name}: litellm loaded = {loaded}, expected {bool(preload)}")
            seconds[name].append(round(took, 3))
        print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()),
              flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    deferred, eager = medians["deferred (the library)"], medians["litellm loaded first (before)"]
    result = {
        "benchmark": "import_time", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/import_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2)},
        "seconds": seconds, "median_seconds": medians, "speedup": round(eager / deferred, 2),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"median: deferred {deferred:.2f} s, litellm loaded {eager:.2f} s: {eager / deferred:.1f}x faster start "
          f"(load average {load_before:.2f} -> {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
