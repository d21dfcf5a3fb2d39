"""Which schedule suits a generation task? DP-ES at one epsilon under several schedules, side by side.

Issue 46 asks for a default schedule for generation that measurements justify. This runs Gaussian
DP-ES on the built-in extraction task (``support_extract``: 600 private records, 40 public
demonstrations, the whole test split of 200, exact match; the local model) under each schedule of
``SCHEDULES`` at the same epsilon, with the same seeds, and pairs the released prompts' test scores:

- ``T6K6_150``: the library's default (6 generations of 6 candidates, q = min(1, 150 / N));
- ``T3K6_150``: the default's rate over half the generations;
- ``T3K4_48``: the schedule of the generation grid (docs/benchmarks.md), restored from its
  committed results file, not rerun;
- ``T2K4_40``: the schedule of the built-in task's demo and example run files.

Each schedule's runs come from ``benchmarks/generation_utility.py`` (same task, methods and work
files); this script runs it once per schedule and summarises: the mean test score, the paired
bootstrap (test records and seeds) against the library default, the share of the non-private gain
kept (the seed prompt and the non-private run of the generation grid as the ends), the planned
private evaluations (q N K T) and the measured engine calls and wall time.

    python benchmarks/generation_schedule.py --seeds 2
    python benchmarks/generation_schedule.py --seeds 2 --summarise-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import generation_utility  # noqa: E402 - after the path insert
import run_records  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"
GRID_RESULTS = RESULTS / "generation_utility_support_extract.json"
DEFAULT_WORK_ROOT = REPO_ROOT / "runs" / "benchmarks"
DEFAULT_OUTPUT = RESULTS / "generation_schedule.json"
TASK = "support_extract"
N_PRIVATE = 600  # the built-in task's private set


@dataclass(frozen=True)
class Schedule:
    generations: int
    population: int
    records: int  # expected private records per candidate and generation (q = records / N)

    @property
    def planned_private_evaluations(self) -> int:
        return self.generations * self.population * self.records


SCHEDULES: dict[str, Schedule] = {
    "T6K6_150": Schedule(6, 6, 150),
    "T3K6_150": Schedule(3, 6, 150),
    "T3K4_48": Schedule(3, 4, 48),
    "T2K4_40": Schedule(2, 4, 40),
}
LIBRARY_DEFAULT = "T6K6_150"
# Run by the generation grid already (its committed results file): restored, never rerun.
FROM_THE_GRID = "T3K4_48"


def results_file(name: str) -> Path:
    return RESULTS / f"generation_schedule_{name}.json"


def run_schedule(name: str, seeds: int, epsilon: int, threads: int | None) -> None:
    schedule = SCHEDULES[name]
    argv = [
        "--task", TASK, "--methods", f"dp_gaussian_eps{epsilon}", "--seeds", str(seeds),
        "--generations", str(schedule.generations), "--population", str(schedule.population),
        "--records", str(schedule.records),
        # Relative paths: the results file records its command, and no path of this machine belongs in it.
        "--work-dir", os.path.relpath(DEFAULT_WORK_ROOT / f"generation_schedule_{name}"),
        "--output", os.path.relpath(results_file(name)),
    ]  # fmt: skip
    if threads is not None:
        argv += ["--threads", str(threads)]
    status = generation_utility.main(argv)
    if status != 0:
        raise SystemExit(f"generation_utility.py stopped with {status} on schedule {name}")


def schedule_runs(name: str, method: str, grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of one schedule: from the grid's results for the grid's schedule, else its own results file."""
    if name == FROM_THE_GRID:
        return [r for r in grid["runs"] if r["method"] == method]
    path = results_file(name)
    if not path.exists():
        return []
    return [r for r in json.loads(path.read_text(encoding="utf-8"))["runs"] if r["method"] == method]


