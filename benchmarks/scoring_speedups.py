"""Two speed-ups of label scoring on the local engine, each measured against the method it replaced.

``prefixes``: saved prefix KV states. The in-process federated simulation asks every silo
for every candidate, so one engine scores candidate 1, 2, ..., K for silo 1, then again
for silo 2, and so on. Two engines on the same model file run that pattern (K candidate
prompts, S silos with a few SST-2 records each): one with saved prefix states (the
default), one without (``saved_prefix_bytes=0``), which decodes the candidate every time.

``choices``: batched continuations of multi-token labels (BANKING77's 10 intents, 2-4
tokens each). The engine decodes every choice's remaining tokens together, one sequence
per choice, against the previous method, here rebuilt from the engine's own plumbing: one
decode per choice after truncating the cache back to the record. It reports how far the
two methods' log-probs differ (llama.cpp's float results depend on the decode batch) and
whether they predict the same labels.

Each part interleaves its two methods block by block (alternating which goes first), so a
change in machine load hits both alike; the ratios are the result, not the seconds.
Data: ``sst2/dev.tsv`` and ``banking77/test.tsv`` under ``$DP_TEXTGRAD_DATA`` or
``../shared/data`` (never copied into the repository); a part skips when its file is absent.

    python benchmarks/scoring_speedups.py                 # K=4, S=10, 3 records per silo; 60 BANKING77 records
    python benchmarks/scoring_speedups.py --silos 2 --banking-records 4 --output smoke.json
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
sys.path.insert(0, str(REPO_ROOT))
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "scoring_speedups.json"


def candidates(k: int) -> list[str]:
    """K public candidate prompts: the throughput benchmark's prompt with its demos rotated."""
    from engine_throughput import CANDIDATE_PROMPT

    head, *demos = CANDIDATE_PROMPT.split("\n\n")
    return [head + "\n\n" + "\n\n".join(demos[i % len(demos):] + demos[:i % len(demos)]) + "\n\n"
            for i in range(k)]


def prefixes_part(args, make_engine) -> dict | None:
    from engine_throughput import CHOICES, RECORD_TEMPLATE, data_file, load_records

    path = data_file(args.data)
    if not path.is_file():
        print(f"prefixes: SKIPPED, SST-2 data not found at {path}")
        return None
    engines = {"saved": make_engine(), "decoded": make_engine(saved_prefix_bytes=0)}
    prompts = candidates(args.candidates)
    records = load_records(path, args.silos * args.records_per_silo)
    silos = [[RECORD_TEMPLATE.format(text=text) for text, _ in records[s::args.silos]] for s in range(args.silos)]
    for engine in engines.values():  # warm-up: first decodes allocate buffers
        engine.score_choices_batch("Warm-up.", ["Review: fine\nSentiment:"], CHOICES)
    seconds = dict.fromkeys(engines, 0.0)
    scores: dict[str, list[np.ndarray]] = {name: [] for name in engines}
    for number, silo in enumerate(silos):
        for name in list(engines)[:: 1 if number % 2 == 0 else -1]:
            started = time.perf_counter()
            for prompt in prompts:
                scores[name].append(engines[name].score_choices_batch(prompt, silo, CHOICES))
            seconds[name] += time.perf_counter() - started
    same = all(np.array_equal(a, b) for a, b in zip(scores["saved"], scores["decoded"]))
    result = {
        "ratio_decoded_over_saved_seconds": seconds["decoded"] / seconds["saved"],
        "seconds": seconds, "identical_scores": same, "llama_threads": engines["saved"].n_threads,
        "pattern": {"candidates": args.candidates, "silos": args.silos, "records_per_silo": args.records_per_silo,
                    "prefix_tokens": [len(engines["saved"].tokenize(p, bos=True)) for p in prompts]},
        "tokens_decoded": {name: e.kv_stats.tokens_decoded for name, e in engines.items()},
    }
    print(f"prefixes: {args.candidates} candidates x {args.silos} silos x {args.records_per_silo} records: "
          f"saved states {seconds['saved']:.1f} s, decoding every prefix {seconds['decoded']:.1f} s "
          f"-> {result['ratio_decoded_over_saved_seconds']:.2f}x; identical scores: {same}")
    return result


def one_decode_per_choice(engine, prefix: str, suffixes: list[str], choices: list[str]) -> np.ndarray:
    """The previous method: per record and multi-token choice, truncate to the record and decode the choice."""
    from dp_textgrad.engines.llama_support import pick_logprobs

    with engine._lock:
        prefix_ids = tuple(engine._tokenize(prefix, True))
        choice_ids = [engine._tokenize(c, False) for c in choices]
        first = np.array([ids[0] for ids in choice_ids])
        out = np.empty((len(suffixes), len(choices)))
        for i, suffix in enumerate(suffixes):
            suffix_ids = tuple(engine._tokenize(suffix, False))
            out[i] = pick_logprobs(engine._position_at(prefix_ids, suffix_ids), first)
            for j, ids in enumerate(choice_ids):
                if len(ids) > 1:
                    engine._truncate(len(prefix_ids) + len(suffix_ids))

                    def add(k: int, row: np.ndarray, j: int = j, ids: list[int] = ids) -> None:
                        out[i, j] += float(pick_logprobs(row, np.array([ids[k + 1]]))[0])

                    engine._decode(ids[:-1], on_row=add)
            engine._truncate(len(prefix_ids) + len(suffix_ids))
    return out


