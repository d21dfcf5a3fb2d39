"""What a user touches around the labelling phase: ``dp-textgrad budget`` plans it, the report shows
its release, and ``dp-textgrad optimize`` runs it end to end on the local model from a run file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.dp_es.config import DEFAULT_TEACHER_DEMOS, DPESConfig, LabellingConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.privacy.accounting import default_accountants
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.report.html import markdown_to_html
from dp_textgrad.report.markdown import build_markdown
from dp_textgrad.settings import EngineSection

runner = CliRunner()

SCHEDULE = dict(epsilon=4.0, generations=2, population=2, parents=1, sampling_rate=0.5)
SCHEDULE_FLAGS = ["--generations", "2", "--population", "2", "--parents", "1", "--sampling-rate", "0.5"]


def flat(output: str) -> str:
    """The console's output on one line (rich wraps long lines at the terminal's width)."""
    return " ".join(output.split())


def printed_epsilons(output: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s+(\w+): ([0-9.]+)", output, re.MULTILINE)}


def labelling_line(output: str) -> dict[str, float]:
    text = flat(output)
    match = re.search(
        r"Labelling phase \(before the search\): GNMax, vote noise sigma = ([0-9.]+) votes, (\d+) public inputs "
        r"\(queries\), (\d+) teachers, up to (\d+) demonstrations each; its own epsilon ([0-9.]+) \(share ([0-9.]+)",
        text,
    )
    assert match, text
    sigma, queries, teachers, demos, epsilon, share = match.groups()
    return dict(sigma=float(sigma), queries=int(queries), teachers=int(teachers), max_demos=int(demos),
                epsilon=float(epsilon), share=float(share))


# -- budget -------------------------------------------------------------------------------------
def test_budget_plans_the_labelling_phase_and_the_composed_total() -> None:
    result = runner.invoke(cli.app, ["budget", "--epsilon", "4", "--dataset-size", "400", "--labelling-queries", "16",
                                     "--no-llm-operators", *SCHEDULE_FLAGS])
    assert result.exit_code == 0, result.output
    shown = labelling_line(result.output)
    # The same plan optimize makes: the labelling at its share, the search calibrated to what is left.
    config = DPESConfig(**SCHEDULE, dataset_size=400, llm_operators=False, delta=1e-5,
                        labelling=LabellingConfig(queries=16).resolved(16, 400))
    plan = RunPlan.calibrated(config)
    assert shown["queries"] == 16 and shown["teachers"] == 20  # 400 / 20 teachers
    assert shown["max_demos"] == DEFAULT_TEACHER_DEMOS
    assert shown["sigma"] == pytest.approx(plan.labelling_sigma, rel=1e-3)
    assert shown["share"] == 0.5
    assert shown["epsilon"] == pytest.approx(min(plan.labelling_epsilons(1e-5).values()), rel=1e-3)
    assert shown["epsilon"] == pytest.approx(2.0, abs=0.01)  # its share of 4, calibrated alone
    z = float(re.search(r"noise multiplier z = ([0-9.]+)", result.output).group(1))
    assert z == pytest.approx(plan.value, abs=1e-4)
    # The total includes the labelling (RunPlan.epsilons composes both), and fits the budget.
    printed = printed_epsilons(result.output)
    expected = plan.epsilons(1e-5, default_accountants())
    for name, value in expected.items():
        assert printed[name] == pytest.approx(value, abs=1e-4), name
    assert 3.5 < printed["used"] <= 4.0 + 1e-4
    assert RunPlan.calibrated(config.model_copy(update={"labelling": None})).value < z  # the search lost some


def test_budget_resolves_the_labelling_of_a_run_file_from_its_public_pool(tmp_path) -> None:
    (tmp_path / "pool.txt").write_text("".join(f"public message {i}\n" for i in range(5)), encoding="utf-8")
    run = tmp_path / "run.toml"
    run.write_text('[task]\nname = "support"\npublic_inputs = "pool.txt"\n\n[dp.labelling]\nepsilon_share = 0.3\n',
                   encoding="utf-8")
    result = runner.invoke(cli.app, ["budget", "--config", str(run), "--epsilon", "2", *SCHEDULE_FLAGS])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    # queries: min(16, the 5 public inputs); N not declared: the teachers come from the DP count.
    assert "GNMax, vote noise sigma =" in text and "5 public inputs (queries)" in text
    assert "teachers from the DP count of N (N / 20, between 10 and 100)" in text
    assert "(share 0.3 of epsilon" in text and "N not declared: a DP count of N" in text
    # The built-in pool counts too (options.public_inputs), and a flag overrides the file.
    # With --config, N is the run file's (as optimize reads it), never a budget flag.
    run.write_text('[task]\nname = "support"\noptions = { public_inputs = 40 }\n\n[dp]\ndataset_size = 3000\n\n'
                   '[dp.labelling]\n', encoding="utf-8")
    result = runner.invoke(cli.app, ["budget", "--config", str(run), "--epsilon", "2",
                                     "--labelling-teachers", "50", *SCHEDULE_FLAGS])
    assert result.exit_code == 0, result.output
    assert "16 public inputs (queries), 50 teachers" in flat(result.output)


@pytest.mark.parametrize("args, message", [
    (["--noise-multiplier", "1", "--labelling-queries", "4"], "--labelling-queries: the labelling phase is "
                                                              "calibrated to its share of --epsilon"),
    (["--epsilon", "4", "--labelling-share", "0.3"], "--labelling-queries: a labelling phase needs the number"),
    (["--epsilon", "4", "--labelling-queries", "4", "--labelling-share", "1"], "dp.labelling.epsilon_share"),
    (["--epsilon", "4", "--labelling-queries", "4", "--labelling-teachers", "1"], "dp.labelling.teachers"),
])
def test_budget_refuses_a_bad_labelling_plan_in_one_line(args, message) -> None:
    result = runner.invoke(cli.app, ["budget", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_budget_refuses_more_queries_than_the_run_files_pool(tmp_path) -> None:
    (tmp_path / "pool.txt").write_text("one\ntwo\n", encoding="utf-8")
    run = tmp_path / "run.yaml"
    run.write_text("task:\n  name: support\n  public_inputs: pool.txt\ndp:\n  labelling:\n    queries: 3\n",
                   encoding="utf-8")
    result = runner.invoke(cli.app, ["budget", "--config", str(run), "--epsilon", "2"])
    assert result.exit_code == 2, result.output
    assert "dp.labelling.queries: 3 inputs to label, but the task has 2 public inputs" in flat(result.stderr)


# -- report -------------------------------------------------------------------------------------
def fake_run(labelling: dict | None) -> tuple[dict, dict]:
    config = {"task": "custom (train.csv)", "engine": "llama_cpp", "noise_multiplier": 1.2,
              "config": {**SCHEDULE, "selection": "gaussian", "feedback": "none", "dataset_size": 40}}
    result = {"prompt": "Read the message.", "epsilon": 3.99, "delta": 1e-5, "epsilons": {"pld": 3.99, "rdp": 4.6},
              "stopped_because": "budget", "estimate": None, "lineage": [], "labelling": labelling}
    return config, result


LABELLING = {
    "mechanism": "gnmax", "sigma": 8.94, "num_labels": 2, "queries": 4, "teachers": 4, "max_demos": 4,
    "answered": 3, "epsilon_share": 0.5, "epsilon": 1.9987, "epsilons": {"pld": 1.9987},
    "labels": ["bill", None, "tech", "bill"],
    "examples": [{"text": "where is my refund", "label": "bill"},
                 {"text": "the router | modem is dead", "label": "tech"},
                 {"text": "a charge I do not know", "label": "bill"}],
}


def test_the_report_shows_the_labelled_demonstrations_as_dp_outputs(tmp_path) -> None:
    config, result = fake_run(LABELLING)
    markdown = build_markdown(tmp_path, config, result, [], {})
    section = markdown.split("## DP-labelled demonstrations", 1)[1].split("\n## ", 1)[0]
    assert "| answered | **3 of 4** public inputs |" in section
    assert "| teachers | 4 (up to 4 demonstrations each) |" in section
    assert "GNMax (Gaussian noisy argmax): vote noise sigma = 8.94 votes" in section
    assert "| labelling epsilon | 1.9987 alone (calibrated to a share of 0.5 of the budget)" in section  # rounded up
    assert "The inputs are public; the labels, and which and how many inputs were answered, are DP outputs" in section
    assert "| 1 | where is my refund | bill |" in section
    assert "| 2 | the router / modem is dead | tech |" in section  # a cell cannot break the table
    page = markdown_to_html(markdown, {})
    assert "<h2>DP-labelled demonstrations</h2>" in page and "<td>the router / modem is dead</td>" in page
    assert "<td><b>3 of 4</b> public inputs</td>" in page
    # Confident GNMax says its threshold; a run without a labelling phase has no section.
    confident = {**LABELLING, "mechanism": "confident_gnmax", "threshold": 3.0, "threshold_sigma": 1.5}
    assert "confident GNMax: vote noise sigma = 8.94 votes; answers only where the noisy top count reaches 3 votes " \
           "(threshold noise sigma 1.5)" in build_markdown(tmp_path, *fake_run(confident), [], {})
    none_answered = {**LABELLING, "answered": 0, "examples": [], "labels": [None] * 4}
    assert "No input was answered" in build_markdown(tmp_path, *fake_run(none_answered), [], {})
    assert "DP-labelled" not in build_markdown(tmp_path, *fake_run(None), [], {})


# -- optimize, end to end on the local model ------------------------------------------------------
BILL = ["I was charged twice for {}", "please refund the fee on {}", "my bill for {} is too high",
        "why is there an extra charge for {}", "the payment for {} was taken twice"]
TECH = ["the app crashes when I open {}", "{} stopped working this morning", "I cannot log in to {}",
        "the connection to {} keeps dropping", "{} shows an error and will not load"]
THINGS = ["my phone", "the router", "my account", "the tv box"]
POOL = ["there is a fee on my bill I do not understand", "the wifi keeps dropping every evening",
        "you took my payment twice", "the app will not start", "refund the extra charge please", "no signal at all"]


def write_task(directory: Path) -> Path:
    records = [(t.format(thing), label) for label, templates in (("bill", BILL), ("tech", TECH))
               for t in templates for thing in THINGS]  # 40 private records, 2 labels
    test = records[::4]
    for name, rows in (("train.csv", records), ("test.csv", test)):
        (directory / name).write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows), encoding="utf-8")
    (directory / "pool.txt").write_text("\n".join(POOL) + "\n", encoding="utf-8")
    run = directory / "run.yaml"
    run.write_text(
        "task:\n  train: train.csv\n  test: test.csv\n  public_inputs: pool.txt\n"
        "  description: Messages to a support desk, about a bill or a technical problem.\n"
        "  record_template: \"Message: {text}\\nCategory:\"\n"
        "dp:\n  epsilon: 4\n  dataset_size: 40\n  generations: 1\n  population: 2\n  parents: 1\n"
        "  sampling_rate: 0.5\n  insecure_noise_seed: 11\n"
        "  labelling:\n    teachers: 4\n    queries: 4\n"
        f"output:\n  runs_root: {(directory / 'runs').as_posix()}\n",
        encoding="utf-8",
    )
    return run


def charges(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text(encoding="utf-8").splitlines()[1:]]


def planned_atoms(run_dir: Path) -> list[dict]:
    """The plan's events, one per charge in order (the labelling phase first), from the released files."""
    config = DPESConfig(**json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["config"])
    plan = RunPlan.with_value(config, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    assert plan.labelling_event is not None
    return [event_to_dict(event) for event in [plan.labelling_event, *plan.charges()]]


def test_optimize_labels_public_inputs_and_charges_exactly_its_plan(tmp_path, monkeypatch, llama_engine) -> None:
    run = write_task(tmp_path)
    monkeypatch.setattr(EngineSection, "build", lambda section: llama_engine)  # the session's local model
    result = runner.invoke(cli.app, ["optimize", "--config", str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    ledger = charges(run_dir)
    assert [c["label"] for c in ledger].count("labelling") == 1 and ledger[0]["label"] == "labelling"
    assert [c["event"] for c in ledger] == planned_atoms(run_dir)  # the ledger is the plan, atom for atom
    outcome = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    labelling = outcome["labelling"]
    assert labelling["queries"] == 4 and labelling["teachers"] == 4 and 0 <= labelling["answered"] <= 4
    assert [e["text"] for e in labelling["examples"]] == [t for t, lab in zip(POOL, labelling["labels"]) if lab]
    assert {e["label"] for e in labelling["examples"]} <= {"bill", "tech"}
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## DP-labelled demonstrations" in report
    assert f"| answered | **{labelling['answered']} of 4** public inputs |" in report
