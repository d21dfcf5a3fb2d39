"""Throughput of label scoring with the local llama.cpp engine (SST-2 records).

Measures, side by side in one run and on the same model file:

* library: ``LlamaCppEngine.score_choices_batch`` (prefix KV cache reused per record)
  vs. a naive loop that re-evaluates the whole prompt + record for every record
  (records/s ratio; target >= 4x);
* library vs. raw llama.cpp evaluation of exactly the tokens the library evaluates
  (the prefix once, then each record after truncating the cache to the prefix):
  prompt tokens/s; the library's overhead target is <= 15%.

The three methods run interleaved, block by block, so a change in machine load hits
them alike. Data: ``sst2/dev.tsv`` under ``$DP_TEXTGRAD_DATA`` or ``../shared/data``
beside the repository (never copied into it); the benchmark skips when it is absent.

    python benchmarks/engine_throughput.py                # 200 records
    python benchmarks/engine_throughput.py --records 5 --output smoke.json
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "engine_throughput.json"
LABELS = ("negative", "positive")
CHOICES = [" negative", " positive"]
RECORD_TEMPLATE = "Review: {text}\nSentiment:"

# A realistic candidate prompt (~250 tokens): instruction plus hand-written demos
# (not taken from SST-2).
CANDIDATE_PROMPT = """You are a careful film critic's assistant. Read each movie review below and decide \
whether the reviewer's overall opinion of the film is positive or negative. Judge the whole \
sentence, not single words: sarcasm, faint praise and complaints about a film's length or \
pacing usually signal a negative review, while admiration for the acting, the writing or the \
emotional impact signals a positive one. Mixed reviews should be labelled by the feeling that \
dominates at the end of the sentence. Answer with exactly one word, positive or negative.

Review: a warm, funny and beautifully acted story that stays with you long after the credits.
Sentiment: positive

Review: the plot limps from one cliche to the next and the jokes land with a thud.
Sentiment: negative

Review: although the middle drags a little, the final act is genuinely moving.
Sentiment: positive

Review: a handsome production wasted on a script that has nothing to say.
Sentiment: negative

Review: the director trusts the audience, and the result is smart, tense and surprising.
Sentiment: positive

