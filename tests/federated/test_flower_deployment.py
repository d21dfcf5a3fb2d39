"""A federation deployed with Flower's Deployment Runtime on this machine: a real SuperLink, one real
SuperNode per silo (each told its silo by ``--node-config``), ``flwr run`` of the Flower App that
``dp-textgrad federated-app`` writes. The engine is the tests-only scripted one, set in the app."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, "the SuperLink exited at start-up"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"the SuperLink did not open port {port} within {seconds:g} s")


def federation_files(tmp_path: Path, placement: str, secure_aggregation: bool) -> Path:
    """Two silo files of the support task and their settings (one short generation)."""
    silos = tmp_path / "silos"
    split = runner.invoke(cli.app, ["federated-split", "--task", "support", "--silos", "2", "--alpha", "1",
                                    "--out", str(silos)])
    assert split.exit_code == 0, split.output
    path = silos / "silos.yaml"
    text = path.read_text(encoding="utf-8").replace(
        "placement: central", f"placement: {placement}\n  secure_aggregation: {str(secure_aggregation).lower()}")
    path.write_text(text + "dp: {epsilon: 2.0, generations: 1, population: 3, sampling_rate: 0.5}\n"
                           "output: {evaluate: false}\n", encoding="utf-8")
    return path


def test_federated_app_refuses_what_a_deployment_cannot_do(tmp_path) -> None:
    simulated = tmp_path / "split.yaml"
    simulated.write_text("federation: {placement: local}\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["federated-app", "--silos", str(simulated), "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and "federation.silos" in result.stderr
    undeclared = tmp_path / "undeclared.yaml"
    undeclared.write_text("task: {name: support}\nfederation:\n  silos:\n    - {name: a, train: a.csv}\n",
                          encoding="utf-8")
    result = runner.invoke(cli.app, ["federated-app", "--silos", str(undeclared), "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "size" in result.stderr and "a" in result.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
@pytest.mark.parametrize("placement, secure", [("local", False), ("distributed", True)],
                         ids=["local", "distributed-secagg"])
def test_a_deployment_runs_over_a_superlink_and_one_supernode_per_silo(tmp_path, placement, secure) -> None:
    pytest.importorskip("flwr", reason="needs the [federated] extra: pip install 'dp-textgrad[federated]'")
    tools = {name: shutil.which(name) for name in ("flower-superlink", "flower-supernode", "flwr")}
    if not all(tools.values()):
        pytest.skip(f"Flower's command-line tools are not on PATH: {tools}")
    settings = federation_files(tmp_path, placement, secure)
    app, runs_root = tmp_path / "app", tmp_path / "runs"
    made = runner.invoke(cli.app, ["federated-app", "--silos", str(settings), "--out", str(app),
                                   "--runs-root", str(runs_root)])
    assert made.exit_code == 0, made.output
    assert "silo=\"silo-1\"" in made.output and "flwr run" in made.output
    module = app / "dp_textgrad_federation.py"
    # The generated module with the tests-only engine on both sides (it runs in Flower's processes).
    module.write_text(module.read_text(encoding="utf-8").replace(
        "from dp_textgrad.federated.deploy import client_app, server_app",
        f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\nfrom tests.helpers import support_engine\n"
        "from dp_textgrad.federated.deploy import client_app, server_app").replace(
        '"federation.yaml")', '"federation.yaml", engine_factory=support_engine)').replace(
        "client_app()", "client_app(engine_factory=support_engine)"), encoding="utf-8")

    # A data file left in the app's directory, of a kind Flower bundles by default (*.jsonl):
    # the app's fab-include must keep it out of what travels to the SuperLink.
    (app / "notes.jsonl").write_text('{"text": "a record that must stay here"}\n', encoding="utf-8")
    home, link = tmp_path / "flwr-home", free_port()
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "here"\n\n[superlink.here]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n', encoding="utf-8")
    env = {**os.environ, "FLWR_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    started: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> None:
        with (logs / f"{name}.log").open("w") as log:
            started.append(subprocess.Popen([tools[name.split(".")[0]] or name, *args], stdout=log,
                                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path))

    try:
        start("flower-superlink", "--insecure", "--port", str(link), "--database", str(tmp_path / "link.db"))
        wait_for_port(link, started[0])
        for silo in ("silo-1", "silo-2"):
            start(f"flower-supernode.{silo}", "--insecure", "--superlink", f"127.0.0.1:{link}",
                  "--port", str(free_port()), "--node-config", f'settings="{settings}" silo="{silo}"')
        run = subprocess.run([tools["flwr"], "run", str(app), "here", "--stream"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=420)
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
    shown = run.stdout + run.stderr + "".join(p.read_text(errors="replace") for p in logs.iterdir())
    assert run.returncode == 0, shown[-4000:]
    run_dirs = list(runs_root.glob("federated-*"))
    assert len(run_dirs) == 1, shown[-4000:]
    federation = json.loads((run_dirs[0] / "federation.json").read_text())
    assert federation["silo_names"] == ["silo-1", "silo-2"] and federation["placement"] == placement
    assert federation["secure_aggregation"] is secure
    assert federation["guarantees"][0]["epsilon"] <= 2.0 + 1e-6
    assert (run_dirs[0] / "released_prompt.txt").read_text().strip()
    # Each silo kept its own account beside its settings file, one answered event per request kind.
    accounts = sorted((settings.parent / "silo_accounts").glob("*.json"))
    assert [a.name for a in accounts] == ["001-silo-1.json", "002-silo-2.json"]
    assert all(json.loads(a.read_text())["events"] for a in accounts)
    # Only the app's two files travelled to the SuperLink (and Flower's own manifest files).
    shipped = {p.name for p in (home / "apps").rglob("*") if p.is_file()}
    assert {"dp_textgrad_federation.py", "federation.yaml"} <= shipped and "notes.jsonl" not in shipped, shipped
    # No record of a silo in any process's output.
    import csv

    with (settings.parent / "silo-1.csv").open(encoding="utf-8") as handle:
        records = [row["text"] for row in csv.DictReader(handle)]
    assert records and not any(text in shown for text in records)
