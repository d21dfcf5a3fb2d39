"""Accounting tightness: what the library's choice of bound saves over the classic theorems.

For each schedule below and each selection mechanism it uses, the benchmark

1. calibrates the run the way a user's run is calibrated (``RunPlan.calibrated``:
   noise multiplier z for Gaussian scoring, per-pick epsilon0 for exponential
   top-k selection) to each budget epsilon;
2. reads that calibrated run's whole-run event (``RunPlan.with_value(config, value).event``) with
   every accountant the ledger has -- basic composition, advanced composition
   (Dwork-Rothblum-Vadhan ``drv`` and Kairouz-Oh-Viswanath ``kov``), RDP and PLD --
   and with the ledger's own choice, the smallest of them (``PrivacyLedger.bounds_with``);
3. calibrates the same schedule under each accountant on its own, for epsilon in
   ``NOISE_TARGETS``: the noise (z) or the epsilon0 that accountant alone would need.

Targets (issue 6): at the calibrated mechanism, the library's epsilon is at most
0.5x the basic-composition epsilon and at most 0.8x the better advanced-composition
epsilon, min(drv, kov).

Schedules (``SCHEDULES``; edit the list to change them). delta is always the
library's default min(1e-5, 1/(10 N)); feedback_noise_ratio is the default 3; the
final selection is the default 'last' (free):

* ``demo``: ``dp-textgrad demo`` with its defaults: the built-in support task with
  N = 1500 private records, T = 3 generations, K = 4 candidates, k = 2 parents,
  q = 50/N (about 50 records per generation), epsilon = 4, Gaussian scoring with
  DP confusion-matrix feedback.
* ``library_default``: ``DPESConfig()`` defaults (DESIGN.md): T = 6, K = 6, k = 2,
  q = min(1, 150/N), epsilon = 4, Gaussian scoring with DP feedback; N = 1500 as in the
  demo.
* ``sst2_n2000``, ``sst2_n20000``, ``banking10_n1592``: the privacy-utility benchmark
  schedules (``benchmarks/privacy_utility.py``): T = 3, K = 4, k = 2, about 24 records
  per generation (q = 24/N),
  epsilon in {1, 2, 4, 8}; selection 'gaussian' (feedback 'dp_confusion') and
  'exponential' (feedback 'none'). ``demo`` and ``library_default`` also run with
  'exponential'.
* ``long_run``: a long search on a large private set, exponential only: N = 15,000,
  T = 100, K = 6, k = 2, q = 150/N, epsilon in {1, 4, 8}.

How each accountant reads a Poisson-subsampled Gaussian generation. RDP and PLD read
the subsampled Gaussian directly. Basic and advanced composition need a per-step
(eps_i, delta_i): the library gives each of the m approximate-DP steps (here m = T: the
T - 1 generations whose scores and feedback share one subsample, merged into one
Gaussian with z_eff = (1/z^2 + 1/z_fb^2)^(-1/2), and the last generation's scores alone)
delta_i = delta/m under basic composition, and delta_i = delta/(2m) under DRV and KOV,
which keep delta/2 as composition slack; eps_i is then the tight one-step epsilon of the
subsampled Gaussian at delta_i (the smaller of the one-step PLD and RDP bounds). A pure
selection (Gumbel top-k of k picks on a Poisson subsample) is one step per generation of
the amplified pure epsilon ln(1 + q (e^(k eps0) - 1)), with delta_i = 0. PLD reads its
tight dominating pair and RDP Zhu-Wang's subsampled bound on the bounded-range curve.

Pure-DP plans against exact values (issue 35; ``PURE_ROWS``): for T generations of k
picks (permute-and-flip or Gumbel top-k) on Poisson subsamples of rate q, at a fixed
per-pick epsilon0 or at the one ``RunPlan.calibrated`` gives for a budget, the ledger's
printed epsilon beside the exact epsilon of the same composition (the T-fold product of
the k-pick dominating pair, a closed-form sum in ``tests/exact_pure_dp.py``). Target:
printed <= 1.01 x exact. (Gumbel top-k is also bounded-range, so its RDP bound may go
below the pure pair's exact value.) ``--pure-exact`` runs only these rows (seconds) and
keeps the schedule cases already in ``--output``.

The per-accountant calibration is a bracketed root search (Brent's method on log
epsilon against log parameter) with the accountant alone, first with a cheaper
pessimistic copy (PLD grid 1e-3 instead of 1e-4, integer RDP orders) for a start,
then with the accountant itself. The returned parameter always satisfies the target
under that accountant, and the exact crossing lies within a relative ``--rtol``
(default 1e-3; 1e-6 for the cheap exponential-selection searches) of it. The library's
column is ``RunPlan.calibrated`` itself.

Output (``--output``, default ``benchmarks/results/accounting.json``)::

    targets          {"library_over_basic_max": 0.5, "library_over_advanced_max": 0.8}
    accountants      column order: basic, drv, kov, rdp, pld, library
    schedules[]      name, description, dataset_size, budgets, selections
    cases[]          one per (schedule, selection):
      config           the resolved schedule (delta, q, T, K, k, feedback, ...)
      parameter        "noise_multiplier" (gaussian) or "selection_epsilon" (exponential)
      side_by_side[]   per budget epsilon: library_parameter (calibrated), epsilons
                       {accountant: epsilon of that run}, library_accountant (the bound
                       the ledger uses), ratio_library_over_basic,
                       ratio_library_over_advanced, advanced_accountant,
                       meets_basic_target, meets_advanced_target, in_schedule (the
                       budget is one of the schedule's; otherwise a noise target only)
      noise[]          per target epsilon: parameters {accountant: calibrated value},
                       epsilon_reached {accountant: its bound at that value},
                       parameter_over_library {accountant: value / library value}
      seconds
    pure_exact[]     per pure row: name, selection, picks, sampling_rate, generations, delta,
                     budget, epsilon0, calibration_seconds, exact, printed, printed_by, pld,
                     rdp, printed_over_exact, pld_over_exact, within_one_percent
    summary          cases checked, misses (schedule, selection, epsilon, which target),
                     worst ratios; pure rows checked, within 1% of exact, worst printed/exact
    rtol, rtol_exponential, seconds, machine, date, command, code_version

    python benchmarks/accounting.py                  # every schedule (several minutes)
    python benchmarks/accounting.py --quick --output smoke.json
    python benchmarks/accounting.py --schedule demo --markdown
    python benchmarks/accounting.py --pure-exact --markdown   # pure-DP rows vs exact only
    python benchmarks/accounting.py --tables-from benchmarks/results/accounting.json --markdown
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # measure this checkout when run as a script

import dp_accounting  # noqa: E402
from scipy.optimize import brentq  # noqa: E402

from dp_textgrad.privacy.accounting import (  # noqa: E402
    Accountant,
    AdvancedCompositionAccountant,
    BasicCompositionAccountant,
    PldAccountant,
    PrivacyLedger,
    RdpAccountant,
)
from dp_textgrad.dp_es.config import DPESConfig  # noqa: E402
from dp_textgrad.dp_es.plan import RunPlan  # noqa: E402
from dp_textgrad.privacy.accounting.events import group_events  # noqa: E402
from dp_textgrad.privacy.mechanisms import selection_mechanism  # noqa: E402
from tests.exact_pure_dp import exact_epsilon as exact_pure_epsilon  # noqa: E402
from dp_textgrad._io import atomic_write_text  # noqa: E402
from dp_textgrad.runs import code_version  # noqa: E402

DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "accounting.json"
ACCOUNTANTS = ("basic", "drv", "kov", "rdp", "pld")
COLUMNS = ACCOUNTANTS + ("library",)
TARGET_OVER_BASIC = 0.5
TARGET_OVER_ADVANCED = 0.8
NOISE_TARGETS = (1.0, 4.0, 8.0)
QUICK_SCHEDULE = "sst2_n20000"
QUICK_TARGETS = (1.0, 2.0)
PURE_RTOL = 1e-6  # relative tolerance of the (cheap) exponential-selection searches
# Cheaper pessimistic copies used only to find a starting point for the exact search.
_COARSE_PLD_INTERVAL = 1e-3
_COARSE_RDP_ORDERS = tuple(float(a) for a in range(2, 65)) + (80.0, 96.0, 128.0, 256.0, 512.0)


@dataclass(frozen=True)
class Schedule:
    """A run schedule: DPESConfig fields (besides epsilon and selection) and the private set size N."""

    name: str
    description: str
    dataset_size: int
    settings: dict[str, Any] = field(default_factory=dict)
    budgets: tuple[float, ...] = (4.0,)
    selections: tuple[str, ...] = ("gaussian",)

    def config(self, selection: str, epsilon: float) -> DPESConfig:
        feedback = "dp_confusion" if selection == "gaussian" else "none"
        settings = {"feedback": feedback, **self.settings}
        return DPESConfig(epsilon=epsilon, selection=selection, **settings).resolved(self.dataset_size)


def _benchmark_schedule(name: str, dataset: str, n: int) -> Schedule:
    return Schedule(
        name,
        f"privacy-utility benchmark, {dataset} with N = {n}: T = 3, K = 4, k = 2, q = 24/N",
        n,
        {"generations": 3, "population": 4, "parents": 2, "sampling_rate": min(1.0, 24 / n)},
        budgets=(1.0, 2.0, 4.0, 8.0),
        selections=("gaussian", "exponential"),
    )


SCHEDULES: list[Schedule] = [
    Schedule(
        "demo",
        "`dp-textgrad demo` defaults: built-in support task, N = 1500, T = 3, K = 4, k = 2, q = 50/N, epsilon 4",
        1500,
        {"generations": 3, "population": 4, "parents": 2, "sampling_rate": 50 / 1500},
        selections=("gaussian", "exponential"),
    ),
    Schedule(
        "library_default",
        "DPESConfig defaults (DESIGN.md): T = 6, K = 6, k = 2, q = min(1, 150/N), epsilon 4; N = 1500",
        1500,
        {},
        selections=("gaussian", "exponential"),
    ),
    _benchmark_schedule("sst2_n2000", "SST-2", 2000),
    _benchmark_schedule("sst2_n20000", "SST-2", 20000),
    _benchmark_schedule("banking10_n1592", "BANKING77 (10 intents)", 1592),
    Schedule(
        "long_run",
        "a long search on a large private set: N = 15,000, T = 100, K = 6, k = 2, q = 150/N; exponential",
        15000,
        {"generations": 100, "population": 6, "parents": 2, "sampling_rate": 150 / 15000},
        budgets=(1.0, 4.0, 8.0),
        selections=("exponential",),
    ),
]


# --------------------------------------------------------------------------- search


class CalibrationFailed(RuntimeError):
    pass


def solve(fn: Callable[[float], float], target: float, start: float, *, increasing: bool, rtol: float,
          step: float = 1.25) -> float:
    """A parameter x with fn(x) <= target whose crossing fn = target lies within a factor 1 + rtol of x.

    ``fn`` is monotone in x > 0 (increasing: epsilon0; decreasing: noise multiplier) and may
    be inf. The search brackets the crossing from ``start`` with factors ``step``,
    ``step**2``, ..., runs Brent's method on log fn against log x, and then steps back to
    the side that fits, so the returned value is always verified.
    """
    cache: dict[float, float] = {}

    def value(x: float) -> float:
        if x not in cache:
            cache[x] = float(fn(x))
        return cache[x]

    def fits(x: float) -> bool:
        return value(x) <= target

    def safer(x: float, factor: float) -> float:  # less privacy loss
        return x / factor if increasing else x * factor

    def riskier(x: float, factor: float) -> float:
        return x * factor if increasing else x / factor

    factor = step
    if fits(start):
        good, bad = start, riskier(start, factor)
        while fits(bad):
            factor *= factor
            good, bad = bad, riskier(bad, factor)
            if not 1e-9 < bad < 1e9:
                raise CalibrationFailed(f"target {target:g} is met at every parameter value")
    else:
        bad, good = start, safer(start, factor)
        while not fits(good):
            factor *= factor
            bad, good = good, safer(good, factor)
            if not 1e-9 < good < 1e9:
                raise CalibrationFailed(f"target {target:g} is not met at any parameter value")
    while not math.isfinite(value(bad)):  # Brent's method needs finite values at both ends
        middle = math.sqrt(good * bad)
        if fits(middle):
            good = middle
        else:
            bad = middle
        if abs(math.log(bad / good)) <= rtol:
            return good
    if abs(math.log(bad / good)) <= rtol:
        return good

    def gap(u: float) -> float:
        return math.log(max(value(math.exp(u)), 1e-300)) - math.log(target)

    lo, hi = sorted((math.log(good), math.log(bad)))
    u = brentq(gap, lo, hi, xtol=rtol / 4)
    # u is within rtol/4 of the crossing; step toward safety until the value fits.
    shift = rtol / 2
    x = safer(math.exp(u), math.exp(shift))
    while not fits(x):
        shift *= 2.0
        x = safer(math.exp(u), math.exp(shift))
        if (x <= good) if increasing else (x >= good):  # reached the verified end
            return good
    return x


# --------------------------------------------------------------------------- one case


def _named(accountants: Sequence[Accountant]) -> dict[str, Accountant]:
    return {a.name: a for a in accountants}


def _coarse_accountants() -> dict[str, Accountant]:
    rdp, pld = RdpAccountant(orders=_COARSE_RDP_ORDERS), PldAccountant(_COARSE_PLD_INTERVAL)
    return _named([
        rdp, pld,
        AdvancedCompositionAccountant("drv", pld=pld, rdp=rdp),
        AdvancedCompositionAccountant("kov", pld=pld, rdp=rdp),
        BasicCompositionAccountant(pld=pld, rdp=rdp),
    ])


def _ratio(a: float, b: float) -> float | None:
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def run_case(schedule: Schedule, selection: str, budgets: Sequence[float], noise_targets: Sequence[float],
             rtol: float, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.perf_counter()
    gaussian = selection == "gaussian"
    parameter = "noise_multiplier" if gaussian else "selection_epsilon"
    targets = sorted(set(budgets) | set(noise_targets))
    base = schedule.config(selection, targets[0])
    delta = float(base.delta)
    # The ledger a run of this schedule builds: its accountants are the exact columns.
    ledger = PrivacyLedger(epsilon_budget=max(targets), delta=delta)
    exact = _named(ledger.accountants)
    coarse = _coarse_accountants()

    def event(x: float):
        return RunPlan.with_value(base, x).event

    def epsilon_of(accountant: Accountant) -> Callable[[float], float]:
        return lambda x: accountant.epsilon([event(x)], delta)

    library: dict[float, float] = {}
    side_by_side = []
    for target in targets:
        t0 = time.perf_counter()
        plan = RunPlan.calibrated(DPESConfig(**{**base.model_dump(), "epsilon": target}))
        value = plan.noise_multiplier if gaussian else plan.selection_epsilon
        library[target] = float(value)
        bounds = ledger.bounds_with(plan.event)
        chosen = min(bounds, key=lambda name: bounds[name])
        epsilons = {name: bounds[name] for name in ACCOUNTANTS}
        epsilons["library"] = bounds[chosen]
        advanced = min(("drv", "kov"), key=lambda name: bounds[name])
        over_basic = _ratio(epsilons["library"], epsilons["basic"])
        over_advanced = _ratio(epsilons["library"], epsilons[advanced])
        side_by_side.append({
            "epsilon_target": target,
            "in_schedule": target in budgets,
            "library_parameter": library[target],
            "epsilons": epsilons,
            "library_accountant": chosen,
            "advanced_accountant": advanced,
            "ratio_library_over_basic": over_basic,
            "ratio_library_over_advanced": over_advanced,
            "meets_basic_target": over_basic is not None and over_basic <= TARGET_OVER_BASIC,
            "meets_advanced_target": over_advanced is not None and over_advanced <= TARGET_OVER_ADVANCED,
        })
        log(f"  {schedule.name}/{selection} eps={target:g}: library {parameter}={value:.5g} "
            f"({chosen}), {time.perf_counter() - t0:.1f}s")

    noise = []
    for target in noise_targets:
        t0 = time.perf_counter()
        parameters: dict[str, float | None] = {}
        reached: dict[str, float | None] = {}
        chosen = next(row["library_accountant"] for row in side_by_side if row["epsilon_target"] == target)
        for name in ACCOUNTANTS:
            try:
                if not gaussian:  # pure parts are cheap to account: search precisely
                    value = solve(epsilon_of(exact[name]), target, library[target], increasing=True,
                                  rtol=PURE_RTOL)
                else:
                    # PLD builds at a 1e-4 grid are slow: start from the coarse accountant's answer
                    # (or, for the bound the ledger chose, from the library's value, whose PLDs
                    # are already built), with a first step inside the tolerance, so that the
                    # exact accountant is usually evaluated only twice.
                    start = library[target]
                    if name != chosen:
                        start = solve(epsilon_of(coarse[name]), target, start, increasing=False, rtol=rtol / 4)
                    value = solve(epsilon_of(exact[name]), target, start, increasing=False, rtol=rtol,
                                  step=1.0 + 0.9 * rtol)
            except CalibrationFailed as exc:
                log(f"  {schedule.name}/{selection} eps={target:g} {name}: {exc}")
                parameters[name] = reached[name] = None
                continue
            parameters[name] = value
            reached[name] = float(exact[name].epsilon([event(value)], delta))
        parameters["library"] = library[target]
        reached["library"] = next(row["epsilons"]["library"] for row in side_by_side if row["epsilon_target"] == target)
        noise.append({
            "epsilon_target": target,
            "parameters": parameters,
            "epsilon_reached": reached,
            "parameter_over_library": {name: (None if v is None else v / library[target])
                                       for name, v in parameters.items()},
        })
        log(f"  {schedule.name}/{selection} eps={target:g}: per-accountant calibration "
            f"{time.perf_counter() - t0:.1f}s")

    config = base.model_dump(include={"delta", "generations", "population", "parents", "sampling_rate",
                                      "selection", "feedback", "feedback_noise_ratio", "final_selection"})
    config["dataset_size"] = schedule.dataset_size
    config["expected_records_per_generation"] = base.sampling_rate * schedule.dataset_size
    return {
        "schedule": schedule.name,
        "selection": selection,
        "config": config,
        "parameter": parameter,
        "side_by_side": side_by_side,
        "noise": noise,
        "seconds": round(time.perf_counter() - started, 1),
    }


# --------------------------------------------------------------------------- pure plans against exact values

PURE_TIGHTNESS = 1.01  # issue 35: no printed epsilon of a pure plan more than 1% above the exact value
_PURE_PUBLIC_N = 1_000_000  # a declared N: the plan is the generations alone (no DP count of N)


@dataclass(frozen=True)
class PureRow:
    """T generations of k picks (``selection``) on Poisson subsamples of rate q, at a fixed
    per-pick ``epsilon0`` or at the eps0 ``RunPlan.calibrated`` gives for ``budget``."""

    name: str
    selection: str
    picks: int
    q: float
    generations: int
    delta: float
    epsilon0: float | None = None
    budget: float | None = None


PURE_ROWS: list[PureRow] = [
    PureRow("issue35_example", "permute_and_flip", 1, 0.005, 1000, 1e-5, epsilon0=0.3),
    PureRow("issue35_two_picks", "permute_and_flip", 2, 0.005, 1000, 1e-5, epsilon0=0.3),
    PureRow("library_default", "permute_and_flip", 2, 0.1, 6, 1e-5, budget=1.0),
    PureRow("library_default", "permute_and_flip", 2, 0.1, 6, 1e-5, budget=4.0),
    PureRow("long_run", "permute_and_flip", 2, 0.01, 100, 1e-5, budget=0.2),
    PureRow("long_run", "permute_and_flip", 2, 0.01, 100, 1e-5, budget=1.0),
    PureRow("long_run", "exponential", 2, 0.01, 100, 1e-5, budget=4.0),
    PureRow("sst2_n2000", "exponential", 2, 0.012, 3, 1e-5, budget=4.0),
    PureRow("unsampled", "permute_and_flip", 2, 1.0, 50, 1e-5, epsilon0=0.2),
    PureRow("tiny_delta", "permute_and_flip", 1, 0.02, 500, 1e-9, epsilon0=0.5),
]


def run_pure_row(row: PureRow) -> dict[str, Any]:
    """The ledger's printed epsilon of a pure plan beside the exact value of the same composition.

    Exact: ``tests/exact_pure_dp.py``, the closed-form sum over the T-fold product of the
    k-pick dominating pair, bisected at delta. The plan's event is checked to be exactly T
    generations of that mechanism's event, so both sides compose the same thing.
    """
    config = DPESConfig(epsilon=row.budget or 1.0, delta=row.delta, generations=row.generations, population=6,
                        parents=row.picks, sampling_rate=row.q, selection=row.selection, feedback="none",
                        final_selection="last", dataset_size=_PURE_PUBLIC_N)
    started = time.perf_counter()
    plan = RunPlan.calibrated(config) if row.budget is not None else RunPlan.with_value(config, row.epsilon0)
    calibration_seconds = time.perf_counter() - started if row.budget is not None else None
    epsilon0 = float(plan.value)
    generation = selection_mechanism(row.selection, epsilon0, row.picks, 1.0).event(row.q)
    if group_events([plan.event]) != group_events([dp_accounting.SelfComposedDpEvent(generation, row.generations)]):
        raise RuntimeError(f"pure row {row.name}: the plan's event is not {row.generations} x {generation!r}")
    bounds = PrivacyLedger(epsilon_budget=1e6, delta=row.delta).bounds_with(plan.event)
    printed_by = min(bounds, key=lambda name: bounds[name])
    printed = bounds[printed_by]
    exact = exact_pure_epsilon(epsilon0, row.picks, row.q, row.generations, row.delta)
    return {
        "name": row.name, "selection": row.selection, "picks": row.picks, "sampling_rate": row.q,
        "generations": row.generations, "delta": row.delta, "budget": row.budget, "epsilon0": epsilon0,
        "calibration_seconds": None if calibration_seconds is None else round(calibration_seconds, 3),
        "exact": exact, "printed": printed, "printed_by": printed_by, "pld": bounds["pld"], "rdp": bounds["rdp"],
        "printed_over_exact": printed / exact, "pld_over_exact": bounds["pld"] / exact,
        "within_one_percent": printed <= PURE_TIGHTNESS * exact,
    }


def pure_table(rows: Sequence[dict[str, Any]], markdown: bool) -> str:
    header = ["row", "selection", "k", "q", "T", "delta", "eps0", "exact", "printed", "pld", "rdp",
              "printed/exact", "pld/exact"]
    body = [[r["name"] + ("" if r["budget"] is None else f" (budget {_fmt(r['budget'])})"), r["selection"],
             str(r["picks"]), _fmt(r["sampling_rate"]), str(r["generations"]), _fmt(r["delta"]),
             _fmt(r["epsilon0"], 5), _fmt(r["exact"], 6), f"{_fmt(r['printed'], 6)} ({r['printed_by']})",
             _fmt(r["pld"], 6), _fmt(r["rdp"], 6), _fmt(r["printed_over_exact"], 5), _fmt(r["pld_over_exact"], 5)]
            for r in rows]
    title = (f"Pure-DP plans: the printed epsilon against the exact value of the same composition "
             f"(target: printed/exact <= {PURE_TIGHTNESS}):")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join([title, "", *lines, *("| " + " | ".join(b) + " |" for b in body)])
    widths = [max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    return "\n".join([title, "", *lines, *("  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body)])


# --------------------------------------------------------------------------- report


def summarise(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [(case, row) for case in cases for row in case["side_by_side"] if row["in_schedule"]]
    misses = []
    for case, row in rows:
        for key, label in (("meets_basic_target", "library <= 0.5x basic"),
                           ("meets_advanced_target", "library <= 0.8x advanced")):
            if not row[key]:
                misses.append({"schedule": case["schedule"], "selection": case["selection"],
                               "epsilon": row["epsilon_target"], "target": label,
                               "ratio": row["ratio_library_over_basic" if key == "meets_basic_target"
                                            else "ratio_library_over_advanced"]})

    def worst(key: str) -> float | None:
        values = [row[key] for _, row in rows if row[key] is not None]
        return max(values) if values else None

    return {
        "rows_checked": len(rows),
        "rows_meeting_both_targets": sum(row["meets_basic_target"] and row["meets_advanced_target"] for _, row in rows),
        "worst_ratio_library_over_basic": worst("ratio_library_over_basic"),
        "worst_ratio_library_over_advanced": worst("ratio_library_over_advanced"),
        "misses": misses,
    }


def _fmt(x: float | str | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):  # a non-finite value read back from JSON
        return x
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def tables(cases: Sequence[dict[str, Any]], markdown: bool) -> str:
    """The two tables (epsilon side by side; parameter per accountant) as text or markdown."""

    def render(header: list[str], rows: list[list[str]]) -> list[str]:
        if markdown:
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            return lines + ["| " + " | ".join(r) + " |" for r in rows]
        widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
        out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
        return out + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]

    header = ["schedule", "selection", "epsilon", "param", *COLUMNS, "lib/basic", "lib/adv", "targets"]
    rows = []
    for case in cases:
        for row in case["side_by_side"]:
            if not row["in_schedule"]:
                continue
            verdict = ("met" if row["meets_basic_target"] and row["meets_advanced_target"] else
                       "MISS " + ",".join(n for n, k in (("basic", "meets_basic_target"), ("adv", "meets_advanced_target"))
                                          if not row[k]))
            eps = row["epsilons"]
            rows.append([case["schedule"], case["selection"], _fmt(row["epsilon_target"]),
                         ("z=" if case["parameter"] == "noise_multiplier" else "eps0=") + _fmt(row["library_parameter"]),
                         *(_fmt(eps[c]) for c in ACCOUNTANTS), f"{_fmt(eps['library'])} ({row['library_accountant']})",
                         _fmt(row["ratio_library_over_basic"], 3),
                         f"{_fmt(row['ratio_library_over_advanced'], 3)} ({row['advanced_accountant']})", verdict])
    out = ["Epsilon of the library-calibrated run under each accountant "
           f"(targets: lib/basic <= {TARGET_OVER_BASIC}, lib/adv <= {TARGET_OVER_ADVANCED}):", ""]
    out += render(header, rows)
    header = ["schedule", "selection", "epsilon", "param", *COLUMNS]
    rows = []
    for case in cases:
        name = "z" if case["parameter"] == "noise_multiplier" else "eps0"
        for row in case["noise"]:
            rows.append([case["schedule"], case["selection"], _fmt(row["epsilon_target"]), name,
                         *(_fmt(row["parameters"][c]) for c in COLUMNS)])
    out += ["", "Parameter each accountant needs on its own for the target epsilon "
            "(z: noise multiplier, larger = more noise; eps0: per-pick epsilon, smaller = more noise):", ""]
    out += render(header, rows)
    return "\n".join(out)




def machine() -> dict[str, Any]:
    from importlib import metadata

    try:
        dp_accounting_version = metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:
        dp_accounting_version = "unknown"
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "dp_accounting": dp_accounting_version,
    }


def _json_float(x: Any) -> Any:
    """Strict JSON: non-finite floats as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_float(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_float(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke mode: schedule {QUICK_SCHEDULE} only, epsilon {', '.join(map(str, QUICK_TARGETS))}")
    parser.add_argument("--schedule", action="append", choices=[s.name for s in SCHEDULES],
                        help="run only this schedule (repeatable; default: all)")
    parser.add_argument("--selection", action="append", choices=["gaussian", "exponential"],
                        help="run only this selection (repeatable; default: each schedule's own)")
    parser.add_argument("--rtol", type=float, default=1e-3,
                        help="relative tolerance of the per-accountant calibration (default 1e-3)")
    parser.add_argument("--update", action="store_true",
                        help="recompute only the selected cases and replace them in --output, keeping the others "
                             "(each kept case stays as its own run measured it; 'runs' lists every command)")
    parser.add_argument("--pure-exact", action="store_true",
                        help="only the pure-DP rows against exact values (PURE_ROWS, seconds); the schedule cases "
                             "of --output are kept as they are")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="where to write the JSON results")
    parser.add_argument("--tables-from", metavar="JSON", default=None,
                        help="only print the tables of an earlier results file (nothing is computed or written)")
    args = parser.parse_args(argv)
    if args.tables_from:
        saved = json.loads(Path(args.tables_from).read_text(encoding="utf-8"), parse_float=float)
        print(tables(saved["cases"], args.markdown))
        if saved.get("pure_exact"):
            print()
            print(pure_table(saved["pure_exact"], args.markdown))
        return 0
    if not 0 < args.rtol < 0.1:
        parser.error("--rtol must be in (0, 0.1)")

    names = args.schedule or ([QUICK_SCHEDULE] if args.quick else [s.name for s in SCHEDULES])
    schedules = [s for s in SCHEDULES if s.name in names]
    started = time.perf_counter()
    cases = []
    for schedule in [] if args.pure_exact else schedules:
        budgets = schedule.budgets
        noise_targets = NOISE_TARGETS
        if args.quick:
            budgets = tuple(b for b in budgets if b in QUICK_TARGETS) or QUICK_TARGETS[:1]
            noise_targets = QUICK_TARGETS
        for selection in schedule.selections:
            if args.selection and selection not in args.selection:
                continue
            cases.append(run_case(schedule, selection, budgets, noise_targets, args.rtol,
                                  lambda line: print(line, file=sys.stderr, flush=True)))
    if args.pure_exact:
        schedules = []  # the kept cases name their schedules below
    pure_rows = []
    for row in PURE_ROWS:
        pure_rows.append(run_pure_row(row))
        print(f"  pure {row.name}/{row.selection}: printed/exact {pure_rows[-1]['printed_over_exact']:.5f}",
              file=sys.stderr, flush=True)

    runs_so_far: list[dict] = []
    if (args.update or args.pure_exact) and Path(args.output).exists():
        previous = json.loads(Path(args.output).read_text(encoding="utf-8"), parse_float=float)
        fresh = {(c["schedule"], c["selection"]) for c in cases}
        cases = [c for c in previous["cases"] if (c["schedule"], c["selection"]) not in fresh] + cases
        runs_so_far = previous.get("runs") or [{k: previous.get(k) for k in ("command", "date", "code_version",
                                                                              "seconds")}]
        order = {s.name: i for i, s in enumerate(SCHEDULES)}
        cases.sort(key=lambda c: (order.get(c["schedule"], len(order)), c["selection"] != "gaussian"))
        schedules = [s for s in SCHEDULES if s.name in {c["schedule"] for c in cases}]

    result = {
        "benchmark": "accounting",
        "targets": {"library_over_basic_max": TARGET_OVER_BASIC, "library_over_advanced_max": TARGET_OVER_ADVANCED},
        "accountants": list(COLUMNS),
        "schedules": [{"name": s.name, "description": s.description, "dataset_size": s.dataset_size,
                       "budgets": list(s.budgets), "selections": list(s.selections)} for s in schedules],
        "quick": args.quick,
        "rtol": args.rtol,
        "rtol_exponential": PURE_RTOL,
        "cases": cases,
        "pure_exact": pure_rows,
        "summary": {**summarise(cases),
                    "pure_rows_checked": len(pure_rows),
                    "pure_rows_within_one_percent_of_exact": sum(r["within_one_percent"] for r in pure_rows),
                    "worst_pure_printed_over_exact": max(r["printed_over_exact"] for r in pure_rows)},
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(a) for a in
                                        ["benchmarks/accounting.py", *(argv if argv is not None else sys.argv[1:])]),
        "code_version": code_version(),
    }
    result["runs"] = runs_so_far + [{k: result[k] for k in ("command", "date", "code_version", "seconds")}]
    out = Path(args.output)
    atomic_write_text(out, json.dumps(_json_float(result), indent=2) + "\n")

    print(tables(cases, args.markdown))
    print()
    print(pure_table(pure_rows, args.markdown))
    summary = result["summary"]
    print()
    print(f"{summary['rows_meeting_both_targets']} of {summary['rows_checked']} schedule budgets meet both targets; "
          f"worst lib/basic {_fmt(summary['worst_ratio_library_over_basic'], 3)}, "
          f"worst lib/adv {_fmt(summary['worst_ratio_library_over_advanced'], 3)}; {result['seconds']:.0f} s")
    for miss in summary["misses"]:
        print(f"  miss: {miss['schedule']} {miss['selection']} epsilon {miss['epsilon']:g}: "
              f"{miss['target']} (ratio {_fmt(miss['ratio'], 3)})")
    print(f"{summary['pure_rows_within_one_percent_of_exact']} of {summary['pure_rows_checked']} pure-DP rows print "
          f"at most {PURE_TIGHTNESS}x the exact epsilon; worst printed/exact "
          f"{summary['worst_pure_printed_over_exact']:.5f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
