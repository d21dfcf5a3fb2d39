"""Federated DP-ES runs with the tests-only scripted engine: in-process silos and one Flower simulation.

Checks that every placement charges the single-machine events, that under ``local`` no
un-noised silo value ever reaches the coordinator, that silos enforce their own budget,
and that a silo's error text stays at the silo.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from dp_textgrad import DPEvolutionStrategy, RunOutcome
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.federated import FederatedScoring, InProcessSilos, RemoteRecords, Silo, SiloRefused, SiloState
from dp_textgrad.federated.config import load_federated_settings
from dp_textgrad.federated.run import run_federated
from dp_textgrad.privacy.data import PrivateDataError, PrivateScoringError
from dp_textgrad.tasks.synthetic import make_support_task
from tests import helpers

tg = import_textgrad()
RESPONSES = helpers.SUPPORT_RESPONSES
make_engine = helpers.support_engine


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=300, n_test=40)


silos_of = helpers.federated_silos
run_with = helpers.federated_run


@pytest.mark.parametrize("placement", ["central", "distributed", "local"])
def test_every_placement_charges_the_single_machine_events(task, placement) -> None:
    # With the fresh estimate of the released prompt too: the silos score it at its own rate.
    fresh = {"final_estimate": {"epsilon_share": 0.2}}
    prompt = tg.Variable(task.seed_prompt, role_description="instruction", requires_grad=True)
    single = DPEvolutionStrategy([prompt], task=task, engine=make_engine(), epsilon=3.0, generations=2, population=4,
                                 sampling_rate=0.3, insecure_noise_seed=7, seed=1, **fresh)
    single_result = single.run()
    optimizer, result, _ = run_with(task, silos_of(task, placement), placement, dp=fresh)
    assert optimizer.ledger.events == single.ledger.events
    assert optimizer.ledger.entries[-1].label.startswith("final estimate")
    factor = math.sqrt(3) if placement == "local" else 1.0
    assert result.final_estimate is not None and single_result.final_estimate is not None
    assert result.final_estimate.noise_std == pytest.approx(factor * single_result.final_estimate.noise_std)
    assert result.epsilon == pytest.approx(single.ledger.epsilon())
    factor = math.sqrt(3) if placement == "local" else 1.0
    assert noise_per_generation(result) == pytest.approx({g: factor * s for g, s in
                                                          noise_per_generation(single.finalise()).items()})


def noise_per_generation(result) -> dict[int, float]:
    """The noise std of one evaluation in each generation (every candidate of a generation shares it)."""
    stds: dict[int, set[float]] = {}
    for candidate in result.lineage:
        for evaluation in candidate["evaluations"]:
            stds.setdefault(evaluation["generation"], set()).add(round(evaluation["noise_std"], 12))
    assert all(len(v) == 1 for v in stds.values())
    return {g: v.pop() for g, v in stds.items()}


def test_local_silos_never_send_an_un_noised_value(task, monkeypatch) -> None:
    raw: list[np.ndarray] = []
    original = Silo._totals

    def spy(self, request, with_confusion):
        totals = original(self, request, with_confusion)
        raw.append(np.array(totals.sums, copy=True))
        if totals.confusion is not None:
            raw.append(np.array(totals.confusion, copy=True).ravel())
        return totals

    monkeypatch.setattr(Silo, "_totals", spy)
    _, _, transport = run_with(task, silos_of(task, "local"), "local")
    received = [np.asarray(v, dtype=float).ravel() for replies in transport.seen for reply in replies
                for k, v in reply.items() if k in ("sums", "confusion")]
    assert raw and received
    for value in received:
        for secret in raw:
            if secret.size == value.size:
                assert not np.allclose(value, secret, atol=1e-6)
    # Every received value differs from an un-noised one by about the silo's full noise.
    with pytest.raises(SiloRefused, match="never sends un-noised"):
        transport.silos[0].handle({"kind": "totals", "prompts": ["x"], "sampling_rate": 0.5, "clip_bound": 1.0,
                                   "with_confusion": False}, SiloState())


def test_silos_enforce_their_own_budget(task) -> None:
    silos = silos_of(task, "local", max_epsilon=0.5, delta=1e-5)
    with pytest.raises(PrivateScoringError):
        run_with(task, silos, "local")
    silo = silos[0]
    # A coordinator asking for a tiny noise multiplier is refused before any record is read.
    request = {"kind": "noised_sums", "prompts": ["a", "b"], "sampling_rate": 0.3, "clip_bound": 1.0,
               "noise_multiplier": 0.05, "feedback_noise_multiplier": None, "keep_confusion": False}
    with pytest.raises(SiloRefused, match="max_epsilon"):
        silo.handle(request, SiloState())


def test_the_coordinator_holds_no_records() -> None:
    records = RemoteRecords(120)
    assert len(records) == 120 and list(records) == []
    with pytest.raises(PrivateDataError, match="silos"):
        records.poisson_subsample(0.1, np.random.default_rng(0))
    with pytest.raises(PrivateDataError):
        records[0]


def test_shrinkage_options_run_and_central_refuses_them(task) -> None:
    for options in ({"shrinkage": "coordinator"}, {"control_variate": True}, {"shrinkage": "coordinator",
                                                                              "control_variate": True}):
        _, result, _ = run_with(task, silos_of(task, "local"), "local", **options)
        assert result.generations_run == 2
        with pytest.raises(ValueError, match="placement 'distributed'"):  # test_silo_guarantees.py: why
            FederatedScoring(InProcessSilos([]), [10, 10], "distributed", **options)
    _, result, _ = run_with(task, silos_of(task, "local", shrink=True), "local", shrinkage="silo")
    assert result.generations_run == 2
    with pytest.raises(ValueError, match="central"):
        FederatedScoring(InProcessSilos([]), [10], "central", shrinkage="coordinator")
    with pytest.raises(ValueError, match="central"):
        silos_of(task, "central", shrink=True)


def test_settings_reject_what_a_placement_cannot_do(tmp_path) -> None:
    path = tmp_path / "silos.yaml"
    path.write_text("federation: {placement: local}\ndp: {selection: exponential, feedback: none}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="dp.selection"):
        load_federated_settings(path)
    path.write_text("federation: {placement: central, jse: coordinator}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="jse"):
        load_federated_settings(path)
    path.write_text("federation: {placement: everywhere}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="federation.placement"):
        load_federated_settings(path)


def test_run_federated_in_process_writes_the_guarantees(task, tmp_path) -> None:
    settings = load_federated_settings(None, {
        "federation": {"placement": "distributed", "transport": "in_process"},
        "dp": {"epsilon": 2.0, "generations": 1, "population": 3, "sampling_rate": 0.3, "insecure_noise_seed": 3},
        "output": {"runs_root": str(tmp_path)},
    })
    outcome = run_federated(settings, engine_factory=make_engine, task=task)
    written = json.loads((outcome.run_dir / "federation.json").read_text())
    # N is not declared: each silo released a DP count, and N (q, delta) comes from their sum.
    assert written["placement"] == "distributed" and written["size_source"] == "dp_count"
    assert json.loads((outcome.run_dir / "config.json").read_text())["dataset_size"] == sum(written["silo_sizes"])
    together, alone = written["guarantees"]
    assert together["epsilon"] <= 2.0 + 1e-6 < alone["epsilon"]
    assert "seconds" not in written  # operator-only
    assert (outcome.run_dir / "released_prompt.txt").read_text().strip() == outcome.result.prompt
    # One outcome type for every run: the coordinator's RunOutcome, with what federation.json holds.
    assert isinstance(outcome, RunOutcome) and outcome.federation["guarantees"] == written["guarantees"]
    assert outcome.evaluation is not None and outcome.federation["seconds"] == outcome.seconds


def flower_settings(tmp_path, generations: int, placement: str = "local", secure_aggregation: bool = False):
    """Settings of a Flower simulation with local noise; Ray workers get this module's engines by value."""
    pytest.importorskip("flwr", reason="needs the [federated] extra: pip install 'dp-textgrad[federated]'")
    ray = pytest.importorskip("ray")
    from tests import helpers

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(helpers)
    return load_federated_settings(None, {
        "federation": {"placement": placement, "transport": "flower", "secure_aggregation": secure_aggregation},
        "dp": {"epsilon": 2.0, "generations": generations, "population": 3, "sampling_rate": 0.3},
        "output": {"runs_root": str(tmp_path), "evaluate": False},
    })


