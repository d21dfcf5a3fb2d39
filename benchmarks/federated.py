"""Federated DP-ES: what each noise placement and James-Stein option costs in accuracy.

Two parts, both written to ``benchmarks/results/federated.json`` (and plots in docs/img):

``--part llm``: real runs with the local Gemma 270M (llama.cpp, one engine shared by the
coordinator and every in-process silo, so the silos' scoring is the code path of a
Flower run without the messaging). The private pool is split over 10 silos by Dirichlet
label skew (alpha 0.3: skewed, 10: near IID); each run releases one prompt, whose test
accuracy is measured on the public test split (outside the guarantee). The schedule is
the privacy-utility benchmark's (3 generations x 4 candidates, about 24 records per
candidate per generation, delta = min(1e-5, 1/(10 N))). ``pooled`` is the single-machine run on
the pooled records at the same epsilon (run once per task, epsilon and seed: the split
does not touch it); ``central`` is the same mechanism in distribution (the same charged
events, the union of the silos' Poisson samples is a Poisson sample of the pool, the
noise added once to the total; tests/federated/test_federated_runs.py checks the events).
Each configuration is also compared with ``central`` seed by seed (a seed fixes the split).
Runs are appended to ``<work-dir>/runs.jsonl`` and the grid resumes where it stopped.
BANKING77 (10 intents) runs take 1.5 to 4 minutes of optimisation each on 2 cores (against
about 1 minute for SST-2), so by default it gets one seed (``--regime-seeds``).

``--part simulated``: no LLM. Candidate utilities come from a model fitted to measured
scores (the spread of the released prompts' test accuracies in the privacy-utility
benchmark); silo drift from Dirichlet label mixes. For S = 10 ... 1,000 silos over a
pool of 100,000 records, one selection round of K candidates is simulated many times
per placement and estimator: the noise std on the pooled estimate, the mean squared
error of the per-candidate estimates and the regret of the chosen candidate.

    python benchmarks/federated.py --part llm [--grid docs|full] [--seeds 3] [--regime-seeds banking10=1] [--configs pooled,central] [--max-minutes 60]
    python benchmarks/federated.py --part simulated
    python benchmarks/federated.py --summarise-only
    python benchmarks/federated.py --part llm --restore-from benchmarks/results/federated.json ...

The results file keeps every run's row (the released prompt only as a fingerprint), so
``--restore-from`` continues a grid on another machine without rerunning what is done.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import run_records  # noqa: E402 - beside this file

OUTPUT = REPO / "benchmarks" / "results" / "federated.json"
WORK_DIR = REPO / "runs" / "benchmarks" / "federated"
IMG_DIR = REPO / "docs" / "img"
SILOS = 10
RECORDS = 24  # expected private records per candidate per generation (as privacy_utility.py)
CONFIGS: dict[str, dict[str, Any]] = {
    "pooled": {"placement": None},  # the single-machine run on the pooled records (no silos; alpha moot)
    "central": {"placement": "central"},
    "distributed": {"placement": "distributed"},
    "local": {"placement": "local"},
    "local_jse_coordinator": {"placement": "local", "shrinkage": "coordinator"},
    "local_jse_silo": {"placement": "local", "shrinkage": "silo"},
    "local_cv_jse": {"placement": "local", "shrinkage": "coordinator", "control_variate": True},
}
CELLS = [("sst2", 0.3, 4.0), ("sst2", 10.0, 4.0), ("banking10", 0.3, 4.0), ("sst2", 0.3, 1.0)]  # the docs' grid
FULL_CELLS = [(regime, alpha, eps) for regime in ("sst2", "banking10") for alpha in (0.3, 10.0) for eps in (4.0, 1.0)]


# ----------------------------------------------------------------------------------------
# part 1: real runs


def build_task(regime: str, data_dir: str | None):
    from dp_textgrad.tasks.registry import build_banking77, build_sst2

    if regime == "sst2":
        return build_sst2(data_dir, n_private=2000, n_test=200, seed=0)
    if regime == "banking10":
        return build_banking77(data_dir, n_private=None, n_test=200, seed=0)
    raise ValueError(f"regime: unknown {regime!r}")


def one_run(task, engine, regime: str, alpha: float, epsilon: float, config: str, seed: int,
            accuracy: dict[str, float]) -> dict[str, Any]:
    from dp_textgrad import DPEvolutionStrategy, textgrad
    from dp_textgrad.federated import FederatedScoring, InProcessSilos, RemoteRecords, Silo
    from dp_textgrad.federated.split import dirichlet_label_split, label_mix
    from dp_textgrad.privacy.data import PrivateDataset

    options = dict(CONFIGS[config])
    placement = options.pop("placement")
    records = [r.unwrap() for r in task.private_train]
    n = len(records)
    parts = dirichlet_label_split([r.label for r in records], SILOS, alpha, np.random.default_rng(seed), min_records=5)
    if placement is None:  # pooled: the single-machine optimiser reads the records itself
        coordinator_task, scoring = task, None
    else:
        silos = [Silo.build(f"silo-{i}", dataclasses.replace(task, private_train=PrivateDataset([records[j] for j in p])),
                            engine, placement, SILOS, max_record_tokens=256, shrink=options.get("shrinkage") == "silo")
                 for i, p in enumerate(parts)]
        backend = FederatedScoring(InProcessSilos(silos), [s.size for s in silos], placement, **options)
        coordinator_task, scoring = dataclasses.replace(task, private_train=RemoteRecords(n)), lambda *_: backend
    tg = textgrad()
    prompt = tg.Variable(task.seed_prompt, role_description="instruction prompt for the classifier", requires_grad=True)
    started = time.perf_counter()
    optimizer = DPEvolutionStrategy([prompt], task=coordinator_task, engine=engine, scoring=scoring,
                                    epsilon=epsilon, generations=3, population=4, parents=2,
                                    sampling_rate=min(1.0, RECORDS / n), max_record_tokens=256, seed=seed)
    result = optimizer.run()
    if result.prompt not in accuracy:
        accuracy[result.prompt] = task.accuracy(engine, result.prompt)
    if task.seed_prompt not in accuracy:
        accuracy[task.seed_prompt] = task.accuracy(engine, task.seed_prompt)
    mix = label_mix([r.label for r in records], parts, task.labels)
    return {"regime": regime, "alpha": alpha, "epsilon": epsilon, "config": config, "seed": seed,
            "placement": placement, "epsilon_spent": float(result.epsilon), "delta": float(optimizer.config.delta),
            "noise_multiplier": optimizer.noise_multiplier, "test_accuracy": accuracy[result.prompt],
            "seed_accuracy": accuracy[task.seed_prompt], "n_test": len(task.test),
            "largest_label_share": None if placement is None else float(mix.max(axis=1).mean()),
            "noise_std_estimate": float(result.history[0].noise_std_estimate),
            "released_prompt": result.prompt, "seconds": time.perf_counter() - started}


def run_llm(args) -> None:
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine

    work = args.work_dir / "runs.jsonl"
    if args.restore_from is not None:
        print(f"{restore_runs(args.restore_from, work)} runs restored from {args.restore_from}", flush=True)
    done = {run_key(r) for r in read_runs(work)}
    seeds_of = {regime: int(count) for regime, count in (item.split("=") for item in args.regime_seeds.split(",")
                                                         if item)}
    cells = FULL_CELLS if args.grid == "full" else CELLS
    wanted = [c for c in args.configs.split(",") if c] if args.configs else list(CONFIGS)
    unknown = sorted(set(wanted) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; choose from {sorted(CONFIGS)}")
    jobs = [(regime, alpha, eps, config, seed) for seed in range(args.seeds) for regime, alpha, eps in cells
            for config in wanted
            if (regime, alpha, eps, config, seed) not in done and seed < seeds_of.get(regime, args.seeds)
            # the pooled run does not depend on the split: once per task, epsilon and seed
            and not (config == "pooled" and (regime, eps, seed) in {(r, e, s) for r, _, e, c, s in done if c == config})
            and not (config == "pooled" and alpha != min(a for r, a, e in cells if (r, e) == (regime, eps)))]
    print(f"{len(done)} runs in {work}; {len(jobs)} to do; load {os.getloadavg()[0]:.2f}", flush=True)
    engine = LlamaCppEngine(n_threads=args.threads)
    tasks: dict[str, Any] = {}
    accuracy: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    for number, (regime, alpha, eps, config, seed) in enumerate(jobs, 1):
        if args.max_minutes is not None and time.perf_counter() - started > 60 * args.max_minutes:
            print(f"time limit: {len(jobs) - number + 1} runs left (rerun to resume)", flush=True)
            break
        if regime not in tasks:
            tasks[regime] = build_task(regime, args.data_dir)
        row = one_run(tasks[regime], engine, regime, alpha, eps, config, seed, accuracy.setdefault(regime, {}))
        run_records.append_run(work, row)
        print(f"[{number}/{len(jobs)}] {regime} alpha={alpha:g} eps={eps:g} {config:22s} seed {seed}: "
              f"test {row['test_accuracy']:.3f} (seed prompt {row['seed_accuracy']:.3f}) in {row['seconds']:.0f}s",
              flush=True)


def run_key(row: dict[str, Any]) -> tuple:
    return row["regime"], row["alpha"], row["epsilon"], row["config"], row["seed"]


def restore_runs(results: Path, work_file: Path) -> int:
    """Append the runs of a results file that the work file lacks; returns how many."""
    return run_records.restore_runs(results, work_file, run_key)


public_row = run_records.prompt_fingerprint
read_runs = run_records.read_runs


def t_interval(values: list[float]) -> list[float] | None:
    interval = run_records.t_interval(values)
    return None if interval is None else list(interval)


def summarise_llm(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cells = []
    for regime, alpha, eps in CELLS + [c for c in FULL_CELLS if c not in CELLS]:
        for config in CONFIGS:
            runs = [r for r in rows if (r["regime"], r["epsilon"], r["config"]) == (regime, eps, config)
                    and (config == "pooled" or r["alpha"] == alpha)]  # one pooled run serves every split
            if not runs:
                continue
            values = [r["test_accuracy"] for r in runs]
            # Paired by seed: a seed fixes the silos' split and the optimiser's public randomness.
            central = {r["seed"]: r["test_accuracy"] for r in rows
                       if (r["regime"], r["alpha"], r["epsilon"], r["config"]) == (regime, alpha, eps, "central")}
            paired = [r["test_accuracy"] - central[r["seed"]] for r in runs if r["seed"] in central]
            cells.append({"regime": regime, "alpha": alpha, "epsilon": eps, "config": config, "runs": len(runs),
                          "seeds": sorted(r["seed"] for r in runs),
                          "test_accuracy_mean": float(np.mean(values)), "test_accuracy_ci95": t_interval(values),
                          "vs_central_mean": float(np.mean(paired)) if paired and config != "central" else None,
                          "vs_central_ci95": t_interval(paired) if config != "central" else None,
                          "seed_accuracy": runs[0]["seed_accuracy"],
                          "noise_std_estimate": float(np.mean([r["noise_std_estimate"] for r in runs])),
                          "epsilon_spent_max": max(r["epsilon_spent"] for r in runs)})
    return cells


# ----------------------------------------------------------------------------------------
# part 2: simulated scores


def simulate(silo_counts=(10, 30, 100, 300, 1000), trials: int = 400, candidates: int = 8, pool: int = 100_000,
             q: float = 0.001, alpha: float = 0.3, epsilon: float = 4.0, seed: int = 0) -> dict[str, Any]:
    """One DP selection round among K candidates over S silos, per placement and estimator."""
    import dp_accounting

    from dp_textgrad.federated.shrinkage import remove_drift, shrink_toward_pooled, shrink_within
    from dp_textgrad.privacy.accounting import calibrate_noise_multiplier

    rng = np.random.default_rng(seed)
    delta = 1.0 / (10 * pool)
    # The utilities' spread is fitted to measured test accuracies of released prompts
    # (benchmarks/results/privacy_utility.json, SST-2: mean and std over all methods and seeds).
    measured = _measured_accuracies()
    mean_u, spread_u = float(np.mean(measured)), float(np.std(measured, ddof=1))
    # Three generations' worth of rounds at this q, as in the LLM part: the noise of one round.
    z = calibrate_noise_multiplier(lambda m: dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(m)), 3), epsilon, delta)
    sigma = z * math.sqrt(candidates)  # std of the noise on each candidate's sum (C = 1)
    estimators = ["none", "jse_coordinator", "jse_silo", "cv_jse"]
    rows = []
    for silos in silo_counts:
        # Equal silo sizes; each silo's share of label 1 drawn from Beta(alpha, alpha) (label skew).
        sizes = np.full(silos, pool / silos)
        mix = rng.beta(alpha, alpha, size=silos)
        results = {(placement, est): {"sq": [], "rel": [], "regret": [], "best": []}
                   for placement in ("central", "distributed", "local") for est in estimators}
        for _ in range(trials):
            utility = np.clip(rng.normal(mean_u, spread_u, size=candidates), 0.05, 0.95)
            # Candidate x label interaction: a prompt may suit one label better (what non-IID silos see).
            tilt = rng.normal(0, spread_u / 2, size=candidates)
            per_silo = np.clip(utility[None, :] + (mix[:, None] - mix.mean()) * tilt[None, :], 0, 1)
            pooled_truth = (sizes[:, None] * per_silo).sum(0) / sizes.sum()
            sampled = rng.binomial(sizes.astype(int), q)
            sums = rng.binomial(sampled[:, None], per_silo).astype(float)  # (S, K) clipped score sums
            scale = q * sizes[:, None]
            for placement in ("central", "distributed", "local"):
                silo_std = {"central": 0.0, "distributed": sigma / math.sqrt(silos), "local": sigma}[placement]
                noisy = sums + rng.normal(0, silo_std, size=sums.shape) if silo_std else sums
                for est in estimators:
                    if placement == "central":
                        if est != "none":
                            continue
                        total = sums.sum(0) + rng.normal(0, sigma, size=candidates)
                    else:
                        values = noisy / scale
                        if est == "jse_silo":
                            values = np.stack([shrink_within(v, silo_std / s) for v, s in zip(values, scale[:, 0])])
                        if est == "cv_jse":
                            values = remove_drift(values, sizes)
                        if est in ("jse_coordinator", "cv_jse"):
                            values = shrink_toward_pooled(values, silo_std / scale[:, 0], sizes)
                        total = (values * scale).sum(0)
                    estimate = total / (q * sizes.sum())
                    chosen = int(np.argmax(estimate))
                    cell = results[(placement, est)]
                    cell["sq"].append(float(np.mean((estimate - pooled_truth) ** 2)))
                    # Ranking depends only on the candidates' differences: their error apart from the
                    # shared part (the realised sample size against the public q N moves all alike).
                    relative = (estimate - estimate.mean()) - (pooled_truth - pooled_truth.mean())
                    cell["rel"].append(float(np.mean(relative ** 2)))
                    cell["regret"].append(float(pooled_truth.max() - pooled_truth[chosen]))
                    cell["best"].append(float(chosen == int(np.argmax(pooled_truth))))
        for (placement, est), cell in results.items():
            if not cell["sq"]:
                continue
            rows.append({"silos": silos, "placement": placement, "estimator": est,
                         "noise_std_total": sigma * (math.sqrt(silos) if placement == "local" else 1.0),
                         "noise_std_estimate": sigma * (math.sqrt(silos) if placement == "local" else 1.0) / (q * pool),
                         "rmse_estimate": float(math.sqrt(np.mean(cell["sq"]))),
                         "rmse_relative": float(math.sqrt(np.mean(cell["rel"]))),
                         "regret": float(np.mean(cell["regret"])), "picks_best": float(np.mean(cell["best"]))})
    return {"pool": pool, "q": q, "candidates": candidates, "alpha": alpha, "epsilon": epsilon, "delta": delta,
            "noise_multiplier": z, "trials": trials, "utility_mean": mean_u, "utility_std": spread_u,
            "measured_from": "benchmarks/results/privacy_utility.json (SST-2 n=2000 test accuracies)", "rows": rows}


def _measured_accuracies() -> list[float]:
    path = REPO / "benchmarks" / "results" / "privacy_utility.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    values: list[float] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("regime") == "sst2_n2000" and isinstance(node.get("test_accuracy"), (int, float)):
                values.append(float(node["test_accuracy"]))
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(data)
    if len(values) < 5:
        raise RuntimeError(f"{path}: fewer than 5 measured SST-2 accuracies to fit the utility model")
    return values


# ----------------------------------------------------------------------------------------
# output


def write(args, simulated: dict[str, Any] | None) -> dict[str, Any]:
    previous = json.loads(args.output.read_text(encoding="utf-8")) if args.output.is_file() else {}
    rows = read_runs(args.work_dir / "runs.jsonl")
    command = "python benchmarks/federated.py " + " ".join(sys.argv[1:])
    commands = dict(previous.get("commands", {}))
    if not args.summarise_only:
        commands.update({part: command for part in ("llm", "simulated") if args.part in (part, "both")})
    summary = {
        "commands": commands,  # the last command that ran each part (the LLM grid resumes across runs)
        "date": dt.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "load_average_at_write": os.getloadavg()[0]},
        "silos": SILOS, "records_per_candidate": RECORDS, "schedule": {"generations": 3, "population": 4, "parents": 2},
        "llm": summarise_llm(rows) if rows else previous.get("llm", []),
        "runs": [public_row(r) for r in rows] if rows else previous.get("runs", []),
        "simulated": simulated if simulated is not None else previous.get("simulated"),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    if not args.no_plots:
        plot(summary, args.img_dir)
    return summary


def plot(summary: dict[str, Any], img_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    sim = summary.get("simulated")
    if sim:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for (placement, est), style in {("central", "none"): "k-", ("distributed", "none"): "b--",
                                        ("local", "none"): "r-", ("local", "jse_coordinator"): "r--",
                                        ("local", "jse_silo"): "r:", ("local", "cv_jse"): "m-."}.items():
            rows = [r for r in sim["rows"] if r["placement"] == placement and r["estimator"] == est]
            if not rows:
                continue
            x = [r["silos"] for r in rows]
            label = placement + ("" if est == "none" else f" + {est}")
            axes[0].plot(x, [r["rmse_estimate"] for r in rows], style, marker="o", label=label)
            axes[1].plot(x, [r["regret"] for r in rows], style, marker="o", label=label)
        for ax, title in zip(axes, ("RMSE of the pooled estimates", "regret of the chosen candidate")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("silos S")
            ax.set_title(title)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"Simulated scores: N={sim['pool']:,}, q={sim['q']}, K={sim['candidates']}, "
                     f"epsilon={sim['epsilon']:g}, alpha={sim['alpha']}")
        fig.tight_layout()
        fig.savefig(img_dir / "federated_simulated.png", dpi=110)
        plt.close(fig)
    cells = summary.get("llm") or []
    if cells:
        groups = sorted({(c["regime"], c["alpha"], c["epsilon"]) for c in cells}, key=str)
        fig, ax = plt.subplots(figsize=(11, 4.2))
        width = 0.8 / len(CONFIGS)
        for j, config in enumerate(CONFIGS):
            xs, ys, errs = [], [], []
            for i, group in enumerate(groups):
                cell = next((c for c in cells if (c["regime"], c["alpha"], c["epsilon"]) == group
                             and c["config"] == config), None)
                if cell is None:
                    continue
                ci = cell["test_accuracy_ci95"] or [cell["test_accuracy_mean"]] * 2
                xs.append(i + j * width)
                ys.append(cell["test_accuracy_mean"])
                errs.append([[cell["test_accuracy_mean"] - ci[0]], [ci[1] - cell["test_accuracy_mean"]]])
            if xs:
                ax.bar(xs, ys, width, label=config, yerr=np.hstack(errs) if errs else None, capsize=2)
        for i, group in enumerate(groups):
            seed_acc = next(c["seed_accuracy"] for c in cells if (c["regime"], c["alpha"], c["epsilon"]) == group)
            ax.hlines(seed_acc, i - width / 2, i + 0.8 - width / 2, colors="grey", linestyles=":")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
        ax.set_xticklabels([f"{r}\nalpha={a:g} eps={e:g}" for r, a, e in groups], fontsize=8)
        ax.set_ylabel("test accuracy (mean, 95% CI)")
        # Accuracy lies in [0, 1]; a t interval over a few seeds can reach past it, so the axis stops
        # at the possible range (the tables give the intervals); the top band holds the legend.
        ax.set_ylim(0.0, 1.35)
        ax.set_yticks(np.linspace(0.0, 1.0, 6))
        ax.set_title(f"Federated DP-ES over {SILOS} silos (dotted: seed prompt)")
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        fig.savefig(img_dir / "federated_llm.png", dpi=110)
        plt.close(fig)


def markdown_tables(summary: dict[str, Any]) -> str:
    """The tables docs/federated.md shows, from a results file."""
    lines = []
    cells = summary.get("llm") or []
    if cells:
        lines += ["| task | alpha | epsilon | configuration | runs | test accuracy (95% CI) | minus central, "
                  "paired by seed (95% CI) | noise std of an estimate |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in cells:
            ci, diff, diff_ci = c["test_accuracy_ci95"], c.get("vs_central_mean"), c.get("vs_central_ci95")
            shown = f"{c['test_accuracy_mean']:.3f}" + (f" ({ci[0]:.3f} to {ci[1]:.3f})" if ci else "")
            versus = "" if diff is None else f"{diff:+.3f}" + (f" ({diff_ci[0]:+.3f} to {diff_ci[1]:+.3f})"
                                                               if diff_ci else "")
            lines.append(f"| {c['regime']} | {c['alpha']:g} | {c['epsilon']:g} | {c['config']} | {c['runs']} | "
                         f"{shown} | {versus} | {c['noise_std_estimate']:.3f} |")
        seeds = sorted({(c["regime"], c["seed_accuracy"]) for c in cells})
        lines += ["", "Seed prompt: " + ", ".join(f"{r} {a:.3f}" for r, a in seeds), ""]
    sim = summary.get("simulated")
    if sim:
        lines += [f"Simulated scores (N = {sim['pool']:,}, q = {sim['q']}, K = {sim['candidates']}, epsilon "
                  f"{sim['epsilon']:g}, z = {sim['noise_multiplier']:.3f}, Beta({sim['alpha']}) label skew, "
                  f"{sim['trials']} rounds per cell):", "",
                  "| silos | placement | estimator | noise std of an estimate | RMSE | RMSE of the differences | "
                  "regret | picks the best |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sim["rows"]:
            lines.append(f"| {r['silos']} | {r['placement']} | {r['estimator']} | {r['noise_std_estimate']:.4f} | "
                         f"{r['rmse_estimate']:.4f} | {r['rmse_relative']:.4f} | {r['regret']:.4f} | "
                         f"{r['picks_best']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("llm", "simulated", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grid", choices=("docs", "full"), default="docs",
                        help="docs: the cells docs/federated.md shows; full: both tasks x alpha 0.3, 10 x epsilon 1, 4")
    parser.add_argument("--regime-seeds", default="banking10=1",
                        help="fewer seeds for slow regimes, e.g. banking10=1 (BANKING77 runs take 1.5 to 4 minutes)")
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--img-dir", type=Path, default=IMG_DIR)
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--restore-from", type=Path, default=None,
                        help="a results file whose runs the work file lacks (continue a grid on another machine)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--summarise-only", action="store_true")
    parser.add_argument("--tables", action="store_true", help="print the docs' tables of --output and stop")
    args = parser.parse_args(argv)
    if args.tables:
        print(markdown_tables(json.loads(args.output.read_text(encoding="utf-8"))))
        return 0
    simulated = None
    if not args.summarise_only:
        if args.part in ("llm", "both"):
            run_llm(args)
        if args.part in ("simulated", "both"):
            simulated = simulate(trials=args.trials)
    summary = write(args, simulated)
    print(json.dumps({"llm_cells": len(summary["llm"]), "simulated_rows": len((summary["simulated"] or {})
                                                                               .get("rows", []))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
