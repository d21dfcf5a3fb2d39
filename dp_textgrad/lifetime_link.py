"""A run's link to its dataset's lifetime budget (:mod:`dp_textgrad.privacy.accounting.lifetime`).

Before the first charge: register the run under the dataset's key (the owner's declared
``dataset_key``, else the records' fingerprint), fix or check the dataset's lifetime
delta, refuse the run if its whole plan would push the dataset's filter bound past the
lifetime cap, and make every later charge go to the store (in one transaction, under the
cap) before the run's own ledger records it.
On resume: charges the store holds but the run's ledger lost in a crash are adopted, so
the two agree and nothing is charged silently twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_textgrad.privacy.accounting.bounds import format_epsilon
from dp_textgrad.privacy.accounting.lifetime import (
    LifetimeBudget,
    LifetimeCapExceeded,
    LifetimeTotal,
)

# The dataset key offered for non-private baselines (privacy off, unsafe mode): their charges are
# infinite, so under the data's own key (or fingerprint) they would leave every later run on it an
# infinite lifetime bound. Under this key they do not; their outputs must then never be released.
SCRATCH_DATASET_KEY = "scratch-baselines"
SCRATCH_KEY_HINT = f"--dataset-key {SCRATCH_DATASET_KEY}, or output.dataset_key in the run file"


@dataclass(frozen=True)
class LifetimeOptions:
    """Where the store is, the cap (None: no cap, only shown), whether to override it, the dataset's name.

    ``dataset_key`` names the dataset so that its versions (more records, a subset, a
    re-split) share one lifetime; None keys it by the records' fingerprint. ``delta``
    declares the dataset's lifetime delta (None: fixed by its first run).
    """

    store: Path | None = None  # None: <runs_root>/operator/lifetime_budget.sqlite (operator-only)
    cap: float | None = None
    override_cap: bool = False
    enabled: bool = True
    dataset_key: str | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.cap is not None and not (math.isfinite(self.cap) and self.cap > 0):
            raise ValueError(f"lifetime_cap: must be a finite number > 0, got {self.cap!r}")
        if self.delta is not None and not 0.0 < self.delta < 1.0:
            raise ValueError(f"lifetime_delta: must be in (0, 1), got {self.delta!r}")
        if self.dataset_key is not None:
            LifetimeBudget.declared_key(self.dataset_key)  # the same check, and error, as the store's

    def store_path(self, runs_root: str | Path) -> Path:
        if self.store is not None:
            return Path(self.store)
        # Beside the runs, in the operator-only folder: it holds a keyed fingerprint of the
        # private data and when each run charged (never part of what a run releases).
        from dp_textgrad.runs import lifetime_store, operator_dir

        operator_dir(runs_root)  # created with its do-not-share README
        return lifetime_store(runs_root)


@dataclass(frozen=True)
class LifetimeStatus:
    """What the console shows before a run starts (operator-facing, before any charge)."""

    store: Path
    before: LifetimeTotal  # every earlier charge on this dataset, at its lifetime delta
    with_plan: float  # lifetime epsilon (tightest bound) if this run spends its whole plan
    cap: float | None
    overridden: bool
    adopted: int  # charges recovered from the store into the run's ledger (resume)
    dataset_key: str | None = None  # the owner's name of the dataset (public); None: the fingerprint
    with_plan_filter: float = 0.0  # the filter bound with the whole plan: what the cap is checked against
    run_delta: float | None = None  # this run's own delta
    resumed: bool = False
    not_private: bool = False  # this run reads the records without noise (privacy off, unsafe mode)

    def charges_what(self) -> str:
        """Which lifetime this run charges (a declared key is public; a fingerprint is never shown)."""
        if self.dataset_key is not None:
            return f"dataset key {self.dataset_key!r}"
        return (
            "the records' fingerprint (no output.dataset_key: another version of the data, one record "
            "more or fewer, is another dataset)"
        )

    def describe(self) -> str:
        earlier = self.before.runs - (1 if self.resumed else 0)  # a resumed run's own row is in ``before``
        spent = (
            "no earlier charges"
            if not self.before.charges
            else (
                f"epsilon {format_epsilon(self.before.epsilon)} spent in {self.before.charges} charge(s) "
                f"({self.before.accountant}; filter bound {format_epsilon(self.before.filter_epsilon)})"
            )
        )
        cap = (
            "no lifetime cap set (output.lifetime_cap)"
            if self.cap is None
            else (
                f"cap {self.cap:g} on the filter bound, after this run at most {self.with_plan_filter:.4g}"
                + (" OVERRIDDEN for this run (recorded in the ledger)" if self.overridden else "")
            )
        )
        unsafe = f"; {self.before.unsafe_runs} earlier run(s) were not private" if self.before.unsafe_runs else ""
        larger = (
            ""
            if self.run_delta is None or self.run_delta <= self.before.delta
            else (
                f"; this run's delta {self.run_delta:g} is larger than the lifetime delta: its charges count at "
                f"{self.before.delta:g}"
            )
        )
        warning = (
            f"; THIS RUN IS NOT PRIVATE: it reads the records without noise, so the lifetime bound of "
            f"{self.charges_what()} becomes infinite for every later run on it; keep baselines apart from the "
            f"data's real lifetime with a scratch key ({SCRATCH_KEY_HINT})"
            if self.not_private and self.dataset_key != SCRATCH_DATASET_KEY
            else ""
        )
        return (
            f"charging {self.charges_what()}; lifetime delta {self.before.delta:g}; this dataset so far: "
            f"{spent}{unsafe}; after this run at most {format_epsilon(self.with_plan)}; {cap}{larger}{warning} "
            f"[store {self.store}; {max(earlier, 0)} other run(s)]"
        )


@dataclass
class LifetimeLink:
    """A run registered in the store with its ledger's charges going there first (under the cap)."""

    store: LifetimeBudget
    dataset: str  # the store's key: a declared name or the records' fingerprint
    delta: float  # the dataset's lifetime delta
    run_id: str
    ledger: Any