def test_a_flower_simulation_runs_end_to_end(task, tmp_path) -> None:
    settings = flower_settings(tmp_path, generations=2)
    outcome = run_federated(settings, engine_factory=make_engine, task=task)
    assert outcome.result.generations_run == 2
    assert outcome.federation["guarantees"][0]["epsilon"] <= 2.0 + 1e-6
    assert outcome.federation["total_noise_factor"] == pytest.approx(math.sqrt(3))


broken_engine = helpers.broken_support_engine


class BrokenSilos:
    """Silo engines that fail on private records; the coordinator's engine (public text only) works."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> ScriptedEngine:
        self.calls += 1
        return make_engine() if self.calls == 1 else broken_engine()


@pytest.mark.parametrize("placement, secure", [("local", False), ("distributed", True)],
                         ids=["local", "distributed-secagg"])
def test_a_silo_error_stays_at_the_silo_over_flower(task, tmp_path, capfd, placement, secure) -> None:
    # Engines that fail on every private record: each record scores 0 at its silo (failures are
    # data), the run ends as planned, and the error's text reaches nothing the coordinator releases.
    settings = flower_settings(tmp_path, generations=1, placement=placement, secure_aggregation=secure)
    outcome = run_federated(settings, engine_factory=BrokenSilos(), task=task)
    out, err = capfd.readouterr()
    assert outcome.result.generations_run == 1
    assert "card was stolen" not in out + err
    run_dir = next(tmp_path.glob("federated-*"))
    for path in run_dir.rglob("*"):
        if path.is_file() and "operator" not in path.relative_to(run_dir).parts:
            assert "card was stolen" not in path.read_text(encoding="utf-8", errors="replace"), path
    ledger = (run_dir / "ledger.jsonl").read_text().splitlines()
    # header, the silos' DP count of N (N is not declared) and the one search charge
    assert len(ledger) == 3 and '"index": 1' in ledger[2]


def test_a_kept_account_directory_caps_each_silos_lifetime(task, tmp_path) -> None:
    """Two runs sharing ``silo_accounts``: each silo's account holds the first run's events, so its
    max_epsilon refuses the second run's first step, before recording or reading anything; with a
    fresh account directory the same run goes through."""
    def settings(root: str, accounts: str):
        return load_federated_settings(None, {
            # The cap is checked on the Renyi filter bound of each silo's account: 2.88 after the first run
            # (calibrated to epsilon 2 under PLD), 3.31 with one more step.
            "federation": {"placement": "local", "transport": "in_process", "silo_max_epsilon": 3.0,
                           "silo_accounts": str(tmp_path / accounts)},
            # N declared: no count, so each silo's account holds the search steps only.
            "dp": {"epsilon": 2.0, "generations": 2, "population": 3, "sampling_rate": 0.3, "delta": 1e-5,
                   "dataset_size": 300},
            "output": {"runs_root": root, "evaluate": False},
        })

    first = run_federated(settings(str(tmp_path / "a"), "kept"), engine_factory=make_engine, task=task)
    accounts = sorted((tmp_path / "kept").glob("*.json"))
    after_first = [json.loads(p.read_text())["events"] for p in accounts]
    assert len(accounts) == 3 and all(len(e) == first.result.generations_run for e in after_first)
    with pytest.raises(PrivateScoringError):
        run_federated(settings(str(tmp_path / "b"), "kept"), engine_factory=make_engine, task=task)
    assert [json.loads(p.read_text())["events"] for p in accounts] == after_first
    fresh = run_federated(settings(str(tmp_path / "c"), "fresh"), engine_factory=make_engine, task=task)
    assert fresh.result.generations_run == first.result.generations_run
