"""Demonstrations for a generation task when the only answers are private (issue 48): DP answers
voted token by token by teachers, alone and as the demonstrations of DP-ES, against public labelled
demonstrations, on the local engine.

Every row sees the same task, engine, seed prompt and search schedule. No row but ``public_dp_es``
sees a public labelled example. Rows, per seed and epsilon:

* ``seed``: the seed prompt, unoptimized (epsilon-free: one per seed);
* ``dp_es``: DP-ES alone at epsilon E, no demonstrations to draw on;
* ``dp_demos``: the seed prompt and the DP answers of ``--queries`` public inputs (the whole epsilon
  E on the answers), no search;
* ``dp_demos_dp_es``: the product path, ``dp.labelling`` on the generation task: the answers at
  ``--share`` of E, then DP-ES on the rest with the answers as its demonstrations;
* ``public_dp_es``: DP-ES at epsilon E with the task's public labelled examples (the reference);
* ``dp_demos_dp_es_span``: as ``dp_demos_dp_es`` with ``answer_filter: span`` (extraction: answers
  kept only when they ended and appear verbatim in their input; a public rule, no privacy cost);
* ``teachers_nonprivate``: the seed prompt and the teachers' answers without noise and without a
  charge (NOT private: the ceiling of the method on this model; epsilon-free, one per seed);
* ``synthetic_demos``: the seed prompt and ``--queries`` demonstrations generated whole, input and
  answer, by the token vote (no public input used; the whole epsilon E), no search;
* ``span_vote_demos``, ``span_vote_dp_es``: as ``dp_demos`` and ``dp_demos_dp_es`` with
  ``vote: span`` (extraction: each teacher writes its whole answer, and one GNMax per answer over
  the input's spans releases it; one charged step per answer instead of one per token);
* ``span_vote_nonprivate``: the seed prompt and the span vote's answers without noise and without a
  charge (NOT private: the span vote's ceiling on this model; epsilon-free, one per seed).

Retained gain (per seed, then averaged): (row - seed) / (public_dp_es - seed) at the same epsilon.
Costs per DP answer (teacher calls, tokens, engine seconds) come from the engine's usage while the
answers are voted. Paired bootstrap intervals (test records and seeds resampled together) of
``dp_demos_dp_es`` against ``public_dp_es`` and against ``dp_es``.

    python benchmarks/dp_answers_utility.py --task support_extract --seeds 3 --epsilons 1 4
    python benchmarks/dp_answers_utility.py --task snips --seeds 2 --epsilons 4 --n-test 200
    python benchmarks/dp_answers_utility.py --table benchmarks/results/dp_answers_support_extract.json
    python benchmarks/dp_answers_utility.py --cost 10 30 60 --queries 2 --epsilons 1 4   # idle machine
    python benchmarks/dp_answers_utility.py --cost 10 30 60 --queries 2 --epsilons 1 4 --vote span
    python benchmarks/dp_answers_utility.py --task snips --cost 10 30 60 --queries 2 --epsilons 4 --candidates 64
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import run_records  # noqa: E402 - after the path insert

DEFAULT_WORK_DIR = REPO_ROOT / "runs" / "benchmarks" / "dp_answers_utility"
ROWS = ("seed", "teachers_nonprivate", "dp_es", "dp_demos", "dp_demos_dp_es", "public_dp_es", "dp_demos_dp_es_span",
        "synthetic_demos", "span_vote_demos", "span_vote_dp_es", "span_vote_nonprivate")
# Rows the default grid leaves out (asked for by --rows).
EXTRA_ROWS = ("synthetic_demos", "dp_demos_dp_es_span", "span_vote_demos", "span_vote_dp_es", "span_vote_nonprivate")
EPSILON_FREE = ("seed", "teachers_nonprivate", "span_vote_nonprivate")


@dataclass(frozen=True)
class Setup:
    task: str = "support_extract"
    n_private: int = 600
    n_test: int = 100
    queries: int = 6
    share: float = 0.5
    generations: int = 2
    population: int = 4
    parents: int = 2
    records: int = 42  # expected private records per candidate and generation
    max_prompt_chars: int = 1500
    teachers: int | None = None  # None: the default, N / 20 in [10, 100]
    candidates: int = 16  # the token vote's public model's top next tokens per step


def build_task(setup: Setup, seed: int, data_dir: str | None) -> Any:
    """The task with its public labelled examples (the reference row's) and ``queries`` public inputs."""
    from dp_textgrad.tasks.registry import get_task

    if setup.task == "support_extract":
        return get_task("support_extract", seed=seed, n_private=setup.n_private, n_test=setup.n_test,
                        public_inputs=setup.queries)
    if setup.task == "snips":
        return get_task("snips", data_dir=data_dir, seed=seed, n_private=setup.n_private, n_test=setup.n_test,
                        public_inputs=setup.queries, max_new_tokens=48)
    raise ValueError(f"--task: use support_extract or snips, got {setup.task!r}")


class NullLedger:
    """For the NOT private ceiling row only: nothing is charged."""

    def spend(self, *args: Any, **kwargs: Any) -> None:
        return None


def answers(
    task: Any, engine: Any, setup: Setup, epsilon: float | None, seed: int, synthetic: bool = False,
    vote: str = "token",
) -> tuple[Any, dict[str, Any]]:
    """DP answers at ``epsilon`` (the whole of it), or without noise (``epsilon=None``: the ceiling);
    ``synthetic``: demonstrations generated whole (input and answer), no public input used."""
    from dp_textgrad.dp_es.config import DEFAULT_ANSWER_DEMOS, LabellingConfig
    from dp_textgrad.dp_es.dp_answers import dp_answers
    from dp_textgrad.privacy.accounting import PrivacyLedger
    from dp_textgrad.privacy.noise import NoiseSource
    from dp_textgrad.privacy.token_voting import AnsweringPlan, TokenGNMax, calibrate_token_gnmax

    tokens = {"candidates": setup.candidates} if vote == "token" else {}
    base = LabellingConfig(synthetic_inputs=setup.queries, teachers=setup.teachers, **tokens) if synthetic else (
        LabellingConfig(teachers=setup.teachers, vote=vote, **tokens)
    )
    settings = base.resolved(0 if synthetic else len(task.public_inputs), setup.n_private,
                             generation_tokens=task.max_new_tokens)
    steps = settings.answer_steps
    delta = min(1e-5, 1 / (10 * setup.n_private))
    if epsilon is None:
        sigma, ledger, noise = 1e-6, NullLedger(), NoiseSource(insecure_seed=seed)
    else:
        sigma = calibrate_token_gnmax(epsilon, delta, setup.queries, steps, settings.sampling_rate)
        ledger, noise = PrivacyLedger(epsilon, delta), NoiseSource()
    plan = AnsweringPlan(TokenGNMax(sigma, steps, settings.sampling_rate), setup.queries, settings.teachers)
    before, started = run_records.usage(engine), time.perf_counter()
    labelled = dp_answers(task, engine, [] if synthetic else task.public_inputs[: setup.queries], plan, ledger,
                          noise, secrets.token_bytes(32), max_demos=settings.max_demos or DEFAULT_ANSWER_DEMOS,
                          candidates=settings.candidates,
                          max_input_tokens=settings.max_input_tokens if synthetic else None,
                          vote=vote, max_answer_tokens=settings.max_answer_tokens)
    used = run_records.usage_delta(before, run_records.usage(engine))
    cost = {"answer_seconds": time.perf_counter() - started, "answer_engine_calls": int(used["calls"]),
            "answer_prompt_tokens": int(used["prompt_tokens"]), "sigma": sigma, "teachers": settings.teachers,
            "sampling_rate": settings.sampling_rate, "max_answer_tokens": settings.max_answer_tokens,
            "answered": labelled.answered,
            "epsilon_spent": None if epsilon is None else float(ledger.epsilon())}
    return labelled, cost


def kshot(task: Any, examples: Any, max_chars: int) -> str:
    """The seed prompt and the answered inputs as demonstrations (as many as fit ``max_chars``)."""
    parts = [task.seed_prompt.strip()]
    for example in examples:
        demo = task.render_demo(example)
        if len("\n\n".join([*parts, demo])) > max_chars:
            break
        parts.append(demo)
    return "\n\n".join(parts)


def search(task: Any, engine: Any, setup: Setup, epsilon: float, seed: int, **extra: Any) -> tuple[str, dict]:
    import dp_textgrad

    outcome = dp_textgrad.optimize(
        task, engine, epsilon=epsilon, dataset_size=setup.n_private, generations=setup.generations,
        population=setup.population, parents=setup.parents, sampling_rate=min(1.0, setup.records / setup.n_private),
        max_prompt_chars=setup.max_prompt_chars, seed=seed, evaluate=False, runs_root=DEFAULT_WORK_DIR / "runs",
        **extra,
    )
    labels = outcome.result.labelling if hasattr(outcome.result, "labelling") else None
    return outcome.result.prompt, {"epsilon_spent": float(outcome.result.epsilon),
                                   "answered": None if not labels else labels.get("answered")}


def run_row(row: str, seed: int, epsilon: float | None, task: Any, engine: Any, setup: Setup) -> dict[str, Any]:
    bare = dataclasses.replace(task, public_examples=[])
    started, before = time.perf_counter(), run_records.usage(engine)
    extra: dict[str, Any] = {}
    if row == "seed":
        prompt = task.seed_prompt
    elif row in ("teachers_nonprivate", "span_vote_nonprivate"):
        labelled, extra = answers(bare, engine, setup, None, seed, vote="span" if row.startswith("span") else "token")
        prompt = kshot(task, labelled.examples, setup.max_prompt_chars)
    elif row in ("dp_demos", "span_vote_demos"):
        labelled, extra = answers(bare, engine, setup, epsilon, seed, vote="span" if row.startswith("span") else "token")
        prompt = kshot(task, labelled.examples, setup.max_prompt_chars)
    elif row == "synthetic_demos":
        labelled, extra = answers(bare, engine, setup, epsilon, seed, synthetic=True)
        extra["synthetic_inputs"] = labelled.metadata.get("synthetic_inputs")
        prompt = kshot(task, labelled.examples, setup.max_prompt_chars)
    elif row == "dp_es":
        prompt, extra = search(bare, engine, setup, epsilon, seed)
    elif row == "public_dp_es":
        prompt, extra = search(dataclasses.replace(task, public_inputs=[]), engine, setup, epsilon, seed)
    elif row in ("dp_demos_dp_es", "dp_demos_dp_es_span", "span_vote_dp_es"):
        prompt, extra = search(bare, engine, setup, epsilon, seed,
                               labelling={"queries": setup.queries, "epsilon_share": setup.share,
                                          **({"teachers": setup.teachers} if setup.teachers else {}),
                                          **({"candidates": setup.candidates} if setup.candidates != 16
                                             and not row.startswith("span_vote") else {}),
                                          **({"answer_filter": "span"} if row.endswith("_span") else {}),
                                          **({"vote": "span"} if row.startswith("span_vote") else {})})
    else:
        raise ValueError(f"row: unknown {row!r}")
    scores = [round(float(v), 4) for v in task.public_scores(engine, prompt, task.test)]
    used = run_records.usage_delta(before, run_records.usage(engine))
    return {"task": setup.task, "row": row, "seed": seed, "epsilon": epsilon, "test_score": float(np.mean(scores)),
            "n_test": len(scores), "test_scores": scores, "released_prompt": prompt,
            "wall_seconds": time.perf_counter() - started, "engine_seconds": float(used["seconds"]), **extra}


def key(row: dict[str, Any]) -> tuple:
    return (row["task"], row["row"], row["seed"], row["epsilon"])


def paired_difference(pairs: list[tuple[list[float], list[float]]], replicates: int = 2000) -> dict[str, float]:
    """Mean of a - b over seeds and test records, with a 95% bootstrap interval that resamples the
    seeds and, within each, its test records (the same draw for a and b: paired)."""
    rng = np.random.default_rng(0)
    diffs = [np.asarray(a, dtype=float) - np.asarray(b, dtype=float) for a, b in pairs]
    draws = np.empty(replicates)
    for i in range(replicates):
        chosen = rng.integers(len(diffs), size=len(diffs))
        draws[i] = np.mean([diffs[j][rng.integers(diffs[j].size, size=diffs[j].size)].mean() for j in chosen])
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"mean": float(np.mean([d.mean() for d in diffs])), "low": float(low), "high": float(high)}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {key(r): r for r in rows}
    epsilons = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
    seeds = sorted({r["seed"] for r in rows})
    out: dict[str, Any] = {"epsilons": epsilons, "seeds": seeds, "rows": {}, "retained": {}, "paired": {}}
    task = rows[0]["task"] if rows else None
    for name in ROWS:
        for eps in [None] if name in EPSILON_FREE else epsilons:
            values = [by[(task, name, s, eps)]["test_score"] for s in seeds if (task, name, s, eps) in by]
            if values:
                label = name if eps is None else f"{name} eps{eps:g}"
                out["rows"][label] = {"mean": float(np.mean(values)), "per_seed": values,
                                      "ci95": run_records.t_interval(values)}
    for eps in epsilons:
        for name in ("dp_es", "dp_demos", "dp_demos_dp_es", "dp_demos_dp_es_span", "teachers_nonprivate",
                     "synthetic_demos", "span_vote_demos", "span_vote_dp_es", "span_vote_nonprivate"):
            gains = []
            for s in seeds:
                base, ref = by.get((task, "seed", s, None)), by.get((task, "public_dp_es", s, eps))
                mine = by.get((task, name, s, None if name in EPSILON_FREE else eps))
                if base and ref and mine and ref["test_score"] > base["test_score"]:
                    gains.append((mine["test_score"] - base["test_score"]) / (ref["test_score"] - base["test_score"]))
            if gains:
                out["retained"][f"{name} eps{eps:g}"] = {"mean": float(np.mean(gains)), "per_seed": gains}
        for mine, other in (("dp_demos_dp_es", "public_dp_es"), ("dp_demos_dp_es", "dp_es"),
                            ("dp_demos_dp_es_span", "public_dp_es"), ("dp_demos_dp_es_span", "dp_es"),
                            ("dp_demos", "dp_es"), ("span_vote_dp_es", "public_dp_es"), ("span_vote_dp_es", "dp_es"),
                            ("span_vote_dp_es", "dp_demos_dp_es_span"), ("span_vote_demos", "dp_demos"),
                            ("dp_es", "public_dp_es"), ("span_vote_demos", "dp_es"),
                            ("span_vote_dp_es", "span_vote_demos")):
            pairs = [(by[(task, mine, s, eps)]["test_scores"], by[(task, other, s, eps)]["test_scores"])
                     for s in seeds if (task, mine, s, eps) in by and (task, other, s, eps) in by]
            if pairs:
                out["paired"][f"{mine} - {other} eps{eps:g}"] = paired_difference(pairs)
    costs = [r for r in rows if r["row"] in ("dp_demos", "teachers_nonprivate") and "answer_seconds" in r]
    if costs:
        out["cost_per_answer"] = {
            "seconds": float(np.mean([r["answer_seconds"] / max(1, r.get("answered") or 1) for r in costs])),
            "engine_calls": float(np.mean([r["answer_engine_calls"] / max(1, r.get("answered") or 1) for r in costs])),
            "prompt_tokens": float(np.mean([r["answer_prompt_tokens"] / max(1, r.get("answered") or 1) for r in costs])),
        }
    return out


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = ["| row | mean test score | per seed | retained gain (mean of per-seed ratios) |", "|---|---|---|---|"]
    for label, value in s["rows"].items():
        retained = s["retained"].get(label)
        lines.append(f"| {label} | {value['mean']:.3f} | {', '.join(f'{v:.3f}' for v in value['per_seed'])} | "
                     + (f"{retained['mean']:.2f}" if retained else "-") + " |")
    for label, diff in s["paired"].items():
        lines.append(f"\n{label}: {diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}] (paired bootstrap)")
    return "\n".join(lines)


