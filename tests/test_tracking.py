"""MLflow tracking against a local file store: what a run logs, and that it is release-safe
(the twin runs D and D plus one long record log the same MLflow run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dp_textgrad as dpt
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy import release
from dp_textgrad.tasks.synthetic import make_support_task
from tests.twin import base_rows, long_record, run_twin

mlflow = pytest.importorskip("mlflow", reason="MLflow tracking tests need the extra dp-textgrad[mlflow]")

from dp_textgrad.tracking import MlflowTracker  # noqa: E402

PROMPTS = ["Label the message with one of: bill, tech, cancel, fraud, update.</PROMPT>",
           "Read the customer message carefully and name its main request.</PROMPT>"]
RULE = {"refund": "bill", "charge": "bill", "app": "tech", "cancel": "cancel", "stolen": "fraud", "address": "update"}
TWIN_SCHEDULE = ("epsilon = 4\ndataset_size = 40\ngenerations = 2\npopulation = 3\nparents = 2\n"
                 "sampling_rate = 0.5\nfeedback = \"none\"\ninsecure_noise_seed = 11\n")


@pytest.fixture(autouse=True)
def file_store_allowed(monkeypatch):
    """MLflow 3 serves file stores only when asked to (the sqlite store needs the full package)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def stored_run(uri: str) -> dict:
    """The one MLflow run in the store: params, metric histories, own tags, artifact files, and its
    clock: the start, and every other timestamp (metrics, end) in milliseconds after the start."""
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dp-textgrad")
    (run,) = client.search_runs([experiment.experiment_id])
    run_id = run.info.run_id
    histories = {key: client.get_metric_history(run_id, key) for key in run.data.metrics}
    metrics = {key: [(m.step, m.value) for m in history] for key, history in histories.items()}
    start = run.info.start_time
    clock = {"end": run.info.end_time - start,
             "metrics": {key: [(m.step, m.timestamp - start) for m in history] for key, history in histories.items()}}
    artifacts: dict[str, bytes] = {}

    def walk(path: str | None) -> None:
        for item in client.list_artifacts(run_id, path):
            if item.is_dir:
                walk(item.path)
            else:
                artifacts[item.path] = Path(client.download_artifacts(run_id, item.path)).read_bytes()

    walk(None)
    return {"status": run.info.status, "params": dict(run.data.params), "metrics": metrics,
            "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}, "artifacts": artifacts,
            "start": start, "clock": clock}


def artifact_times(uri: str) -> dict[str, int]:
    """The modification time of each artifact file the local store holds (the copies of released files)."""
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("dp-textgrad").experiment_id])
    root = Path(client.download_artifacts(run.info.run_id, ""))
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_is_logged_with_params_metrics_and_the_released_files(tmp_path) -> None:
    uri = (tmp_path / "mlruns").as_uri()
    task = make_support_task(n_private=120, n_test=20)
    config = DPESConfig(epsilon=4.0, generations=3, population=3, parents=2, sampling_rate=0.4, insecure_noise_seed=3)
    engine = ScriptedEngine(responses=list(PROMPTS), choice_rule=RULE)
    outcome = dpt.optimize(task, engine, config, task_name="support", engine_name="scripted",
                           runs_root=tmp_path / "runs", observers=[MlflowTracker(uri)])
    run = stored_run(uri)
    assert run["status"] == "FINISHED"
    params = run["params"]
    assert params["epsilon"] == "4.0" and params["generations"] == "3" and params["selection"] == "gaussian"
    assert float(params["noise_multiplier"]) > 0 and "lifetime.lifetime_epsilon" in params
    assert not any("store" in key for key in params)  # the lifetime store's path is operator-only
    assert [step for step, _ in run["metrics"]["best_estimate"]] == [0, 1, 2]
    assert [v for _, v in run["metrics"]["epsilon_spent"]] == pytest.approx(
        [h.epsilon_spent for h in outcome.result.history])
    assert run["metrics"]["epsilon"][-1][1] == pytest.approx(outcome.result.epsilon)
    assert "epsilons.pld" in run["metrics"] and "final_pld" in run["metrics"]
    assert "test.released_accuracy" in run["metrics"]
    assert run["tags"]["stopped_because"] == outcome.result.stopped_because
    assert run["tags"]["run_dir"] == outcome.run_dir.name
    # Public clock: the start taken when the tracker was built (whole seconds), then one second a step.
    assert run["start"] % 1000 == 0
    assert all(offset == 1000 * step for history in run["clock"]["metrics"].values() for step, offset in history)
    assert run["clock"]["end"] == 1000 * (outcome.result.generations_run + 1)
    released = outcome.run_dir / "released_prompt.txt"
    assert run["artifacts"]["released_prompt.txt"].decode().strip() == released.read_text(encoding="utf-8").strip()
    assert {"report.html", "report.md", "result.json"} <= set(run["artifacts"])
    assert any(name.startswith("plots/") and name.endswith(".png") for name in run["artifacts"])
    # Release-safe fields only: every parameter and metric is a released field of its channel.
    for key in params:
        name = key.removeprefix("lifetime.")
        assert release.classify("events", name) in (release.PUBLIC, release.DP_OUTPUT), key
    for key in run["metrics"]:
        base = key.split(".")[0].removeprefix("final_")
        channel_kinds = {release.classify(channel, base) for channel in ("metrics", "result", "events")
                         if base in release.CHANNELS[channel]}
        if key.startswith(("final_", "test.")):
            continue  # nested parts of result's `epsilons` and `evaluation`, both released
        assert channel_kinds and release.OPERATOR_ONLY not in channel_kinds, key


