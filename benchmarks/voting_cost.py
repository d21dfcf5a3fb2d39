"""Cost and label accuracy of DP labelling by a teacher vote (dp_textgrad.dp_es.labelling): SST-2 or BANKING77.

The real-model part: ``--records`` private SST-2 records (``get_task("sst2")``, drawn by ``--seed``)
split into T teachers by the keyed hash, for each T in ``--teachers``; every teacher (the seed
prompt plus up to ``--max-demos`` of its records as demonstrations, spread over the labels)
votes on Q = ``--queries`` public unlabelled inputs with ONE ``score_choices_batch`` call (its
prefix decoded once). The inputs come from ``train.tsv`` outside the private part (texts of at
least ``--min-words`` words, drawn by ``--seed``); their labels are hidden from the teachers and
used only to measure accuracy. ``--task banking10``: the private records are all of BANKING77's
``train.tsv`` records of the 10 intents (``--records`` ignored) and the public inputs come from
its ``dev.tsv`` on those intents (no text in common with train or test). The teachers run
through ``teacher_votes`` and the real release path (``label_by_vote``: the charge, the
histogram, GNMax at epsilon 1 with seeded noise).

Measured per T: teacher calls per labelled example, tokens decoded, prefix tokens, wall time,
each teacher's accuracy, the vote margins, the plain majority's accuracy. Then, simulated on the
MEASURED histograms (``--draws`` noise draws each): the DP label accuracy at the GNMax sigma that
``plan_labelling`` gives for labelling shares epsilon in ``--epsilons`` (delta 1e-5, Q planned
inputs). And a table for larger T (200 to 1000 teachers) whose votes on each input follow the
measured shares over the labels (pooled over T), teachers independent given the input: how the
noise (epsilon, the planned Q), the number of teachers and N (at least T x max_demos records,
so that every teacher keeps its demonstrations) trade off.

    python benchmarks/voting_cost.py                                  # 2,000 records, T in 25/50/100
    python benchmarks/voting_cost.py --records 200 --teachers 4 --queries 4 --output smoke.json
    python benchmarks/voting_cost.py --task banking10 --teachers 40,80 --max-demos 10
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # measure this checkout when run as a script
RESULTS = REPO_ROOT / "benchmarks" / "results"
TASKS = ("sst2", "banking10")
KEY = b"voting-cost-benchmark-key-000001"  # fixed: a measurement, not a run (a run draws 32 random bytes)
DELTA = 1e-5


# -- simulations on vote histograms (no model) ---------------------------------------------------


def dp_accuracy(histograms: np.ndarray, gold: np.ndarray, sigma: float, draws: int, seed: int = 0) -> float:
    """Mean over inputs of P(argmax(n + N(0, sigma^2)) == gold), estimated with ``draws`` draws each."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(histograms, dtype=float)
    hits = 0.0
    for row, label in zip(counts, gold):
        noisy = row[None, :] + rng.normal(0.0, sigma, size=(draws, row.size))
        hits += float(np.mean(np.argmax(noisy, axis=1) == label))
    return hits / len(counts)


def simulate_teachers(
    vote_shares: np.ndarray, gold: np.ndarray, teachers: int, sigma: float, draws: int, seed: int = 0
) -> dict[str, float]:
    """The vote of ``teachers`` independent teachers whose votes on input i follow the measured
    shares ``vote_shares[i]`` (one row per input, one column per label; wrong votes go where the
    measured teachers put them, not spread evenly, which matters with many labels): the DP label
    accuracy (GNMax, ``sigma``) and the plain majority's (ties split), averaged over the inputs."""
    rng = np.random.default_rng(seed)
    shares = np.asarray(vote_shares, dtype=float)
    dp_hits, majority_hits = 0.0, 0.0
    for row, label in zip(shares, gold):
        counts = rng.multinomial(teachers, row / row.sum(), size=draws).astype(float)
        noisy = counts + rng.normal(0.0, sigma, size=counts.shape)
        dp_hits += float(np.mean(np.argmax(noisy, axis=1) == label))
        best = counts.max(axis=1)
        majority_hits += float(np.mean((counts[:, label] == best) / (counts == best[:, None]).sum(axis=1)))
    n = len(shares)
    return {"dp_accuracy": dp_hits / n, "majority_accuracy": majority_hits / n}


