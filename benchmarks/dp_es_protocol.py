"""DP-ES's own protocol, side by side: the paper's method, ours, and the controls it lacks.

The protocol of the DP-ES paper (EMNLP 2026): N = 200 private records, population K = 6,
M = 2 parents, T = 3 generations, epsilon <= 0.71 at delta 1e-5. Every method below runs on
the same local engine, task, seed prompt, initial population (the seed and five public variants,
public seed = the run's seed) and mutation operators; only the use of private data differs.

* ``seed``: the seed prompt, unoptimised (once per task);
* ``eps0``: the epsilon-0 control: parents drawn at random, no private record read (if a DP
  method does not beat it, its private scores chose nothing);
* ``dpes_published``: DP-ES as the paper describes it (``baselines/dp_es_paper.py``): b = 10
  records per candidate without replacement, noise multiplier 10 on C / b (std 1.0 on a mean),
  the best noisy mean released; its own accountant says 0.705;
* ``ours_default``: ``dp_textgrad`` at epsilon 0.71, N declared, q its default min(1, 150 / N);
* ``ours_auto``: the same with ``sampling_rate: auto``;
* ``nonprivate``: ours with ``privacy = "off"`` (exact scores at the default q);
* ``ours_auto_formats`` (generation tasks, run only when named in ``--methods``): ``ours_auto``
  with public record formats (the ``record_format_change`` operator): the task's own
  ``record_formats`` and the four generic ones of ``tasks.record_format``. Every other
  method runs with ``record_formats = ()``, the operators the grid started with, so the grid's
  methods share one operator set and this row measures what the formats add.
* ``ours_auto_equal_work`` (run only when named): ``ours_auto`` capped at DP-ES's private work,
  ``max_private_evaluations`` = b K T = 180 planned record evaluations (the paper's 10 records per
  candidate): does ours still lead when it may read no more private records than DP-ES does?
* ``ours_auto_own_formats`` (likewise run only when named): ``ours_auto`` with the task's own
  ``record_formats`` only, the built-in task's default since 2026-12-05 (its two field-name formats).

Tasks: ``sst2`` (200 records of train.tsv; test: the first ``--n-test`` of dev.tsv), ``banking10``
(BANKING77 on the 10 intents of dp_textgrad.tasks.registry; test: the first ``--n-test`` of their
test split), ``support_extract`` (the built-in generation task, exact match). Each run's
per-record test outcomes are kept, so the summary gives paired bootstrap intervals (test records
and seeds resampled together) of every method against DP-ES and against the epsilon-0 control.
An extra method run on fewer of the completed seeds than the core methods (they are costly) is
compared on its own seeds only, every method restricted to them, and its row names those seeds.

    python benchmarks/dp_es_protocol.py --seeds 3                  # resumable (runs/benchmarks/dp_es_protocol)
    python benchmarks/dp_es_protocol.py --summarise-only           # rebuild the results file
    python benchmarks/dp_es_protocol.py --restore-from benchmarks/results/dp_es_protocol.json --tasks banking10
    python benchmarks/dp_es_protocol.py --tasks sst2 --seeds 1 --n-test 20 --work-dir smoke --output smoke.json

GSM8K needs a capable model: ``--tasks gsm8k --engine-url http://HOST:PORT/v1 --model NAME`` runs
the same protocol against any OpenAI-compatible endpoint (the local 270M model solves almost none).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import run_records  # noqa: E402 - beside this file
from baselines.dp_es_paper import (  # noqa: E402
    PaperSettings,
    paper_epsilon_add_remove,
    paper_epsilon_autodp,
    paper_epsilon_dp_accounting,
    run_paper_dpes,
    run_random_parents,
)
from paired_bootstrap import decode_outcomes, encode_outcomes, paired_bootstrap  # noqa: E402

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "dp_es_protocol.json"
DEFAULT_WORK_DIR = REPO_ROOT / "runs" / "benchmarks" / "dp_es_protocol"
EPSILON, DELTA, N = 0.71, 1e-5, 200
METHODS = ("eps0", "dpes_published", "ours_default", "ours_auto", "nonprivate")
# Run only when named; compared on the seeds (of those the core methods completed) they ran on.
EXTRA_METHODS = ("ours_auto_equal_work", "ours_auto_formats", "ours_auto_own_formats")
ABLATED = "ours_auto"  # each extra method changes one thing of this one; their paired difference is reported
TASKS = ("sst2", "banking10", "support_extract")


@dataclass(frozen=True)
class Job:
    task: str
    method: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.task}/{self.method}/{self.seed}"


def row_key(row: dict[str, Any]) -> str:
    return Job(row["task"], row["method"], row["seed"]).key


def build_task(name: str, n_test: int, data_dir: str | None) -> Any:
    from dp_textgrad.tasks.registry import build_banking77, build_gsm8k, build_sst2
    from dp_textgrad.tasks.support_extract import make_support_extract_task

    if name == "sst2":
        task = build_sst2(data_dir, n_private=N, n_test=None, seed=0)
    elif name == "banking10":
        task = build_banking77(data_dir, n_private=N, n_test=None, seed=0)
    elif name == "support_extract":
        # Without its record formats: the operator set every method of the grid shares
        # (``ours_auto_formats`` puts them back).
        task = replace(make_support_extract_task(seed=0, n_private=N, n_test=n_test), record_formats=())
    elif name == "gsm8k":
        task = build_gsm8k(data_dir, n_private=N, n_test=n_test, seed=0)
    else:
        raise ValueError(f"task: unknown {name!r}; choose from {(*TASKS, 'gsm8k')}")
    return replace(task, test=list(task.test)[:n_test])  # the first n_test: the same records for every method


class OutcomeCache:
    """Per-record test scores per (task, prompt), as 0/1 text when binary: each prompt scored once."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str] = {}

    def outcomes(self, name: str, task: Any, engine: Any, prompt: str) -> str:
        key = (name, prompt)
        if key not in self.values:
            scores = np.asarray(task.public_scores(engine, prompt, task.test), dtype=float)
            self.values[key] = encode_outcomes(scores >= 0.5)
        return self.values[key]


