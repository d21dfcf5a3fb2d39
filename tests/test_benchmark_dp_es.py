"""The DP-ES baseline of benchmarks/baselines/dp_es_paper.py and the protocol benchmark around it.

The paper's accountant is reproduced (autodp: 0.705168 for its protocol, issue 46), the identical
mechanism is priced by dp-accounting beside it, the baseline scores each candidate on b records of
its own with the paper's noise and releases its best noisy mean, the epsilon-0 control reads no
private record, and the protocol benchmark runs end to end (scripted engine) into a summary with
paired intervals against DP-ES and against the control.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from dp_textgrad.privacy.data import Private

REPO = Path(__file__).resolve().parents[1]


def _load_script(name: str):
    """A benchmark script as a module; running it puts benchmarks/ on its path, as it does when run."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


protocol = _load_script("dp_es_protocol")
fidelity = _load_script("selection_fidelity")
paper = sys.modules["baselines.dp_es_paper"]


def test_the_papers_own_figure_is_reproduced_and_priced_beside_it() -> None:
    pytest.importorskip("autodp")
    settings = paper.PaperSettings()
    assert settings.mean_noise_std == pytest.approx(1.0)
    assert paper.paper_epsilon_autodp(settings, 200, 1e-5) == pytest.approx(0.705168, abs=1e-4)
    # The same mechanism under tighter analyses: dp-accounting's RDP for sampling without
    # replacement (replace-one), and our ledger's add/remove pricing with a Poisson subsample.
    exact = paper.paper_epsilon_dp_accounting(settings, 200, 1e-5)
    ours = paper.paper_epsilon_add_remove(settings, 200, 1e-5)
    assert 0.1 < exact < 0.705 and 0.03 < ours < exact
    calibrated = paper.calibrate_paper_noise(0.71, 1e-5, settings, 200, "replace_one")
    assert calibrated.noise_multiplier < 10.0  # 0.705 < 0.71: a little less noise fits
    assert paper.paper_epsilon_autodp(calibrated, 200, 1e-5) == pytest.approx(0.71, abs=2e-3)


def _task():
    from dp_textgrad.tasks.synthetic import make_support_task

    return make_support_task(seed=0, n_private=60, n_test=8)


def test_the_baseline_scores_b_records_per_candidate_and_releases_its_best_noisy_mean(monkeypatch) -> None:
    from tests.helpers import support_engine

    task, engine = _task(), support_engine()
    seen: list[int] = []
    outcomes = type(task).private_outcomes

    def counting(self, engine, prompt, batch, *args, **kwargs):
        seen.append(len(batch))
        return outcomes(self, engine, prompt, batch, *args, **kwargs)

    monkeypatch.setattr(type(task), "private_outcomes", counting)
    settings = paper.PaperSettings(generations=2)
    found = paper.run_paper_dpes(task, engine, settings, seed=1)
    assert seen == [settings.batch] * (settings.population * settings.generations)
    assert found.private_evaluations == settings.batch * settings.population * settings.generations
    assert found.released_estimate == max(r["best_noisy_mean"] for r in found.per_generation)
    assert isinstance(found.prompt, str) and found.prompt


def test_the_epsilon_0_control_reads_no_private_record(monkeypatch) -> None:
    from tests.helpers import support_engine

    def refuse(self):
        raise AssertionError("the epsilon-0 control read a private record")

    task, engine = _task(), support_engine()  # built (and its records checked) before the guard
    monkeypatch.setattr(Private, "unwrap", refuse)
    found = paper.run_random_parents(task, engine, paper.PaperSettings(), seed=2)
    assert found.prompt and found.private_evaluations == 0