def sigma_for(epsilon: float, queries: int, teachers: int) -> float:
    from dp_textgrad.privacy.voting import plan_labelling

    return float(plan_labelling(epsilon, DELTA, queries=queries, teachers=teachers, num_labels=2).mechanism.sigma)


# -- the real-model part ------------------------------------------------------------------------


def labelled_pool(data_dir: Path, task_name: str, private_texts: set[str], min_words: int) -> list[tuple[str, str]]:
    """Every public (text, label) candidate, in file order: SST-2's ``train.tsv`` or (banking10)
    BANKING77's ``dev.tsv`` on the 10 intents, without the private texts, duplicates and texts
    under ``min_words`` words. The labels are for measuring accuracy only (shared with
    ``labelling_utility.py``)."""
    from dp_textgrad.tasks.loaders import load_classification_file
    from dp_textgrad.tasks.registry import BANKING77_INTENTS, SST2_LABEL_NAMES

    if task_name == "banking10":
        rows = load_classification_file(
            data_dir / "banking77" / "dev.tsv",
            labels=list(BANKING77_INTENTS),
            drop_other_labels=True,
            warn_imbalance=False,
        )
    else:
        rows = load_classification_file(
            data_dir / "sst2" / "train.tsv", label_names=SST2_LABEL_NAMES, warn_imbalance=False
        )
    seen: set[str] = set()
    candidates = []
    for row in rows:
        if row.text in private_texts or row.text in seen or len(row.text.split()) < min_words:
            continue
        seen.add(row.text)
        candidates.append((row.text, row.label))
    return candidates


def public_pool(
    data_dir: Path, private_texts: set[str], queries: int, min_words: int, seed: int, task_name: str = "sst2"
) -> list[tuple[str, str]]:
    """Q (text, label) of :func:`labelled_pool`, drawn by seed."""
    candidates = labelled_pool(data_dir, task_name, private_texts, min_words)
    rng = np.random.default_rng(seed + 1000)
    picks = rng.choice(len(candidates), size=queries, replace=False)
    return [candidates[i] for i in sorted(picks)]