def _link(
    ledger: Any, task: Any, options: LifetimeOptions, *, runs_root: str | Path, run_id: str, label: str
) -> LifetimeLink:
    """Register the run (fixing or checking the lifetime delta) and send every charge to the store first."""
    store = LifetimeBudget(options.store_path(runs_root))
    if options.dataset_key is not None:
        dataset = store.declared_key(options.dataset_key)
    else:
        dataset = store.fingerprint(task.private_train)
    delta = store.open_run(
        run_id,
        dataset,
        label=label,
        epsilon_budget=ledger.epsilon_budget,
        delta=ledger.delta,
        cap=options.cap,
        cap_overridden=options.override_cap,
        lifetime_delta=options.delta,
    )
    ledger.set_lifetime(options.cap, options.override_cap)
    ledger.add_charge_hook(lambda entry: store.record(run_id, entry.to_dict(), cap=options.cap))
    return LifetimeLink(store, dataset, delta, run_id, ledger)


def link_before_count(
    config: Any,
    task: Any,
    options: LifetimeOptions,
    *,
    runs_root: str | Path,
    run_id: str,
    label: str,
    ledger: Any = None,
) -> LifetimeLink | None:
    """For a fresh run that counts N first: the ledger of that count, already linked to the store.

    The DP count of N (``dp_es.size_count``) is a charge like any other: it must pass the
    cap and be in the store before it reads a record, so the run is registered and its
    ledger (``ledger``, or a new one) linked before the optimizer is built. Pass
    ``link.ledger`` to the optimizer and ``link`` to :func:`attach`. None when nothing is
    counted (N declared or already counted, privacy off).
    """
    if not options.enabled or not (config.counts_dataset_size and config.counted_dataset_size is None):
        return None
    if ledger is None:
        from dp_textgrad.dp_es.config import DEFAULT_DELTA
        from dp_textgrad.privacy.accounting.ledger import PrivacyLedger

        # The same budget as the count's own ledger (dp_es.size_count.stage_one): delta does not depend on N.
        ledger = PrivacyLedger(config.epsilon, config.delta if config.delta is not None else DEFAULT_DELTA)
    return _link(ledger, task, options, runs_root=runs_root, run_id=run_id, label=label)


