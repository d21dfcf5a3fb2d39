"""What a federated run promises must hold against the adversary it names (issue 35, items 3 to 5).

- Shrinkage under ``distributed`` would release a function of each silo's under-noised value,
  not of the noised sum: it is refused. A silo's share is clipped before its noise, so the
  secure sum's clipping only ever acts on a 12-sigma noise draw, and the coupling term of the
  clipping and of SecAgg+'s rounding is added to the delta of the secure-sum guarantee.
- A silo computes the noise of every release itself, from what it charged: a coordinator that
  asks for a tiny feedback noise multiplier gets the charged noise, or a refusal, and the
  silo's account lists every release.
- Under secure aggregation every sum SecAgg+ can unmask (at least ``t`` silos, the
  reconstruction threshold) carries the run's full noise: each silo adds sigma^2 / t.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dp_textgrad.federated import FederatedScoring, InProcessSilos, SiloRefused, SiloState
from dp_textgrad.federated.config import load_federated_settings
from dp_textgrad.federated.placement import guarantees
from dp_textgrad.federated.run import run_federated
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.privacy.accounting.events import PureDpEvent
from dp_textgrad.privacy.accounting.serialize import event_from_dict
from dp_textgrad.tasks.synthetic import make_support_task
import dp_accounting.dp_event as dpe
from tests import helpers

PROMPTS = ["Label the message.", "Name the customer's request."]


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=120, n_test=20)


# -- item 3: shrinkage and the secure sum's fixed point ------------------------------------------


@pytest.mark.parametrize("federation", [
    {"placement": "distributed", "jse": "coordinator"},
    {"placement": "distributed", "jse": "silo"},
    {"placement": "distributed", "control_variate": True},
    {"placement": "distributed", "jse": "silo", "secure_aggregation": True},
], ids=["jse-coordinator", "jse-silo", "control-variate", "jse-silo-secure"])
def test_settings_refuse_shrinkage_under_distributed_noise(federation) -> None:
    with pytest.raises(ValueError, match="placement 'distributed'") as caught:
        load_federated_settings(None, {"federation": federation})
    assert "placement 'local'" in str(caught.value)  # the fix is named


def test_the_backend_and_the_silo_refuse_shrinkage_under_distributed_noise(task) -> None:
    with pytest.raises(ValueError, match="distributed"):
        FederatedScoring(InProcessSilos([]), [10, 10], "distributed", shrinkage="coordinator")
    with pytest.raises(ValueError, match="distributed"):
        FederatedScoring(InProcessSilos([]), [10, 10], "distributed", control_variate=True)
    with pytest.raises(ValueError, match="distributed"):
        helpers.federated_silos(task, "distributed", shrink=True)


def test_a_share_entering_the_secure_sum_is_clipped_before_its_noise(task) -> None:
    """A value bound far below the silos' sums: the clipping must act on the un-noised sums, so
    the noise survives it (clipping after the noise would return S * bound, noise-free)."""
    silos = helpers.federated_silos(task, "distributed", secure_aggregation=True)
    transport = InProcessSilos(silos)
    request = {"kind": "noised_sums", "prompts": PROMPTS, "sampling_rate": 0.5, "clip_bound": 1.0,
               "noise_multiplier": 0.05, "feedback_noise_multiplier": None, "keep_confusion": False}
    silo_std = silos[0].handle(dict(request), SiloState())["noise_std"]
    bound = 12 * silo_std + 0.5  # far below a sum of about 20 records' scores
    total = transport.ask_sum({**request, "value_bound": bound}, "sums", bound)
    assert not np.any(np.isclose(total, len(silos) * bound))
    assert np.all(np.abs(total - len(silos) * 0.5) < 12 * silo_std * math.sqrt(len(silos)))


def test_the_coupling_error_is_tiny_at_usual_sizes_and_refused_when_the_grid_is_coarse() -> None:
    from dp_textgrad.federated.secure_sum import coupling_error, value_bound

    usual = value_bound([10_000], 1.0, 1.0)
    assert 0 < coupling_error(8, 3, 1.0, usual) < 1e-30
    coarse = value_bound([5_000_000], 1.0, 1.0)  # grid step ~2.4, coarser than the noise
    assert coupling_error(1, 3, 1.0, coarse) == 1.0


def test_a_secure_sum_too_coarse_for_the_noise_is_refused_before_it_is_sent(task) -> None:
    from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism

    transport = InProcessSilos(helpers.federated_silos(task, "distributed", secure_aggregation=True),
                               keep_replies=True)
    backend = FederatedScoring(transport, [5_000_000] * 3, "distributed", secure_aggregation=True)
    mechanism = GaussianScoreMechanism(noise_multiplier=1.0, clip_bound=1.0, num_candidates=len(PROMPTS))
    with pytest.raises(ValueError, match="secure_aggregation"):
        backend.noised_sums(PROMPTS, 0.5, mechanism, keep_confusion=False)
    assert transport.seen == []


def test_the_secure_guarantee_adds_the_coupling_term_to_delta() -> None:
    events = [dpe.PoissonSampledDpEvent(0.2, dpe.GaussianDpEvent(1.5))] * 4
    plain = guarantees("distributed", 5, events, 1e-5, smallest_bound, secure_aggregation=True)
    coupled = guarantees("distributed", 5, events, 1e-5, smallest_bound, secure_aggregation=True,
                         coupling_error=1e-9)
    assert coupled[0].epsilon == pytest.approx(plain[0].epsilon)
    assert coupled[0].delta == pytest.approx(1e-5 + (1 + math.exp(plain[0].epsilon)) * 1e-9)


# -- item 4: the silo's own noise for every release ----------------------------------------------


def sums_request(noise_multiplier: float, feedback: float | None, keep: bool) -> dict:
    return {"kind": "noised_sums", "prompts": PROMPTS, "sampling_rate": 0.5, "clip_bound": 1.0,
            "noise_multiplier": noise_multiplier, "feedback_noise_multiplier": feedback, "keep_confusion": keep}


def confusion_request(feedback: float) -> dict:
    """What a deviating coordinator sends: a feedback noise multiplier of its choosing."""
    return {"kind": "noised_confusion", "indices": [0, 1], "num_candidates": len(PROMPTS), "clip_bound": 1.0,
            "noise_multiplier": 1e-9, "feedback_noise_multiplier": feedback}


def test_a_deviating_coordinator_gets_the_charged_feedback_noise_or_a_refusal(task, tmp_path) -> None:
    silo = helpers.federated_silos(task, "local", count=1, account_path=tmp_path / "silo.json")[0]
    state = SiloState()
    silo.handle(sums_request(1.0, 2.0, keep=True), state)
    reply = silo.handle(confusion_request(1e-9), state)
    # The noise the silo charged with the sums (feedback multiplier 2 on 2 matrices), not the 1e-9 asked.
    assert reply["noise_std"] == pytest.approx(2.0 * math.sqrt(2))
    assert not np.allclose(reply["confusion"], np.round(reply["confusion"]))
    with pytest.raises(SiloRefused, match="noised_confusion"):  # released once, then dropped
        silo.handle(confusion_request(1e-9), state)
    # Sums charged without feedback: no confusion counts at any noise.
    silo.handle(sums_request(1.0, None, keep=True), state)
    with pytest.raises(SiloRefused, match="feedback"):
        silo.handle(confusion_request(1e-9), state)
    account = json.loads((tmp_path / "silo.json").read_text())
    assert [r["kind"] for r in account["releases"]] == ["noised_sums", "noised_confusion", "noised_sums"]
    assert len(account["events"]) == 2
    charged = event_from_dict(account["events"][0])
    assert charged.event.noise_multiplier == pytest.approx((1.0 ** -2 + 2.0 ** -2) ** -0.5)


def test_a_silo_refuses_a_tiny_noise_multiplier_past_its_cap(task, tmp_path) -> None:
    silo = helpers.federated_silos(task, "local", count=1, max_epsilon=5.0, account_path=tmp_path / "silo.json")[0]
    state = SiloState()
    with pytest.raises(SiloRefused, match="max_epsilon"):
        silo.handle(sums_request(1e-9, None, keep=False), state)
    silo.handle(sums_request(2.0, None, keep=False), state)
    for _ in range(200):  # repeated requests at an honest multiplier: refused once the cap is reached
        try:
            silo.handle(sums_request(2.0, None, keep=False), state)
        except SiloRefused:
            break
    else:
        pytest.fail("the silo answered past its own max_epsilon")
    account = json.loads((tmp_path / "silo.json").read_text())
    assert len(account["releases"]) == len(account["events"])
    assert smallest_bound([event_from_dict(e) for e in account["events"]], silo.delta) <= 5.0


# -- item 5: dropouts -----------------------------------------------------------------------------


def test_every_sum_secure_aggregation_can_unmask_carries_the_full_noise(task, tmp_path) -> None:
    """Five silos, threshold t = 3: each silo's own account must show the noise multiplier z / sqrt(3), so
    that any 3 of them (what SecAgg+ unmasks when 2 drop out) carry the run's z."""
    from dp_textgrad.federated.secure_sum import unmask_threshold

    settings = load_federated_settings(None, {
        "federation": {"placement": "distributed", "transport": "in_process", "secure_aggregation": True,
                       "split": {"silos": 5}},
        "dp": {"epsilon": 2.0, "generations": 1, "population": 3, "sampling_rate": 0.3, "insecure_noise_seed": 3,
               "feedback": "none", "dataset_size": 120},
        "output": {"runs_root": str(tmp_path), "evaluate": False},
    })
    outcome = run_federated(settings, engine_factory=helpers.support_engine, task=task)
    t = unmask_threshold(5)
    assert t == 3
    ledger = [json.loads(line) for line in (outcome.run_dir / "ledger.jsonl").read_text().splitlines()[1:]]
    run_z = [e for e in ledger if "event" in e][-1]["event"]["event"]["noise_multiplier"]
    for account in sorted((outcome.run_dir / "silo_accounts").glob("*.json")):
        silo_z = json.loads(account.read_text())["events"][-1]["event"]["noise_multiplier"]
        assert silo_z == pytest.approx(run_z / math.sqrt(t))
    assert outcome.federation["total_noise_factor"] == pytest.approx(math.sqrt(5 / 3))
    together, colluding = outcome.federation["guarantees"]
    assert "drop out" in together["holds_if"] and "sqrt(3)" in colluding["holds_if"]


