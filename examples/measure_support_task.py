"""Measure the built-in support task on the local model: seed prompt vs. good prompts.

Usage (from the repository root, needs the [local] extra)::

    python examples/measure_support_task.py --seed 0 --n-test 200 --threads 2

Prints test accuracy and mean gold-label probability (normalised over the labels)
for the seed prompt, the label list alone, the label list with 10 demonstrations
from the task's public split, and the reference prompt (15 fixed hand-written
demonstrations, alone and after the label list). Only public text
and the synthetic test split are used; no private record is read.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dp_textgrad.engines.llama_cpp import LlamaCppEngine
from dp_textgrad.tasks.synthetic import (
    SUPPORT_REFERENCE_INSTRUCTION,
    demo_prompt,
    make_support_task,
    reference_prompt,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="task seed")
    parser.add_argument("--n-test", type=int, default=200, help="test messages to score")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all CPUs)")
    parser.add_argument("--hard-fraction", type=float, default=None, help="override the task's hard fraction")
    parser.add_argument("--only", default="", help="comma-separated prompt names to run (default: all)")
    args = parser.parse_args()

    kwargs = {} if args.hard_fraction is None else {"hard_fraction": args.hard_fraction}
    task = make_support_task(seed=args.seed, n_test=args.n_test, **kwargs)
    prompts = {
        "seed": task.seed_prompt,
        "label list": SUPPORT_REFERENCE_INSTRUCTION,
        "10 public demos": demo_prompt(task, 10, SUPPORT_REFERENCE_INSTRUCTION),
        "reference": reference_prompt(task),
        "label list + reference": reference_prompt(task, with_label_list=True),
    }
    wanted = [name.strip() for name in args.only.split(",") if name.strip()] or list(prompts)
    engine = LlamaCppEngine(n_threads=args.threads)
    choices = [task.verbalizers[label] for label in task.labels]
    gold = np.array([task.labels.index(ex.label) for ex in task.test])
    records = [task.render_record(ex.text) for ex in task.test]
    print(f"support task, seed {args.seed}, {len(task.test)} test messages, model {engine.model_string}")
    for name in wanted:
        start = time.perf_counter()
        logprobs = engine.score_choices_batch(task.render_prefix(prompts[name]), records, choices)
        predicted = logprobs.argmax(axis=1)
        probs = np.exp(logprobs - logprobs.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        accuracy = float(np.mean(predicted == gold))
        label_prob = float(probs[np.arange(len(gold)), gold].mean())
        counts = np.bincount(predicted, minlength=len(task.labels)).tolist()
        print(f"{name:24s} accuracy {accuracy:.3f}  label_prob {label_prob:.3f}  "
              f"predicted counts {counts}  ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