def cost_sweep(task: Any, engine: Any, setup: Setup, teachers: list[int], epsilons: list[float],
               vote: str = "token") -> list[dict]:
    """Teacher calls, prompt tokens and seconds per DP answer, by number of teachers and epsilon
    (run it on an idle machine: the seconds are wall time)."""
    bare = dataclasses.replace(task, public_examples=[])
    rows = []
    for count in teachers:
        for eps in epsilons:
            labelled, cost = answers(bare, engine, dataclasses.replace(setup, teachers=count), eps, 0, vote=vote)
            per = max(1, setup.queries)
            rows.append({"vote": vote, "teachers": count, "epsilon": eps, "sigma": cost["sigma"],
                         "sampling_rate": cost["sampling_rate"], "answered": labelled.answered,
                         "seconds_per_answer": cost["answer_seconds"] / per,
                         "engine_calls_per_answer": cost["answer_engine_calls"] / per,
                         "prompt_tokens_per_answer": cost["answer_prompt_tokens"] / per})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="support_extract", choices=("support_extract", "snips"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--rows", nargs="+", default=[r for r in ROWS if r not in EXTRA_ROWS], choices=ROWS)
    parser.add_argument("--n-private", type=int, default=None)
    parser.add_argument("--n-test", type=int, default=None)
    parser.add_argument("--queries", type=int, default=6)
    parser.add_argument("--teachers", type=int, default=None, help="default N / 20 in [10, 100]")
    parser.add_argument("--candidates", type=int, default=16, help="the token vote's candidates per step")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None, help="print the tables of a results file and stop")
    parser.add_argument("--restore-from", type=Path, default=None,
                        help="first copy the runs of a results file (e.g. the committed one) into the work file, "
                             "so a fresh checkout extends the grid instead of rerunning it")
    parser.add_argument("--cost", type=int, nargs="+", default=None, metavar="TEACHERS",
                        help="measure the cost per answer for these numbers of teachers (seed 0) and stop")
    parser.add_argument("--vote", choices=("token", "span"), default="token", help="--cost: the vote measured")
    parser.add_argument("--saved-prefix-mib", type=int, default=None,
                        help="the engine's memory for saved prefix states (default: the engine's 256 MiB; the "
                             "token vote holds every teacher's prefix over it in any case)")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return 0
    defaults = {"support_extract": (600, 100), "snips": (2000, 200)}[args.task]
    setup = Setup(task=args.task, n_private=args.n_private or defaults[0], n_test=args.n_test or defaults[1],
                  queries=args.queries, teachers=args.teachers, candidates=args.candidates)
    engine_options = {} if args.saved_prefix_mib is None else {"saved_prefix_bytes": args.saved_prefix_mib * 2**20}
    if args.cost is not None:
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine

        engine = LlamaCppEngine(**engine_options)
        rows = cost_sweep(build_task(setup, 0, args.data_dir), engine, setup, args.cost, args.epsilons, args.vote)
        suffix = "" if args.vote == "token" else "_span"
        output = args.output or REPO_ROOT / "benchmarks" / "results" / f"dp_answers_cost_{args.task}{suffix}.json"
        output.write_text(json.dumps({"command": run_records.command_line("benchmarks/dp_answers_utility.py", argv),
                                      "date": dt.date.today().isoformat(), "setup": dataclasses.asdict(setup),
                                      "machine": "2 CPU cores, local llama.cpp engine (Gemma 3 270M Q4_K_M)",
                                      "rows": rows}, indent=1) + "\n", encoding="utf-8")
        return 0
    work_file = args.work_dir / f"{args.task}.jsonl"
    work_file.parent.mkdir(parents=True, exist_ok=True)
    if args.restore_from is not None:
        print(f"{run_records.restore_runs(args.restore_from, work_file, key)} runs restored from {args.restore_from}",
              flush=True)
    done = {key(r) for r in run_records.read_runs(work_file)}
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(**engine_options)
    for seed in range(args.seeds):
        task = build_task(setup, seed, args.data_dir)
        for row in args.rows:
            for eps in [None] if row in EPSILON_FREE else args.epsilons:
                if (args.task, row, seed, eps) in done:
                    continue
                record = run_row(row, seed, eps, task, engine, setup)
                record["command"] = run_records.command_line("benchmarks/dp_answers_utility.py", argv)
                run_records.append_run(work_file, record)
                print(f"{args.task} seed {seed} {row} eps {eps}: {record['test_score']:.3f} "
                      f"({record['wall_seconds']:.0f} s)", flush=True)
    rows = [r for r in run_records.read_runs(work_file) if r["task"] == args.task]
    # Rows written before commands were recorded per row came from the first grid's command.
    first = "python benchmarks/dp_answers_utility.py --task support_extract --seeds 3 --epsilons 1 4"
    result = {
        "commands": sorted({str(r.get("command", first)) for r in rows}),
        "date": dt.date.today().isoformat(),
        "setup": dataclasses.asdict(setup),
        "machine": "2 CPU cores, local llama.cpp engine (Gemma 3 270M Q4_K_M)",
        "summary": summarise(rows),
        "runs": [run_records.prompt_fingerprint(r) for r in rows],
    }
    output = args.output or REPO_ROOT / "benchmarks" / "results" / f"dp_answers_{args.task}.json"
    output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
