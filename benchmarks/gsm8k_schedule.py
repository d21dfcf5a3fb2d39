"""GSM8K under the schedule of the published DP evolution-strategy paper, as one command.

The schedule: 200 private records (drawn from GSM8K ``train.jsonl``), 6 candidates per
generation, 2 parents, 3 generations, epsilon at most 0.71 for the whole run, delta 1e-5.
Each candidate is scored on every private record (``--sampling-rate 1``, our reading of
the schedule; lower it to score Poisson subsamples). The metric is the numeric final
answer (the output's last number against the number after ``####``). The seed prompt and
the released prompt are then scored on the test split (all 1,319 records unless
``--test-records``), and the result file gives both accuracies, their paired difference
with a bootstrap interval, and the epsilon the run's ledger spent.

Any OpenAI-compatible endpoint (an instruction-following model is what the schedule is
for; the local 270M model solves almost no problem and only proves the pipeline)::

    python benchmarks/gsm8k_schedule.py --base-url http://127.0.0.1:8080/v1 --model NAME --mode chat
    python benchmarks/gsm8k_schedule.py --local --records 20 --test-records 10 --max-new-tokens 48

The API key is read from ``$OPENAI_API_KEY`` (or the variable ``--api-key-env`` names).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # paired_bootstrap beside this file

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "gsm8k_schedule.json"
# The published schedule (issue 34).
PAPER_SCHEDULE = {"records": 200, "population": 6, "parents": 2, "generations": 3, "epsilon": 0.71, "delta": 1e-5}


def run_schedule(
    task: Any,
    engine: Any,
    *,
    epsilon: float = 0.71,
    delta: float = 1e-5,
    sampling_rate: float = 1.0,
    population: int = 6,
    parents: int = 2,
    generations: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """One DP-ES run of ``task`` under the schedule, then the seed and released prompts on ``task.test``."""
    from paired_bootstrap import paired_bootstrap

    from dp_textgrad import DPEvolutionStrategy, textgrad

    tg = textgrad()
    variable = tg.Variable(
        task.seed_prompt, role_description="instruction prompt for math word problems", requires_grad=True
    )
    before = engine.usage.as_dict()
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = DPEvolutionStrategy(
            [variable],
            task=task,
            engine=engine,
            epsilon=epsilon,
            delta=delta,
            population=population,
            parents=parents,
            generations=generations,
            sampling_rate=sampling_rate,
            selection="gaussian",
            seed=seed,
        )
        while opt.stopped_because is None:
            if opt.step() is None:
                break
        result = opt.finalise()
    search_seconds = time.perf_counter() - started
    t0 = time.perf_counter()
    seed_scores = np.asarray(task.public_scores(engine, task.seed_prompt, task.test), dtype=float)
    released_scores = np.asarray(task.public_scores(engine, result.prompt, task.test), dtype=float)
    test_seconds = time.perf_counter() - t0
    paired = paired_bootstrap({"seed": seed_scores, "released": released_scores}, ceiling="released")
    after = engine.usage.as_dict()
    return {
        "schedule": {
            "private_records": len(task.private_train),
            "population": population,
            "parents": parents,
            "generations": generations,
            "sampling_rate": sampling_rate,
            "epsilon_target": epsilon,
            "delta": delta,
            "seed": seed,
            "max_new_tokens": task.max_new_tokens,
        },
        "epsilon_spent": None if result.unsafe else float(result.epsilon),
        "delta": float(result.delta),
        "epsilons_by_accountant": dict(result.epsilons),
        "stopped_because": result.stopped_because,
        "generations_run": result.generations_run,
        "test_records": len(task.test),
        "seed_accuracy": float(seed_scores.mean()),
        "released_accuracy": float(released_scores.mean()),
        "released_minus_seed": paired["released"]["vs_seed"],
        "released_minus_seed_ci95": paired["released"]["vs_seed_ci"],
        "released_prompt": result.prompt,  # the DP release itself
        "search_seconds": search_seconds,
        "test_seconds": test_seconds,
        "engine_calls": int(after["calls"] - before["calls"]),
        "tokens": int(
            after["prompt_tokens"] + after["completion_tokens"] - before["prompt_tokens"] - before["completion_tokens"]
        ),
    }


def build_engine(args: argparse.Namespace) -> Any:
    if args.local:
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine

        return LlamaCppEngine(n_threads=args.threads)
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    return OpenAIEngine(
        args.model,
        base_url=args.base_url,
        api_key=os.environ.get(args.api_key_env),
        mode=args.mode,
        max_concurrency=args.concurrency,
    )


def main(argv: list[str] | None = None, engine: Any = None) -> int:
    """The command line; ``engine``: use this engine instead of building one (tests)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_argument_group("engine (one of --local or --model)")
    where.add_argument("--local", action="store_true", help="the bundled local model (llama.cpp)")
    where.add_argument("--model", default=None, help="model name at the OpenAI-compatible endpoint")
    where.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:8080/v1 (default: api.openai.com)")
    where.add_argument("--mode", choices=("chat", "completions"), default="chat")
    where.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    where.add_argument("--concurrency", type=int, default=8)
    where.add_argument("--threads", type=int, default=None, help="llama.cpp threads with --local")
    parser.add_argument("--records", type=int, default=PAPER_SCHEDULE["records"], help="private records (200)")
    parser.add_argument("--test-records", type=int, default=None, help="a slice of the test split (default: 1,319)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--epsilon", type=float, default=PAPER_SCHEDULE["epsilon"])
    parser.add_argument("--delta", type=float, default=PAPER_SCHEDULE["delta"])
    parser.add_argument("--sampling-rate", type=float, default=1.0)
    parser.add_argument("--population", type=int, default=PAPER_SCHEDULE["population"])
    parser.add_argument("--parents", type=int, default=PAPER_SCHEDULE["parents"])
    parser.add_argument("--generations", type=int, default=PAPER_SCHEDULE["generations"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if engine is None and args.local == (args.model is not None):
        parser.error("engine: give either --local or --model NAME (with --base-url for a server other than OpenAI)")
    from dp_textgrad.runs import code_version, machine_summary
    from dp_textgrad.tasks.benchmark_generation import build_gsm8k

    task = build_gsm8k(
        args.data_dir,
        n_private=args.records,
        n_test=args.test_records,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
    )
    engine = engine if engine is not None else build_engine(args)
    result = run_schedule(
        task,
        engine,
        epsilon=args.epsilon,
        delta=args.delta,
        sampling_rate=args.sampling_rate,
        population=args.population,
        parents=args.parents,
        generations=args.generations,
        seed=args.seed,
    )
    result.update(
        {
            "benchmark": "gsm8k_schedule",
            "engine": getattr(engine, "model_string", type(engine).__name__),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python benchmarks/gsm8k_schedule.py", *(sys.argv[1:] if argv is None else argv)]),
            "code_version": code_version(),
            "machine": machine_summary(),
        }
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1), encoding="utf-8")
    ci = result["released_minus_seed_ci95"]
    print(
        f"test accuracy on {result['test_records']} records: seed {result['seed_accuracy']:.3f}, released "
        f"{result['released_accuracy']:.3f} (difference {result['released_minus_seed']:+.3f}"
        + ("" if ci is None else f" [{ci[0]:+.3f}, {ci[1]:+.3f}]")
        + ")"
    )
    eps = result["epsilon_spent"]
    print(
        f"epsilon spent (ledger): {'unsafe' if eps is None else f'{eps:.3f}'} at delta {result['delta']:g}; "
        f"search {result['search_seconds']:.0f} s, test {result['test_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
