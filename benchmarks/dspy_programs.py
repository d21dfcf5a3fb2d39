"""DSPy programs as people write them, compiled by DSPy's stock optimizers and by DPES on the local
model (issue 49): a two-predictor program and a retrieval program over the shipped public
help-centre corpus, on the built-in ``support`` task, with paired intervals on one test split.

Programs (``--programs``):

- ``two_step``: ``Predict("message -> topic")`` then ``Predict("message, topic -> category")``:
  both predictors optimized by one DPES compile, the metric on the final category. The public
  examples carry a topic too (a fixed public phrase per category, ``TOPICS``), so that the first
  predictor has demonstrations; the private ones carry only the message and the category;
- ``rag``: ``dspy.retrievers.Embeddings`` over ``help_centre_articles()`` (an in-process hashed
  word embedder, declared public) then ``Predict("context, message -> category")``;
- ``single``: ``Predict("message -> category")`` (the program of ``dspy_utility.py``);
- ``cot``: ``ChainOfThought("message -> category")``: a reasoning, then the category, so each call
  writes many tokens (run it with ``--max-tokens 32`` or more).

Methods, all on the same test records: ``seed`` (as written), ``fewshot_public``
(``LabeledFewShot(k)`` on the public examples), ``bootstrap_private`` (``BootstrapFewShot`` on the
PRIVATE trainset, what a DSPy user does today; the private records it copies into the saved
program are counted), ``mipro_private`` (``MIPROv2``, only when named in ``--methods``: it needs
``pip install optuna``; its instruction proposer writes ``--proposer-tokens`` tokens; a failure
is recorded as the row's outcome), ``dpes_nonprivate`` (DPES, ``privacy="off"``), ``dpes_eps<E>``. Each DPES
compile is timed and its plan (``DPES.plan``) is recorded beside it: planned against spent
private program calls. ``--speed [VARIANT ...]``: for the first seed (every seed with
``--speed-seeds all``), more compiles at the first epsilon, timed side by side in this run:
``unbatched`` (``DPES(batch_candidates=False)``: each record under one candidate at a time, the
path before batched generation), ``no_prefix_cache`` (``EngineLM(reuse_prefix=False)``: neither
the cached prefix nor batching) and ``old_schedule`` (that, with the pre-issue-49 schedule,
q = min(1, 150 / N)); ``--speed`` alone runs all three. Odd seeds run the variants first (ABBA).
``--methods``: run only these rows (e.g. ``dpes_eps4``; the speed variants are added to them).

Run::

    python benchmarks/dspy_programs.py --programs two_step rag --n-private 100 --n-test 60 \\
        --seeds 0 1 --epsilons 4 1 --speed --output benchmarks/results/dspy_programs.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_bootstrap import decode_outcomes, encode_outcomes, paired_bootstrap  # noqa: E402


#: The public intermediate label of the two-step program's public examples: a phrase per category.
TOPICS = {
    "bill": "a charge, a bill or a payment",
    "tech": "something that does not work",
    "update": "changing the customer's details",
    "cancel": "ending a contract or a service",
    "fraud": "a theft or an unknown transaction",
}


#: The slower paths ``--speed`` times beside the default, oldest last.
SPEED_VARIANTS = ("unbatched", "no_prefix_cache", "old_schedule")


def speed_variant(name: str, epsilon: float) -> tuple[dict, dict]:
    """(DPES settings, EngineLM settings) of a ``--speed`` variant at ``epsilon``."""
    return {
        "unbatched": (dict(epsilon=epsilon, batch_candidates=False), {}),
        "no_prefix_cache": (dict(epsilon=epsilon), {"reuse_prefix": False}),
        "old_schedule": (dict(epsilon=epsilon, sampling_rate=None), {"reuse_prefix": False}),
    }[name]


def build_programs(dspy):
    from dp_textgrad.tasks.help_centre import hashed_word_embedder, help_centre_articles

    class TwoStep(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.topic = dspy.Predict("message -> topic")
            self.classify = dspy.Predict("message, topic -> category")

        def forward(self, message: str):
            topic = self.topic(message=message).topic
            return self.classify(message=message, topic=topic)

    class HelpCentreRAG(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.retrieve = dspy.retrievers.Embeddings(
                corpus=help_centre_articles(),
                embedder=dspy.Embedder(hashed_word_embedder(256), caching=False),
                k=1,
                brute_force_threshold=100_000,
            )
            self.classify = dspy.Predict("context, message -> category")

        def forward(self, message: str):
            context = self.retrieve(message).passages[0]
            return self.classify(context=context, message=message)

    class Single(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classify = dspy.Predict("message -> category")

        def forward(self, message: str):
            return self.classify(message=message)

    class Reasoned(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classify = dspy.ChainOfThought("message -> category")

        def forward(self, message: str):
            return self.classify(message=message)

    return {
        "two_step": (TwoStep, {}),
        "cot": (Reasoned, {}),
        "rag": (HelpCentreRAG, {"public_retrievers": ["retrieve"]}),
        "single": (Single, {}),
    }


LABELS = {
    "seed": "uncompiled",
    "fewshot_public": "LabeledFewShot(k=4) on public examples",
    "bootstrap_private": "BootstrapFewShot on the private trainset (stock DSPy)",
    "dpes_nonprivate": "DPES, privacy off",
    "mipro_private": "MIPROv2 (auto light) on the private trainset (stock DSPy)",
}


def summarise(matrices: dict[str, np.ndarray]) -> dict:
    """Paired intervals: each method against the uncompiled program, DPES's rows also against the
    stock optimizer on the private trainset (``vs_baseline``)."""
    stock = {name: "bootstrap_private" for name in matrices if name.startswith("dpes_")}
    summary = paired_bootstrap(matrices, reference="seed", ceiling="dpes_nonprivate", baselines=stock)
    if "mipro_private" in matrices:  # DPES's rows against MIPROv2 on the private trainset too
        mipro = {name: "mipro_private" for name in matrices if name.startswith("dpes_")}
        against = paired_bootstrap(matrices, reference="seed", ceiling="dpes_nonprivate", baselines=mipro)
        for name in mipro:
            summary[name]["vs_mipro"] = against[name]["vs_baseline"]
            summary[name]["vs_mipro_ci"] = against[name]["vs_baseline_ci"]
    return summary


def merged(paths: list[Path], seeds: list[int] | None = None) -> dict:
    """Saved results of several runs on the same split (other seeds or other rows) as one result:
    the runs pooled (a later file's row replaces an earlier one of the same program, seed and
    method; only ``seeds`` when given) and the paired intervals over every method that has all the
    seeds (a failed run is listed, not scored)."""
    runs: dict[tuple, dict] = {}
    commands = []
    for path in paths:
        result = json.loads(path.read_text(encoding="utf-8"))
        commands.append(result["command"])
        for row in result["runs"]:
            if seeds is None or row["seed"] in seeds:
                runs[(row["program"], row["seed"], row["method"])] = row
    rows = list(runs.values())
    summaries = {}
    for program in sorted({r["program"] for r in rows}):
        mine = [r for r in rows if r["program"] == program and "failed" not in r]
        seeds = sorted({r["seed"] for r in mine})
        found: dict[str, list[np.ndarray]] = {}
        for seed in seeds:
            for r in mine:
                if r["seed"] == seed and not r["method"].endswith(tuple(f"_{v}" for v in SPEED_VARIANTS)):
                    found.setdefault(r["method"], []).append(decode_outcomes(r["outcomes"]))
        complete = {name: np.vstack(found[name]) for name in found if len(found[name]) == len(seeds)}
        summaries[program] = summarise(complete)
    return {"command": " && ".join(commands) + " (merged)", "summary": summaries, "runs": rows}


def speed_summary(rows: list[dict]) -> dict:
    """Each ``--speed`` variant against the default compile of the same program, seed and epsilon:
    compile seconds and accuracy side by side, the per-seed time ratio and its geometric mean."""
    found: dict[str, dict] = {}
    defaults = {(r["program"], r["seed"], r["method"]): r for r in rows}
    for r in rows:
        for variant in SPEED_VARIANTS:
            if not r["method"].endswith(f"_{variant}"):
                continue
            base = defaults.get((r["program"], r["seed"], r["method"].removesuffix(f"_{variant}")))
            if base is None:
                continue
            entry = found.setdefault(f"{r['program']} {variant}", {"pairs": []})
            entry["pairs"].append(
                {
                    "seed": r["seed"],
                    "default_seconds": base["compile_seconds"],
                    "variant_seconds": r["compile_seconds"],
                    "ratio": r["compile_seconds"] / base["compile_seconds"],
                    "default_accuracy": base["accuracy"],
                    "variant_accuracy": r["accuracy"],
                }
            )
    for entry in found.values():
        ratios = np.array([p["ratio"] for p in entry["pairs"]])
        entry["geometric_mean_ratio"] = float(np.exp(np.log(ratios).mean()))
        entry["default_accuracy"] = float(np.mean([p["default_accuracy"] for p in entry["pairs"]]))
        entry["variant_accuracy"] = float(np.mean([p["variant_accuracy"] for p in entry["pairs"]]))
    return found


def table(result: dict) -> str:
    """The result as markdown: per program, each method's accuracy, paired difference to the
    uncompiled program, private records in the saved program, compile minutes; then the timing rows."""

    def interval(row: dict, key: str) -> str:
        low, high = row[f"{key}_ci"]
        return f"{row[key]:+.3f} [{low:+.3f}, {high:+.3f}]"

    lines = []
    for program in result["summary"]:
        runs = [r for r in result["runs"] if r["program"] == program]
        found: dict[str, list[np.ndarray]] = {}
        for r in runs:
            if "failed" not in r and not r["method"].endswith(tuple(f"_{v}" for v in SPEED_VARIANTS)):
                found.setdefault(r["method"], []).append(decode_outcomes(r["outcomes"]))
        summary = summarise({name: np.vstack(rows) for name, rows in found.items()})
        seeds = sorted({r["seed"] for r in runs})
        lines += [
            f"**{program}** ({len(seeds)} seeds, {len(found['seed'][0])} test records)",
            "",
            "| method | accuracy | vs uncompiled [95% CI] | vs BootstrapFewShot [95% CI] | vs MIPROv2 [95% CI] | "
            "private records in the saved program (max over seeds) | compile, min (mean) |",
            "|---|---|---|---|---|---|---|",
        ]
        for method, row in summary.items():
            mine = [r for r in runs if r["method"] == method and "failed" not in r]
            minutes = [r["compile_seconds"] / 60 for r in mine if r.get("compile_seconds")]
            name = LABELS.get(method, method.replace("dpes_eps", "DPES, epsilon "))
            lines.append(
                f"| {name} | {row['accuracy']:.3f} | {interval(row, 'vs_seed') if 'vs_seed' in row else '-'} | "
                f"{interval(row, 'vs_baseline') if 'vs_baseline' in row else '-'} | "
                f"{interval(row, 'vs_mipro') if 'vs_mipro' in row else '-'} | "
                f"{max(r['private_records_in_program'] for r in mine)} | "
                f"{(sum(minutes) / len(minutes)) if minutes else 0:.1f} |"
            )
        for r in runs:
            if "failed" in r:
                lines.append(
                    f"\nSeed {r['seed']}, {r['method']}: failed after {r['compile_seconds']:.0f} s ({r['failed']})"
                )
        timed = [r for r in runs if r["method"].startswith("dpes_")]
        lines += [
            "",
            "| compile (seed, method) | accuracy | compile, s | planned private program calls | planned, s | "
            "engine calls |",
            "|---|---|---|---|---|---|",
        ]
        for r in timed:
            lines.append(
                f"| {r['seed']} {r['method']} | {r['accuracy']:.3f} | {r['compile_seconds']:.0f} | "
                f"{r['planned_private_calls']:.0f} | {r['planned_seconds']:.0f} | {r['engine_calls']} |"
            )
        lines.append("")
    if result.get("speed"):
        lines += [
            "| program, slower path | seeds | compile s, default (each seed) | compile s, slower path | "
            "slower / default (geometric mean) | accuracy, default | accuracy, slower path |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, entry in result["speed"].items():
            pairs = entry["pairs"]
            default = ", ".join(f"{p['default_seconds']:.0f}" for p in pairs)
            slower = ", ".join(f"{p['variant_seconds']:.0f}" for p in pairs)
            lines.append(
                f"| {name} | {len(pairs)} | {default} | {slower} | {entry['geometric_mean_ratio']:.2f}x | "
                f"{entry['default_accuracy']:.3f} | {entry['variant_accuracy']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", nargs="+", default=["two_step", "rag"])
    parser.add_argument("--n-private", type=int, default=100)
    parser.add_argument("--n-public", type=int, default=10)
    parser.add_argument("--n-test", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[4.0, 1.0])
    parser.add_argument("--k", type=int, default=4, help="LabeledFewShot's and BootstrapFewShot's demonstrations")
    parser.add_argument("--auto", default="light", help="DPES's schedule preset")
    parser.add_argument("--max-tokens", type=int, default=6, help="tokens a program call may write")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: free CPUs)")
    parser.add_argument(
        "--speed",
        nargs="*",
        choices=SPEED_VARIANTS,
        default=None,
        help="time these slower paths beside the default (none named: all of them)",
    )
    parser.add_argument("--speed-seeds", choices=["first", "all"], default="first")
    parser.add_argument(
        "--proposer-tokens", type=int, default=96, help="tokens MIPROv2's instruction proposer may write"
    )
    parser.add_argument("--methods", nargs="+", default=None, help="run only these rows (default: all)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--table", type=Path, nargs="+", default=None, help="print the tables of saved results")
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="pool saved results on one split (into --output)"
    )
    parser.add_argument("--merge-seeds", type=int, nargs="+", default=None, help="pool only these seeds")
    args = parser.parse_args(argv)
    if args.speed is not None and not args.speed:
        args.speed = list(SPEED_VARIANTS)
    if args.merge:
        result = merged(args.merge, args.merge_seeds)
        print(table(result))
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(result, indent=2, default=float) + "\n", encoding="utf-8")
        return result
    if args.table:
        for path in args.table:
            print(table(json.loads(path.read_text(encoding="utf-8"))))
        return {}

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy

    from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    from dp_textgrad.integrations.dspy import DPES, CompletionAdapter, EngineLM
    from dp_textgrad.tasks.registry import get_task

    engine = LlamaCppEngine(n_threads=args.threads) if args.threads else LlamaCppEngine()
    lm = EngineLM(engine, max_tokens=args.max_tokens)
    dspy.configure(lm=lm, adapter=CompletionAdapter())
    work = Path(tempfile.mkdtemp(prefix="dspy_programs_"))
    os.environ["DP_TEXTGRAD_HOME"] = str(work / "home")  # DPES's default runs root, thrown away after

    def metric(example, prediction, trace=None):
        return str(prediction.category).strip().lower() == example.category

    def score(program, example) -> float:
        try:
            return float(metric(example, program(**example.inputs())))
        except dspy.utils.exceptions.AdapterParseError:
            return 0.0

    task = get_task("support", seed=0, n_private=args.n_private, n_public=args.n_public, n_test=args.n_test)

    def as_example(record):
        return dspy.Example(message=record.text, category=record.label).with_inputs("message")

    private = [as_example(r.unwrap()) for r in task.private_train]
    public = [as_example(r) for r in task.public_examples]
    unknown = {ex.category for ex in public} - set(TOPICS)
    if unknown:
        raise SystemExit(f"TOPICS: no public topic for the categories {sorted(unknown)}")
    public_by_program = {
        "two_step": [ex.copy(topic=TOPICS[ex.category]).with_inputs("message") for ex in public],
    }
    test = [as_example(r) for r in task.test]
    programs = build_programs(dspy)
    rows: list[dict] = []
    summaries: dict[str, dict] = {}
    started = time.perf_counter()

    def leaked(compiled, name: str) -> int:
        path = work / f"{name}.json"
        compiled.save(str(path))
        saved = path.read_text(encoding="utf-8")
        return sum(ex.message in saved for ex in private)

    for program_name in args.programs:
        make, settings = programs[program_name]
        public_examples = public_by_program.get(program_name, public)
        outcomes: dict[str, list[np.ndarray]] = {}
        for seed in args.seeds:
            student = make()

            def wanted(name: str) -> bool:
                return args.methods is None or name in args.methods

            methods: dict[str, dict] = {"seed": {"program": student}} if wanted("seed") else {}
            if wanted("fewshot_public"):
                methods["fewshot_public"] = {
                    "program": dspy.LabeledFewShot(k=args.k).compile(student, trainset=public_examples)
                }
            if wanted("bootstrap_private"):
                t0 = time.perf_counter()
                boot = dspy.BootstrapFewShot(
                    metric=metric, max_bootstrapped_demos=args.k, max_labeled_demos=0, max_errors=len(private)
                )
                methods["bootstrap_private"] = {
                    "program": boot.compile(student, trainset=private),
                    "compile_seconds": time.perf_counter() - t0,
                }
            if args.methods and "mipro_private" in args.methods:  # only when named: needs optuna, runs long
                try:
                    import optuna  # noqa: F401
                except ImportError:
                    raise SystemExit("mipro_private: MIPROv2 needs optuna; pip install optuna") from None
                t0 = time.perf_counter()
                mipro = dspy.MIPROv2(
                    metric=metric,
                    prompt_model=EngineLM(engine, max_tokens=args.proposer_tokens),
                    auto=args.auto,
                    max_bootstrapped_demos=args.k,
                    max_labeled_demos=args.k,
                    num_threads=1,
                    seed=seed,
                    verbose=False,
                )
                try:
                    program = mipro.compile(student, trainset=private, requires_permission_to_run=False)
                    methods["mipro_private"] = {"program": program, "compile_seconds": time.perf_counter() - t0}
                except Exception as exc:  # noqa: BLE001 - recorded as the row's outcome, not hidden
                    failure = f"{type(exc).__name__}: {exc}"[:500]
                    print(f"{program_name} seed {seed} mipro_private failed: {failure}", flush=True)
                    rows.append(
                        {
                            "program": program_name,
                            "seed": seed,
                            "method": "mipro_private",
                            "failed": failure,
                            "compile_seconds": time.perf_counter() - t0,
                        }
                    )
            dpes_runs = [("dpes_nonprivate", dict(privacy="off", epsilon=4.0), {})]
            dpes_runs += [(f"dpes_eps{eps:g}", dict(epsilon=eps), {}) for eps in args.epsilons]
            dpes_runs = [run for run in dpes_runs if wanted(run[0])]
            if args.speed and (args.speed_seeds == "all" or seed == args.seeds[0]):
                first = args.epsilons[0]
                variants = [(f"dpes_eps{first:g}_{v}", *speed_variant(v, first)) for v in args.speed]
                odd = args.seeds.index(seed) % 2 == 1
                dpes_runs = [*variants, *dpes_runs] if odd else [*dpes_runs, *variants]
            for name, dp_settings, lm_settings in dpes_runs:
                run_lm = EngineLM(engine, max_tokens=args.max_tokens, **lm_settings) if lm_settings else lm
                optimizer = DPES(
                    metric,
                    public_trainset=public_examples,
                    lm=run_lm,
                    engine=engine,
                    auto=args.auto,
                    seed=seed,
                    progress=False,
                    **settings,
                    **dp_settings,
                )
                plan = optimizer.plan(student, private, dataset_size=len(private), show=False)  # expected N
                engine_calls = engine.usage.calls if hasattr(engine, "usage") else None
                t0 = time.perf_counter()
                compiled = optimizer.compile(student, private)
                seconds = time.perf_counter() - t0
                methods[name] = {
                    "program": compiled,
                    "compile_seconds": seconds,
                    "planned_private_calls": plan.private_calls,
                    "planned_seconds": plan.expected_seconds,
                    "engine_calls": None if engine_calls is None else engine.usage.calls - engine_calls,
                    "epsilon": compiled.dp_guarantee.epsilon,
                    "prompt": optimizer.outcome.result.prompt,
                }
            for name, info in methods.items():
                correct = np.array([score(info["program"], ex) for ex in test])
                if not name.endswith(tuple(f"_{v}" for v in SPEED_VARIANTS)):
                    outcomes.setdefault(name, []).append(correct)
                row = {
                    "program": program_name,
                    "seed": seed,
                    "method": name,
                    "accuracy": float(correct.mean()),
                    "outcomes": encode_outcomes(correct),
                    "private_records_in_program": leaked(info["program"], f"{program_name}_{name}_{seed}"),
                    **{k: v for k, v in info.items() if k != "program"},
                }
                rows.append(row)
                print(
                    f"{program_name} seed {seed} {name:34s} accuracy {row['accuracy']:.3f}  private records "
                    f"in program: {row['private_records_in_program']}  "
                    f"compile {info.get('compile_seconds') or 0:.0f} s",
                    flush=True,
                )
        matrices = {name: np.vstack(found) for name, found in outcomes.items()}
        if {"seed", "dpes_nonprivate"} <= set(matrices):  # the paired intervals need both rows
            summaries[program_name] = summarise(matrices)
            for name, row in summaries[program_name].items():
                print(program_name, name, json.dumps(row, default=float), flush=True)
    result = {
        "command": "python benchmarks/dspy_programs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": vars(args) | {"output": str(args.output) if args.output else None},
        "model": f"Gemma 3 270M Q4_K_M (bundled), EngineLM(max_tokens={args.max_tokens}) + CompletionAdapter",
        "seconds": time.perf_counter() - started,
        "summary": summaries,
        "speed": speed_summary(rows),
        "runs": rows,
    }
    shutil.rmtree(work, ignore_errors=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2, default=float) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
