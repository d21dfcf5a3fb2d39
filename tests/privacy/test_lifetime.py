"""The lifetime store: keyed dataset fingerprints, charges recorded once, composition across runs, the cap."""

from __future__ import annotations

import math
import sqlite3
import threading

import pytest
from dp_accounting import dp_event as dpe

from dp_textgrad.privacy.accounting import PrivacyLedger, default_accountants, smallest_bound
from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget, LifetimeCapExceeded
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import Example

GAUSS = dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(1.0))
RECORDS = [Example(f"message {i}", "bill" if i % 2 else "tech") for i in range(20)]


def charged_ledger(store: LifetimeBudget, run_id: str, dataset: str, cap=None) -> PrivacyLedger:
    ledger = PrivacyLedger(50.0, 1e-5)
    store.open_run(run_id, dataset, label="t", epsilon_budget=50.0, delta=1e-5, cap=cap)
    ledger.add_charge_hook(lambda e: store.record(run_id, e.to_dict(), cap=cap, delta=1e-5))
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
    store.record("r", entry.to_dict(), cap=None, delta=1e-5)
    assert len(store.entries("r")) == 1


def test_cap_refuses_a_charge_and_records_nothing(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    one = smallest_bound([GAUSS], 1e-5, default_accountants())
    two = smallest_bound([GAUSS] * 2, 1e-5, default_accountants())
    ledger = charged_ledger(store, "r", dataset, cap=(one + two) / 2)
    ledger.spend(GAUSS, "first")
    with pytest.raises(LifetimeCapExceeded, match="override-lifetime-cap"):
        ledger.spend(GAUSS, "second")
    assert len(ledger.entries) == 1 and len(store.entries("r")) == 1


def test_override_lets_the_charge_through_and_is_recorded(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    store.open_run("r", dataset, label="t", epsilon_budget=50.0, delta=1e-5, cap=0.01, cap_overridden=True)
    store.record("r", PrivacyLedger(50.0, 1e-5).spend(GAUSS, "x").to_dict(), cap=0.01, delta=1e-5)
    assert store.runs(dataset)[0].cap_overridden and len(store.entries("r")) == 1


def test_concurrent_runs_cannot_both_slip_under_the_cap(tmp_path) -> None:
    store = LifetimeBudget(tmp_path / "s.sqlite")
    dataset = store.fingerprint(PrivateDataset(RECORDS))
    cap = smallest_bound([GAUSS] * 4, 1e-5, default_accountants()) * 1.0001
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
    assert total.charges == 4 and total.epsilon <= cap and len(refused) == 8


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
