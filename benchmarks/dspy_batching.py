"""Batched generation on the DSPy path, side by side on the local model (issue 49).

DPES scores each private example under the K candidates of a generation. Without batching
(``DPES(batch_candidates=False)``) each candidate's program runs over the examples in turn, its
instruction and demonstrations decoded once and kept (``EngineLM``'s cached prefix). With it (the
default on llama.cpp) one example runs under the K candidates at once and their LM calls go to the
engine together (``generate_for_prefixes``: one decode per step for the K sequences; never two
examples in a decode). This times both on the same public support messages, outside DP-ES (the
same calls, whatever a search would select), for a few program shapes:

- ``predict-6``: ``Predict("message -> category")``, 6 tokens a call, CompletionAdapter's stops;
- ``predict-24``: the same, 24 tokens a call and no stop (every call writes its 24 tokens);
- ``cot-48``: ``ChainOfThought("message -> category")``, up to 48 tokens, the adapter's stops.

Each shape runs sequential, batched, batched, sequential (ABBA), so load drifts hit both alike;
the ratio is sequential seconds over batched seconds, summed over the two repeats. The answers of
the two paths are compared (greedy decoding: equal up to float near-ties).

    python benchmarks/dspy_batching.py --threads 2 --output benchmarks/results/dspy_batching_micro.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_records  # noqa: E402

#: Public candidate instructions, one per candidate (K = 4).
INSTRUCTIONS = [
    "Classify the customer message into a category.",
    "Which team should handle this message?",
    "Category of the support request:",
    "Read the message and name its category.",
]

#: Shape -> (ChainOfThought?, max tokens a call, CompletionAdapter's stop).
SHAPES = {"predict-6": (False, 6, "auto"), "predict-24": (False, 24, None), "cot-48": (True, 48, "auto")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--messages", type=int, default=16, help="public test messages per candidate")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: free CPUs)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy

    from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    from dp_textgrad.integrations.dspy import CompletionAdapter, EngineLM
    from dp_textgrad.integrations.dspy.batching import run_under_prompts
    from dp_textgrad.tasks.registry import get_task

    engine = LlamaCppEngine(n_threads=args.threads) if args.threads else LlamaCppEngine()
    task = get_task("support", seed=0, n_private=20, n_public=10, n_test=max(args.messages, 10))
    demos = [dspy.Example(message=r.text, category=r.label) for r in task.public_examples[:4]]
    messages = [r.text for r in task.test[: args.messages]]  # public test split: nothing private here

    def program(instruction: str, reasoned: bool):
        signature = dspy.Signature("message -> category", instruction)
        module = dspy.ChainOfThought(signature) if reasoned else dspy.Predict(signature)
        (module.predict if reasoned else module).demos = list(demos)
        return module

    def answer(instruction: str, message: str, reasoned: bool) -> str:
        try:
            return str(program(instruction, reasoned)(message=message).category)
        except dspy.utils.exceptions.AdapterParseError:
            return "<unparsed>"

    results = {}
    for shape in args.shapes:
        reasoned, max_tokens, stop = SHAPES[shape]
        lm = EngineLM(engine, max_tokens=max_tokens)
        answers: dict[str, list[str]] = {}

        def sequential(reasoned: bool = reasoned) -> list[str]:
            return [answer(i, m, reasoned) for i in INSTRUCTIONS for m in messages]

        def batched(reasoned: bool = reasoned) -> list[str]:
            per_message = [
                run_under_prompts(INSTRUCTIONS, lambda i, m=m, r=reasoned: answer(i, m, r)) for m in messages
            ]
            return [str(per_message[j][k]) for k in range(len(INSTRUCTIONS)) for j in range(len(messages))]

        seconds = {"sequential": 0.0, "batched": 0.0}
        with dspy.context(lm=lm, adapter=CompletionAdapter(stop=stop)):
            abba = (("sequential", sequential), ("batched", batched), ("batched", batched), ("sequential", sequential))
            for name, run in abba:
                started = time.perf_counter()
                answers[name] = run()
                seconds[name] += time.perf_counter() - started
        equal = sum(a == b for a, b in zip(answers["sequential"], answers["batched"], strict=True))
        results[shape] = {
            "calls_per_path": 2 * len(INSTRUCTIONS) * len(messages),
            "sequential_seconds": seconds["sequential"],
            "batched_seconds": seconds["batched"],
            "speedup": seconds["sequential"] / seconds["batched"],
            "equal_answers": equal,
            "answers": len(answers["batched"]),
        }
        print(
            f"{shape}: sequential {seconds['sequential']:.1f} s, batched {seconds['batched']:.1f} s, "
            f"{results[shape]['speedup']:.2f}x; equal answers {equal} of {len(answers['batched'])}",
            flush=True,
        )
    load = os.getloadavg()
    document = {
        "model": "Gemma 3 270M Q4_K_M (bundled), EngineLM + CompletionAdapter",
        "candidates": len(INSTRUCTIONS),
        "messages": len(messages),
        "threads": args.threads,
        "load_average_after": list(load),
        "shapes": results,
    }
    if args.output:
        run_records.write_results(args.output, document, "benchmarks/dspy_batching.py", argv or sys.argv[1:])
    return document


if __name__ == "__main__":
    main()