def test_the_protocol_benchmark_runs_end_to_end(tmp_path, monkeypatch) -> None:
    pytest.importorskip("autodp")

    from tests.helpers import support_engine

    monkeypatch.setattr(protocol, "N", 60)
    monkeypatch.setattr(protocol, "build_task", lambda name, n_test, data_dir: _task())
    rows = []
    cache = protocol.OutcomeCache()
    for job in protocol.plan_jobs(["support"], list(protocol.METHODS), seeds=2):
        rows.append(protocol.run_job(job, _task(), support_engine(), cache))
    summary = protocol.summarise(rows)["support"]["methods"]
    assert set(summary) == {"seed", *protocol.METHODS}
    assert summary["ours_auto"]["sampling_rate"] == pytest.approx(1.0)  # N 60: auto affords every record
    assert summary["ours_default"]["epsilon_spent"] <= 0.71 + 1e-9
    for method in ("ours_default", "ours_auto", "nonprivate", "eps0"):
        assert "vs_dpes_published" in summary[method] and len(summary[method]["vs_dpes_published_ci"]) == 2
    assert all(np.isfinite(v["score"]) for v in summary.values())
    json.dumps(summary)  # the results file can hold it
    # Capped at DP-ES's private work (b K T = 180 planned evaluations), auto plans within it.
    capped = protocol.run_job(protocol.Job("support", "ours_auto_equal_work", 0), _task(), support_engine(), cache)
    assert capped["planned_private_evaluations"] <= 180 + 1e-9 < rows[-1]["planned_private_evaluations"]
    assert capped["epsilon_spent"] <= 0.71 + 1e-9


def test_the_protocol_compares_an_extra_method_on_the_completed_seeds_it_ran() -> None:
    def row(method: str, seed: int, bits: str) -> dict:
        return {"task": "t", "method": method, "seed": seed, "test_correct": bits, "engine_calls": 1}

    # Seed 1 is the harder one for every core method: comparing an extra method run on seed 0
    # alone against the core methods' two-seed means would flatter it.
    first = {m: "1100" if m != "eps0" else "1000" for m in protocol.METHODS}
    core = [row(m, s, first[m] if s == 0 else "0000") for s in (0, 1) for m in protocol.METHODS]
    unfinished = row("ours_auto_formats", 2, "1111")  # seed 2: no core method ran it
    rows = [row("seed", 0, "1000"), *core, row("ours_auto_formats", 0, "1110"), unfinished]
    summary = protocol.summarise(rows)["t"]
    assert summary["seeds"] == [0, 1] and summary["runs_left_out"] == ["t/ours_auto_formats/2"]
    partial = summary["methods"]["ours_auto_formats"]
    assert partial["seeds"] == [0] and partial["runs"] == 1
    assert partial["vs_eps0"] == pytest.approx(3 / 4 - 1 / 4)  # on seed 0 only, not against eps0's 1/8
    assert partial["vs_ours_auto"] == pytest.approx(3 / 4 - 1 / 2)
    assert summary["methods"]["ours_auto"]["score"] == pytest.approx(1 / 4)  # the core rows keep both seeds
    tables = protocol.markdown_tables({"t": summary})
    assert "| ours, `auto`, with record formats (seed 0 only, compared on them) | 1 |" in tables
    core = [row(m, s, "1100" if m != "eps0" else "1000") for s in (0, 1) for m in protocol.METHODS]
    rows = [row("seed", 0, "1000"), *core, row("ours_auto_formats", 0, "1110")]
    summary = protocol.summarise([*rows, row("ours_auto_formats", 1, "1111")])["t"]
    assert "seeds" not in summary["methods"]["ours_auto_formats"]
    assert summary["methods"]["ours_auto_formats"]["score"] == pytest.approx(7 / 8)
    assert summary["methods"]["ours_auto_formats"]["vs_eps0"] == pytest.approx(7 / 8 - 1 / 4)
    # An extra method is an ablation of ``ours_auto``: its paired difference to it is kept and printed.
    assert summary["methods"]["ours_auto_formats"]["vs_ours_auto"] == pytest.approx(7 / 8 - 1 / 2)
    assert "vs_ours_auto" not in summary["methods"]["ours_default"]
    assert "Paired against ours, `auto`: ours, `auto`, with record formats +0.375 [" in protocol.markdown_tables(
        {"t": summary}
    )
    with pytest.raises(SystemExit):
        protocol.main(["--methods", "ours_auto,ours_typo", "--work-dir", "unused"])


