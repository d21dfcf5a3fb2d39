"""The lifetime store: keyed dataset fingerprints, charges recorded once, composition across runs, the cap."""

from __future__ import annotations

import math
import sqlite3
import threading

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dp_textgrad.privacy.accounting import PrivacyLedger, RdpAccountant, default_accountants, smallest_bound
from dp_textgrad.privacy.accounting.lifetime import (
    FILTER_ORDERS,
    LifetimeBudget,
    LifetimeCapExceeded,
    filter_epsilon,
)
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import Example

GAUSS = dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(1.0))
RECORDS = [Example(f"message {i}", "bill" if i % 2 else "tech") for i in range(20)]


def charged_ledger(store: LifetimeBudget, run_id: str, dataset: str, cap=None) -> PrivacyLedger:
    ledger = PrivacyLedger(50.0, 1e-5)
    store.open_run(run_id, dataset, label="t", epsilon_budget=50.0, delta=1e-5, cap=cap)
    ledger.add_charge_hook(lambda e: store.record(run_id, e.to_dict(), cap=cap))
    return ledger


def test_fingerprint_is_keyed_order_free_and_content_sensitive(tmp_path) -> None:
    a, b = LifetimeBudget(tmp_path / "a.sqlite"), LifetimeBudget(tmp_path / "b.sqlite")
    data = PrivateDataset(RECORDS)
    assert a.fingerprint(data) == a.fingerprint(PrivateDataset(list(reversed(RECORDS))))
    assert a.fingerprint(data) != a.fingerprint(PrivateDataset(RECORDS[:-1]))  # one record less
    changed = RECORDS[:-1] + [Example("message 19", "tech")]                   # one label changed
    assert a.fingerprint(data) != a.fingerprint(PrivateDataset(changed))
    assert a.fingerprint(data) != b.fingerprint(data)  # another store's key: no dictionary test across stores
    assert LifetimeBudget(tmp_path / "a.sqlite").fingerprint(data) == a.fingerprint(data)  # the key persists


