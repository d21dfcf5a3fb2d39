"""Batched vs. sequential greedy generation with the local llama.cpp engine (tokens per second).

Side by side in one run, on one engine: ``LlamaCppEngine.generate`` once per prompt
(sequential) against ``LlamaCppEngine.generate_many`` on all prompts (the sequences decoded
together, one ``llama_decode`` per step). The prompts are replies to the built-in support task's
public messages (placeholders, no personal data), greedy, ``--max-tokens`` each and no stop
string. The two methods alternate, repeat by repeat (ABBA order), so a change in machine load
hits both alike; tokens/s is generated tokens over wall time, summed over the repeats. The
texts of the two methods are compared (greedy decoding: equal up to float near-ties).

    python benchmarks/batched_generation.py                     # 8 prompts, 32 tokens, 3 repeats
    python benchmarks/batched_generation.py --prompts 2 --max-tokens 4 --repeats 1 --out smoke.json

Target (issue 34): batched >= 2x the tokens/s of sequential on 2 idle cores. The load average
before and after goes into the results: rerun on an idle machine before quoting a number.
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

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "batched_generation.json"
PROMPT_TEMPLATE = (
    "You answer customer support messages for a phone and broadband company. "
    "Write a short, polite reply to the customer.\n\nMessage: {text}\nReply:"
)


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def support_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` reply prompts over the support task's public messages (placeholders only)."""
    from dp_textgrad.tasks.synthetic import generate_support_examples

    return [PROMPT_TEMPLATE.format(text=example.text) for example in generate_support_examples(n, seed, public=True)]


def main(argv: list[str] | None = None) -> int:
    from dp_textgrad._io import atomic_write_text
    from dp_textgrad.engines.llama_support import busy_now
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="number of prompts (default 8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per prompt (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each method (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the CPUs free now)")
    parser.add_argument("--out", default=str(DEFAULT_OUTPUT), help="where to write the JSON results")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1 or args.repeats < 1:
        parser.error("--prompts, --max-tokens and --repeats must be >= 1")

    load_before = load_average()
    busy_before = busy_now()
    try:
        import llama_cpp

        from dp_textgrad.engines.llama_cpp import LlamaCppEngine

        engine = LlamaCppEngine(n_threads=args.threads)
    except ImportError as exc:
        print(f"SKIPPED: the local engine is unavailable ({exc})")
        return 0

    prompts = support_prompts(args.prompts)
    with engine:
        engine.generate(prompts[0], max_tokens=2)  # warm both paths: first calls allocate buffers
        engine.generate_many(prompts[:2], max_tokens=2)

        def sequential() -> list[str]:
            return [engine.generate(p, max_tokens=args.max_tokens) for p in prompts]

        def batched() -> list[str]:
            return engine.generate_many(prompts, max_tokens=args.max_tokens)

        methods = {"sequential": sequential, "batched": batched}
        seconds = {name: 0.0 for name in methods}
        tokens = {name: 0 for name in methods}
        per_repeat: list[dict[str, float]] = []
        texts: dict[str, list[str]] = {}
        for repeat in range(args.repeats):
            order = list(methods) if repeat % 2 == 0 else list(methods)[::-1]
            row: dict[str, float] = {}
            for name in order:
                before = engine.usage.completion_tokens
                start = time.perf_counter()
                texts[name] = methods[name]()
                elapsed = time.perf_counter() - start
                generated = engine.usage.completion_tokens - before
                seconds[name] += elapsed
                tokens[name] += generated
                row[f"{name}_tokens_per_s"] = generated / elapsed
            row["ratio"] = row["batched_tokens_per_s"] / row["sequential_tokens_per_s"]
            per_repeat.append(row)
        threads = engine.n_threads
        model = engine.model_path.name

    rate = {name: tokens[name] / seconds[name] for name in methods}
    same = sum(a == b for a, b in zip(texts["sequential"], texts["batched"], strict=True))
    result = {
        "ratios": {"tokens_per_s_batched_over_sequential": rate["batched"] / rate["sequential"]},
        "absolute": {
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "tokens_per_s": rate,
            "tokens_generated": tokens,
            "seconds": seconds,
            "per_repeat": per_repeat,
            "identical_texts": same,
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "llama_threads": threads,
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "cpus_busy_before": busy_before,
            "python": platform.python_version(),
            "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
            "model": model,
        },
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(
            ["python", "benchmarks/batched_generation.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "code_version": code_version(),
    }
    atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(f"{args.prompts} prompts x {args.max_tokens} tokens, {args.repeats} repeats, {threads} llama.cpp threads")
    print(f"{'method':<12}{'tokens':>8}{'seconds':>10}{'tokens/s':>10}")
    for name in methods:
        print(f"{name:<12}{tokens[name]:>8}{seconds[name]:>10.2f}{rate[name]:>10.1f}")
    ratio = result["ratios"]["tokens_per_s_batched_over_sequential"]
    print(f"batched / sequential: {ratio:.2f}x (target >= 2x on 2 idle cores)")
    print(f"identical texts: {same} of {args.prompts}")
    print(
        f"load average before {load_before}, after {result['machine']['load_average_after']}; "
        f"CPUs busy just before: {busy_before if busy_before is None else round(busy_before, 2)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
