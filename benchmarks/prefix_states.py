"""Saved prefix KV states: what restoring them saves when scoring alternates between candidates.

The in-process federated simulation asks every silo for every candidate, so one engine
scores candidate 1, 2, ..., K for silo 1, then again for silo 2, and so on: without saved
states every call decodes its candidate prompt again. This benchmark runs that pattern
(K candidate prompts, S silos with a few SST-2 records each) on two engines on the same
model file, one with saved prefix states (the default) and one without
(``saved_prefix_bytes=0``), interleaved silo by silo so that a change in machine load hits
both alike. It reports the time ratio and checks that both give the same scores.

    python benchmarks/prefix_states.py                        # K=4, S=10, 3 records per silo
    python benchmarks/prefix_states.py --silos 2 --output smoke.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "prefix_states.json"


def candidates(k: int) -> list[str]:
    """K public candidate prompts: the throughput benchmark's prompt with its demos rotated."""
    from engine_throughput import CANDIDATE_PROMPT

    head, *demos = CANDIDATE_PROMPT.split("\n\n")
    return [head + "\n\n" + "\n\n".join(demos[i % len(demos):] + demos[:i % len(demos)]) + "\n\n"
            for i in range(k)]


def main(argv: list[str] | None = None) -> int:
    from engine_throughput import CHOICES, RECORD_TEMPLATE, data_file, load_records

    from dp_textgrad._io import atomic_write_text
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--silos", type=int, default=10)
    parser.add_argument("--records-per-silo", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the free CPUs)")
    parser.add_argument("--data", default=None, help="path of sst2/dev.tsv (default: $DP_TEXTGRAD_DATA or ../shared/data)")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT))
    args = parser.parse_args(argv)
    if min(args.candidates, args.silos, args.records_per_silo) < 1:
        parser.error("--candidates, --silos and --records-per-silo must be >= 1")
    path = data_file(args.data)
    if not path.is_file():
        print(f"SKIPPED: SST-2 data not found at {path}; set DP_TEXTGRAD_DATA to the folder holding sst2/dev.tsv")
        return 0
    try:
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
        engines = {"saved": LlamaCppEngine(n_threads=args.threads),
                   "decoded": LlamaCppEngine(n_threads=args.threads, saved_prefix_bytes=0)}
    except ImportError as exc:
        print(f"SKIPPED: the local engine is unavailable ({exc})")
        return 0

    prompts = candidates(args.candidates)
    records = load_records(path, args.silos * args.records_per_silo)
    silos = [[RECORD_TEMPLATE.format(text=text) for text, _ in records[s::args.silos]] for s in range(args.silos)]
    for engine in engines.values():  # warm-up: first decodes allocate buffers
        engine.score_choices_batch("Warm-up.", ["Review: fine\nSentiment:"], CHOICES)
    seconds = dict.fromkeys(engines, 0.0)
    scores: dict[str, list[np.ndarray]] = {name: [] for name in engines}
    for number, silo in enumerate(silos):
        for name in list(engines)[::1 if number % 2 == 0 else -1]:  # alternate which engine goes first
            engine = engines[name]
            started = time.perf_counter()
            for prompt in prompts:
                scores[name].append(engine.score_choices_batch(prompt, silo, CHOICES))
            seconds[name] += time.perf_counter() - started
    same = all(np.array_equal(a, b) for a, b in zip(scores["saved"], scores["decoded"]))
    result = {
        "ratio_decoded_over_saved_seconds": seconds["decoded"] / seconds["saved"],
        "seconds": seconds,
        "identical_scores": same,
        "pattern": {"candidates": args.candidates, "silos": args.silos, "records_per_silo": args.records_per_silo,
                    "prefix_tokens": [len(engines["saved"].tokenize(p, bos=True)) for p in prompts]},
        "tokens_decoded": {name: e.kv_stats.tokens_decoded for name, e in engines.items()},
        "llama_threads": engines["saved"].n_threads,
        "load_average_at_end": list(os.getloadavg()),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/prefix_states.py", *(argv if argv is not None else sys.argv[1:])]),
        "code_version": code_version(),
    }
    out = Path(args.output)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"{args.candidates} candidates x {args.silos} silos x {args.records_per_silo} records: "
          f"saved states {seconds['saved']:.1f} s, decoding every prefix {seconds['decoded']:.1f} s "
          f"-> {result['ratio_decoded_over_saved_seconds']:.2f}x; identical scores: {same}")
    print(f"wrote {out}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
