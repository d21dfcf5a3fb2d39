"""A run's link to its dataset's lifetime budget (:mod:`dp_textgrad.privacy.accounting.lifetime`).

Before the first charge: register the run under the dataset's key, refuse it if its
whole plan would push the dataset past the lifetime cap, and make every later charge go
to the store (in one transaction, under the cap) before the run's own ledger records it.
On resume: charges the store holds but the run's ledger lost in a crash are adopted, so
the two agree and nothing is charged silently twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_textgrad.privacy.accounting.lifetime import (
    STORE_NAME,
    LifetimeBudget,
    LifetimeCapExceeded,
    LifetimeTotal,
)


@dataclass(frozen=True)
class LifetimeOptions:
    """Where the store is, the cap (None: no cap, only shown) and whether to override it."""

    store: Path | None = None  # None: <runs_root>/operator/lifetime_budget.sqlite (operator-only)
    cap: float | None = None
    override_cap: bool = False
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.cap is not None and not (math.isfinite(self.cap) and self.cap > 0):
            raise ValueError(f"lifetime_cap: must be a finite number > 0, got {self.cap!r}")

    def store_path(self, runs_root: str | Path) -> Path:
        if self.store is not None:
            return Path(self.store)
        # Beside the runs, in the operator-only folder: it holds a keyed fingerprint of the
        # private data and when each run charged (never part of what a run releases).
        from dp_textgrad.runs import operator_dir

        return operator_dir(runs_root) / STORE_NAME


@dataclass(frozen=True)
class LifetimeStatus:
    """What the console shows before a run starts (operator-facing, before any charge)."""

    store: Path
    before: LifetimeTotal        # every earlier charge on this dataset
    with_plan: float             # lifetime epsilon if this run spends its whole plan
    cap: float | None
    overridden: bool
    adopted: int                 # charges recovered from the store into the run's ledger (resume)

    def describe(self) -> str:
        earlier = self.before.runs - (1 if self.adopted or self.before.charges else 0)
        spent = "no earlier charges" if not self.before.charges else (
            f"epsilon {self.before.epsilon:.4g} spent in {self.before.charges} charge(s) "
            f"({self.before.accountant}, delta={self.before.delta:g})")
        cap = "no lifetime cap set (output.lifetime_cap)" if self.cap is None else (
            f"cap {self.cap:g}" + (" OVERRIDDEN for this run (recorded in the ledger)" if self.overridden else ""))
        unsafe = f"; {self.before.unsafe_runs} earlier run(s) were not private" if self.before.unsafe_runs else ""
        return (f"this dataset so far: {spent}{unsafe}; after this run at most {self.with_plan:.4g}; {cap} "
                f"[store {self.store}; {max(earlier, 0)} other run(s)]")


def attach(optimizer: Any, task: Any, options: LifetimeOptions, *, runs_root: str | Path, run_id: str,
           label: str, resume: bool) -> LifetimeStatus | None:
    """Link ``optimizer``'s ledger to the store; raise :class:`LifetimeCapExceeded` before any charge."""
    if not options.enabled:
        return None
    store = LifetimeBudget(options.store_path(runs_root))
    ledger = optimizer.ledger
    dataset = store.fingerprint(task.private_train)
    delta = ledger.delta
    store.open_run(run_id, dataset, label=label, epsilon_budget=ledger.epsilon_budget, delta=delta,
                   cap=options.cap, cap_overridden=options.override_cap)
    adopted = 0
    if resume:
        # Store ahead of the ledger: a kill between the two writes. Ledger ahead (a run from
        # before the store, or one whose store was moved): replay its entries into the store.
        adopted = ledger.recover(store.entries(run_id))
        optimizer.interrupted_charges += adopted  # charged after the last checkpoint, like the ledger's own
        for entry in ledger.entries:
            store.record(run_id, entry.to_dict(), cap=None, delta=delta)
    before = store.total(dataset, delta)
    remaining = optimizer.plan.remaining_event(optimizer.generation) if resume else optimizer.plan.event
    projected = store.total(dataset, delta, extra=[remaining] if remaining is not None else [])
    if options.cap is not None and projected.epsilon > options.cap and not options.override_cap:
        raise LifetimeCapExceeded(projected.epsilon, options.cap, delta, "this run's plan")
    if ledger.unsafe:
        store.mark_unsafe(run_id)
    ledger.set_lifetime(options.cap, options.override_cap)
    ledger.add_charge_hook(lambda entry: store.record(run_id, entry.to_dict(), cap=options.cap, delta=delta,
                                                      accountants=ledger.accountants))
    return LifetimeStatus(store.path, before, projected.epsilon, options.cap, options.override_cap, adopted)


def describe_dataset(store: LifetimeBudget, dataset: str, number: int | None = None,
                     delta: float | None = None) -> list[str]:
    """Lines for ``dp-textgrad ledger``: a dataset's runs and the composed epsilon of all their charges.

    ``delta`` None: the largest delta among the dataset's runs (the total holds at that delta).
    """
    import datetime as dt

    rows = store.runs(dataset)
    name = f"Dataset {number}" if number is not None else "This dataset"
    if not rows:
        return [f"{name}: no runs recorded in {store.path}."]
    at = delta if delta is not None else max(r.delta for r in rows)
    total = store.total(dataset, at)
    lines = [f"{name} ({rows[0].label}): {len(rows)} run(s), {total.charges} charge(s)"]
    for r in rows:
        when = dt.datetime.fromtimestamp(r.started, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
        flags = (" NOT PRIVATE" if r.unsafe else "") + (" cap overridden" if r.cap_overridden else "")
        lines.append(f"  {r.run_id}  {when} UTC  budget eps {r.epsilon_budget:g} delta {r.delta:g}  "
                     f"{r.charges} charge(s){flags}")
    by = ", ".join(f"{k} {v:.4g}" for k, v in sorted(total.by_accountant.items()) if math.isfinite(v))
    shown = "inf (a run was not private)" if total.unsafe_runs else f"{total.epsilon:.4g}"
    lines.append(f"  lifetime epsilon {shown} at delta {at:g}: all charges composed, smallest valid bound "
                 f"({total.accountant}); {by}")
    return lines


__all__ = ["LifetimeOptions", "LifetimeStatus", "attach", "describe_dataset"]