def test_mlflow_payload_is_identical_for_twin_datasets(tmp_path, monkeypatch) -> None:
    """D and D plus one long record: the MLflow runs agree on everything (the record's length,
    its tokens and its scoring time never reach MLflow), their clocks too: every timestamp after
    the start (each generation's metrics, the end), and the released files' times in the artifacts."""
    rows = base_rows(40)
    logged = []
    for name, data in (("d", rows), ("dx", rows + [long_record(rows)])):
        root = tmp_path / name
        uri = (root / "mlruns").as_uri()
        capture = run_twin(root, data, monkeypatch, TWIN_SCHEDULE, extra_args=["--mlflow", uri])
        assert capture.exit_code == 0, capture.stderr
        run = stored_run(uri)
        for key, data_bytes in run["artifacts"].items():  # the run directory's name and root differ
            run["artifacts"][key] = data_bytes.replace(capture.run_dir.name.encode(), b"<RUN>").replace(
                str(root).encode(), b"<ROOT>")
        run["tags"]["run_dir"] = "<RUN>"
        run["artifact_times"] = artifact_times(uri)
        logged.append(run)
    d, dx = logged
    assert d["params"] == dx["params"]
    assert d["metrics"] == dx["metrics"]
    assert d["tags"] == dx["tags"]
    assert d["artifacts"].keys() == dx["artifacts"].keys()
    assert [k for k in d["artifacts"] if d["artifacts"][k] != dx["artifacts"][k]] == []
    assert d["clock"] == dx["clock"]
    assert d["artifact_times"] == dx["artifact_times"]


def test_a_failed_run_is_marked_failed_with_the_error_class_only(tmp_path) -> None:
    uri = (tmp_path / "mlruns").as_uri()
    tracker = MlflowTracker(uri)
    tracker({"event": "start", "epsilon": 1.0})
    tracker.fail("EngineError")
    run = stored_run(uri)
    assert run["status"] == "FAILED" and run["tags"]["failed_with"] == "EngineError"
    assert run["clock"]["end"] == 1000  # public: one second after the last step (none), not the wall clock


def test_a_refused_store_is_a_clear_error_before_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    with pytest.raises(ValueError, match=r"output.mlflow: cannot use the tracking store.*MLFLOW_ALLOW_FILE_STORE=true"):
        MlflowTracker((tmp_path / "mlruns").as_uri())


def test_missing_mlflow_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(ValueError, match=r"output.mlflow: MLflow is not installed.*dp-textgrad\[mlflow\]"):
        MlflowTracker("file:./never-created")