def summarise(
    runs: dict[str, list[dict[str, Any]]],
    seed_row: dict[str, Any],
    nonprivate: list[dict[str, Any]],
    reference: str = LIBRARY_DEFAULT,
) -> dict[str, Any]:
    """Schedules on the seeds all of them completed: scores, paired differences to ``reference``, kept gain."""
    from paired_bootstrap import paired_bootstrap

    present = {name: rows for name, rows in runs.items() if rows}
    if reference not in present:
        return {"seeds": [], "schedules": {}, "note": f"no run of the reference schedule {reference} yet"}
    common = sorted(set.intersection(*({r["seed"] for r in rows} for rows in present.values())))
    if not common:
        return {"seeds": [], "schedules": {}, "note": "no seed that every schedule completed: nothing to pair"}
    common_nonprivate = [r for r in nonprivate if r["seed"] in common]
    matrices = {
        name: np.asarray([r["test_scores"] for r in sorted(rows, key=lambda r: r["seed"]) if r["seed"] in common])
        for name, rows in present.items()
    }
    matrices["seed"] = np.asarray([seed_row["test_scores"]])
    if len(common_nonprivate) == len(common):
        by_seed = sorted(common_nonprivate, key=lambda r: r["seed"])
        matrices["nonprivate"] = np.asarray([r["test_scores"] for r in by_seed])
    paired = paired_bootstrap(matrices, reference="seed", ceiling="nonprivate",
                              baselines={name: reference for name in present if name != reference})  # fmt: skip
    schedules: dict[str, Any] = {}
    for name, rows in present.items():
        chosen = sorted((r for r in rows if r["seed"] in common), key=lambda r: r["seed"])
        row = paired[name]
        schedules[name] = {
            "generations": SCHEDULES[name].generations,
            "population": SCHEDULES[name].population,
            "records_per_candidate": SCHEDULES[name].records,
            "planned_private_evaluations": SCHEDULES[name].planned_private_evaluations,
            "score": row["accuracy"],
            "score_ci": row["accuracy_ci"],
            "per_seed": [r["test_score"] for r in chosen],
            f"vs_{reference}": row.get("vs_baseline"),
            f"vs_{reference}_ci": row.get("vs_baseline_ci"),
            "retained_gain": row.get("retained_gain"),
            "retained_gain_ci": row.get("retained_gain_ci"),
            "epsilon_spent_mean": float(np.mean([r["epsilon_spent"] for r in chosen])),
            "engine_calls_mean": float(np.mean([r["engine_calls"] for r in chosen])),
            "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in chosen])),
        }
    return {
        "seeds": common,
        "reference": reference,
        "seed_prompt_score": paired["seed"]["accuracy"],
        "nonprivate_score": paired.get("nonprivate", {}).get("accuracy"),
        "schedules": schedules,
    }


def table(summary: dict[str, Any]) -> str:
    reference = summary.get("reference", LIBRARY_DEFAULT)
    lines = [
        f"| schedule | planned evaluations | test score | vs {reference} | retained gain | engine calls | wall s |",
        "|---|---|---|---|---|---|---|",
    ]

    def interval(value: float | None, ci: list[float] | None, signed: bool = True) -> str:
        if value is None:
            return ""
        form = "{:+.3f}" if signed else "{:.3f}"
        text = form.format(value)
        return text if ci is None else f"{text} [{form.format(ci[0])}, {form.format(ci[1])}]"

    for name, row in summary["schedules"].items():
        lines.append(
            f"| {name} | {row['planned_private_evaluations']} | {row['score']:.3f} | "
            f"{interval(row[f'vs_{reference}'], row[f'vs_{reference}_ci'])} | "
            f"{interval(row['retained_gain'], row['retained_gain_ci'], signed=False)} | "
            f"{row['engine_calls_mean']:.0f} | {row['wall_seconds_mean']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--schedules", default=",".join(SCHEDULES), help="comma-separated subset of " + ",".join(SCHEDULES)
    )
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epsilon", type=int, choices=(1, 4), default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--summarise-only", action="store_true")
    args = parser.parse_args(argv)
    names = [n for n in args.schedules.split(",") if n]
    unknown = sorted(set(names) - set(SCHEDULES))
    if unknown:
        parser.error(f"--schedules: unknown {unknown}; choose from {','.join(SCHEDULES)}")
    if not args.summarise_only:
        for name in names:
            if name != FROM_THE_GRID:
                run_schedule(name, args.seeds, args.epsilon, args.threads)
    grid = json.loads(GRID_RESULTS.read_text(encoding="utf-8"))
    method = f"dp_gaussian_eps{args.epsilon}"
    runs = {name: [r for r in schedule_runs(name, method, grid) if r["seed"] < args.seeds] for name in names}
    seed_row = next(r for r in grid["runs"] if r["method"] == "seed")
    nonprivate = [r for r in grid["runs"] if r["method"] == "nonprivate"]
    summary = summarise(runs, seed_row, nonprivate)
    document = {"task": TASK, "n_private": N_PRIVATE, "epsilon": args.epsilon, "summary": summary}
    run_records.write_results(
        args.output, document, "benchmarks/generation_schedule.py", sys.argv[1:] if argv is None else argv
    )
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