def test_every_charge_of_every_run_composes_like_one_ledger(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    for run in ("r1", "r2"):
        ledger = charged_ledger(store, run, dataset)
        for i in range(3):
            ledger.spend(GAUSS, f"step {i}")
    total = store.total(dataset, 1e-5)
    assert total.runs == 2 and total.charges == 6
    expected = smallest_bound([GAUSS] * 6, 1e-5, default_accountants())
    assert total.epsilon == pytest.approx(expected, rel=1e-9)
    assert total.epsilon < total.by_accountant["basic"]  # composed, not summed
    assert [len(store.entries(r)) for r in ("r1", "r2")] == [3, 3]
    assert store.total(store.fingerprint(PrivateDataset(RECORDS[:5])), 1e-5).epsilon == 0.0


def test_replayed_charge_is_recorded_once(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    ledger = charged_ledger(store, "r", dataset)
    entry = ledger.spend(GAUSS, "step")
    store.record("r", entry.to_dict(), cap=None)
    assert len(store.entries("r")) == 1


def test_cap_refuses_a_charge_and_records_nothing(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    one, two = filter_epsilon([GAUSS], 1e-5), filter_epsilon([GAUSS] * 2, 1e-5)  # what the cap decides on
    ledger = charged_ledger(store, "r", dataset, cap=(one + two) / 2)
    ledger.spend(GAUSS, "first")
    with pytest.raises(LifetimeCapExceeded, match="override-lifetime-cap"):
        ledger.spend(GAUSS, "second")
    assert len(ledger.entries) == 1 and len(store.entries("r")) == 1


def test_override_lets_the_charge_through_and_is_recorded(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    store.open_run("r", dataset, label="t", epsilon_budget=50.0, delta=1e-5, cap=0.01, cap_overridden=True)
    store.record("r", PrivacyLedger(50.0, 1e-5).spend(GAUSS, "x").to_dict(), cap=0.01)
    assert store.runs(dataset)[0].cap_overridden and len(store.entries("r")) == 1


def test_concurrent_runs_cannot_both_slip_under_the_cap(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    cap = filter_epsilon([GAUSS] * 4, 1e-5) * 1.0001
    refused: list[int] = []

    def worker(name: str) -> None:
        ledger = charged_ledger(LifetimeBudget(tmp_path / "s.sqlite"), name, dataset, cap=cap)
        for i in range(4):
            try:
                ledger.spend(GAUSS, f"step {i}")
            except LifetimeCapExceeded:
                refused.append(i)

    threads = [threading.Thread(target=worker, args=(f"r{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = store.total(dataset, 1e-5)
    assert total.charges == 4 and total.filter_epsilon <= cap and len(refused) == 8


def test_ledger_recovers_charges_the_store_holds(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    ledger = charged_ledger(store, "r", dataset)
    for i in range(3):
        ledger.spend(GAUSS, f"step {i}")
    lost = PrivacyLedger(50.0, 1e-5)  # as if the ledger file was written before the last two charges
    lost.recover(store.entries("r")[:1])
    assert lost.recover(store.entries("r")) == 2
    assert [e.label for e in lost.entries] == ["step 0", "step 1", "step 2"]
    assert lost.epsilon() == pytest.approx(ledger.epsilon())
    other = PrivacyLedger(50.0, 1e-5)
    other.spend(dpe.GaussianDpEvent(3.0), "something else")
    with pytest.raises(ValueError, match="differs"):
        other.recover(store.entries("r"))


def test_unsafe_run_makes_the_lifetime_infinite(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    charged_ledger(store, "r", dataset).spend(GAUSS, "x")
    store.mark_unsafe("r")
    assert math.isinf(store.total(dataset, 1e-5).epsilon) and store.total(dataset, 1e-5).unsafe_runs == 1


def test_a_file_that_is_not_a_store_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(ValueError, match="lifetime_store"):
        LifetimeBudget(path)
    with sqlite3.connect(tmp_path / "other.sqlite") as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('schema', '99')")
    with pytest.raises(ValueError, match="schema"):
        LifetimeBudget(tmp_path / "other.sqlite")


# -- issue 35, item 2: one lifetime delta per dataset, the cap decided by an RDP filter
STEP = dpe.GaussianDpEvent(10.0)  # ~12 of these reach epsilon 2 at delta 1e-7, ~29 at delta 1e-3


def charge_until_refused(store: LifetimeBudget, run_id: str, dataset: str, delta: float, cap: float,
                         limit: int = 60) -> int:
    """Open a run at ``delta`` and charge STEP until the cap refuses; the number of charges recorded."""
    store.open_run(run_id, dataset, label="t", epsilon_budget=1000.0, delta=delta, cap=cap)
    ledger = PrivacyLedger(1000.0, delta)
    ledger.add_charge_hook(lambda e: store.record(run_id, e.to_dict(), cap=cap))
    for i in range(limit):
        try:
            ledger.spend(STEP, f"step {i}")
        except LifetimeCapExceeded:
            return i
    return limit


def test_a_larger_delta_run_cannot_lift_the_lifetime_past_the_cap(tmp_path) -> None:
    # The finding: a run at delta 1e-7 fills the cap, a second run at delta 1e-3 was then
    # checked at its own delta and allowed many more steps; at 1e-7 the total passed the cap.
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    cap = 2.0
    first = charge_until_refused(store, "small-delta", dataset, 1e-7, cap)
    assert 1 <= first < 60
    try:
        second = charge_until_refused(store, "large-delta", dataset, 1e-3, cap)
    except ValueError as exc:  # refused outright: its delta is larger than the dataset's lifetime delta
        assert "dp.delta" in str(exc) and "lifetime_delta" in str(exc)
        second = 0
    total = store.total(dataset, 1e-7)
    assert total.epsilon <= cap, (first, second, total.epsilon)


def test_the_lifetime_delta_is_fixed_by_the_first_charge_or_declared(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    assert store.lifetime_delta(dataset) is None
    charge_until_refused(store, "r1", dataset, 1e-7, cap=1e9, limit=2)
    assert store.lifetime_delta(dataset) == 1e-7
    with pytest.raises(ValueError, match=r"dp\.delta.*lifetime_delta"):  # under a cap: refused
        store.open_run("r2", dataset, label="t", epsilon_budget=4.0, delta=1e-5, cap=5.0)
    assert [r.run_id for r in store.runs(dataset)] == ["r1"]  # the refused run left no row
    # Without a cap there is no policy to hold it to: it runs, and its events count at 1e-7.
    assert store.open_run("r2", dataset, label="t", epsilon_budget=4.0, delta=1e-5) == 1e-7
    store.open_run("r3", dataset, label="t", epsilon_budget=4.0, delta=1e-8)  # a smaller delta is fine
    with pytest.raises(ValueError, match="lifetime_delta"):  # another declared value: refused, not changed
        store.open_run("r4", dataset, label="t", epsilon_budget=4.0, delta=1e-8, lifetime_delta=1e-6)
    other = store.fingerprint(PrivateDataset(RECORDS[:7]))
    store.open_run("r5", other, label="t", epsilon_budget=4.0, delta=1e-9, lifetime_delta=1e-6)
    assert store.lifetime_delta(other) == 1e-6
    assert store.total(dataset).delta == 1e-7  # totals default to the lifetime delta


def test_the_cap_is_decided_by_the_rdp_filter_at_the_lifetime_delta(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    cap = 2.0
    first = charge_until_refused(store, "a", dataset, 1e-7, cap)
    second = charge_until_refused(store, "b", dataset, 1e-7, cap)  # same delta: no room left either
    assert first >= 1 and second == 0
    events = [STEP] * first
    # The filter bound, by hand: the Gaussian's RDP is alpha / (2 sigma^2); delta is shared by the orders.
    rdp = np.array([o / (2 * 10.0**2) for o in FILTER_ORDERS]) * first
    by_hand = min(r + math.log((o - 1) / o) + (math.log(len(FILTER_ORDERS) / 1e-7) - math.log(o)) / (o - 1)
                  for r, o in zip(rdp, FILTER_ORDERS))
    assert filter_epsilon(events, 1e-7) == pytest.approx(by_hand, rel=1e-9)
    assert filter_epsilon(events, 1e-7) <= cap < filter_epsilon(events + [STEP], 1e-7)
    total = store.total(dataset)
    assert total.filter_epsilon == pytest.approx(by_hand, rel=1e-9) and total.epsilon <= total.filter_epsilon


# -- issue 35, item 7: a dataset named by its owner, shared by its versions
def test_a_declared_key_composes_different_record_sets(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    key = store.declared_key("clinic-notes")
    assert key == LifetimeBudget(tmp_path / "s.sqlite").declared_key("clinic-notes")
    assert key != store.fingerprint(PrivateDataset(RECORDS))
    for run, records in (("v1", RECORDS), ("v2", RECORDS + [Example("one more", "tech")]), ("v3", RECORDS[:9])):
        ledger = charged_ledger(store, run, key)
        ledger.spend(GAUSS, "step")
    total = store.total(key, 1e-5)
    assert total.runs == 3 and total.charges == 3
    assert total.epsilon == pytest.approx(smallest_bound([GAUSS] * 3, 1e-5, default_accountants()), rel=1e-9)
    assert store.find_declared("clinic-notes") == key and store.find_declared("other") is None
    with pytest.raises(ValueError, match="dataset_key"):
        store.declared_key("  ")


def test_the_filter_bound_is_the_per_order_conversion_at_a_shared_delta() -> None:
    # Independent of our formula: dp-accounting's own RDP -> (epsilon, delta) conversion,
    # one order at a time with delta / |orders|, minimised; and never below the tightest bound.
    events = [GAUSS] * 10 + [dpe.LaplaceDpEvent(5.0)]
    curve = RdpAccountant(FILTER_ORDERS).rdp_curve(events)
    share = 1e-6 / len(FILTER_ORDERS)
    expected = min(rdp_lib.compute_epsilon([a], [r], share)[0] for a, r in zip(FILTER_ORDERS, curve))
    assert filter_epsilon(events, 1e-6) == pytest.approx(expected, rel=1e-9)
    assert filter_epsilon(events, 1e-6) > smallest_bound(events, 1e-6, default_accountants())
    assert filter_epsilon([], 1e-6) == 0.0
