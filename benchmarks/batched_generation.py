"""Generation on the local llama.cpp engine, faster than one ``generate`` per prompt (tokens per second).

Side by side in one run, on one engine, two comparisons (``--compare``):

- ``after_prefix`` (default; the private path of generation tasks): a few-shot prefix of about
  300 tokens (an instruction and ``--demos`` public support messages with their topics) and
  ``--prompts`` records after it. ``LlamaCppEngine.generate`` on ``prefix + record``, once per
  record (sequential), against ``LlamaCppEngine.generate_after_prefix(prefix, records)``: the
  prefix decoded once, then each record with its greedy continuation, one record at a time
  (never in a decode with another record: an output depends on its own record only).
- ``for_prefixes`` (the private path when the scorer scores ``--candidates`` prompts on the same
  records): K candidate prompts of about 300 tokens each (the same demos in other orders, under
  other instructions) and ``--prompts`` records. Three methods side by side: ``generate`` on
  ``prompt_k + record`` for every pair (sequential), ``generate_after_prefix(prompt_k, records)``
  once per prompt, and ``generate_for_prefixes(prompts, record)`` once per record (one record
  under the K prompts, their K sequences decoded together; never two records in a decode).
- ``generate_many`` (public prompts only): replies to public support messages, ``generate`` once
  per prompt against ``generate_many`` (the sequences decoded together, one ``llama_decode`` per
  step; an output can depend on the other prompts, so nothing private goes through it).

Greedy, ``--max-tokens`` each and no stop string (so that every record generates about as many
tokens). The two methods alternate, repeat by repeat (ABBA order), so a change in machine load
hits both alike; tokens/s is generated tokens over wall time, summed over the repeats. The texts
of the two methods are compared (greedy decoding: equal up to float near-ties).

    python benchmarks/batched_generation.py                     # after_prefix: 16 records, 24 tokens, 3 repeats
    python benchmarks/batched_generation.py --compare generate_many --prompts 8 --max-tokens 32
    python benchmarks/batched_generation.py --compare for_prefixes --candidates 4   # 4 prompts x 16 records x 24 tokens
    python benchmarks/batched_generation.py --prompts 2 --max-tokens 4 --repeats 1 --out smoke.json

Target (issue 34): >= 2x the tokens/s of sequential generation on 2 idle cores. The load average
and the CPUs busy before and after are printed and go into the results: other work on the CPUs
slows both methods and llama.cpp's spinning threads badly, so rerun on an idle machine before
quoting a number.
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
FOR_PREFIXES_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "batched_generation_for_prefixes.json"
PROMPT_TEMPLATE = (
    "You answer customer support messages for a phone and broadband company. "
    "Write a short, polite reply to the customer.\n\nMessage: {text}\nReply:"
)


TOPIC_INSTRUCTION = "Sort each customer message into one topic: bill, cancel, fraud, tech or update.\n\n"
# Other instructions for the candidate prompts of --compare for_prefixes (public text).
CANDIDATE_INSTRUCTIONS = (
    TOPIC_INSTRUCTION,
    "Read the customer message and name its topic (bill, cancel, fraud, tech or update).\n\n",
    "Topic of each message, one word: bill, cancel, fraud, tech or update.\n\n",
    "Classify the support request by topic. Topics: bill, cancel, fraud, tech, update.\n\n",
)
RECORD_TEMPLATE = "Input: {text}\nOutput:"


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def support_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` reply prompts over the support task's public messages (placeholders only)."""
    from dp_textgrad.tasks.synthetic import generate_support_examples

    return [PROMPT_TEMPLATE.format(text=example.text) for example in generate_support_examples(n, seed, public=True)]


def few_shot_prompts(n_records: int, n_demos: int = 10, seed: int = 0) -> tuple[str, list[str]]:
    """A few-shot prefix (the instruction and ``n_demos`` public support messages with their
    topics, about 320 tokens for 10 with 16 records) and ``n_records`` other public messages as records, in the
    generation task's layout. Placeholders only, no personal data."""
    from dp_textgrad.tasks.synthetic import generate_support_examples

    examples = generate_support_examples(n_demos + n_records, seed, public=True)
    demos = "".join(RECORD_TEMPLATE.format(text=e.text) + f" {e.label}\n\n" for e in examples[:n_demos])
    return TOPIC_INSTRUCTION + demos, [RECORD_TEMPLATE.format(text=e.text) for e in examples[n_demos:]]


