"""Generation tasks from the command line: ``task.kind: generate`` in a run file, through
``optimize``, ``budget`` and ``evaluate``, with the tests-only ScriptedEngine patched in.

The scripted engine answers a record with its city when the prompt asks for the city, and
"none" otherwise; asked to rewrite a prompt, it writes one that asks for the city. So the seed
prompt scores 0, a rewritten prompt scores 1, and every number below is known.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.settings import EngineSection
from tests.test_cli import one_error_line

runner = CliRunner()

CITIES = ["Oslo", "Lima", "Rome", "Paris"]
ASK_CITY = "Name the city of the order."
SEED = "Read the order."


def answer(prompt: str, system: str | None) -> str:
    if prompt.rstrip().endswith("Output:"):  # a record to answer
        last = prompt.rsplit("Input:", 1)[-1]
        match = re.search(r"shop in (\w+)", last)
        asks = "city" in prompt.split("Input:", 1)[0].lower()
        return " " + (match.group(1) if match and asks else "none")
    if "Grade" in prompt or "grade" in (system or "").lower():  # a judge's request
        return "Grade: 10/10" if "Reference" in prompt and _same_city(prompt) else "Grade: 0/10"
    return ASK_CITY + "</PROMPT>"  # a rewrite


def _same_city(prompt: str) -> bool:
    return any(prompt.count(city) >= 2 for city in CITIES)


def write_data(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, start, n in (("train", 0, 60), ("test", 100, 24)):
        rows = [{"input": f"order {i} went to a shop in {CITIES[i % 4]}", "answer": {"city": CITIES[i % 4]}}
                for i in range(start, start + n)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def gen_config(tmp_path: Path, metric: str = "exact", extra: str = "", engine: str = "kind: llama_cpp") -> Path:
    write_data(tmp_path / "data")
    config = tmp_path / "gen.yaml"
    config.write_text(
        "task:\n  kind: generate\n  train: data/train.jsonl\n  test: data/test.jsonl\n"
        "  target_column: answer.city\n"
        f"  metric: {metric}\n  seed_prompt: {SEED}\n  max_new_tokens: 8\n"
        "  description: Orders sent to shops; the answer is the city of the shop.\n"
        f"{extra}"
        f"engine:\n  {engine}\n"
        "dp:\n  epsilon: 4\n  generations: 2\n  population: 3\n  parents: 2\n  sampling_rate: 0.5\n"
        "  dataset_size: 60\n  insecure_noise_seed: 7\n"
        f"output:\n  runs_root: {(tmp_path / 'runs').as_posix()}\n",
        encoding="utf-8",
    )
    return config


@pytest.fixture
def engines(monkeypatch) -> list[ScriptedEngine]:
    built: list[ScriptedEngine] = []

    def build(section):
        built.append(ScriptedEngine(responses=answer))
        return built[-1]

    monkeypatch.setattr(EngineSection, "build", build)
    return built


def test_optimize_runs_a_generation_task_end_to_end(tmp_path, engines) -> None:
    config = gen_config(tmp_path, engine="kind: openai\n  model: local\n  base_url: http://127.0.0.1:9/v1")
    result = runner.invoke(cli.app, ["optimize", "--config", str(config)], terminal_width=200)
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    written = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    ev = written["evaluation"]
    # Old keys kept; the metric and its interval added.
    assert ev["metric"] == "exact" and ev["interval"] == "wilson" and ev["n_test"] == 24
    assert ev["seed_accuracy"] == 0.0 and 0.0 <= ev["released_accuracy"] <= 1.0
    assert ev["seed_low"] == 0.0 and 0.0 < ev["seed_high"] < 0.2  # Wilson at 0 of 24
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "exact match, n = 24 [95% Wilson interval]" in report
    assert "Test exact match" in result.output
    assert 0 < written["epsilon"] <= 4.0 + 1e-9


def test_a_non_binary_metric_gets_bootstrap_intervals_in_the_report(tmp_path, engines) -> None:
    from dp_textgrad.report import write_report

    config = gen_config(tmp_path, metric="f1", engine="kind: openai\n  model: local")
    result = runner.invoke(cli.app, ["optimize", "--config", str(config), "--generations", "1"],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    ev = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["evaluation"]
    assert ev["metric"] == "f1" and ev["interval"] == "bootstrap" and ev["mcnemar_p"] is None
    write_report(run_dir)
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "token F1, n = 24 [95% bootstrap interval]" in report and "McNemar" not in report
    # One generation: no feedback is read, so none was charged, and the report says none (issue 47).
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()[1:]]
    assert ledger and not any(entry["metadata"].get("feedback_candidates") for entry in ledger)
    assert "feedback" not in report.split("## Guarantee")[0] and "histogram feedback" not in report
    assert "Test token F1" in result.output and "bootstrap" in result.output


def test_budget_plans_a_generation_run_file(tmp_path) -> None:
    config = gen_config(tmp_path)
    result = runner.invoke(cli.app, ["budget", "--config", str(config), "--epsilon", "4"])
    assert result.exit_code == 0, result.output
    assert "noise multiplier z =" in result.output and "used" in result.output


def test_evaluate_scores_prompts_of_a_generation_task(tmp_path, engines) -> None:
    config = gen_config(tmp_path, metric="f1")
    mine = tmp_path / "mine.txt"
    mine.write_text(ASK_CITY + "\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["evaluate", "--config", str(config), "--seed-prompt", "--prompt", str(mine),
                                     "--json"])
    assert result.exit_code == 0, result.output
    seed, better = [json.loads(line) for line in result.stdout.splitlines()]
    assert seed["metric"] == "f1" and seed["metric_label"] == "token F1" and seed["interval"] == "bootstrap"
    assert seed["score"] == 0.0 and better["score"] == 1.0 and better["n_test"] == 24
    assert better["difference"] == 1.0 and better["mcnemar_p"] is None and better["discordant"] is None
    table = runner.invoke(cli.app, ["evaluate", "--config", str(config), "--seed-prompt", "-p", str(mine)],
                          terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "token F1" in table.stdout and "paired bootstrap" in table.stdout and "McNemar" not in table.stdout
    # Only test records were generated for: none of the private train file.
    asked = [call.prompt for engine in engines for call in engine.history]
    assert asked and all("order 1" in p.rsplit("Input:", 1)[-1] for p in asked)


def test_a_judge_grades_with_the_run_engine(tmp_path, engines) -> None:
    config = gen_config(tmp_path, metric="judge", extra="  metric_options:\n    max_tokens: 8\n",
                        engine="kind: openai\n  model: local")
    mine = tmp_path / "mine.txt"
    mine.write_text(ASK_CITY + "\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["evaluate", "--config", str(config), "--seed-prompt", "-p", str(mine), "--json"])
    assert result.exit_code == 0, result.output
    seed, better = [json.loads(line) for line in result.stdout.splitlines()]
    assert seed["metric"] == "judge" and better["score"] == 1.0 and seed["score"] == 0.0
    (engine,) = engines  # one engine: it generates and it judges
    assert any(call.max_tokens == 8 for call in engine.history)


@pytest.mark.parametrize("extra, field", [
    ("  labels: [a, b]\n", "task.labels: applies only to task.kind: classify"),
    ("  label_column: y\n", "task.label_column"),
    ("  metric_options:\n    tolerence: 1\n", "task.metric_options"),
])
def test_a_bad_generation_run_file_is_one_line_before_any_engine(tmp_path, monkeypatch, extra, field) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: pytest.fail("no engine for a bad task"))
    config = gen_config(tmp_path, metric="numeric", extra=extra)
    result = runner.invoke(cli.app, ["optimize", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert field in one_error_line(result)
    assert not list((tmp_path / "runs").glob("run-*/ledger.jsonl"))


def test_judge_with_ray_and_federated_generation_are_refused_by_name(tmp_path) -> None:
    config = gen_config(tmp_path, metric="judge", engine="kind: openai\n  model: local")
    result = runner.invoke(cli.app, ["optimize", "--config", str(config), "--distributed"])
    assert result.exit_code == 2 and "judge cannot score on Ray actors" in one_error_line(result)
    silos = tmp_path / "silos.yaml"
    silos.write_text(config.read_text(encoding="utf-8").replace("  metric: judge\n", "  metric: exact\n"),
                     encoding="utf-8")
    from dp_textgrad.federated.config import load_federated_settings

    with pytest.raises(Exception, match="task.kind: federated runs take classification tasks only"):
        load_federated_settings(silos)


# -- Ray: a generation task scores on actors as in this process; a judge is refused ------------------
def _city_engine() -> ScriptedEngine:
    return ScriptedEngine(responses=answer)


def test_generation_totals_on_ray_actors_equal_the_local_ones(tmp_path) -> None:
    ray = pytest.importorskip("ray", reason="needs the [ray] extra")
    import sys
    import warnings

    import numpy as np

    from dp_textgrad.distributed import RayScoringPool
    from dp_textgrad.dp_es.scoring_backends import LocalScoring
    from dp_textgrad.settings import TaskSection

    write_data(tmp_path / "data")
    files = {"train": tmp_path / "data" / "train.jsonl", "test": tmp_path / "data" / "test.jsonl"}
    task = TaskSection(kind="generate", target_column="answer.city", metric="f1", **files).build()
    judged = TaskSection(kind="generate", target_column="answer.city", metric="judge", **files).build(_city_engine())
    with pytest.raises(ValueError, match="cannot score on Ray actors"):
        RayScoringPool(_city_engine, actors=2)(judged, _city_engine(), np.random.default_rng(0), True)
    prompts = [SEED, ASK_CITY]
    local = LocalScoring(task, _city_engine(), np.random.default_rng(0)).totals(prompts, 1.0, 1.0, True)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with warnings.catch_warnings():  # Ray's tip about accelerator variables says nothing about this test
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        with RayScoringPool(_city_engine, actors=2) as pool:
            spread = pool(task, _city_engine(), np.random.default_rng(0), True).totals(prompts, 1.0, 1.0, True)
    finally:
        ray.shutdown()
    assert np.array_equal(local.sums, spread.sums) and np.array_equal(local.confusion, spread.confusion)
    assert list(spread.sums) == [0.0, 60.0] and spread.confusion.shape == (2, len(task.feedback.names))


# -- the evaluation block: binary metrics as before, bootstrap for the others ------------------------
def test_compare_paired_bootstraps_a_graded_metric_and_keeps_wilson_for_a_binary_one() -> None:
    import numpy as np
    from scipy import stats

    from dp_textgrad.report.plots import accuracy_ci
    from dp_textgrad.workflow import compare_paired

    rng = np.random.default_rng(0)
    seed = rng.uniform(0.0, 0.6, 80)
    released = np.clip(seed + rng.uniform(0.0, 0.3, 80), 0, 1)
    graded = compare_paired(seed, released, binary=False, metric="f1")
    assert graded.interval == "bootstrap" and graded.metric == "f1" and graded.mcnemar_p is None
    assert graded.seed_low < seed.mean() < graded.seed_high
    assert 0 < graded.difference_low < graded.difference < graded.difference_high
    expected = stats.bootstrap((seed, released), lambda a, b, axis=-1: np.mean(b - a, axis=axis), paired=True,
                               vectorized=True, n_resamples=9999, method="percentile", random_state=0)
    assert graded.difference_low == pytest.approx(expected.confidence_interval.low)
    ones = (rng.uniform(size=50) < 0.5).astype(float)
    binary = compare_paired(ones, np.ones(50))
    assert binary.interval == "wilson" and binary.metric == "accuracy" and binary.mcnemar_p is not None
    assert (binary.seed_low, binary.seed_high) == pytest.approx(accuracy_ci(ones.mean(), 50))


def test_an_old_evaluation_block_still_renders_with_wilson_intervals() -> None:
    from dp_textgrad.report.markdown import evaluation

    old = {"seed_accuracy": 0.5, "released_accuracy": 0.75, "n_test": 40, "difference": 0.25,
           "difference_low": 0.1, "difference_high": 0.4, "mcnemar_p": 0.01, "discordant": [12, 2]}
    text = "\n".join(evaluation({"evaluation": old}, None))
    assert "accuracy, n = 40 [95% Wilson interval]" in text and "McNemar" in text


def test_ledger_finds_a_generation_files_runs(tmp_path, engines) -> None:
    # Issue 46: `ledger --dataset FILE` read every file as classification data (asking for a label
    # column), then said "no runs recorded" for a generation file with runs.
    config = gen_config(tmp_path, engine="kind: openai\n  model: local\n  base_url: http://127.0.0.1:9/v1")
    for _ in range(3):
        done = runner.invoke(cli.app, ["optimize", "--config", str(config), "--generations", "1"], terminal_width=200)
        assert done.exit_code == 0, done.output
    listing = runner.invoke(cli.app, ["ledger", "--dataset", str(tmp_path / "data" / "train.jsonl"), "--target-column",
                                      "answer.city", "--runs-root", str(tmp_path / "runs")], terminal_width=200)
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("run-") == 3 and "no runs recorded" not in listing.output


def test_the_console_names_the_task_family_and_its_metric(tmp_path, engines) -> None:
    # Issue 46: the progress line said "best estimate" of an unnamed score on a generation task.
    config = gen_config(tmp_path, engine="kind: openai\n  model: local\n  base_url: http://127.0.0.1:9/v1")
    result = runner.invoke(cli.app, ["optimize", "--config", str(config)], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Task: generation (the prompt writes an answer), scored by exact match" in text
    assert "generation 1/2: best estimate of exact match" in text
    start = json.loads(runner.invoke(cli.app, ["optimize", "--config", str(config), "--json"]).output.splitlines()[1])
    assert start["event"] == "start" and (start["task_kind"], start["metric"]) == ("generate", "exact")