def run_ours(task: Any, engine: Any, method: str, seed: int) -> tuple[str, dict[str, Any]]:
    import dp_textgrad

    settings: dict[str, Any] = dict(
        generations=3,
        population=6,
        parents=2,
        dataset_size=N,
        seed=seed,
        llm_operators=bool(getattr(engine, "instruction_following", False)),
    )
    if method == "nonprivate":
        settings.update(privacy="off")
    else:
        settings.update(epsilon=EPSILON, delta=DELTA)
        if method in ("ours_auto", *EXTRA_METHODS):
            settings.update(sampling_rate="auto")
        if method == "ours_auto_equal_work":
            paper = PaperSettings()
            settings.update(max_private_evaluations=paper.batch * paper.releases)
    if method in ("ours_auto_formats", "ours_auto_own_formats"):
        from dp_textgrad.tasks.record_format import GENERIC_RECORD_FORMATS
        from dp_textgrad.tasks.support_extract import SUPPORT_EXTRACT_RECORD_FORMATS

        if getattr(task, "kind", "") != "generate":
            raise ValueError(f"{method}: record formats apply to generation tasks only")
        own = SUPPORT_EXTRACT_RECORD_FORMATS if task.name == "support_extract" else ()
        # ours_auto_formats as measured on 2026-12-05: the field-name formats and the four generic ones.
        formats = own if method == "ours_auto_own_formats" else (*own, *GENERIC_RECORD_FORMATS)
        task = replace(task, record_formats=formats)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = dp_textgrad.optimize(
            task,
            engine,
            runs_root=REPO_ROOT / "runs" / "benchmarks" / "dp_es_protocol" / "runs",
            evaluate=False,
            **settings,
        )
    config = outcome.optimizer.config
    notes = {
        "sampling_rate": config.resolved_sampling_rate,
        "noise_multiplier": outcome.optimizer.noise_multiplier,
        "epsilon_spent": None if outcome.result.unsafe else float(outcome.result.epsilon),
        "released_estimate": outcome.result.estimate,
        "planned_private_evaluations": outcome.optimizer.planned_private_evaluations * config.generations,
    }
    return outcome.result.prompt, notes


