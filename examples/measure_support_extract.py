"""Measure the built-in generation task ``support_extract`` on the local model: seed vs hand-written prompts.

Usage (from the repository root, needs the [local] extra)::

    python examples/measure_support_extract.py --dev-seed 7 --n 40 --threads 2
    python examples/measure_support_extract.py --dev-seed 7 --n 40 --threads 2 --cue "Account number:"

Scores each prompt by exact match on ``--n`` records of the test split of task seed
``--dev-seed`` (a seed other than the demo's 0, so prompts are not chosen on the demo's
test split). Demonstrations are the first public examples of task seed 0, the ones the
search may show. ``--cue`` replaces the record template's ``Answer:`` (to measure how much a
cue naming the field gives away). Only public examples and the synthetic test split are
read; no private record is.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from dp_textgrad.engines.llama_cpp import LlamaCppEngine
from dp_textgrad.tasks.support_extract import make_support_extract_task

INSTRUCTION = "Write the customer's account number exactly as it appears in the message."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev-seed", type=int, default=7, help="task seed of the records scored")
    parser.add_argument("--n", type=int, default=40, help="records to score")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the free CPUs)")
    parser.add_argument("--cue", default="Answer:", help="the record template's cue after the message")
    args = parser.parse_args()

    task = make_support_extract_task(seed=0, n_private=1)
    task = dataclasses.replace(task, record_template="Message: {text}\n" + args.cue)
    records = make_support_extract_task(seed=args.dev_seed, n_private=1, n_test=args.n).test

    def demos(*indices: int) -> str:
        return "\n\n".join(task.render_demo(task.public_examples[i]) for i in indices)

    prompts = {
        "seed prompt": task.seed_prompt,
        "instruction": INSTRUCTION,
        "2 demos": demos(0, 1),
        "3 demos": demos(0, 1, 2),
        "instruction + 2 demos": INSTRUCTION + "\n\n" + demos(0, 1),
        "instruction + 4 demos": INSTRUCTION + "\n\n" + demos(0, 1, 2, 3),
        "4 other demos": demos(4, 5, 6, 7),
    }
    engine = LlamaCppEngine(n_ctx=1024, n_threads=args.threads)
    print(f"template {task.record_template!r}, {len(records)} records of seed {args.dev_seed}")
    for name, prompt in prompts.items():
        start = time.perf_counter()
        scores = task.public_scores(engine, prompt, records)
        print(f"{name:24s} exact {np.mean(scores):.3f}   ({time.perf_counter() - start:.0f} s)", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