Review: two hours of shouting, explosions and not one character worth caring about.
Sentiment: negative"""


def data_file(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    root = os.environ.get("DP_TEXTGRAD_DATA")
    base = Path(root) if root else REPO_ROOT.parent / "shared" / "data"
    return base / "sst2" / "dev.tsv"


def load_records(path: Path, n: int) -> list[tuple[str, int]]:
    records = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            records.append((row["text"].strip(), int(row["label"])))
            if len(records) == n:
                break
    return records




def last_logits(llama_cpp, llm, n_vocab: int) -> np.ndarray:
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))


def main(argv: list[str] | None = None) -> int:
    from dp_textgrad._io import atomic_write_text
    from dp_textgrad.runs import code_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200, help="number of SST-2 dev records (default 200)")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="where to write the JSON results")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all available CPUs)")
    parser.add_argument("--block", type=int, default=10, help="records per interleaved block (default 10)")
    parser.add_argument("--data", default=None, help="path of sst2/dev.tsv (default: $DP_TEXTGRAD_DATA or ../shared/data)")
    args = parser.parse_args(argv)
    if args.records < 1 or args.block < 1:
        parser.error("--records and --block must be >= 1")

    path = data_file(args.data)
    if not path.is_file():
        print(f"SKIPPED: SST-2 data not found at {path}; set DP_TEXTGRAD_DATA to the folder holding sst2/dev.tsv")
        return 0
    try:
        import llama_cpp

        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
        from dp_textgrad.engines.llama_cpp import quiet_native_output
        engine = LlamaCppEngine(n_threads=args.threads)
    except ImportError as exc:
        print(f"SKIPPED: the local engine is unavailable ({exc})")
        return 0

    records = load_records(path, args.records)
    prefix = CANDIDATE_PROMPT.rstrip() + "\n\n"  # as ClassificationTask.render_prefix renders it
    suffixes = [RECORD_TEMPLATE.format(text=text) for text, _ in records]
    gold = np.array([label for _, label in records])

    # Each baseline gets its own context on the same model file, with the engine's settings.
    def context():
        with quiet_native_output(llama_cpp):
            return llama_cpp.Llama(model_path=str(engine.model_path), n_ctx=engine.n_ctx, n_batch=512, n_ubatch=512,
                                   n_threads=engine.n_threads, n_threads_batch=engine.n_threads, logits_all=False,
                                   swa_full=True, verbose=False)

    naive_llm, raw_llm = context(), context()
    n_vocab = raw_llm.n_vocab()
    prefix_ids = raw_llm.tokenize(prefix.encode(), add_bos=True)
    suffix_ids = [raw_llm.tokenize(s.encode(), add_bos=False) for s in suffixes]
    choice_ids = [raw_llm.tokenize(c.encode(), add_bos=False) for c in CHOICES]
    if any(len(ids) != 1 for ids in choice_ids):
        raise SystemExit("the label words must be single tokens for the naive baseline")
    first = np.array([ids[0] for ids in choice_ids])

    # Warm-up (first decodes allocate buffers), outside the timed region.
    engine.score_choices_batch("Warm-up.", ["Review: fine\nSentiment:"], CHOICES)
    for llm in (naive_llm, raw_llm):
        llm.reset()
        llm.eval(llm.tokenize(b"Warm-up.", add_bos=True))
        llm.reset()

    times = {"library": 0.0, "naive": 0.0, "raw": 0.0}
    lib_scores, naive_scores = [], []
    decoded_before = engine.kv_stats.tokens_decoded
    for start in range(0, len(records), args.block):
        block = range(start, min(start + args.block, len(records)))

        t0 = time.perf_counter()
        lib_scores.append(engine.score_choices_batch(prefix, [suffixes[i] for i in block], CHOICES))
        times["library"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        for i in block:  # naive: the whole prompt + record, from scratch, every record
            naive_llm.reset()
            naive_llm.eval(prefix_ids + suffix_ids[i])
            row = last_logits(llama_cpp, naive_llm, n_vocab).astype(np.float64)
            top = row.max()
            naive_scores.append(row[first] - top - np.log(np.exp(row - top).sum()))
        times["naive"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        if start == 0:  # raw llama.cpp doing exactly the library's work: the prefix once
            raw_llm.eval(prefix_ids)
        for i in block:
            raw_llm.n_tokens = len(prefix_ids)  # Llama.eval drops cached positions >= n_tokens
            raw_llm.eval(suffix_ids[i])
            last_logits(llama_cpp, raw_llm, n_vocab)
        times["raw"] += time.perf_counter() - t0

    library_tokens = engine.kv_stats.tokens_decoded - decoded_before
    raw_tokens = len(prefix_ids) + sum(len(ids) for ids in suffix_ids)
    lib = np.vstack(lib_scores)
    naive = np.array(naive_scores)
    n = len(records)
    result = {
        "ratios": {
            "records_per_s_library_over_naive": (n / times["library"]) / (n / times["naive"]),
            "prompt_tokens_per_s_library_over_raw": (library_tokens / times["library"]) / (raw_tokens / times["raw"]),
            "library_overhead_vs_raw": times["library"] / times["raw"] - 1.0,
        },
        "targets": {"records_per_s_library_over_naive": ">= 4", "library_overhead_vs_raw": "<= 0.15"},
        "absolute": {
            "records": n,
            "prefix_tokens": len(prefix_ids),
            "mean_record_tokens": float(np.mean([len(ids) for ids in suffix_ids])),
            "library_seconds": times["library"],
            "naive_seconds": times["naive"],
            "raw_seconds": times["raw"],
            "library_records_per_s": n / times["library"],
            "naive_records_per_s": n / times["naive"],
            "library_prompt_tokens_per_s": library_tokens / times["library"],
            "raw_prompt_tokens_per_s": raw_tokens / times["raw"],
            "library_tokens_evaluated": library_tokens,
            "naive_tokens_evaluated": int(sum(len(prefix_ids) + len(ids) for ids in suffix_ids)),
            "model_load_seconds": engine.load_seconds,
            "label_agreement_library_vs_naive": float(np.mean(lib.argmax(1) == naive.argmax(1))),
            "max_abs_logprob_diff_library_vs_naive": float(np.abs(lib - naive).max()),
            "accuracy_library": float(np.mean(lib.argmax(1) == gold)),
            "accuracy_naive": float(np.mean(naive.argmax(1) == gold)),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "llama_threads": engine.n_threads,
            "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(),
            "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
            "model": engine.model_path.name,
        },
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/engine_throughput.py", *(argv if argv is not None else sys.argv[1:])]),
        "code_version": code_version(),
    }
    out = Path(args.output)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    ratios, absolute = result["ratios"], result["absolute"]
    print(f"records: {n}, prefix tokens: {len(prefix_ids)}, mean record tokens: {absolute['mean_record_tokens']:.1f}")
    print(f"library {absolute['library_records_per_s']:.2f} records/s vs naive {absolute['naive_records_per_s']:.2f}"
          f" -> {ratios['records_per_s_library_over_naive']:.2f}x (target >= 4x)")
    print(f"library {absolute['library_prompt_tokens_per_s']:.0f} tokens/s vs raw {absolute['raw_prompt_tokens_per_s']:.0f}"
          f" -> overhead {100 * ratios['library_overhead_vs_raw']:.1f}% (target <= 15%)")
    print(f"label agreement library vs naive: {absolute['label_agreement_library_vs_naive']:.3f}; "
          f"accuracy library {absolute['accuracy_library']:.3f}, naive {absolute['accuracy_naive']:.3f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