def run_job(job: Job, task: Any, engine: Any, cache: OutcomeCache) -> dict[str, Any]:
    started = time.perf_counter()
    before = run_records.usage(engine)
    notes: dict[str, Any] = {}
    if job.method == "seed":
        prompt = task.seed_prompt
    elif job.method == "eps0":
        prompt = run_random_parents(task, engine, PaperSettings(), job.seed).prompt
        notes = {"epsilon_spent": 0.0}
    elif job.method == "dpes_published":
        paper = PaperSettings()
        found = run_paper_dpes(task, engine, paper, job.seed)
        prompt = found.prompt
        notes = {
            "epsilon_spent": paper_epsilon_autodp(paper, N, DELTA),
            "released_estimate": found.released_estimate,
            "private_evaluations": found.private_evaluations,
        }
    else:
        prompt, notes = run_ours(task, engine, job.method, job.seed)
    bits = cache.outcomes(job.task, task, engine, prompt)
    used = run_records.usage_delta(before, run_records.usage(engine))
    return {
        "task": job.task,
        "method": job.method,
        "seed": job.seed,
        "released_prompt": prompt,
        "test_correct": bits,
        "test_score": bits.count("1") / len(bits),
        "n_test": len(bits),
        "engine_calls": int(used["calls"]),
        "seconds": time.perf_counter() - started,
        **notes,
    }


def plan_jobs(tasks: list[str], methods: list[str], seeds: int) -> list[Job]:
    jobs = [Job(t, "seed", 0) for t in tasks]
    for seed in range(seeds):  # seed-major: a partial grid covers every method
        jobs += [Job(t, m, seed) for t in tasks for m in methods]
    return jobs


