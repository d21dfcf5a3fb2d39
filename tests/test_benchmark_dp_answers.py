"""The DP-answers benchmark's summary (benchmarks/dp_answers_utility.py) on made-up rows: retained
gains against the public-demonstrations reference, the paired interval, the cost per answer."""

from __future__ import annotations

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
