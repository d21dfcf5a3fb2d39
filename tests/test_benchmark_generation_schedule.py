"""The generation-schedule benchmark (benchmarks/generation_schedule.py): which runs it starts, and its
paired summary against the library's default schedule, on made-up rows."""

from __future__ import annotations

import json

import pytest

from tests.test_benchmark_generation import load_benchmark

bench = load_benchmark("generation_schedule")


def run(seed: int, scores: list[float], **extra) -> dict:
    return {"method": "dp_gaussian_eps1", "seed": seed, "test_scores": scores, "test_score": sum(scores) / len(scores),
            "epsilon_spent": 1.0, "engine_calls": 10, "wall_seconds": 2.0, **extra}  # fmt: skip


def test_each_schedule_runs_the_grid_script_with_its_own_schedule_and_files_and_the_grids_is_never_rerun(
    monkeypatch, tmp_path
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(bench.generation_utility, "main", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(bench, "GRID_RESULTS", tmp_path / "grid.json")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    grid = [run(0, [0, 0]) | {"method": "seed"}, run(0, [1, 1]) | {"method": "nonprivate"}]
    (tmp_path / "grid.json").write_text(json.dumps({"runs": grid}))
    bench.main(["--seeds", "2", "--output", str(tmp_path / "out.json")])
    ran = {argv[argv.index("--generations") + 1] + "x" + argv[argv.index("--population") + 1]: argv for argv in calls}
    assert sorted(ran) == ["2x4", "3x6", "6x6"]  # T3K4_48 comes from the grid's committed runs
    default = ran["6x6"]
    assert default[default.index("--records") + 1] == "150" and default[default.index("--seeds") + 1] == "2"
    assert default[default.index("--methods") + 1] == "dp_gaussian_eps1"
    # No path of this machine reaches the results file's recorded command.
    assert not any(arg.startswith("/") for argv in calls for arg in argv if "generation_schedule" in arg)
    # A failed schedule stops the benchmark instead of summarising without it.
    monkeypatch.setattr(bench.generation_utility, "main", lambda argv: 2)
    with pytest.raises(SystemExit, match="T6K6_150"):
        bench.main(["--seeds", "1", "--output", str(tmp_path / "out.json")])


def test_the_summary_pairs_every_schedule_with_the_default_on_the_seeds_all_completed() -> None:
    runs = {
        "T6K6_150": [run(0, [1, 1, 0, 0]), run(1, [1, 1, 1, 0])],
        "T3K4_48": [run(0, [1, 0, 0, 0]), run(1, [1, 1, 0, 0]), run(2, [1, 1, 1, 1])],  # seed 2: not paired
        "T2K4_40": [],  # not run yet: left out, not a zero
    }
    seed_row = run(0, [0, 0, 0, 0])
    nonprivate = [run(0, [1, 1, 1, 0]), run(1, [1, 1, 1, 1]), run(2, [1, 1, 1, 1])]
    summary = bench.summarise(runs, seed_row, nonprivate)
    assert summary["seeds"] == [0, 1]
    assert set(summary["schedules"]) == {"T6K6_150", "T3K4_48"}
    grid = summary["schedules"]["T3K4_48"]
    assert grid["score"] == pytest.approx(3 / 8)
    assert grid["vs_T6K6_150"] == pytest.approx(3 / 8 - 5 / 8)
    assert grid["retained_gain"] == pytest.approx((3 / 8) / (7 / 8))
    assert grid["planned_private_evaluations"] == 3 * 4 * 48
    assert summary["schedules"]["T6K6_150"]["vs_T6K6_150"] is None  # the reference itself
    assert "| T3K4_48 | 576 | 0.375 | -0.250" in bench.table(summary)
    # Schedules with no seed in common are not paired either.
    apart = bench.summarise({"T6K6_150": runs["T6K6_150"], "T2K4_40": [run(5, [1, 1, 1, 1])]}, seed_row, nonprivate)
    assert apart["schedules"] == {} and "no seed" in apart["note"]
    # Without the reference schedule there is nothing to pair against.
    assert bench.summarise({"T3K4_48": runs["T3K4_48"]}, seed_row, nonprivate)["schedules"] == {}