def attach(
    optimizer: Any,
    task: Any,
    options: LifetimeOptions,
    *,
    runs_root: str | Path,
    run_id: str,
    label: str,
    resume: bool,
    link: LifetimeLink | None = None,
) -> LifetimeStatus | None:
    """Link ``optimizer``'s ledger to the store; raise :class:`LifetimeCapExceeded` before any search charge.

    ``link``: from :func:`link_before_count`, when the ledger was linked before the optimizer
    (its count of N is in the store already).
    """
    if not options.enabled:
        return None
    ledger = optimizer.ledger
    if link is None or link.ledger is not ledger:
        link = _link(ledger, task, options, runs_root=runs_root, run_id=run_id, label=label)
    store, dataset, delta = link.store, link.dataset, link.delta
    adopted = 0
    if resume:
        # Store ahead of the ledger: a kill between the two writes. Ledger ahead (a run from
        # before the store, or one whose store was moved): replay its entries into the store.
        adopted = ledger.recover(store.entries(run_id))
        optimizer.interrupted_charges += adopted  # charged after the last checkpoint, like the ledger's own
    for entry in ledger.entries:  # no-op for entries the store holds (the count, charged through the link)
        store.record(run_id, entry.to_dict(), cap=None)
    # Earlier runs' charges (resumed: this run's own too, as before the interruption).
    before = store.total(dataset, delta, exclude_run=None if resume else run_id)
    # What this run may still spend: all of its plan, or (resumed, or N counted already) what is left.
    started = resume or bool(ledger.entries)
    remaining = optimizer.remaining_event() if started else optimizer.plan.event
    projected = store.total(dataset, delta, extra=[remaining] if remaining is not None else [])
    # The filter bound decides (valid over adaptively chosen runs); the tightest total is information.
    if options.cap is not None and projected.filter_epsilon > options.cap and not options.override_cap:
        charged = (
            "only this run's DP count of N was charged (it ran first)"
            if ledger.entries and not resume
            else "nothing was charged"
        )
        raise LifetimeCapExceeded(projected.filter_epsilon, options.cap, delta, "this run's plan", charged=charged)
    if ledger.unsafe:
        store.mark_unsafe(run_id)
    return LifetimeStatus(
        store.path,
        before,
        projected.epsilon,
        options.cap,
        options.override_cap,
        adopted,
        dataset_key=store.declared_name(dataset),
        with_plan_filter=projected.filter_epsilon,
        run_delta=ledger.delta,
        resumed=resume,
        not_private=bool(ledger.unsafe),
    )


def describe_dataset(
    store: LifetimeBudget, dataset: str, number: int | None = None, delta: float | None = None
) -> list[str]:
    """Lines for ``dp-textgrad ledger``: a dataset's runs and the composed epsilon of all their charges.

    ``delta`` None: the dataset's lifetime delta (where its cap is checked); another delta
    shows the tightest total there, the filter bound stays at the lifetime delta.
    """
    import datetime as dt

    rows = store.runs(dataset)
    declared = store.declared_name(dataset)
    name = f"Dataset {number}" if number is not None else "This dataset"
    if not rows:
        return [f"{name}: no runs recorded in {store.path}."]
    lifetime_delta = store.lifetime_delta(dataset)
    at = delta if delta is not None else lifetime_delta
    total = store.total(dataset, at)
    filtered = total if at == lifetime_delta else store.total(dataset, lifetime_delta)
    what = f"dataset key {declared!r}" if declared is not None else f"{rows[0].label}, by fingerprint"
    lines = [f"{name} ({what}): {len(rows)} run(s), {total.charges} charge(s), lifetime delta {lifetime_delta:g}"]
    for r in rows:
        when = dt.datetime.fromtimestamp(r.started, dt.UTC).strftime("%Y-%m-%d %H:%M")
        flags = (" NOT PRIVATE" if r.unsafe else "") + (" cap overridden" if r.cap_overridden else "")
        lines.append(
            f"  {r.run_id}  {when} UTC  budget eps {r.epsilon_budget:g} delta {r.delta:g}  {r.charges} charge(s){flags}"
        )
    by = ", ".join(f"{k} {v:.4g}" for k, v in sorted(total.by_accountant.items()) if math.isfinite(v))
    shown = "inf (a run was not private)" if total.unsafe_runs else format_epsilon(total.epsilon)
    bound = "inf" if total.unsafe_runs else format_epsilon(filtered.filter_epsilon)
    lines.append(
        f"  lifetime epsilon {shown} at delta {at:g}: all charges composed, smallest valid bound "
        f"({total.accountant}); {by}"
    )
    lines.append(
        f"  filter bound {bound} at the lifetime delta {lifetime_delta:g} (Renyi filter: what a "
        "lifetime cap is checked against)"
    )
    return lines


__all__ = ["LifetimeLink", "LifetimeOptions", "LifetimeStatus", "attach", "describe_dataset", "link_before_count"]
