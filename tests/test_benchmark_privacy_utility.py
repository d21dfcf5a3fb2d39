"""Smoke run of the privacy-utility benchmark (tiny schedule, every method once) and its summary maths."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.subprocess_driver import run_script

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("privacy_utility", REPO_ROOT / "benchmarks" / "privacy_utility.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def row(method: str, seed: int, accuracy: float, epsilon: float | None = None) -> dict:
    return {"regime": "r", "method": method, "seed": seed, "test_accuracy": accuracy, "epsilon_spent": epsilon,
            "engine_calls": 10, "prompt_tokens": 100, "completion_tokens": 5, "engine_seconds": 9.0,
            "wall_seconds": 10.0, "per_generation": [], "released_prompt": "p"}


def test_summary_retained_gain_and_ci() -> None:
    bench = load_benchmark()
    rows = [row("seed", 0, 0.6), *[row("nonprivate", s, a) for s, a in enumerate((0.8, 0.82, 0.78))],
            *[row("dp_gaussian_eps4", s, a, 3.9) for s, a in enumerate((0.7, 0.75, 0.65))]]
    summary = bench.summarise(rows)["r"]
    assert summary["nonprivate_gain"] == pytest.approx(0.2)
    assert summary["retained_gain"]["dp_gaussian_eps4"] == pytest.approx(0.5)
    low, high = summary["methods"]["dp_gaussian_eps4"]["accuracy_ci95"]
    assert low < 0.7 < high and high - low > 0.1  # t interval over 3 seeds with spread 0.05
    assert summary["methods"]["seed"]["accuracy_ci95"] is None  # one seed: no interval claimed
    assert summary["methods"]["nonprivate"]["outside_engine_share"] == pytest.approx(0.1)


def test_grid_puts_every_main_method_first_and_resumes_by_key() -> None:
    bench = load_benchmark()
    jobs = bench.plan_jobs("full", 5)
    first = [j for j in jobs if j.regime == "sst2_n2000" and not j.method.endswith(("_flatstart", "_auto"))]
    assert {j.method for j in first} == {"seed", "kshot", "nonprivate", "tgd", *bench.dp_methods(),
                                         "dp_gaussian_eps1_noshrink", "dp_gaussian_eps4_noshrink"}
    assert {j.regime for j in jobs} == {"sst2_n2000", "banking10", "support", "sst2_n20000"}
    assert len({j.key for j in jobs}) == len(jobs)
    assert jobs.index(first[-1]) < min(jobs.index(j) for j in jobs if j.regime != "sst2_n2000")
    for regime in ("support", "banking10", "sst2_n20000"):  # every epsilon and TGD, cheap methods first
        methods = [j.method for j in jobs if j.regime == regime]
        assert set(methods) >= {"seed", "kshot", "nonprivate", "tgd", *(f"dp_gaussian_eps{e:g}" for e in bench.EPSILONS)}
        assert methods.index("dp_gaussian_eps4") < methods.index("dp_gaussian_eps8")
    ablation = [j for j in jobs if j.method.endswith("_flatstart")]
    assert {(j.regime, j.method) for j in ablation} == {
        (r, m) for r in ("support", "sst2_n2000") for m in ("nonprivate_flatstart", "dp_gaussian_eps4_flatstart")}
    planned = [j for j in jobs if j.method.endswith("_auto")]  # the planner's q (issue 46), last
    assert {(j.regime, j.method) for j in planned} == {("sst2_n2000", "dp_gaussian_eps4_auto")}
    assert jobs[-len(planned):] == planned and len(planned) == 5


def test_flatstart_runs_turn_the_structured_start_off(monkeypatch) -> None:
    from tests.helpers import support_engine

    from dp_textgrad.dp_es.mutation.mutation_engine import MutationEngine
    from dp_textgrad.tasks.synthetic import make_support_task

    bench = load_benchmark()
    seen: list[bool] = []
    original = MutationEngine.variants

    def recording(self, *args, **kwargs):
        seen.append(self.structured_start)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MutationEngine, "variants", recording)
    task = make_support_task(seed=0, n_private=60, n_test=10)
    schedule = bench.Schedule(generations=1, population=3, parents=1, records=20)
    for method in ("nonprivate", "nonprivate_flatstart"):
        record = bench.run_dp_es(bench.Job("support", method, 0), task, support_engine(), schedule, bench.AccuracyCache())
        assert record.method == method and len(record.test_correct) == 10
    assert seen == [True, False]


def outcome_rows(method: str, accuracies: list[float], n: int, rng) -> list[dict]:
    rows = []
    for seed, accuracy in enumerate(accuracies):
        correct = rng.random(n) < accuracy
        rows.append({**row(method, seed, float(correct.mean())), "test_correct": "".join("01"[int(c)] for c in correct)})
    return rows


def test_paired_intervals_cover_the_truth_and_shrink_with_pairing() -> None:
    """Paired differences: two methods that agree on most records get a narrow interval."""
    import numpy as np

    bench = load_benchmark()
    rng = np.random.default_rng(1)
    n = 800
    seed_right = rng.random(n) < 0.6
    # The method fixes 20% of the seed's mistakes and breaks nothing: true difference ~ +0.08.
    better = seed_right | (rng.random(n) < 0.2)
    rows = [{**row("seed", 0, seed_right.mean()), "test_correct": "".join("01"[int(c)] for c in seed_right)},
            {**row("dp_gaussian_eps4", 0, better.mean()), "test_correct": "".join("01"[int(c)] for c in better)},
            {**row("nonprivate", 0, better.mean()), "test_correct": "".join("01"[int(c)] for c in better)}]
    paired = bench.summarise(rows)["r"]["paired"]
    diff = paired["dp_gaussian_eps4"]["vs_seed"]
    low, high = paired["dp_gaussian_eps4"]["vs_seed_ci"]
    assert diff == pytest.approx(better.mean() - seed_right.mean())
    assert 0 < low < diff < high
    acc_low, acc_high = paired["dp_gaussian_eps4"]["accuracy_ci"]
    assert high - low < 0.6 * (acc_high - acc_low)  # pairing removes the records' shared difficulty
    assert paired["dp_gaussian_eps4"]["vs_nonprivate_ci"] == (0.0, 0.0)
    assert paired["dp_gaussian_eps4"]["retained_gain"] == pytest.approx(1.0)


def test_ablation_rows_compare_with_the_method_they_ablate() -> None:
    import numpy as np

    bench = load_benchmark()
    rng = np.random.default_rng(2)
    n = 600
    rows = [*outcome_rows("seed", [0.5], n, rng), *outcome_rows("nonprivate", [0.7] * 3, n, rng),
            *outcome_rows("nonprivate_flatstart", [0.6] * 3, n, rng)]
    result = {"regimes": bench.summarise(rows), "runs": [{**r, "n_test": n} for r in rows]}
    ablation = result["regimes"]["r"]["paired"]["nonprivate_flatstart"]
    low, high = ablation["vs_baseline_ci"]
    assert ablation["baseline"] == "nonprivate" and low < ablation["vs_baseline"] < high < 0
    assert "vs_baseline" not in result["regimes"]["r"]["paired"]["nonprivate"]
    assert "Ablation: nonprivate_flatstart - nonprivate: -0.1" in bench.markdown_tables(result)


def test_paired_intervals_count_seed_to_seed_spread() -> None:
    import numpy as np

    bench = load_benchmark()
    rng = np.random.default_rng(2)
    rows = [*outcome_rows("seed", [0.6], 500, rng), *outcome_rows("nonprivate", [0.8] * 5, 500, rng)]
    steady = bench.summarise([*rows, *outcome_rows("dp_gaussian_eps4", [0.7] * 5, 500, rng)])["r"]["paired"]
    spread = bench.summarise([*rows, *outcome_rows("dp_gaussian_eps4", [0.5, 0.9, 0.55, 0.85, 0.7], 500, rng)]
                             )["r"]["paired"]

    def width(p):
        low, high = p["dp_gaussian_eps4"]["retained_gain_ci"]
        return high - low

    assert width(spread) > 2 * width(steady)
    low, high = steady["dp_gaussian_eps4"]["retained_gain_ci"]
    assert low < 0.5 < high


def test_kshot_prompt_is_balanced_public_and_seeded() -> None:
    from dp_textgrad.tasks.synthetic import make_support_task

    bench = load_benchmark()
    task = make_support_task(seed=0, n_private=20, n_test=5)
    prompt, per_label = bench.kshot_prompt(task, 2, seed=3)
    assert prompt.startswith(task.seed_prompt.strip()) and per_label == 2
    demos = [ex for ex in task.public_examples if task.render_demo(ex) in prompt]
    assert sorted(ex.label for ex in demos) == sorted(task.labels * 2)
    assert bench.kshot_prompt(task, 2, seed=3)[0] == prompt != bench.kshot_prompt(task, 2, seed=4)[0]
    assert len(bench.kshot_prompt(task, 3, seed=0, max_chars=300)[0]) <= 300


@pytest.mark.slow
def test_privacy_utility_smoke(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    data_root = Path(os.environ.get("DP_TEXTGRAD_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (data_root / "sst2" / "train.tsv").is_file():
        pytest.skip(f"SST-2 data not found under {data_root}; set DP_TEXTGRAD_DATA")
    output = tmp_path / "pu.json"
    script, env = REPO_ROOT / "benchmarks" / "privacy_utility.py", {**os.environ, "DP_TEXTGRAD_DATA": str(data_root)}
    run_script(script, "--plan", "smoke", "--work-dir", str(tmp_path / "work"), "--output", str(output),
               "--img-dir", str(tmp_path / "img"), timeout=900, cwd=tmp_path, env=env)
    result = json.loads(output.read_text())
    assert set(result) >= {"regimes", "runs", "machine", "date", "command", "code_version", "schedule"}
    methods = result["regimes"]["smoke"]["methods"]
    assert set(methods) == {"seed", "kshot", "nonprivate", "tgd", "dp_gaussian_eps4", "dp_exponential_eps4"}
    assert result["regimes"]["smoke"]["paired"]["dp_gaussian_eps4"]["vs_seed_ci"] is not None
    for run in result["runs"]:
        assert 0.0 <= run["test_accuracy"] <= 1.0
        assert len(run["test_correct"]) == run["n_test"] == 8
        assert "released_prompt" not in run  # only a fingerprint leaves the work directory
        if run["method"].startswith("dp_"):
            assert run["epsilon_spent"] <= 4.0 + 1e-9
            assert run["engine_calls"] > 0
        if run["method"] == "nonprivate":
            assert run["epsilon_spent"] is None  # privacy off claims nothing
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == [
        "privacy_utility_accuracy_vs_epsilon.png", "privacy_utility_accuracy_vs_generation.png"]
    # Resuming finds every run done and only rebuilds the summary.
    again = run_script(script, "--plan", "smoke", "--work-dir", str(tmp_path / "work"), "--output", str(output),
                       "--no-plots", timeout=300, cwd=tmp_path, env=env)
    assert "6 runs already" in again.stdout
    # A fresh checkout extends the grid from the committed results instead of rerunning it.
    restored = run_script(script, "--plan", "smoke", "--work-dir", str(tmp_path / "fresh"), "--output",
                          str(tmp_path / "again.json"), "--no-plots", "--restore-from", str(output),
                          timeout=300, cwd=tmp_path, env=env)
    assert "6 runs restored" in restored.stdout and "0 to do" in restored.stdout
    again_result = json.loads((tmp_path / "again.json").read_text())
    assert again_result["regimes"]["smoke"]["paired"] == result["regimes"]["smoke"]["paired"]
    assert {r["released_prompt_sha256"] for r in again_result["runs"]} == {
        r["released_prompt_sha256"] for r in result["runs"]} and "0 to do" in again.stdout


def test_an_auto_run_plans_its_sampling_rate_and_is_paired_with_the_schedules(monkeypatch) -> None:
    bench = load_benchmark()
    seen = {}

    class Stop(Exception):
        pass

    def capture(params, **settings):  # the optimizer's settings, then stop: no model needed
        seen.update(settings)
        raise Stop

    import dp_textgrad
    from dp_textgrad.engines.scripted import ScriptedEngine

    monkeypatch.setattr(dp_textgrad, "DPEvolutionStrategy", capture)
    task = type("T", (), {"private_train": [0] * 2000, "seed_prompt": "p"})()
    with pytest.raises(Stop):
        bench.run_dp_es(bench.Job("sst2_n2000", "dp_gaussian_eps4_auto", 0), task, ScriptedEngine(), bench.Schedule(), None)
    assert seen["sampling_rate"] == "auto" and seen["epsilon"] == 4.0
    assert bench.method_order("dp_gaussian_eps4") < bench.method_order("dp_gaussian_eps4_auto")
    assert bench.method_order("dp_gaussian_eps4_auto") < bench.method_order("dp_gaussian_eps8")
