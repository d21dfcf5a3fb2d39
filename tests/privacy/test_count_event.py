"""The DP count of N is charged as the pure-DP event it is (issue 47, item 6).

The count adds discrete Laplace noise, P(k) proportional to exp(-eps_c |k|). Shifted by one (a
record added or removed), its privacy loss is +eps_c or -eps_c with the probabilities of binary
randomized response, so its Renyi divergences and its PLD are those of randomized response: larger
than a continuous Laplace's, which charged it before (0.03701 against 0.03935 at order 2, eps_c 0.2).
The references here are computed from the discrete Laplace pair itself, not from the library.
Ledgers, lifetime stores and silo accounts written before hold ``LaplaceDpEvent(1 / eps_c)`` for the
count: every accountant reads such an event as ``PureDpEvent(eps_c)``, valid for any sensitivity-1
Laplace, discrete or not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from scipy.special import logsumexp

from dp_textgrad.privacy.accounting import PldAccountant, RdpAccountant, default_accountants
from dp_textgrad.privacy.accounting.events import PureDpEvent
from dp_textgrad.privacy.accounting.filter import filter_epsilon
from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget, LifetimeCapExceeded
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.privacy.mechanisms import LaplaceCountMechanism
from tests.exact_pure_dp import exact_randomized_response_epsilon

EPS_C = 0.2  # the count's epsilon: 5% of epsilon 4


def discrete_laplace_renyi(epsilon: float, order: float) -> float:
    """D_order(X || X + 1) for X discrete Laplace(epsilon), summed over the integers (tails below e^-60)."""
    k = np.arange(-int(60 / epsilon) - 1, int(60 / epsilon) + 2, dtype=np.float64)
    log_norm = math.log(math.tanh(epsilon / 2.0))  # (1 - e^-eps) / (1 + e^-eps)
    log_p = log_norm - epsilon * np.abs(k)
    log_q = log_norm - epsilon * np.abs(k - 1.0)
    return float(logsumexp(order * log_p + (1.0 - order) * log_q)) / (order - 1.0)


def test_the_count_is_charged_as_a_pure_dp_event() -> None:
    count = LaplaceCountMechanism(EPS_C)
    assert count.event() == PureDpEvent(EPS_C)
    assert count.noise_scale == pytest.approx(1 / EPS_C)  # the sampler's scale is unchanged


@pytest.mark.parametrize("order, expected", [(2.0, 0.03935), (5.0, 0.08871), (12.0, 0.14653)])
def test_the_counts_rdp_is_the_discrete_laplace_pairs(order, expected) -> None:
    exact = discrete_laplace_renyi(EPS_C, order)
    assert exact == pytest.approx(expected, abs=5e-6)
    charged = RdpAccountant([order]).rdp_curve([LaplaceCountMechanism(EPS_C).event()])[0]
    assert charged == pytest.approx(exact, rel=1e-9)


def test_twenty_counts_under_the_lifetime_filter() -> None:
    # Twenty runs' counts at eps_c 0.2: the continuous Laplace's curve gave 3.8385.
    counts = [LaplaceCountMechanism(EPS_C).event()] * 20
    assert filter_epsilon(counts, 1e-5) == pytest.approx(3.9231, abs=1e-4)


def test_the_pld_of_the_counts_is_never_below_their_exact_composition() -> None:
    exact = exact_randomized_response_epsilon(EPS_C, 20, 1e-5)
    pld = PldAccountant().epsilon([LaplaceCountMechanism(EPS_C).event()] * 20, 1e-5)
    assert exact * (1 - 1e-8) <= pld <= exact * 1.01, f"pld {pld:.6f} vs exact {exact:.6f}"


# -- what earlier versions wrote: LaplaceDpEvent(1 / eps_c) -------------------------------------------
@pytest.mark.parametrize("legacy, pure", [
    (dpe.LaplaceDpEvent(1 / EPS_C), PureDpEvent(EPS_C)),
    (dpe.SelfComposedDpEvent(dpe.LaplaceDpEvent(1 / EPS_C), 20), dpe.SelfComposedDpEvent(PureDpEvent(EPS_C), 20)),
    (dpe.PoissonSampledDpEvent(0.1, dpe.LaplaceDpEvent(1 / EPS_C)), dpe.PoissonSampledDpEvent(0.1, PureDpEvent(EPS_C))),
], ids=["one", "self-composed", "sampled"])
def test_a_stored_laplace_event_is_charged_as_pure_dp(legacy, pure) -> None:
    orders = [2.0, 5.0, 12.0]
    assert np.array_equal(RdpAccountant(orders).rdp_curve([legacy]), RdpAccountant(orders).rdp_curve([pure]))
    assert filter_epsilon([legacy], 1e-5) == filter_epsilon([pure], 1e-5)
    for accountant in default_accountants():
        assert accountant.supports(legacy), accountant.name
        assert accountant.epsilon([legacy], 1e-5) == accountant.epsilon([pure], 1e-5), accountant.name


def test_a_lifetime_store_of_earlier_versions_charges_its_counts_as_pure_dp(tmp_path) -> None:
    """Twenty counts recorded as LaplaceDpEvent by an earlier version: the store's filter bound is the
    discrete pair's 3.9231, so a cap of 3.9 refuses the twentieth (3.8385 let it through)."""
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.declared_key("clinic-notes")
    legacy = event_to_dict(dpe.LaplaceDpEvent(1 / EPS_C))
    assert legacy["type"] == "LaplaceDpEvent"
    for run in range(19):
        store.open_run(f"r{run}", dataset, label="t", epsilon_budget=4.0, delta=1e-5)
        store.record(f"r{run}", {"index": 0, "label": "dataset size: DP count", "event": legacy}, cap=None)
    assert store.total(dataset).filter_epsilon == pytest.approx(
        filter_epsilon([PureDpEvent(EPS_C)] * 19, 1e-5), rel=1e-12)
    store.open_run("r19", dataset, label="t", epsilon_budget=4.0, delta=1e-5, cap=3.9)
    with pytest.raises(LifetimeCapExceeded, match="3.923"):
        store.record("r19", {"index": 0, "label": "dataset size: DP count", "event": legacy}, cap=3.9)
    assert store.total(dataset).charges == 19
    assert store.entries("r0")[0]["event"] == legacy  # the store is read as it is, not rewritten