def _compare(mine: list[dict[str, Any]], methods: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Paired bootstrap of ``methods`` (their runs in ``mine``) against DP-ES and against the epsilon-0 control."""
    outcomes = {}
    for method in ("seed", *methods):
        runs = [r for r in mine if r["method"] == method]
        if runs:
            outcomes[method] = np.stack([decode_outcomes(r["test_correct"]) for r in runs])
    table: dict[str, dict[str, Any]] = {}
    for reference in ("dpes_published", "eps0"):
        if reference in outcomes:
            boot = paired_bootstrap(
                outcomes, reference=reference, ceiling="nonprivate", baselines=dict.fromkeys(EXTRA_METHODS, ABLATED)
            )
            for method, stats in boot.items():
                entry = table.setdefault(
                    method,
                    {
                        "score": stats["accuracy"],
                        "score_ci": stats["accuracy_ci"],
                        "runs": int(outcomes[method].shape[0]),
                    },
                )
                if f"vs_{reference}" in stats:
                    entry[f"vs_{reference}"] = stats[f"vs_{reference}"]
                    entry[f"vs_{reference}_ci"] = stats[f"vs_{reference}_ci"]
                if "vs_baseline" in stats:  # the same draws whichever reference: keep the first
                    entry.setdefault(f"vs_{ABLATED}", stats["vs_baseline"])
                    entry.setdefault(f"vs_{ABLATED}_ci", stats["vs_baseline_ci"])
    return table


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == name]
        # Only seeds every core method ran are compared: an unfinished seed (a time limit) would weight
        # the methods' means over different seeds.
        methods = tuple(m for m in METHODS if any(r["method"] == m for r in mine))
        complete = sorted(
            s
            for s in {r["seed"] for r in mine if r["method"] != "seed"}
            if {r["method"] for r in mine if r["seed"] == s} >= set(methods)
        )
        ran = {m: sorted({r["seed"] for r in mine if r["method"] == m} & set(complete)) for m in EXTRA_METHODS}
        everywhere = tuple(m for m in EXTRA_METHODS if complete and ran[m] == complete)
        kept = [
            r for r in mine if r["method"] == "seed" or (r["seed"] in complete and r["method"] in methods + everywhere)
        ]
        table = _compare(kept, methods + everywhere)
        # An extra method (costly, run only when named) may cover fewer of those seeds. It is then
        # compared on its own seeds only, every core method restricted to them too, so no
        # difference mixes seeds of different difficulty; its entry names those seeds.
        for extra in EXTRA_METHODS:
            seeds = ran[extra]
            if not seeds or extra in everywhere:
                continue
            subset = [
                r for r in mine if r["method"] == "seed" or (r["seed"] in seeds and r["method"] in (*methods, extra))
            ]
            table[extra] = {**_compare(subset, (*methods, extra))[extra], "seeds": seeds}
            kept += [r for r in mine if r["method"] == extra and r["seed"] in seeds]
        left_out = [r for r in mine if r not in kept]
        seed_bits = next((r["test_correct"] for r in kept if r["method"] == "seed"), None)
        for method, entry in table.items():
            runs = [r for r in kept if r["method"] == method]
            for field in ("sampling_rate", "noise_multiplier", "epsilon_spent", "planned_private_evaluations"):
                values = [r[field] for r in runs if r.get(field) is not None]
                if values:
                    entry[field] = float(np.mean(values))
            entry["engine_calls_mean"] = float(np.mean([r["engine_calls"] for r in runs]))
        out[name] = {
            "n_test": len(seed_bits) if seed_bits else None,
            "seeds": complete,
            "runs_left_out": [row_key(r) for r in left_out],
            "methods": table,
        }
    return out


def accounting() -> dict[str, float]:
    paper = PaperSettings()
    return {
        "autodp_replace_one_published": paper_epsilon_autodp(paper, N, DELTA),
        "dp_accounting_rdp_replace_one_without_replacement": paper_epsilon_dp_accounting(paper, N, DELTA),
        "ours_add_remove_poisson_approximation": paper_epsilon_add_remove(paper, N, DELTA),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--n-test", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine-url", default=None, help="an OpenAI-compatible endpoint (GSM8K) instead of local")
    parser.add_argument("--model", default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--summarise-only", action="store_true")
    parser.add_argument(
        "--restore-from",
        type=Path,
        default=None,
        help="first copy the runs of a results file (e.g. the committed one) into the work file, so a fresh "
        "checkout extends the grid instead of rerunning it",
    )
    args = parser.parse_args(argv)
    work_file = args.work_dir / "runs.jsonl"
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [m for m in args.methods.split(",") if m and m not in (*METHODS, *EXTRA_METHODS)]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join((*METHODS, *EXTRA_METHODS))}")
    # Restored only after the arguments are valid, so a mistyped method leaves the work file as it was.
    if args.restore_from is not None:
        restored = run_records.restore_runs(args.restore_from, work_file, row_key)
        print(f"{restored} runs restored from {args.restore_from}", flush=True)
    if not args.summarise_only:
        if args.engine_url:
            from dp_textgrad.engines.openai_engine import OpenAIEngine

            engine = OpenAIEngine(args.model or "model", base_url=args.engine_url)
        else:
            from dp_textgrad.engines.llama_cpp import LlamaCppEngine

            engine = LlamaCppEngine(n_threads=args.threads)
        jobs = run_records.pending(
            plan_jobs(tasks, [m for m in args.methods.split(",") if m], args.seeds), work_file, row_key
        )
        print(f"{len(jobs)} runs to do", flush=True)
        built: dict[str, Any] = {}
        cache = OutcomeCache()
        started = time.perf_counter()
        for number, job in enumerate(jobs, 1):
            if args.max_minutes is not None and time.perf_counter() - started > 60 * args.max_minutes:
                print(f"time limit reached; {len(jobs) - number + 1} runs left", flush=True)
                break
            if job.task not in built:
                built[job.task] = build_task(job.task, args.n_test, args.data_dir)
            row = run_job(job, built[job.task], engine, cache)
            run_records.append_run(work_file, row)
            print(
                f"[{number}/{len(jobs)}] {job.key}: test {row['test_score']:.3f} ({row['seconds']:.0f} s)", flush=True
            )
    rows = run_records.read_runs(work_file)
    document = {
        "protocol": {
            "N": N,
            "population": 6,
            "parents": 2,
            "generations": 3,
            "epsilon": EPSILON,
            "delta": DELTA,
            "n_test": args.n_test,
            "paper_batch": PaperSettings().batch,
            "paper_noise_multiplier": PaperSettings().noise_multiplier,
        },
        "accounting_of_the_paper_mechanism": accounting(),
        "tasks": summarise(rows),
        "runs": [run_records.prompt_fingerprint(r) for r in rows],
    }
    command = sys.argv[1:] if argv is None else argv
    run_records.write_results(args.output, document, "benchmarks/dp_es_protocol.py", command)
    for name, values in document["tasks"].items():
        print(name, {m: round(v["score"], 3) for m, v in values["methods"].items()})
    print(markdown_tables(document["tasks"]))
    return 0


LABELS = {
    "seed": "seed prompt",
    "eps0": "epsilon-0 control (random parents)",
    "dpes_published": "DP-ES as published",
    "ours_default": "ours, default q",
    "ours_auto": "ours, `auto`",
    "ours_auto_equal_work": "ours, `auto`, DP-ES's private work (180 evaluations)",
    "ours_auto_formats": "ours, `auto`, with record formats",
    "ours_auto_own_formats": "ours, `auto`, with the task's own record formats",
    "nonprivate": "ours, privacy off",
}


def markdown_tables(tasks: dict[str, Any]) -> str:
    """The docs' tables (docs/benchmarks.md) of a summary: one per task."""

    def diff(entry: dict[str, Any], key: str) -> str:
        if key not in entry:
            return ""
        low, high = entry[f"{key}_ci"]
        return f"{entry[key]:+.3f} [{low:+.3f}, {high:+.3f}]"

    out = []
    for name, values in tasks.items():
        out += [
            f"##### {name} ({values['n_test']} test records, seeds {', '.join(map(str, values['seeds']))})",
            "",
            "| method | runs | test score [95% CI] | vs DP-ES published | vs epsilon-0 | q | epsilon | engine calls |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def label(method: str, entry: dict[str, Any]) -> str:
            if "seeds" not in entry:
                return LABELS.get(method, method)
            seeds = ("seeds " if len(entry["seeds"]) > 1 else "seed ") + ", ".join(map(str, entry["seeds"]))
            return f"{LABELS.get(method, method)} ({seeds} only, compared on them)"

        for method, entry in values["methods"].items():
            low, high = entry["score_ci"]
            q = f"{entry['sampling_rate']:.2f}" if "sampling_rate" in entry else ""
            eps = f"{entry['epsilon_spent']:.3f}" if "epsilon_spent" in entry else ""
            out.append(
                f"| {label(method, entry)} | {entry['runs']} | {entry['score']:.3f} [{low:.3f}, {high:.3f}] | "
                f"{diff(entry, 'vs_dpes_published')} | {diff(entry, 'vs_eps0')} | {q} | {eps} | "
                f"{entry['engine_calls_mean']:.0f} |"
            )
        ablations = [
            f"{label(method, entry)} {diff(entry, f'vs_{ABLATED}')}"
            for method, entry in values["methods"].items()
            if f"vs_{ABLATED}" in entry
        ]
        if ablations:
            out += ["", f"Paired against {LABELS[ABLATED]}: " + "; ".join(ablations) + "."]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