def candidate_prefixes(k: int, n_records: int, n_demos: int = 10, seed: int = 0) -> tuple[list[str], list[str]]:
    """``k`` candidate prompts over the same public demos (prompt j: the j-th instruction, cycled,
    and the demos rotated by j) and the ``n_records`` records of :func:`few_shot_prompts`."""
    prefix, records = few_shot_prompts(n_records, n_demos, seed)
    demos = [block + "\n\n" for block in prefix[len(TOPIC_INSTRUCTION) :].split("\n\n") if block]
    prompts = []
    for j in range(k):
        shift = j % len(demos) if demos else 0
        rotated = demos[shift:] + demos[:shift]
        prompts.append(CANDIDATE_INSTRUCTIONS[j % len(CANDIDATE_INSTRUCTIONS)] + "".join(rotated))
    return prompts, records


def main(argv: list[str] | None = None) -> int:
    from dp_textgrad._io import atomic_write_text
    from dp_textgrad.engines.llama_support import busy_now
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--compare",
        choices=("after_prefix", "for_prefixes", "generate_many"),
        default="after_prefix",
        help="the batched method set against one generate per prompt (default after_prefix)",
    )
    parser.add_argument("--prompts", type=int, default=16, help="number of records / prompts (default 16)")
    parser.add_argument("--demos", type=int, default=10, help="demonstrations in the after_prefix prefix (default 10)")
    parser.add_argument("--candidates", type=int, default=4, help="candidate prompts for for_prefixes (default 4)")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens generated per prompt (default 24)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each method (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the CPUs free now)")
    parser.add_argument(
        "--out",
        default=None,
        help="where to write the JSON results (default benchmarks/results/batched_generation.json, "
        "batched_generation_for_prefixes.json for for_prefixes)",
    )
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1 or args.repeats < 1 or args.demos < 0 or args.candidates < 1:
        parser.error("--prompts, --max-tokens, --repeats and --candidates must be >= 1, --demos >= 0")
    if args.out is None:
        args.out = str(FOR_PREFIXES_OUTPUT if args.compare == "for_prefixes" else DEFAULT_OUTPUT)

    load_before = load_average()
    busy_before = busy_now()
    try:
        import llama_cpp

        from dp_textgrad.engines.llama_cpp import LlamaCppEngine

        engine = LlamaCppEngine(n_ctx=2048, n_threads=args.threads)
    except ImportError as exc:
        print(f"SKIPPED: the local engine is unavailable ({exc})")
        return 0

    prefix = ""
    candidates: list[str] = []
    if args.compare == "after_prefix":
        prefix, prompts = few_shot_prompts(args.prompts, args.demos)
    elif args.compare == "for_prefixes":
        candidates, prompts = candidate_prefixes(args.candidates, args.prompts, args.demos)
        prefix = candidates[0]
    else:
        prompts = support_prompts(args.prompts)
    with engine:
        # Warm every path: first calls allocate buffers.
        engine.generate(prefix + prompts[0], max_tokens=2)
        if args.compare in ("after_prefix", "for_prefixes"):
            engine.generate_after_prefix("Warm-up.\n\n", prompts[:2], max_tokens=2)
        if args.compare == "for_prefixes":
            engine.generate_for_prefixes(["Warm-up.\n\n", "Warm up.\n\n"], prompts[0], max_tokens=2)
        if args.compare == "generate_many":
            engine.generate_many(prompts[:2], max_tokens=2)

        # Each repeat's prefix starts with its own number, so that generate_after_prefix decodes
        # its prefix in every repeat (as for a new candidate prompt) instead of reusing the KV
        # cache of the repeat before; both methods get the same prefix in a repeat.
        def repeat_prefix(repeat: int) -> str:
            return f"Batch {repeat + 1}. {prefix}" if prefix else ""

        prefix_tokens = len(engine.tokenize(repeat_prefix(0), bos=True)) if prefix else 0

        # for_prefixes: every candidate gets the repeat's number, as new candidates would.
        def repeat_candidates(repeat: int) -> list[str]:
            return [f"Batch {repeat + 1}. {c}" for c in candidates]

        # Texts in (prompt, record) order for every method, so that they can be compared.
        def sequential(repeat: int) -> list[str]:
            if args.compare == "for_prefixes":
                return [
                    engine.generate(c + p, max_tokens=args.max_tokens)
                    for c in repeat_candidates(repeat)
                    for p in prompts
                ]
            return [engine.generate(repeat_prefix(repeat) + p, max_tokens=args.max_tokens) for p in prompts]

        def after_prefix(repeat: int) -> list[str]:
            return [
                text
                for c in repeat_candidates(repeat)
                for text in engine.generate_after_prefix(c, prompts, max_tokens=args.max_tokens)
            ]

        def batched(repeat: int) -> list[str]:
            if args.compare == "for_prefixes":
                per_record = [
                    engine.generate_for_prefixes(repeat_candidates(repeat), p, max_tokens=args.max_tokens)
                    for p in prompts
                ]
                return [per_record[i][k] for k in range(len(candidates)) for i in range(len(prompts))]
            if args.compare == "after_prefix":
                return engine.generate_after_prefix(repeat_prefix(repeat), prompts, max_tokens=args.max_tokens)
            return engine.generate_many(prompts, max_tokens=args.max_tokens)

        methods = {"sequential": sequential, "batched": batched}
        if args.compare == "for_prefixes":
            methods = {"sequential": sequential, "after_prefix": after_prefix, "batched": batched}
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
                texts[name] = methods[name](repeat)
                elapsed = time.perf_counter() - start
                generated = engine.usage.completion_tokens - before
                seconds[name] += elapsed
                tokens[name] += generated
                row[f"{name}_tokens_per_s"] = generated / elapsed
            row["ratio"] = row["batched_tokens_per_s"] / row["sequential_tokens_per_s"]
            if "after_prefix" in methods:
                row["ratio_after_prefix"] = row["after_prefix_tokens_per_s"] / row["sequential_tokens_per_s"]
            per_repeat.append(row)
        threads = engine.n_threads
        model = engine.model_path.name

    load_after = load_average()
    busy_after = busy_now()
    rate = {name: tokens[name] / seconds[name] for name in methods}
    same = sum(a == b for a, b in zip(texts["sequential"], texts["batched"], strict=True))
    ratios = {"tokens_per_s_batched_over_sequential": rate["batched"] / rate["sequential"]}
    if "after_prefix" in methods:
        ratios["tokens_per_s_after_prefix_over_sequential"] = rate["after_prefix"] / rate["sequential"]
        ratios["tokens_per_s_batched_over_after_prefix"] = rate["batched"] / rate["after_prefix"]
    batched_names = {
        "after_prefix": "generate_after_prefix",
        "for_prefixes": "generate_for_prefixes",
        "generate_many": "generate_many",
    }
    result = {
        "ratios": ratios,
        "absolute": {
            "compare": args.compare,
            "batched_method": batched_names[args.compare],
            "candidates": len(candidates) if candidates else None,
            "prompts": args.prompts,
            "prefix_tokens": prefix_tokens,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "tokens_per_s": rate,
            "tokens_generated": tokens,
            "seconds": seconds,
            "per_repeat": per_repeat,
            "identical_texts": same,
            "texts_compared": len(texts["sequential"]),
            "identical_texts_after_prefix": (
                sum(a == b for a, b in zip(texts["after_prefix"], texts["batched"], strict=True))
                if "after_prefix" in texts
                else None
            ),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "llama_threads": threads,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "cpus_busy_before": busy_before,
            "cpus_busy_after": busy_after,
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
    batched_name = result["absolute"]["batched_method"]
    if args.compare == "after_prefix":
        print(f"a {prefix_tokens}-token prefix, then {args.prompts} records x {args.max_tokens} tokens")
    elif args.compare == "for_prefixes":
        print(
            f"{len(candidates)} candidate prompts of ~{prefix_tokens} tokens, "
            f"{args.prompts} records x {args.max_tokens} tokens each"
        )
    else:
        print(f"{args.prompts} prompts x {args.max_tokens} tokens")
    print(f"{args.repeats} repeats, {threads} llama.cpp threads, {result['machine']['cpus_available']} CPUs")
    print(f"{'method':<24}{'tokens':>8}{'seconds':>10}{'tokens/s':>10}")
    for name in methods:
        label = {"sequential": "generate (sequential)", "after_prefix": "generate_after_prefix"}.get(name, batched_name)
        print(f"{label:<24}{tokens[name]:>8}{seconds[name]:>10.2f}{rate[name]:>10.1f}")
    ratio = result["ratios"]["tokens_per_s_batched_over_sequential"]
    print(f"batched / sequential: {ratio:.2f}x (target >= 2x on 2 idle cores)")
    if "after_prefix" in methods:
        print(f"generate_after_prefix / sequential: {ratios['tokens_per_s_after_prefix_over_sequential']:.2f}x")
        print(f"{batched_name} / generate_after_prefix: {ratios['tokens_per_s_batched_over_after_prefix']:.2f}x")
    print(f"identical texts (batched vs sequential): {same} of {len(texts['sequential'])}")
    if "after_prefix" in texts:
        print(
            f"identical texts (batched vs generate_after_prefix): "
            f"{result['absolute']['identical_texts_after_prefix']} of {len(texts['sequential'])}"
        )

    def busy(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.2f}"

    print(
        f"load average before {load_before}, after {load_after}; "
        f"CPUs busy (0.2 s sample) before {busy(busy_before)}, after {busy(busy_after)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
