"""The winner's curse of the released estimate, and what ``dp.final_estimate`` does about it.

On the clean per-record scores of ``benchmarks/selection_fidelity.py`` (K = 6 prompts scored by the
local model on all N = 200 private records of SST-2, BANKING77 (10 intents) and the built-in
extraction task; benchmark only), each draw simulates the last scoring round of a run and its
release, with the parameters a real run's plan calibrates:

* the search's round: one Poisson subsample (the plan's q) for the K candidates, Gaussian noise
  z C sqrt(K) on each sum, estimates over the public q N, empirical-Bayes shrinkage (the run's
  default), the released prompt = the best shrunk estimate, and the released estimate = that
  shrunk value (what ``result.json`` calls ``estimate``);
* the final estimate: the released prompt's sum on a fresh Poisson subsample of rate q_f plus
  noise z_f C, over q_f N, clipped to [0, 1] (``result.json``'s ``final_estimate``).

z and z_f come from ``RunPlan.calibrated`` for DP-ES's protocol schedule (T = 3, K = 6, 2 parents,
delta 1e-5, N = 200 declared) at each epsilon, with ``final_estimate: {epsilon_share: 0.2}``; the
search's z without a final estimate is printed beside it (what the estimate costs the search).

Reported per task and epsilon over ``--draws`` draws: each estimate's bias against the released
prompt's true mean over the private set, its RMSE, and how often its 95% interval covers that
mean (the search's: the report's noise interval with the subsampling bound; the fresh one's: its
own). A simulation of the mechanisms on real scores, not of a whole search: earlier generations
would add more candidates to the archive, and a larger best-of makes the curse larger.

    python benchmarks/winners_curse.py                      # the three tasks, epsilon 0.71, 1, 4
    python benchmarks/winners_curse.py --draws 500 --output smoke.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import run_records  # noqa: E402 - beside this file
from selection_fidelity import DEFAULT_CACHE, DELTA, N  # noqa: E402

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "winners_curse.json"
EPSILONS = (0.71, 1.0, 4.0)
SHARE = 0.2
Z95 = 1.959964


def plans(epsilon: float) -> dict[str, float]:
    """The calibrated parameters of the protocol's schedule at ``epsilon``, with and without the estimate."""
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.plan import RunPlan

    settings = dict(epsilon=epsilon, delta=DELTA, generations=3, population=6, parents=2, dataset_size=N)
    settings["llm_operators"] = False  # the local base model: no feedback charged
    with_estimate = DPESConfig(**settings, final_estimate={"epsilon_share": SHARE}).resolved()
    plan = RunPlan.calibrated(with_estimate)
    alone = RunPlan.calibrated(DPESConfig(**settings).resolved())
    return {
        "q": with_estimate.resolved_sampling_rate,
        "z": float(plan.value),
        "z_without_estimate": float(alone.value),
        "q_f": float(with_estimate.final_estimate_rate),
        "z_f": float(plan.final_estimate_noise_multiplier),
    }


def simulate(scores: np.ndarray, p: dict[str, float], draws: int, rng: np.random.Generator) -> dict[str, Any]:
    from dp_textgrad.dp_es.estimates import shrink_estimates

    k, n = scores.shape
    truth = scores.mean(axis=1)
    q, z, q_f, z_f = p["q"], p["z"], p["q_f"], p["z_f"]
    search_std = z * math.sqrt(k) / (q * n)
    search_sampling = math.sqrt(max(0.0, 1 - q) / (q * n))
    fresh_std = z_f / (q_f * n)
    fresh_sampling = math.sqrt(max(0.0, 1 - q_f) / (q_f * n))
    search_err, fresh_err, search_cover, fresh_cover, best_true = [], [], 0, 0, 0
    for _ in range(draws):
        keep = rng.random(n) < q
        noisy = (scores[:, keep].sum(axis=1) + rng.normal(0.0, z * math.sqrt(k), size=k)) / (q * n)
        shrunk = shrink_estimates(noisy, search_std**2)
        chosen = int(np.argmax(shrunk))
        released = min(1.0, max(0.0, float(shrunk[chosen])))
        target = float(truth[chosen])
        best_true += chosen == int(np.argmax(truth))
        fresh_keep = rng.random(n) < q_f
        fresh = (scores[chosen, fresh_keep].sum() + rng.normal(0.0, z_f)) / (q_f * n)
        fresh = min(1.0, max(0.0, float(fresh)))
        search_err.append(released - target)
        fresh_err.append(fresh - target)
        search_half = Z95 * math.hypot(search_std, search_sampling)
        fresh_half = Z95 * math.hypot(fresh_std, fresh_sampling)
        search_cover += abs(released - target) <= search_half
        fresh_cover += abs(fresh - target) <= fresh_half
    s, f = np.asarray(search_err), np.asarray(fresh_err)
    return {
        "search_noise_std": search_std,
        "fresh_noise_std": fresh_std,
        "fresh_sampling_bound": fresh_sampling,
        "p_released_is_true_best": best_true / draws,
        "search_bias": float(s.mean()),
        "search_bias_se": float(s.std() / math.sqrt(draws)),
        "search_rmse": float(np.sqrt(np.mean(s**2))),
        "search_coverage": search_cover / draws,
        "fresh_bias": float(f.mean()),
        "fresh_bias_se": float(f.std() / math.sqrt(draws)),
        "fresh_rmse": float(np.sqrt(np.mean(f**2))),
        "fresh_coverage": fresh_cover / draws,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="selection_fidelity.py's clean scores")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if not args.cache.is_file():
        raise SystemExit(
            f"--cache: {args.cache} not found; run benchmarks/selection_fidelity.py first (it scores them)"
        )
    cache = json.loads(args.cache.read_text())
    results: dict[str, Any] = {}
    for epsilon in args.epsilons:
        p = plans(epsilon)
        print(
            f"epsilon {epsilon:g}: q {p['q']:.3g}, search z {p['z_without_estimate']:.3f} -> {p['z']:.3f} with the "
            f"estimate; q_f {p['q_f']:.3g}, z_f {p['z_f']:.2f}",
            flush=True,
        )
        per_task = {}
        for name, entry in cache.items():
            scores = np.asarray(entry["scores"], dtype=float)
            rng = np.random.default_rng(zlib.crc32(f"{name}/{epsilon}".encode()))
            row = simulate(scores, p, args.draws, rng)
            per_task[name] = row
            print(
                f"  {name}: search estimate bias {row['search_bias']:+.4f} (rmse {row['search_rmse']:.4f}, covers "
                f"{row['search_coverage']:.3f}); fresh {row['fresh_bias']:+.4f} (rmse {row['fresh_rmse']:.4f}, "
                f"covers {row['fresh_coverage']:.3f})",
                flush=True,
            )
        results[f"{epsilon:g}"] = {"plan": p, "tasks": per_task}
    document = {
        "protocol": {"N": N, "delta": DELTA, "generations": 3, "population": 6, "parents": 2, "share": SHARE},
        "draws": args.draws,
        "epsilons": results,
    }
    run_records.write_results(
        args.output, document, "benchmarks/winners_curse.py", sys.argv[1:] if argv is None else argv
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