def test_the_protocol_restores_a_results_files_runs_and_runs_only_what_it_lacks(tmp_path, monkeypatch) -> None:
    # A fresh checkout has no work file: --restore-from extends the committed grid instead of rerunning it.
    def row(method: str, seed: int) -> dict:
        return {"task": "t", "method": method, "seed": seed, "test_correct": "1100", "test_score": 0.5,
                "engine_calls": 1, "seconds": 1.0}

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [row("seed", 0), *(row(m, 0) for m in protocol.METHODS)]}))
    work = tmp_path / "work"
    ran: list[str] = []
    monkeypatch.setattr(protocol, "build_task", lambda name, n_test, data_dir: None)

    def run_job(job, task, engine, cache) -> dict:
        ran.append(job.key)
        return row(job.method, job.seed)

    monkeypatch.setattr(protocol, "run_job", run_job)
    no_model = types.SimpleNamespace(LlamaCppEngine=lambda **_: None)
    monkeypatch.setitem(sys.modules, "dp_textgrad.engines.llama_cpp", no_model)
    argv = ["--tasks", "t", "--seeds", "2", "--work-dir", str(work), "--output", str(tmp_path / "out.json")]
    with pytest.raises(SystemExit):  # a mistyped method is refused before the work file is touched
        protocol.main([*argv, "--methods", "ours_defualt", "--restore-from", str(results)])
    assert not (work / "runs.jsonl").exists()
    assert protocol.main([*argv, "--restore-from", str(results)]) == 0
    assert ran == [f"t/{m}/1" for m in protocol.METHODS]  # seed 0 and the seed prompt came from the file
    assert protocol.main([*argv, "--restore-from", str(results)]) == 0  # restoring twice adds nothing
    assert len(protocol.run_records.read_runs(work / "runs.jsonl")) == 1 + 2 * len(protocol.METHODS)
    assert json.loads((tmp_path / "out.json").read_text())["tasks"]["t"]["seeds"] == [0, 1]


def test_selection_fidelity_prices_replace_one_soundly_and_simulates_both_scorers() -> None:
    # Unsampled (q = 1), our Gaussian has the same sensitivity under both relations: same price.
    import dp_accounting

    from dp_textgrad.privacy.accounting.bounds import smallest_bound

    same = fidelity.replace_one_epsilon(8.0, 1.0, 3)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(8.0), 3)
    assert same == pytest.approx(smallest_bound([event], 1e-5))
    # Subsampled, dp-accounting's REPLACE_ONE model (two sensitivities apart) costs more than
    # add/remove at the same q: an upper bound, never below it.
    sampled = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(4.0)), 3
    )
    assert fidelity.replace_one_epsilon(4.0, 0.5, 3) > smallest_bound([sampled], 1e-5)
    # DP-ES's sigma under replace-one is calibrated by its own mechanism's analysis to the target.
    sigma = fidelity.dpes_sigma("replace_one")
    assert paper.paper_epsilon_dp_accounting(paper.PaperSettings(noise_multiplier=sigma), 200, 1e-5) <= 0.71 + 1e-9
    assert paper.paper_epsilon_dp_accounting(paper.PaperSettings(noise_multiplier=0.99 * sigma), 200, 1e-5) > 0.71
    # The simulation: without noise, every record scored (ours at q = 1) always ranks the best
    # first; DP-ES's 10 records per candidate do not, and noise lowers the rank agreement.
    rng = np.random.default_rng(0)
    scores = (rng.random((6, 200)) < np.array([0.3, 0.8, 0.5, 0.75, 0.2, 0.4])[:, None]).astype(float)
    exact = fidelity.simulate(scores, "ours", 1e-9, 1.0, 200, np.random.default_rng(1))
    assert exact["p_top1"] == 1.0 and exact["expected_regret"] == 0.0 and exact["kendall_tau"] == pytest.approx(1.0)
    sampled_only = fidelity.simulate(scores, "dpes", 1e-9, 0.05, 400, np.random.default_rng(2))
    assert 0.2 < sampled_only["p_top1"] < 0.95 and sampled_only["total_error_std"] > 0.05
    noisy = fidelity.simulate(scores, "ours", 8.0, 1.0, 400, np.random.default_rng(3))
    assert noisy["kendall_tau"] < exact["kendall_tau"] and noisy["noise_std_on_mean"] == pytest.approx(
        8.0 * np.sqrt(6) / 200
    )


