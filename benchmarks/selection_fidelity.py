"""Selection fidelity: how often a scoring round ranks the right prompt first, DP-ES against ours at equal epsilon.

For each task, K = 6 candidate prompts (the seed prompt and five public variants from our
MutationEngine, public seed 0) are scored on ALL N = 200 private records once with the local
model (benchmark only: the clean per-record scores are what a mechanism's noise is measured
against). Each mechanism is then simulated many times on those scores, its noise calibrated so
that the whole DP-ES protocol (T = 3 generations of K = 6 at epsilon 0.71, delta 1e-5) costs the
same epsilon:

* ``dpes_published``: the paper's scorer as published (a mean of b = 10 records drawn without
  replacement, noise multiplier sigma = 10 on C / b: a noise std of 1.0 on a mean), priced by its
  own accountant (autodp, replace-one: 0.705);
* ``dpes`` under each relation: the same scorer with sigma calibrated to 0.71;
* ``ours_default`` and ``ours_auto``: our joint Gaussian over the K Poisson-subsampled sums, q the
  default min(1, 150 / N) or planned by ``sampling_rate: auto``, z calibrated to 0.71.

Relations: ``add_remove`` (our ledger's: PLD and RDP, the smaller; DP-ES's fixed-size sample
priced as a Poisson subsample of rate b / N, as the ledger would) and ``replace_one``. Under
replace-one, DP-ES is priced as what it is, a sample of b without replacement, by dp-accounting's
RDP (``SampledWithoutReplacementDpEvent``, REPLACE_ONE: a replaced record moves a mean of scores
in [0, C] by at most C / b). Ours at q = 1 is an unsampled Gaussian whose replace-one sensitivity
equals its add/remove one (scores in [0, C]: a replaced record moves each sum by at most C), so
it costs the same under both; at q < 1 dp-accounting has no tight replace-one analysis of a
Poisson subsample, and ours is priced by its PLD under REPLACE_ONE, which assumes the two
records lie 2 sensitivities apart: an upper bound, pessimistic for ours.

Reported per task, mechanism and relation over ``--draws`` simulated rounds: the noise std on a
mean score, P(noisy top-1 = true top-1), the mean Kendall tau between noisy and true means, and
the expected regret (true best mean minus the true mean of the noisy top-1).

    python benchmarks/selection_fidelity.py                  # the three tasks, 4000 draws each
    python benchmarks/selection_fidelity.py --tasks sst2 --draws 500 --output smoke.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import run_records  # noqa: E402 - beside this file
from baselines.dp_es_paper import (  # noqa: E402
    PaperSettings,
    calibrate_paper_noise,
    generation_parts,
    paper_epsilon_autodp,
    paper_epsilon_dp_accounting,
)

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "selection_fidelity.json"
DEFAULT_CACHE = REPO_ROOT / "runs" / "benchmarks" / "selection_fidelity" / "scores.json"
EPSILON, DELTA, N = 0.71, 1e-5, 200
TASKS = ("sst2", "banking10", "support_extract")


def build_task(name: str, data_dir: str | None):
    from dp_textgrad.tasks.registry import build_banking77, build_sst2
    from dp_textgrad.tasks.support_extract import make_support_extract_task

    if name == "sst2":
        return build_sst2(data_dir, n_private=N, n_test=50, seed=0)
    if name == "banking10":
        return build_banking77(data_dir, n_private=N, n_test=50, seed=0)
    if name == "support_extract":
        return make_support_extract_task(seed=0, n_private=N, n_test=50)
    raise ValueError(f"task: unknown {name!r}; choose from {TASKS}")


def clean_scores(task: Any, engine: Any, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """The K candidate prompts (our generation 0 for the protocol's schedule) and their per-record
    scores on every private record, shape (K, N): what the mechanisms are simulated on."""
    from dp_textgrad.privacy.data import PrivateBatch

    step = generation_parts(task, engine, PaperSettings(), seed, len(task.private_train))
    prompts = [c.text for c in step.population.candidates]
    batch = PrivateBatch(list(task.private_train))
    many = getattr(task, "private_outcomes_many", None)
    if callable(many):
        outcomes = many(engine, prompts, batch)
    else:
        outcomes = [task.private_outcomes(engine, p, batch) for p in prompts]
    return prompts, np.clip(np.stack([np.asarray(o.scores, dtype=float) for o in outcomes]), 0.0, 1.0)


# -- the mechanisms, calibrated to the same epsilon ------------------------------------------------
def replace_one_epsilon(multiplier: float, q: float, count: int) -> float:
    """An upper bound on epsilon under replace-one neighbours for ``count`` of our releases: a
    Gaussian of ``multiplier`` on a Poisson subsample of rate q. At q = 1 the mechanism has the same
    sensitivity under both relations (module docstring): our ledger's pricing. Below 1,
    dp-accounting's PLD under REPLACE_ONE (its model: the two records 2 sensitivities apart)."""
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution as pld

    from dp_textgrad.privacy.accounting.bounds import smallest_bound

    if q >= 1.0:
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier), count)
        return float(smallest_bound([event], DELTA))
    one = pld.from_gaussian_mechanism(
        multiplier,
        sensitivity=1.0,
        sampling_prob=q,
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    return float(one.self_compose(count).get_epsilon_for_delta(DELTA))


def _bisect(price, low: float = 0.05, high: float = 400.0) -> float:
    """The smallest multiplier in [low, high] whose price is at most EPSILON (price decreasing in it)."""
    for _ in range(50):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if price(middle) > EPSILON else (low, middle)
    return high


def dpes_sigma(relation: str) -> float:
    """The paper's sigma calibrated to EPSILON (its fixed-size sample priced as Poisson, rate b / N)."""

    paper = PaperSettings()
    if relation == "add_remove":
        return calibrate_paper_noise(EPSILON, DELTA, paper, N, "add_remove").noise_multiplier

    def price(sigma: float) -> float:  # its sample without replacement, dp-accounting's RDP, replace-one
        return paper_epsilon_dp_accounting(PaperSettings(noise_multiplier=sigma), N, DELTA)

    return _bisect(price)


def ours(relation: str, auto: bool) -> tuple[float, float]:
    """(q, z) of our Gaussian scores for the protocol's schedule at EPSILON under ``relation``."""

    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.plan import RunPlan, resolve_sampling_rate

    config = DPESConfig(
        epsilon=EPSILON,
        delta=DELTA,
        generations=3,
        population=6,
        parents=2,
        dataset_size=N,
        llm_operators=False,
        sampling_rate="auto" if auto else None,
    )
    config = resolve_sampling_rate(config.resolved())
    if relation == "add_remove":
        return config.resolved_sampling_rate, float(RunPlan.calibrated(config).value)
    q = config.resolved_sampling_rate

    def price(z: float) -> float:  # the plan's Gaussian (no feedback in this protocol), T times
        scores = RunPlan.with_value(config, z).generation_mechanisms(0).scores
        return replace_one_epsilon(scores.effective_noise_multiplier, q, config.generations)

    return q, _bisect(price)


# -- simulation ---------------------------------------------------------------------------------------
def simulate(
    scores: np.ndarray, kind: str, parameter: float, q: float, draws: int, rng: np.random.Generator
) -> dict[str, float]:
    """``draws`` scoring rounds of one mechanism on the clean scores: fidelity statistics."""
    from scipy import stats

    k, n = scores.shape
    truth = scores.mean(axis=1)
    best = int(np.argmax(truth))
    paper = PaperSettings()
    top1, taus, regrets, errors = 0, [], [], []
    for _ in range(draws):
        if kind == "dpes":  # each candidate its own b records without replacement, noise sigma C / b
            means = np.array([scores[j, rng.choice(n, paper.batch, replace=False)].mean() for j in range(k)])
            noisy = means + rng.normal(0.0, parameter / paper.batch, size=k)
        else:  # one Poisson subsample for all K candidates, noise z C sqrt(K) on each sum, over the public q N
            keep = rng.random(n) < q
            sums = scores[:, keep].sum(axis=1)
            noisy = (sums + rng.normal(0.0, parameter * math.sqrt(k), size=k)) / (q * n)
        chosen = int(np.argmax(noisy))
        top1 += chosen == best
        regrets.append(float(truth[best] - truth[chosen]))
        tau = stats.kendalltau(noisy, truth).statistic
        taus.append(0.0 if math.isnan(tau) else float(tau))
        errors.append(noisy - truth)
    noise_std = parameter / paper.batch if kind == "dpes" else parameter * math.sqrt(k) / (q * n)
    return {
        "noise_std_on_mean": float(noise_std),
        "total_error_std": float(np.std(np.concatenate(errors))),
        "p_top1": top1 / draws,
        "kendall_tau": float(np.mean(taus)),
        "expected_regret": float(np.mean(regrets)),
    }


def mechanisms() -> dict[str, dict[str, Any]]:
    """Each compared mechanism: kind, noise parameter, q, the relation it is calibrated under, its epsilon."""
    paper = PaperSettings()
    rows: dict[str, dict[str, Any]] = {
        "dpes_published": {
            "kind": "dpes",
            "parameter": paper.noise_multiplier,
            "q": paper.batch / N,
            "relation": "replace_one (autodp, its own accountant)",
            "epsilon": paper_epsilon_autodp(paper, N, DELTA),
        },
    }
    for relation in ("add_remove", "replace_one"):
        rows[f"dpes_{relation}"] = {
            "kind": "dpes",
            "parameter": dpes_sigma(relation),
            "q": paper.batch / N,
            "relation": relation,
            "epsilon": EPSILON,
        }
        for name, auto in (("ours_default", False), ("ours_auto", True)):
            q, z = ours(relation, auto)
            rows[f"{name}_{relation}"] = {
                "kind": "ours",
                "parameter": z,
                "q": q,
                "relation": relation,
                "epsilon": EPSILON,
            }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="clean scores, reused when present")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    names = [t for t in args.tasks.split(",") if t]
    cache = json.loads(args.cache.read_text()) if args.cache.is_file() else {}
    engine = None
    timings: dict[str, float] = {}
    for name in names:
        if name in cache:
            continue
        if engine is None:
            from dp_textgrad.engines.llama_cpp import LlamaCppEngine

            engine = LlamaCppEngine(n_threads=args.threads)
        started = time.perf_counter()
        prompts, scores = clean_scores(build_task(name, args.data_dir), engine)
        timings[name] = time.perf_counter() - started
        cache[name] = {"prompts": prompts, "scores": scores.tolist()}
        args.cache.parent.mkdir(parents=True, exist_ok=True)
        args.cache.write_text(json.dumps(cache))
        print(
            f"{name}: clean scores of {len(prompts)} prompts on {scores.shape[1]} records in {timings[name]:.0f} s; "
            f"means {np.round(scores.mean(axis=1), 3).tolist()}",
            flush=True,
        )
    compared = mechanisms()
    results: dict[str, Any] = {}
    for name in names:
        scores = np.asarray(cache[name]["scores"], dtype=float)
        truth = scores.mean(axis=1)
        per = {}
        for label, spec in compared.items():
            rng = np.random.default_rng(zlib.crc32(f"{name}/{label}".encode()))
            per[label] = {
                **{k: v for k, v in spec.items() if k != "kind"},
                **simulate(scores, spec["kind"], spec["parameter"], spec["q"], args.draws, rng),
            }
        ranked = np.sort(truth)
        results[name] = {
            "true_means": truth.round(4).tolist(),
            "gap_best_second": float(ranked[-1] - ranked[-2]),
            "mechanisms": per,
        }
        for relation in ("add_remove", "replace_one"):
            dpes, ours_auto = per[f"dpes_{relation}"], per[f"ours_auto_{relation}"]
            print(
                f"{name} [{relation}]: noise std {dpes['noise_std_on_mean']:.3f} (DP-ES) vs "
                f"{ours_auto['noise_std_on_mean']:.3f} (ours, auto); P(top-1) {dpes['p_top1']:.3f} vs "
                f"{ours_auto['p_top1']:.3f}",
                flush=True,
            )
    document = {
        "protocol": {
            "epsilon": EPSILON,
            "delta": DELTA,
            "N": N,
            "population": 6,
            "parents": 2,
            "generations": 3,
            "paper_batch": PaperSettings().batch,
            "draws": args.draws,
        },
        "tasks": results,
        "clean_scoring_seconds": timings,
    }
    command = sys.argv[1:] if argv is None else argv
    run_records.write_results(args.output, document, "benchmarks/selection_fidelity.py", command)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