def choices_part(args, make_engine) -> dict | None:
    from dp_textgrad.tasks.registry import build_banking77

    try:
        task = build_banking77(args.data_dir, n_private=None, n_test=args.banking_records, seed=0)
    except FileNotFoundError as exc:
        print(f"choices: SKIPPED, BANKING77 data unavailable ({exc})")
        return None
    engines = {"batched": make_engine(), "per_choice": make_engine()}
    methods = {"batched": lambda e, p, s, c: e.score_choices_batch(p, s, c), "per_choice": one_decode_per_choice}
    prefix = task.render_prefix(task.seed_prompt)
    choices = [task.verbalizers[label] for label in task.labels]
    suffixes = [task.render_record(example.text) for example in task.test]
    for name, engine in engines.items():  # warm-up, and the prefix decoded outside the timing
        methods[name](engine, prefix, suffixes[:1], choices)
    seconds = dict.fromkeys(engines, 0.0)
    scores: dict[str, list[np.ndarray]] = {name: [] for name in engines}
    for number, start in enumerate(range(0, len(suffixes), args.block)):
        block = suffixes[start : start + args.block]
        for name in list(engines)[:: 1 if number % 2 == 0 else -1]:
            started = time.perf_counter()
            scores[name].append(methods[name](engines[name], prefix, block, choices))
            seconds[name] += time.perf_counter() - started
    batched, per_choice = np.vstack(scores["batched"]), np.vstack(scores["per_choice"])
    gold = np.array([task.labels.index(example.label) for example in task.test])
    result = {
        "ratio_per_choice_over_batched_seconds": seconds["per_choice"] / seconds["batched"],
        "seconds": seconds, "records": len(suffixes), "llama_threads": engines["batched"].n_threads,
        "choice_tokens": [len(engines["batched"].tokenize(c, bos=False)) for c in choices],
        "max_abs_logprob_diff": float(np.abs(batched - per_choice).max()),
        "label_agreement": float(np.mean(batched.argmax(1) == per_choice.argmax(1))),
        "accuracy": {"batched": float(np.mean(batched.argmax(1) == gold)),
                     "per_choice": float(np.mean(per_choice.argmax(1) == gold))},
    }
    print(f"choices: {len(suffixes)} BANKING77 records x {len(choices)} labels: batched {seconds['batched']:.1f} s, "
          f"one decode per choice {seconds['per_choice']:.1f} s -> {result['ratio_per_choice_over_batched_seconds']:.2f}x; "
          f"label agreement {result['label_agreement']:.3f}, largest log-prob difference "
          f"{result['max_abs_logprob_diff']:.3f} nats")
    return result


def main(argv: list[str] | None = None) -> int:
    from dp_textgrad._io import atomic_write_text
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("prefixes", "choices", "both"), default="both")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--silos", type=int, default=10)
    parser.add_argument("--records-per-silo", type=int, default=3)
    parser.add_argument("--banking-records", type=int, default=60)
    parser.add_argument("--block", type=int, default=10, help="BANKING77 records per interleaved block")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the free CPUs)")
    parser.add_argument("--data", default=None, help="path of sst2/dev.tsv (default: $DP_TEXTGRAD_DATA or ../shared/data)")
    parser.add_argument("--data-dir", default=None, help="folder holding banking77/ (default: $DP_TEXTGRAD_DATA or ../shared/data)")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT))
    args = parser.parse_args(argv)
    if min(args.candidates, args.silos, args.records_per_silo, args.banking_records, args.block) < 1:
        parser.error("--candidates, --silos, --records-per-silo, --banking-records and --block must be >= 1")
    try:
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    except ImportError as exc:
        print(f"SKIPPED: the local engine is unavailable ({exc})")
        return 0

    def make_engine(**options):
        return LlamaCppEngine(n_threads=args.threads, **options)

    result = {
        "prefixes": prefixes_part(args, make_engine) if args.part in ("prefixes", "both") else None,
        "choices": choices_part(args, make_engine) if args.part in ("choices", "both") else None,
        "load_average_at_end": list(os.getloadavg()),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/scoring_speedups.py", *(argv if argv is not None else sys.argv[1:])]),
        "code_version": code_version(),
    }
    out = Path(args.output)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    prefixes = result["prefixes"]
    return 0 if prefixes is None or prefixes["identical_scores"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
