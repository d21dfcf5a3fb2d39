"""``dp-textgrad federated-split`` and ``dp-textgrad federated`` (in-process silos, scripted engine)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.settings import EngineSection
from tests.helpers import support_cue_rule

runner = CliRunner()


def scripted(*_args, **_kwargs) -> ScriptedEngine:
    return ScriptedEngine(responses=["Name the request: bill, tech, cancel, fraud or update.</PROMPT>"],
                          choice_rule=support_cue_rule)


def test_split_then_federated_run_on_the_silo_files(tmp_path, monkeypatch) -> None:
    silos_dir = tmp_path / "silos"
    split = runner.invoke(cli.app, ["federated-split", "--task", "support", "--silos", "3", "--alpha", "0.5",
                                    "--out", str(silos_dir)])
    assert split.exit_code == 0, split.output
    assert sorted(p.name for p in silos_dir.iterdir()) == ["silo-1.csv", "silo-2.csv", "silo-3.csv", "silos.yaml"]
    monkeypatch.setattr(EngineSection, "build", scripted)  # the engine federated runs build
    result = runner.invoke(cli.app, ["federated", "--silos", str(silos_dir / "silos.yaml"), "--placement", "local",
                                     "--transport", "in_process", "--generations", "1", "--population", "3",
                                     "--epsilon", "2", "--runs-root", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "noise placement local" in result.output and "Released prompt:" in result.output
    assert "against everyone, the coordinator and the other silos included" in result.output
    run_dir = next((tmp_path / "runs").glob("federated-*"))
    federation = json.loads((run_dir / "federation.json").read_text())
    assert federation["silo_names"] == ["silo-1", "silo-2", "silo-3"]
    assert federation["guarantees"][0]["epsilon"] <= 2.0 + 1e-6


def test_bad_federation_settings_are_exit_2_naming_the_key(tmp_path) -> None:
    path = tmp_path / "silos.yaml"
    path.write_text("federation:\n  placement: central\n  jse: coordinator\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["federated", "--silos", str(path), "--transport", "in_process"])
    assert result.exit_code == 2
    assert "jse" in result.stderr and "central" in result.stderr
    missing = tmp_path / "missing.csv"
    path.write_text(f"federation:\n  silos:\n    - {{name: a, train: {missing.name}}}\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["federated", "--silos", str(path), "--transport", "in_process"])
    assert result.exit_code == 2 and "missing.csv" in result.stderr


def test_an_interrupted_federated_run_resumes_without_resetting_a_budget(tmp_path, monkeypatch) -> None:
    """Interrupted after its second checkpoint, the run continues from there with its saved settings:
    the coordinator's ledger keeps its charges and each silo's own account file keeps its events."""
    from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy

    silos_dir = tmp_path / "silos"
    assert runner.invoke(cli.app, ["federated-split", "--task", "support", "--silos", "3", "--alpha", "0.5",
                                   "--out", str(silos_dir)]).exit_code == 0
    monkeypatch.setattr(EngineSection, "build", scripted)  # the engine federated runs build
    step = DPEvolutionStrategy.step

    def step_then_interrupt(self):
        report = step(self)
        if self.generation == 2:  # Ctrl-C right after the second generation's checkpoint
            raise KeyboardInterrupt
        return report

    monkeypatch.setattr(DPEvolutionStrategy, "step", step_then_interrupt)
    first = runner.invoke(cli.app, ["federated", "--silos", str(silos_dir / "silos.yaml"), "--placement", "local",
                                    "--transport", "in_process", "--generations", "3", "--population", "3",
                                    "--epsilon", "2", "--runs-root", str(tmp_path / "runs")])
    run_dir = next((tmp_path / "runs").glob("federated-*"))
    assert first.exit_code == cli.EXIT_INTERRUPTED, first.output
    assert f"dp-textgrad federated --resume {run_dir}" in first.output
    ledger = (run_dir / "ledger.jsonl").read_text().splitlines()
    accounts = {p.name: json.loads(p.read_text())["events"] for p in (run_dir / "silo_accounts").glob("*.json")}
    assert len(accounts) == 3 and all(len(events) == 2 for events in accounts.values())

    monkeypatch.setattr(DPEvolutionStrategy, "step", step)
    refused = runner.invoke(cli.app, ["federated", "--resume", str(run_dir), "--epsilon", "8"])
    assert refused.exit_code == cli.EXIT_BAD_INPUT and "--epsilon cannot be given with --resume" in refused.output
    resumed = runner.invoke(cli.app, ["federated", "--resume", str(run_dir)])
    assert resumed.exit_code == 0, resumed.output
    assert "(resumed)" in resumed.output and "Released prompt:" in resumed.output
    after = (run_dir / "ledger.jsonl").read_text().splitlines()
    assert after[:len(ledger)] == ledger and len(after) > len(ledger)  # every charge kept, new ones appended
    for name, events in accounts.items():
        now = json.loads((run_dir / "silo_accounts" / name).read_text())["events"]
        assert now[:2] == events and len(now) == 3  # the silo's account continued, not restarted
    result = json.loads((run_dir / "result.json").read_text())
    assert result["generations_run"] == 3 and result["epsilon"] <= 2.0 + 1e-6


def test_silo_account_directory_is_relative_to_the_settings_file(tmp_path) -> None:
    from dp_textgrad.federated.config import load_federated_settings

    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "silos.yaml"
    path.write_text("federation: {placement: local, silo_accounts: accounts}\n", encoding="utf-8")
    assert load_federated_settings(path).federation.silo_accounts == tmp_path / "conf" / "accounts"