# -- item 1, federated: the dataset size ----------------------------------------------------------


def test_without_a_declared_size_each_silo_releases_a_charged_dp_count(task, tmp_path) -> None:
    """N not declared: each silo charges its own account, then releases a discrete-Laplace count; the
    coordinator's ledger charges one count (a record lives in one silo) and plans q and delta from the
    sum of the noisy counts. The silos' exact sizes appear nowhere."""
    settings = load_federated_settings(None, {
        "federation": {"placement": "local", "transport": "in_process", "split": {"silos": 3}},
        "dp": {"epsilon": 2.0, "generations": 1, "population": 3, "sampling_rate": 0.3, "insecure_noise_seed": 4,
               "feedback": "none"},
        "output": {"runs_root": str(tmp_path), "evaluate": False},
    })
    outcome = run_federated(settings, engine_factory=helpers.support_engine, task=task)
    size_epsilon = 0.05 * 2.0
    written = outcome.federation
    assert written["size_source"] == "dp_count"
    exact = [120 // 3] * 3  # not the split's sizes, but their total: the released total must not be it
    assert sum(written["silo_sizes"]) != sum(exact)
    config = json.loads((outcome.run_dir / "config.json").read_text())
    assert config["dataset_size"] == sum(written["silo_sizes"])
    first = json.loads((outcome.run_dir / "ledger.jsonl").read_text().splitlines()[1])
    assert first["event"]["type"] == "PureDpEvent" and first["event"]["epsilon"] == pytest.approx(size_epsilon)
    for account in sorted((outcome.run_dir / "silo_accounts").glob("*.json")):
        saved = json.loads(account.read_text())
        assert saved["releases"][0]["kind"] == "size_count"
        assert event_from_dict(saved["events"][0]) == PureDpEvent(size_epsilon)
    assert written["guarantees"][0]["epsilon"] <= 2.0 + 1e-6


def test_a_resumed_run_reuses_the_silos_counts_and_is_not_charged_again(task, tmp_path, monkeypatch) -> None:
    from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy
    from dp_textgrad.federated.run import saved_settings

    settings = load_federated_settings(None, {
        "federation": {"placement": "local", "transport": "in_process", "split": {"silos": 3}},
        "dp": {"epsilon": 2.0, "generations": 2, "population": 3, "sampling_rate": 0.3, "insecure_noise_seed": 4,
               "feedback": "none"},
        "output": {"runs_root": str(tmp_path), "evaluate": False},
    })
    step = DPEvolutionStrategy.step

    def step_then_interrupt(self):
        report = step(self)
        if self.generation == 1:
            raise KeyboardInterrupt
        return report

    monkeypatch.setattr(DPEvolutionStrategy, "step", step_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_federated(settings, engine_factory=helpers.support_engine, task=task)
    run_dir = next(tmp_path.glob("federated-*"))
    counts = json.loads((run_dir / "silo_counts.json").read_text())["silo_sizes"]
    monkeypatch.setattr(DPEvolutionStrategy, "step", step)
    outcome = run_federated(saved_settings(run_dir), engine_factory=helpers.support_engine, task=task,
                            run_dir=run_dir, resume=True)
    assert outcome.result.generations_run == 2 and outcome.federation["silo_sizes"] == counts
    ledger = (run_dir / "ledger.jsonl").read_text()
    assert ledger.count("PureDpEvent") == 1  # the count (the search is Gaussian)
    for account in (run_dir / "silo_accounts").glob("*.json"):
        kinds = [r["kind"] for r in json.loads(account.read_text())["releases"]]
        assert kinds.count("size_count") == 1 and kinds.count("noised_sums") == 2
