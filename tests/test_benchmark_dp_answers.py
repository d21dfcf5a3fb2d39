"""The DP-answers benchmark's summary (benchmarks/dp_answers_utility.py) on made-up rows: retained
gains against the public-demonstrations reference, the paired interval, the cost per answer."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from tests.test_benchmark_generation import load_benchmark

bench = load_benchmark("dp_answers_utility")


def row(name, seed, eps, scores, **extra):
    return {"task": "support_extract", "row": name, "seed": seed, "epsilon": eps,
            "test_score": sum(scores) / len(scores), "test_scores": scores, **extra}


def rows():
    out = []
    for seed in (0, 1):
        out += [row("seed", seed, None, [0.0, 0.0, 0.0, 0.0]),
                row("teachers_nonprivate", seed, None, [1.0, 1.0, 0.0, 0.0], answer_seconds=12.0,
                    answer_engine_calls=600, answer_prompt_tokens=9000, answered=6),
                row("public_dp_es", seed, 4.0, [1.0, 1.0, 1.0, 1.0]),
                row("dp_es", seed, 4.0, [1.0, 0.0, 0.0, 0.0]),
                row("dp_demos_dp_es", seed, 4.0, [1.0, 1.0, 1.0, 0.0])]
    return out


def test_retained_gain_is_against_the_public_reference_per_seed() -> None:
    summary = bench.summarise(rows())
    assert summary["rows"]["seed"]["mean"] == 0.0
    assert summary["rows"]["dp_demos_dp_es eps4"]["mean"] == 0.75
    assert summary["retained"]["dp_demos_dp_es eps4"]["mean"] == 0.75
    assert summary["retained"]["dp_es eps4"]["mean"] == 0.25
    assert summary["retained"]["teachers_nonprivate eps4"]["mean"] == 0.5
    assert summary["cost_per_answer"]["engine_calls"] == 100.0


def test_the_paired_interval_holds_the_difference() -> None:
    summary = bench.summarise(rows())
    diff = summary["paired"]["dp_demos_dp_es - public_dp_es eps4"]
    assert diff["mean"] == -0.25 and diff["low"] <= -0.25 <= diff["high"]
    diff = summary["paired"]["dp_demos_dp_es - dp_es eps4"]
    assert diff["mean"] == 0.5 and 0.0 < diff["low"] <= 0.5 <= diff["high"]
    assert "dp_demos_dp_es eps4 | 0.750" in bench.table({"summary": summary})


def test_a_fresh_checkout_restores_the_committed_grid_and_rebuilds_its_summary(tmp_path, monkeypatch) -> None:
    # --restore-from copies a results file's runs into an empty work file: nothing left to run,
    # and the summary rebuilt from the restored runs is the committed one.
    committed = Path(bench.__file__).parent / "results" / "dp_answers_support_extract.json"
    stored = json.loads(committed.read_text(encoding="utf-8"))
    monkeypatch.setattr(bench, "run_row", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran a row")))
    no_model = types.SimpleNamespace(LlamaCppEngine=lambda: None)
    monkeypatch.setitem(sys.modules, "dp_textgrad.engines.llama_cpp", no_model)
    done = {bench.key(r) for r in stored["runs"]}
    # the rows the stored grid holds for seeds 0 and 1 at both epsilons (the rest ran on fewer)
    rows = sorted({r["row"] for r in stored["runs"]
                   if all(("support_extract", r["row"], seed, eps) in done for seed in (0, 1)
                          for eps in ([None] if r["row"] in bench.EPSILON_FREE else [1.0, 4.0]))})
    assert len(rows) >= 6
    argv = ["--seeds", "2", "--rows", *rows, "--epsilons", "1", "4", "--work-dir", str(tmp_path),
            "--output", str(tmp_path / "out.json"), "--restore-from", str(committed)]
    monkeypatch.setattr(bench, "build_task", lambda setup, seed, data_dir: None)
    assert bench.main(argv) == 0
    assert json.loads((tmp_path / "out.json").read_text())["summary"] == stored["summary"]