def test_the_winners_curse_benchmark_shows_the_bias_the_fresh_estimate_removes(tmp_path) -> None:
    # Six equal prompts: the search's released estimate is the best of six noisy ones (biased up);
    # the fresh estimate of dp.final_estimate is not. Run as the script runs, on a cache of scores.
    curse = _load_script("winners_curse")
    rng = np.random.default_rng(0)
    scores = (rng.random((6, 200)) < 0.5).astype(float)
    scores[:] = scores[0]  # equal candidates: the curse at its largest
    cache = tmp_path / "scores.json"
    cache.write_text(json.dumps({"equal": {"prompts": ["p"] * 6, "scores": scores.tolist()}}))
    output = tmp_path / "curse.json"
    assert curse.main(["--draws", "600", "--epsilons", "1", "--cache", str(cache), "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    plan, row = result["epsilons"]["1"]["plan"], result["epsilons"]["1"]["tasks"]["equal"]
    assert plan["z"] > plan["z_without_estimate"] and plan["q_f"] == 1.0
    assert row["search_bias"] > 4 * row["search_bias_se"]
    assert abs(row["fresh_bias"]) < 4 * row["fresh_bias_se"]
    assert 0.9 < row["fresh_coverage"] <= 1.0
    assert result["command"].startswith("python benchmarks/winners_curse.py")


def test_the_record_format_benchmark_writes_one_prompt_per_format_and_draw_and_pairs_them() -> None:
    formats = _load_script("record_formats")
    from dp_textgrad.tasks.record_format import split_record_format
    from dp_textgrad.tasks.support_extract import make_support_extract_task

    task = make_support_extract_task(seed=0, n_private=4, n_public=6, n_test=2)
    jobs = formats.prompts_for(task, [[0, 1], [2, 3]])
    assert len(jobs) == 2 * (1 + len(task.record_formats))
    for name, draw, prompt in jobs:
        body, record_format = split_record_format(prompt)
        assert (record_format or task.record_template) == name
        demos = [task.render_demo(task.public_examples[i], record_format) for i in ([0, 1], [2, 3])[draw]]
        assert body == "\n\n".join([task.seed_prompt, *demos])
    own, other = np.array([[1.0, 0.0, 1.0, 0.0]] * 2), np.array([[1.0, 1.0, 1.0, 0.0]] * 2)
    summary = formats.summarise("own", {"own": own, "other": other})
    assert summary["own"]["vs_task_template"] == 0.0 and summary["other"]["mean"] == 0.75
    assert summary["other"]["vs_task_template"] == pytest.approx(0.25)
    low, high = summary["other"]["vs_task_template_ci"]
    assert 0.0 <= low <= 0.25 <= high <= 1.0  # one record of four differs


# autodp's own optimiser warns while pricing DP-ES's plan at this tiny N (its figure is still finite).
@pytest.mark.filterwarnings("ignore:invalid value encountered in scalar divide:RuntimeWarning")
def test_the_protocol_runs_gsm8k_against_an_openai_compatible_endpoint(tmp_path, monkeypatch) -> None:
    # The GSM8K command of docs/benchmarks.md (--tasks gsm8k --engine-url URL --model NAME), end to
    # end over HTTP on loopback: every method of the protocol, one seed, a tiny GSM8K in the data layout.
    pytest.importorskip("autodp")
    from tests.servers import FaultServer
    from tests.tasks.test_benchmark_generation import write_tiny_data

    def solve(content: str) -> str:  # the fake model adds the last question's numbers
        asked = re.findall(r"What is (\d+) plus", content)
        return f" {2 * int(asked[-1])}" if asked else " no idea"

    monkeypatch.setattr(protocol, "N", 24)
    root = write_tiny_data(tmp_path / "data", gsm_train=40)
    output, work = tmp_path / "gsm8k.json", tmp_path / "work"
    with FaultServer(reply=solve) as server:
        argv = ["--tasks", "gsm8k", "--engine-url", server.base_url, "--model", "capable-model", "--seeds", "1",
                "--n-test", "4", "--data-dir", str(root), "--work-dir", str(work), "--output", str(output)]
        assert protocol.main(argv) == 0
    paths = {request.path for request in server.requests}
    assert paths == {"/v1/chat/completions"}, paths  # the endpoint did the work, as a chat model
    assert {request.body["model"] for request in server.requests} == {"capable-model"}
    summary = json.loads(output.read_text())["tasks"]["gsm8k"]
    assert summary["seeds"] == [0] and set(summary["methods"]) == {"seed", *protocol.METHODS}
    for method, values in summary["methods"].items():
        assert values["score"] == pytest.approx(1.0), method  # the numeric metric read every answer
    for method in ("ours_default", "ours_auto"):  # calibrated to the protocol's epsilon at this N
        assert 0.5 < summary["methods"][method]["epsilon_spent"] <= 0.71 + 1e-9
    # DP-ES keeps its published noise, so at N = 24 its 10-record batches cost more than at 200.
    assert summary["methods"]["dpes_published"]["epsilon_spent"] > 0.71
