"""How much the record format matters: the same prompt and demonstrations in every public
record format of a generation task, scored on its test split (no private data, no DP).

For each of ``--draws`` sets of ``--demos`` public demonstrations (drawn with a fixed public
seed), the task's seed prompt is followed by those demonstrations written in each format and
then the format's own paragraph (``tasks.record_format``): the task's ``record_template`` and
each of its ``record_formats``. Every prompt is scored by the local model on the first
``--n-test`` test records; the summary gives each format's mean over draws and its paired
difference to the task's own template (a bootstrap over test records, draws kept together).
This is the headroom the ``record_format_change`` operator can reach; whether a search finds it
is ``dp_es_protocol.py``'s ``ours_auto_formats`` row.

    python benchmarks/record_formats.py                       # support_extract, 200 test records
    python benchmarks/record_formats.py --n-test 10 --draws 1 --output smoke.json
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import run_records  # noqa: E402 - beside this file

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "record_formats.json"


def prompts_for(task: Any, demo_sets: list[list[int]]) -> list[tuple[str, int, str]]:
    """(format name, draw, prompt) for every format and demonstration set."""
    from dp_textgrad.tasks.record_format import with_record_format

    out = []
    for record_format in (None, *task.record_formats):
        name = task.record_template if record_format is None else record_format
        for draw, indices in enumerate(demo_sets):
            demos = [task.render_demo(task.public_examples[i], record_format) for i in indices]
            body = "\n\n".join([task.seed_prompt.strip(), *demos])
            out.append((name, draw, with_record_format(body, record_format)))
    return out


def summarise(task_template: str, scores: dict[str, np.ndarray], replicates: int = 2000) -> dict[str, Any]:
    """Each format's mean (over draws and records) and its paired difference to the task's own
    template: a bootstrap over test records, the draws of a record kept together."""
    rng = np.random.default_rng(0)
    own = scores[task_template]  # shape (draws, records)
    n = own.shape[1]
    picks = rng.integers(0, n, size=(replicates, n))
    out = {}
    for name, values in scores.items():
        diff = values.mean(axis=0) - own.mean(axis=0)
        boot = diff[picks].mean(axis=1)
        out[name] = {
            "mean": float(values.mean()),
            "per_draw": [float(v) for v in values.mean(axis=1)],
            "vs_task_template": float(diff.mean()),
            "vs_task_template_ci": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--demos", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    from dp_textgrad.tasks.support_extract import make_support_extract_task

    task = make_support_extract_task(seed=0, n_private=10, n_test=args.n_test)
    task = replace(task, test=list(task.test)[: args.n_test])
    rng = np.random.default_rng(46)  # public: which public examples each draw shows
    demo_sets = [
        [int(i) for i in rng.choice(len(task.public_examples), args.demos, replace=False)] for _ in range(args.draws)
    ]
    engine = LlamaCppEngine(n_threads=args.threads)
    jobs = prompts_for(task, demo_sets)
    started = time.perf_counter()
    outcomes = task.public_outcomes_many(engine, [prompt for _, _, prompt in jobs], task.test)
    seconds = time.perf_counter() - started
    scores: dict[str, np.ndarray] = {}
    for (name, draw, _), outcome in zip(jobs, outcomes, strict=True):
        scores.setdefault(name, np.zeros((args.draws, len(task.test))))[draw] = outcome.scores / task.clip_bound
    summary = summarise(task.record_template, scores)
    document = {
        "task": task.name,
        "n_test": len(task.test),
        "draws": demo_sets,
        "seed_prompt": task.seed_prompt,
        "formats": summary,
        "seconds": seconds,
    }
    run_records.write_results(
        args.output, document, "benchmarks/record_formats.py", sys.argv[1:] if argv is None else argv
    )
    print(f"{len(jobs)} prompts x {len(task.test)} records in {seconds:.0f} s")
    print("| record format | mean exact match | per draw | vs the task's template [95% CI] |")
    print("|---|---|---|---|")
    for name, entry in sorted(summary.items(), key=lambda item: -item[1]["mean"]):
        low, high = entry["vs_task_template_ci"]
        label = name.replace("\n", "\\n")
        print(
            f"| `{label}` | {entry['mean']:.3f} | {', '.join(f'{v:.3f}' for v in entry['per_draw'])} | "
            f"{entry['vs_task_template']:+.3f} [{low:+.3f}, {high:+.3f}] |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