def measure(
    engine: Any, task: Any, inputs: list[str], gold: np.ndarray, teachers: int, max_demos: int, prompt: str
) -> dict[str, Any]:
    """Every teacher's vote through the real path (label_by_vote with teacher_votes), timed."""
    from dp_textgrad.dp_es.labelling import prefix_token_cap, teacher_prompt, teacher_votes
    from dp_textgrad.privacy.accounting import PrivacyLedger
    from dp_textgrad.privacy.noise import NoiseSource
    from dp_textgrad.privacy.voting import label_by_vote, partition_teachers, plan_labelling, vote_histograms

    queries = len(inputs)
    cap = prefix_token_cap(engine, task, inputs, prompt)
    partition = partition_teachers(task.private_train, KEY, teachers)
    vote = teacher_votes(engine, task, partition, inputs, prompt, max_demos, key=KEY, max_prefix_tokens=cap)
    rows: list[list[int | None]] = []
    seconds: list[float] = []
    prefix_tokens: list[int] = []
    demos_used: list[int] = []
    decoded_before = engine.kv_stats.tokens_decoded
    calls_before = engine.usage.calls

    def timed(group):
        text = teacher_prompt(
            task, group, prompt, max_demos, key=KEY, count_tokens=engine.count_tokens, max_prefix_tokens=cap
        )
        prefix_tokens.append(engine.count_tokens(task.render_prefix(text)) if text is not None else 0)
        demos_used.append(0 if text is None else text.count("\nSentiment:"))
        start = time.perf_counter()
        votes = vote(group)
        seconds.append(time.perf_counter() - start)
        rows.append(votes)
        return votes

    plan = plan_labelling(1.0, DELTA, queries=queries, teachers=teachers, num_labels=len(task.labels))
    ledger = PrivacyLedger(1.0 + 1e-9, DELTA)
    start = time.perf_counter()
    released = label_by_vote(ledger, plan.mechanism, partition, timed, queries, NoiseSource(insecure_seed=teachers))
    wall = time.perf_counter() - start
    calls = engine.usage.calls - calls_before
    decoded = engine.kv_stats.tokens_decoded - decoded_before
    histograms = vote_histograms(rows, len(task.labels), queries)
    votes = np.array([[-1 if v is None else v for v in row] for row in rows])
    asked = len(rows)
    per_teacher = [float(np.mean(row == gold)) for row in votes if np.any(row >= 0)]
    top2 = np.sort(histograms, axis=1)[:, ::-1]
    margins = (top2[:, 0] - top2[:, 1]).astype(int)
    record_tokens = [engine.count_tokens(task.render_record(x)) for x in inputs]
    return {
        "teachers": teachers,
        "teachers_asked": asked,
        "teachers_abstaining": int(sum(1 for row in votes if np.all(row < 0))) + (teachers - asked),
        "engine_calls": int(calls),
        "teacher_calls_per_labelled_example": calls / queries,
        "wall_seconds": wall,
        "seconds_per_teacher_mean": float(np.mean(seconds)),
        "seconds_per_labelled_example": wall / queries,
        "tokens_decoded": int(decoded),
        "tokens_decoded_per_labelled_example": decoded / queries,
        "tokens_if_prefix_decoded_per_input": int(sum(prefix_tokens) * queries + asked * sum(record_tokens)),
        "prefix_token_cap": cap,
        "prefix_tokens": {
            "mean": float(np.mean(prefix_tokens)),
            "min": int(min(prefix_tokens)),
            "max": int(max(prefix_tokens)),
        },
        "demos_per_teacher": {"mean": float(np.mean(demos_used)), "min": int(min(demos_used))},
        "record_tokens_mean": float(np.mean(record_tokens)),
        "per_teacher_accuracy": {
            "mean": float(np.mean(per_teacher)),
            "std": float(np.std(per_teacher)),
            "min": float(np.min(per_teacher)),
            "max": float(np.max(per_teacher)),
        },
        "per_input_share_of_teachers_right": [
            float(histograms[i, gold[i]] / max(1.0, histograms[i].sum())) for i in range(queries)
        ],
        "margins": margins.tolist(),
        "margin_over_teachers_quantiles": {
            q: float(np.quantile(margins / teachers, float(q))) for q in ("0.1", "0.25", "0.5", "0.75", "0.9")
        },
        "majority_accuracy": float(np.mean(np.argmax(histograms, axis=1) == gold)),
        "histograms": histograms.astype(int).tolist(),
        "released_at_epsilon_1": {
            "sigma": plan.mechanism.sigma,
            "accuracy": float(np.mean(np.array(released) == gold)),
            "ledger_epsilon": ledger.epsilon(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    from dp_textgrad._io import atomic_write_text
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=TASKS, default="sst2", help="sst2 (default) or banking10")
    parser.add_argument(
        "--records", type=int, default=2000, help="private SST-2 records (default 2000; banking10 uses all)"
    )
    parser.add_argument("--teachers", default="25,50,100", help="teacher counts, comma-separated")
    parser.add_argument("--max-demos", type=int, default=6, help="demonstrations per teacher (default 6)")
    parser.add_argument("--queries", type=int, default=16, help="public unlabelled inputs (default 16)")
    parser.add_argument("--min-words", type=int, default=6, help="shortest public input, in words (default 6)")
    parser.add_argument("--epsilons", default="0.25,0.5,1,2", help="labelling shares of epsilon (delta 1e-5)")
    parser.add_argument(
        "--plan-queries",
        default="16,100,1000",
        help="planned labelled inputs Q for the simulated table (sigma grows with Q)",
    )
    parser.add_argument("--sim-teachers", default="200,500,1000", help="teacher counts of the simulated table")
    parser.add_argument("--draws", type=int, default=20000, help="noise draws per input (default 20000)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data-dir", default=None, help="folder holding sst2/ (default $DP_TEXTGRAD_DATA or ../shared/data)"
    )
    parser.add_argument(
        "--output", default=None, help="the JSON results (default benchmarks/results/voting_cost_TASK.json)"
    )
    args = parser.parse_args(argv)
    teacher_counts = [int(t) for t in args.teachers.split(",")]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    plan_queries = [int(q) for q in args.plan_queries.split(",")]
    sim_teachers = [int(t) for t in args.sim_teachers.split(",")]

    from dp_textgrad.tasks.loaders import resolve_data_dir

    try:
        data_dir = resolve_data_dir(args.data_dir)
    except FileNotFoundError as exc:
        print(f"SKIPPED: {exc}")
        return 0
    needed = data_dir / ("banking77/dev.tsv" if args.task == "banking10" else "sst2/train.tsv")
    if not needed.is_file():
        print(f"SKIPPED: {needed.relative_to(data_dir)} not found under {data_dir}; set DP_TEXTGRAD_DATA")
        return 0
    try:
        import llama_cpp

        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    except ImportError as exc:
        print(f"SKIPPED: the local engine is unavailable ({exc})")
        return 0
    from dp_textgrad.tasks.registry import build_banking77, get_task

    if args.task == "banking10":
        task = build_banking77(data_dir, n_private=None, seed=args.seed)
    else:
        task = get_task("sst2", data_dir=data_dir, n_private=args.records, seed=args.seed)
    private_texts = {rec.unwrap().text for rec in task.private_train}  # a measurement: kept apart from the pool
    pool = public_pool(data_dir, private_texts, args.queries, args.min_words, args.seed, args.task)
    inputs = [text for text, _ in pool]
    gold = np.array([task.labels.index(label) for _, label in pool])
    prompt = task.seed_prompt
    engine = LlamaCppEngine(n_threads=args.threads)
    engine.score_choices_batch("Warm-up.", [task.render_record(inputs[0])], [task.verbalizers[task.labels[0]]])
    zero_shot = engine.score_choices_batch(
        task.render_prefix(prompt),
        [task.render_record(x) for x in inputs],
        [task.verbalizers[label] for label in task.labels],
    )
    zero_shot_accuracy = float(np.mean(np.argmax(zero_shot, axis=1) == gold))

    started = time.perf_counter()
    measured = []
    for teachers in teacher_counts:
        row = measure(engine, task, inputs, gold, teachers, args.max_demos, prompt)
        row["dp_accuracy"] = []
        for epsilon in epsilons:
            sigma = sigma_for(epsilon, args.queries, teachers)
            row["dp_accuracy"].append(
                {
                    "epsilon": epsilon,
                    "planned_queries": args.queries,
                    "sigma": sigma,
                    "accuracy": dp_accuracy(np.array(row["histograms"]), gold, sigma, args.draws, args.seed),
                }
            )
        measured.append(row)
        print(
            f"T={teachers}: {row['wall_seconds']:.1f} s, per-teacher acc {row['per_teacher_accuracy']['mean']:.3f}, "
            f"majority {row['majority_accuracy']:.3f}",
            flush=True,
        )
    real_seconds = time.perf_counter() - started

    # Each input's vote shares over the labels, pooled over the measured teacher counts.
    pooled = sum(np.array(row["histograms"], dtype=float) for row in measured)
    vote_shares = pooled / np.maximum(pooled.sum(axis=1, keepdims=True), 1.0)
    p_correct = vote_shares[np.arange(args.queries), gold]
    simulated = []
    for teachers in [*teacher_counts, *sim_teachers]:
        for queries in plan_queries:
            for epsilon in epsilons:
                sigma = sigma_for(epsilon, queries, teachers)
                sim = simulate_teachers(vote_shares, gold, teachers, sigma, max(2000, args.draws // 10), args.seed)
                simulated.append(
                    {
                        "teachers": teachers,
                        "records_needed": teachers * args.max_demos,
                        "planned_queries": queries,
                        "epsilon": epsilon,
                        "sigma": sigma,
                        **sim,
                    }
                )

    result = {
        "config": {
            "task": args.task,
            "records": len(task.private_train),
            "teachers": teacher_counts,
            "max_demos": args.max_demos,
            "queries": args.queries,
            "min_words": args.min_words,
            "epsilons": epsilons,
            "delta": DELTA,
            "mechanism": "gnmax",
            "prompt": prompt,
            "draws": args.draws,
            "seed": args.seed,
            "public_inputs": (
                "banking77/dev.tsv on the 10 intents"
                if args.task == "banking10"
                else "train.tsv outside the private part"
            )
            + ", labels hidden (accuracy only)",
        },
        "zero_shot_accuracy": zero_shot_accuracy,
        "real_model_seconds": real_seconds,
        "measured": measured,
        "per_input_p_correct": p_correct.tolist(),
        "per_input_vote_shares": vote_shares.tolist(),
        "simulated": simulated,
        "simulation_model": (
            "teachers independent given the input, each voting with the measured per-input shares over "
            "the labels (pooled over the measured T); every teacher keeps max_demos demonstrations, so N >= "
            "T x max_demos; GNMax sigma from plan_labelling(epsilon, 1e-5, queries=planned Q)"
        ),
        "machine": {
            "platform": platform.platform(),
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "llama_threads": engine.n_threads,
            "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(),
            "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
            "model": engine.model_path.name,
        },
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/voting_cost.py", *(argv if argv is not None else sys.argv[1:])]),
        "code_version": code_version(),
    }
    engine.close()
    out = Path(args.output) if args.output else RESULTS / f"voting_cost_{args.task}.json"
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(format_tables(result))
    print(f"wrote {out}")
    return 0


def format_tables(result: dict[str, Any]) -> str:
    lines = [
        f"zero-shot accuracy of the seed prompt on the {result['config']['queries']} inputs: "
        f"{result['zero_shot_accuracy']:.3f}",
        "",
        "| T | calls/label | tokens/label | prefix tok (mean) | s/teacher | wall s | teacher acc | "
        "majority | median margin/T | " + " | ".join(f"DP eps {e:g}" for e in result["config"]["epsilons"]) + " |",
        "|---" * (9 + len(result["config"]["epsilons"])) + "|",
    ]
    for row in result["measured"]:
        dp = " | ".join(f"{c['accuracy']:.3f} (s={c['sigma']:.1f})" for c in row["dp_accuracy"])
        lines.append(
            f"| {row['teachers']} | {row['teacher_calls_per_labelled_example']:.2f} | "
            f"{row['tokens_decoded_per_labelled_example']:.0f} | {row['prefix_tokens']['mean']:.0f} | "
            f"{row['seconds_per_teacher_mean']:.2f} | {row['wall_seconds']:.1f} | "
            f"{row['per_teacher_accuracy']['mean']:.3f} | {row['majority_accuracy']:.3f} | "
            f"{row['margin_over_teachers_quantiles']['0.5']:.2f} | {dp} |"
        )
    lines += [
        "",
        "simulated (measured per-input vote shares; DP label accuracy):",
        "",
        "| T | N >= | Q planned | " + " | ".join(f"eps {e:g}" for e in result["config"]["epsilons"]) + " | majority |",
        "|---" * (4 + len(result["config"]["epsilons"])) + "|",
    ]
    cells: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for cell in result["simulated"]:
        cells.setdefault((cell["teachers"], cell["planned_queries"]), []).append(cell)
    for (teachers, queries), row in cells.items():
        lines.append(
            f"| {teachers} | {row[0]['records_needed']} | {queries} | "
            + " | ".join(f"{c['dp_accuracy']:.3f}" for c in row)
            + f" | {row[0]['majority_accuracy']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
