"""Secure aggregation of the distributed placement (Flower SecAgg+), with the tests-only scripted engine.

The coordinator must receive only sums; the sums must equal the plain sum of the silos'
noised values (up to SecAgg+'s fixed-point rounding), so a run with secure aggregation
releases what the same run without it releases; settings it cannot serve are refused
before any charge.
"""

from __future__ import annotations

import json
import sys

import pytest

from dp_textgrad.federated.config import load_federated_settings
from dp_textgrad.federated.placement import guarantees
from dp_textgrad.federated.run import run_federated
from dp_textgrad.federated.secure_sum import MAX_SILOS, value_bound
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.tasks.synthetic import make_support_task
import dp_accounting.dp_event as dpe
from tests import helpers

make_engine = helpers.support_engine


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=240, n_test=30)


def run_in_process(task, secure_aggregation: bool):
    # Both runs' silos calibrate their noise share to the secure sum's threshold: the same values.
    silos = helpers.federated_silos(task, "distributed", secure_aggregation=True)
    return helpers.federated_run(task, silos, "distributed", secure_aggregation=secure_aggregation)


def estimates(result) -> list[float]:
    return [e["estimate"] for c in result.lineage for e in c["evaluations"]]


def test_the_coordinator_receives_only_sums_and_releases_what_plain_summing_releases(task) -> None:
    plain_optimizer, plain, plain_transport = run_in_process(task, secure_aggregation=False)
    secure_optimizer, secure, transport = run_in_process(task, secure_aggregation=True)
    # Every exchange gave the coordinator one value, the sum; without secure aggregation, one per silo.
    assert transport.seen and all(len(replies) == 1 for replies in transport.seen)
    assert all(len(replies) == 3 for replies in plain_transport.seen)
    # Same silos, same seeds: the same noised sums, so the same run, charged the same.
    assert secure.prompt == plain.prompt
    assert estimates(secure) == pytest.approx(estimates(plain), abs=1e-9)
    assert secure_optimizer.ledger.events == plain_optimizer.ledger.events


def test_the_value_bound_is_public_and_wide() -> None:
    # Declared sizes, clip bound and noise std only; a value needs a 12-sigma draw to be clipped.
    assert value_bound([100, 250], 1.0, 2.0) == pytest.approx(250 + 24)
    assert value_bound([100], 0.5, 0.0) == pytest.approx(100)  # counts need 1 per record


@pytest.mark.parametrize("federation, fix", [
    ({"placement": "local", "secure_aggregation": True}, "only placement 'distributed'"),
    ({"placement": "central", "secure_aggregation": True}, "only placement 'distributed'"),
    ({"placement": "distributed", "secure_aggregation": True, "split": {"silos": 1}}, "needs 2 to"),
    ({"placement": "distributed", "secure_aggregation": True, "split": {"silos": MAX_SILOS + 1}}, "needs 2 to"),
])
def test_settings_refuse_what_secure_aggregation_cannot_do(federation, fix) -> None:
    with pytest.raises(ValueError, match="secure_aggregation") as caught:
        load_federated_settings(None, {"federation": federation})
    assert fix in str(caught.value)


def test_guarantees_name_the_adversary_with_and_without_secure_aggregation() -> None:
    events = [dpe.PoissonSampledDpEvent(0.2, dpe.GaussianDpEvent(1.5))] * 4
    on = guarantees("distributed", 5, events, 1e-5, smallest_bound, secure_aggregation=True)
    off = guarantees("distributed", 5, events, 1e-5, smallest_bound, secure_aggregation=False)
    assert on[0].epsilon == pytest.approx(off[0].epsilon)
    # With secure aggregation each silo's share is sigma^2 / t (t = 3 of 5, the dropout threshold): a
    # colluding coordinator is left more noise than without it (sigma^2 / 5).
    assert on[0].epsilon < on[1].epsilon < off[1].epsilon
    assert on[0].against.startswith("everyone, the coordinator included") and "drop out" in on[0].against
    assert "colludes with no silo" in on[0].holds_if and "colluding" in on[1].against
    # Without secure aggregation, nothing is promised against the coordinator beyond each silo's share.
    assert "coordinator" not in off[0].against and "secure aggregation is off" in off[1].holds_if


def test_flower_secagg_plus_sums_what_the_silos_send(task, tmp_path) -> None:
    """Over Flower's simulation engine with SecAgg+: the run releases what in-process summing of the
    same silos (same seeds, same threshold-calibrated shares) releases, to within the protocol's
    fixed-point rounding."""
    pytest.importorskip("flwr", reason="needs the [federated] extra: pip install 'dp-textgrad[federated]'")
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(helpers)

    def settings(transport: str, secure: bool, root: str):
        return load_federated_settings(None, {
            "federation": {"placement": "distributed", "transport": transport, "secure_aggregation": secure},
            "dp": {"epsilon": 2.0, "generations": 1, "population": 3, "sampling_rate": 0.3,
                   "insecure_noise_seed": 5},
            "output": {"runs_root": root, "evaluate": False},
        })

    over_flower = run_federated(settings("flower", True, str(tmp_path / "flower")), engine_factory=make_engine,
                                task=task)
    # In process, the secure sum is the plain sum of the same clipped shares (t-calibrated), without the masks.
    plain = run_federated(settings("in_process", True, str(tmp_path / "plain")), engine_factory=make_engine,
                          task=task)
    assert over_flower.result.prompt == plain.result.prompt
    # Rounding: about bound / 2^22 per silo on a sum, divided by q * N in an estimate.
    assert estimates(over_flower.result) == pytest.approx(estimates(plain.result), abs=1e-3)
    written = json.loads((over_flower.run_dir / "federation.json").read_text())
    assert written["secure_aggregation"] is True
    assert written["guarantees"][0]["against"].startswith("everyone, the coordinator included")
