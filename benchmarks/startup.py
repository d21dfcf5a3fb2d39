"""Start-up time of the command line: ``dp-textgrad --help`` and ``dp-textgrad budget``, this tree against a baseline.

    python benchmarks/startup.py                      # 7 repeats, baseline ee4a9b8 (the code issue 36 measured)
    python benchmarks/startup.py --repeats 1 --out startup_smoke.json   # a smoke run, for tests

Each command runs in a fresh interpreter, timed from the parent (interpreter start, imports,
the command), for this tree and for the baseline commit side by side: each repeat runs every
(command, tree) pair once, one after the other, so both trees see the same machine load. The
baseline is materialised with ``git archive COMMIT | tar -x`` into a temporary directory and
run from there with ``PYTHONPATH`` (nothing is installed); this tree runs the same way from the
repository root. Every child checks that it imported the tree it was meant to. Reports the
medians, their ratio (this tree / baseline) and the issue's target (< 1.5 s on an idle
machine; the load average is recorded beside the numbers), as a table and as JSON
(``--out``, default ``benchmarks/results/startup.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "startup.json"
DEFAULT_BASELINE = "ee4a9b8"
TARGET_S = 1.5
# The same options in both trees (the baseline's budget has no --dataset-size).
COMMANDS = {
    "--help": ["--help"],
    "budget": ["budget", "--epsilon", "4", "--generations", "4", "--population", "6"],
}
# The child: check which tree it imports, then run the command as the console script does.
CHILD = ("import sys\n"
         "import dp_textgrad\n"
         "assert dp_textgrad.__file__.startswith({root!r}), dp_textgrad.__file__\n"
         "sys.argv = ['dp-textgrad', *{argv!r}]\n"
         "from dp_textgrad.cli import app\n"
         "app()\n")


def materialise(commit: str, into: Path) -> Path:
    """The files of ``commit`` under ``into`` (``git archive | tar -x``): nothing checked out, nothing installed."""
    path = into / f"baseline-{commit}"
    path.mkdir()
    archive = subprocess.Popen(["git", "-C", str(REPO_ROOT), "archive", commit], stdout=subprocess.PIPE)
    extract = subprocess.run(["tar", "-x", "-C", str(path)], stdin=archive.stdout, capture_output=True)
    archive.stdout.close()
    if archive.wait() != 0 or extract.returncode != 0:
        raise RuntimeError(f"--baseline: cannot materialise {commit}: {extract.stderr.decode().strip()}")
    return path


def time_once(root: Path, argv: list[str], scratch: Path) -> float:
    """Seconds of one fresh ``dp-textgrad ARGV`` run from the tree at ``root``; raises when it fails."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = CHILD.format(root=str(root.resolve()) + os.sep, argv=argv)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=scratch, env=env,
                          timeout=300)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"dp-textgrad {shlex.join(argv)} from {root} exited {done.returncode}: "
                           f"{done.stderr.strip()[-800:]}")
    return seconds


def measure(repeats: int, baseline: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="dp-textgrad-startup-") as tmp:
        scratch = Path(tmp) / "cwd"  # an empty working directory: `python -c` puts it first on sys.path
        scratch.mkdir()
        trees = {"current": REPO_ROOT, "baseline": materialise(baseline, Path(tmp))}
        runs: dict[str, dict[str, list[float]]] = {name: {tree: [] for tree in trees} for name in COMMANDS}
        for _ in range(repeats):
            for name, argv in COMMANDS.items():
                for tree, root in trees.items():
                    runs[name][tree].append(time_once(root, argv, scratch))
    commands = {}
    for name, times in runs.items():
        current, before = statistics.median(times["current"]), statistics.median(times["baseline"])
        commands[name] = {"argv": COMMANDS[name], "current_s": current, "baseline_s": before,
                          "ratio": current / before, "meets_target": current < TARGET_S,
                          "current_runs_s": times["current"], "baseline_runs_s": times["baseline"]}
    return commands


def code_version() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def table(result: dict) -> str:
    lines = [f"{'command':<10} {'this tree (s)':>14} {'baseline (s)':>13} {'ratio':>7}  target < {TARGET_S:g} s",
             "-" * 62]
    for name, row in result["commands"].items():
        lines.append(f"{name:<10} {row['current_s']:>14.3f} {row['baseline_s']:>13.3f} {row['ratio']:>7.2f}  "
                     f"{'met' if row['meets_target'] else 'MISSED'}")
    lines.append(f"medians of {result['repeats']} fresh processes each; baseline {result['baseline']}; "
                 f"load average before {result['load_average_before']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per command and tree (median)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the commit to compare with")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT, help="where the JSON result is written")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: must be >= 1")
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    commands = measure(args.repeats, args.baseline)
    result = {
        "commands": commands,
        "repeats": args.repeats,
        "baseline": args.baseline,
        "target_s": TARGET_S,
        "load_average_before": load,
        "seconds": time.perf_counter() - started,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/startup.py", *sys.argv[1:]]),
        "code_version": code_version(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
