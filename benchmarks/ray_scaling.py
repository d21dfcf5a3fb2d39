"""Scoring throughput on Ray actors: speed-up from 1 to N actors, and the driver's share.

Two engines, measured side by side in one run on a local Ray instance:

- ``local``: the embedded Gemma 3 270M (llama.cpp) in every actor, on this machine's
  cores: 1 actor x 1 thread, 1 actor x 2 threads, 2 actors x 1 thread.
- ``latency``: an OpenAI-compatible server on loopback (tests/servers.py) answering
  every request after a fixed delay, one request at a time per actor, with 1, 2, 4, 8
  and 16 actors: what spreading buys when the engine is a remote server.

Each configuration scores the same prompts on every record of a partitioned private
set (q = 1) through ``RayScoring.totals`` -- the code path of a run -- twice
after a warm-up; records/s is from the median. The driver's share is its CPU time
(drawing, dispatching, adding up) over the wall time. Writes
benchmarks/results/ray_scaling.json.

    python benchmarks/ray_scaling.py [--records 120] [--latency 0.05] [--skip-local]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # for tests.servers when run as a script

import numpy as np  # noqa: E402
import ray  # noqa: E402

from dp_textgrad.distributed import RayScoringPool  # noqa: E402
from dp_textgrad.settings import DistributedSection, EngineSection  # noqa: E402
from dp_textgrad.tasks.base import ClassificationTask  # noqa: E402
from dp_textgrad.tasks.synthetic import make_support_task  # noqa: E402
from tests.servers import FaultServer  # noqa: E402

PROMPTS = ["Read the message.", "Read the customer message and answer with its category only."]


def measure(pool: RayScoringPool, task: ClassificationTask, repeats: int = 2) -> dict:
    backend = pool(task, None, np.random.default_rng(0), True)
    backend.totals(PROMPTS[:1], 1.0, 1.0, False)  # warm-up: caches, sockets
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        totals = backend.totals(PROMPTS, 1.0, 1.0, True)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        assert totals.confusion.sum() == len(PROMPTS) * len(task.private_train)  # every record, once per prompt
    pool.close()
    evaluations = len(PROMPTS) * len(task.private_train)
    wall = statistics.median(walls)
    return {"records_per_s": round(evaluations / wall, 2), "seconds": round(wall, 3),
            "driver_share": round(statistics.median(c / w for c, w in zip(cpus, walls)), 4)}


def local_section(task: ClassificationTask) -> dict:
    rows = {}
    for actors, threads in ((1, 1), (1, 2), (2, 1)):
        engine = EngineSection(kind="llama_cpp", options={"n_threads": threads, "n_ctx": 512})
        rows[f"{actors} actor(s) x {threads} thread(s)"] = measure(DistributedSection(actors=actors).build(engine), task)
        print("local", actors, threads, rows[f"{actors} actor(s) x {threads} thread(s)"], flush=True)
    base = rows["1 actor(s) x 1 thread(s)"]["records_per_s"]
    both = rows["1 actor(s) x 2 thread(s)"]["records_per_s"]
    two = rows["2 actor(s) x 1 thread(s)"]["records_per_s"]
    return {"rows": rows, "speedup_1_to_2_actors": round(two / base, 2),
            "two_actors_vs_one_actor_two_threads": round(two / both, 2)}


def latency_section(task: ClassificationTask, latency: float) -> dict:
    rows = {}
    with FaultServer(latency=latency) as server:
        engine = EngineSection(kind="openai", model="fake-model", base_url=server.base_url, mode="completions",
                               options={"max_concurrency": 1, "max_retries": 0, "timeout": 60})
        for actors in (1, 2, 4, 8, 16):
            rows[actors] = measure(DistributedSection(actors=actors).build(engine), task)
            print("latency", actors, rows[actors], flush=True)
    base = rows[1]["records_per_s"]
    for actors, row in rows.items():
        row["speedup"] = round(row["records_per_s"] / base, 2)
        row["efficiency"] = round(row["records_per_s"] / base / actors, 3)
    return {"latency_s": latency, "rows": {str(k): v for k, v in rows.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=120, help="private records (local engine)")
    parser.add_argument("--latency-records", type=int, default=64, help="private records (latency-bound engine)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per server answer")
    parser.add_argument("--skip-local", action="store_true", help="no local-model section")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "ray_scaling.json")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()[0]
    # 16 logical CPUs: lets 16 latency-bound actors be placed on 2 cores (they mostly wait).
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        result = {"command": "python benchmarks/ray_scaling.py " + " ".join(argv or sys.argv[1:]),
                  "date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                  "ray": ray.__version__, "load_average_before": round(load_before, 2)}
        if not args.skip_local:
            result["local"] = local_section(make_support_task(seed=0, n_private=args.records, n_test=10))
        result["latency_bound"] = latency_section(make_support_task(seed=0, n_private=args.latency_records,
                                                                    n_test=10), args.latency)
    finally:
        ray.shutdown()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
