"""Concurrent vs sequential requests through OpenAIEngine against a fixed-latency server.

The fault server from tests/servers.py answers every request after a fixed artificial
latency, so the ratio measures only what bounded concurrency buys (target: >= 10x for
16-way with 64 requests of 0.2 s). Writes benchmarks/results/openai_concurrency.json.

    python benchmarks/openai_concurrency.py [--requests 64] [--latency 0.2] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # for tests.servers when run as a script

from dp_textgrad.engines.openai_engine import OpenAIEngine  # noqa: E402
from tests.servers import FaultServer  # noqa: E402


def timed_run(base_url: str, prompts: list[str], concurrency: int) -> float:
    with OpenAIEngine("fake-model", base_url=base_url, mode="completions", max_concurrency=concurrency,
                      max_retries=0, timeout=30) as engine:
        start = time.perf_counter()
        outputs = engine.generate_many(prompts, max_tokens=8)
        seconds = time.perf_counter() - start
    if len(outputs) != len(prompts) or not all(outputs):
        raise RuntimeError("the benchmark server returned empty answers")
    return seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per answer")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "openai_concurrency.json")
    args = parser.parse_args(argv)

    prompts = [f"request {i}" for i in range(args.requests)]
    with FaultServer(latency=args.latency) as server:
        timed_run(server.base_url, prompts[:2], 2)  # warm up imports and sockets
        server.reset()
        sequential = timed_run(server.base_url, prompts, 1)
        server.reset()
        concurrent = timed_run(server.base_url, prompts, args.concurrency)
        max_in_flight = server.max_in_flight

    result = {
        "ratio": round(sequential / concurrent, 2),
        "sequential_seconds": round(sequential, 3),
        "concurrent_seconds": round(concurrent, 3),
        "requests": args.requests,
        "latency_seconds": args.latency,
        "concurrency": args.concurrency,
        "server_max_in_flight": max_in_flight,
        "ideal_ratio": round(args.requests / -(-args.requests // args.concurrency), 2),
        "machine": f"{platform.platform()}; {os.cpu_count()} CPUs; Python {platform.python_version()}",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python benchmarks/openai_concurrency.py",
                             shlex.join(argv if argv is not None else sys.argv[1:])]).strip(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=args.output.parent, suffix=".tmp", delete=False) as tmp:
        json.dump(result, tmp, indent=2)
        tmp.write("\n")
    os.replace(tmp.name, args.output)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
