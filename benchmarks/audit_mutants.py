"""Mutant-kill table: each privacy bug patched into the real code, audited by ``audit_scorer``
(the real scorer, per channel) and ``audit_controller_loop`` (the whole controller at q < 1).

    python benchmarks/audit_mutants.py            # prints the markdown table for docs/audit.md

Each mutant is a context manager that patches the library's own code (not a copy);
``tests/audit/test_audit_mutants.py`` uses the same mutants and settings and fails if a
mutant passes or the correct code is flagged. Seeded (insecure noise): deterministic.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # measure this checkout when run as a script

from dp_textgrad.audit import audit_controller_loop, audit_scorer  # noqa: E402
from dp_textgrad.dp_es import scorer as scorer_module  # noqa: E402
from dp_textgrad.dp_es import scoring_backends as scoring_module  # noqa: E402
from dp_textgrad.privacy import mechanisms  # noqa: E402
from dp_textgrad.privacy.data import PrivateBatch, PrivateDataset  # noqa: E402

# A small rate q makes the amplified claim far below what an always-sampled canary shows, so
# the Gaussian statistics see a fixed-seed subsample too (at q = 0.5 they could not: docs/audit.md).
# Every audit places the canary at four positions (Bonferroni over them).
SETTINGS = {
    "gaussian": dict(mechanism="gaussian", sampling_rate=0.1, noise_multiplier=1.0, positions=4, runs=40000),
    "confusion": dict(mechanism="confusion", sampling_rate=0.1, noise_multiplier=4.0, feedback_noise_multiplier=1.0,
                      positions=4, runs=40000),
    # The failure histogram of a generation task: the same release as the confusion matrix, one
    # Gaussian per released vector with L2 sensitivity sqrt(m), through a real GenerationTask.
    # The sums' noise is 1.5x the confusion row's: a doubled histogram is then the larger part of
    # the event (at 4.0 that mutant's margin is thin; at 8.0 the fixed-seed subsample is missed).
    "failures": dict(mechanism="failures", sampling_rate=0.1, noise_multiplier=6.0, feedback_noise_multiplier=1.0,
                     positions=4, runs=40000),
    "exponential": dict(mechanism="exponential", sampling_rate=0.25, epsilon0=2.0, candidates=20, runs=12000),
    # The whole DP-ES controller (calibration to epsilon 0.9, mutation, the real DPScorer at
    # q = 0.3, release) with the ScriptedEngine; statistic: the released prompt is the seed,
    # which the canary favours, among 16 candidates.
    "controller": dict(selection="exponential", sampling_rate=0.3, epsilon=0.9, generations=1, population=16,
                       parents=1, n_background=3, positions=2, runs=6000, positive_control=False),
}


def run_audit(name: str):
    """The audit of row ``name`` of :data:`SETTINGS` (the controller loop or the real scorer)."""
    settings = SETTINGS[name]
    return audit_controller_loop(**settings) if name == "controller" else audit_scorer(**settings)


@contextlib.contextmanager
def correct() -> Iterator[None]:
    yield


@contextlib.contextmanager
def half_noise() -> Iterator[None]:
    """Noise std x 0.5 (Gaussian scores, confusion matrices) and Gumbel scale x 0.5 (selection)."""
    confusion_std = mechanisms.GaussianScoreMechanism.confusion_noise_std
    with mock.patch.object(mechanisms.GaussianScoreMechanism, "noise_std",
                           property(lambda self: 0.5 * self.noise_multiplier * self.l2_sensitivity)), \
            mock.patch.object(mechanisms.GaussianScoreMechanism, "confusion_noise_std",
                              lambda self, matrices: 0.5 * confusion_std(self, matrices)), \
            mock.patch.object(mechanisms.GumbelTopK, "noise_scale",
                              property(lambda self: 0.5 * self.sensitivity / self.epsilon0)):
        yield


@contextlib.contextmanager
def clip_ignored() -> Iterator[None]:
    """Sensitivity x 2 or more: utility sums without clipping (a record moves a sum by 3C), and
    feedback counts (confusion matrices, failure histograms) that count each record twice."""
    totals = scoring_module.batch_totals

    def doubled(*args, **kwargs):
        # After the one-unit-per-record check, as a backend that summed its counts twice would.
        found = totals(*args, **kwargs)
        return scoring_module.SubsampleTotals(found.sums, None if found.confusion is None else 2.0 * found.confusion)

    with mock.patch.object(scoring_module, "clipped_utility_sums",
                           lambda scores, clip_bound: np.nan_to_num(np.asarray(scores, dtype=float)).sum(axis=1)), \
            mock.patch.object(scoring_module, "batch_totals", doubled):
        yield


@contextlib.contextmanager
def charge_skipped() -> Iterator[None]:
    """The mechanism runs without charging the ledger."""
    from dp_textgrad.dp_es.replay import Charge

    # The scorer goes on as after a charge (no journal: nothing to adopt), but the ledger never hears of it.
    with mock.patch.object(scorer_module.DPScorer, "_charge",
                           lambda self, mechanism, label, *args, **kwargs: Charge(0, label, adopted=False)):
        yield


@contextlib.contextmanager
def fixed_seed_subsample() -> Iterator[None]:
    """The Poisson subsample drawn from a fixed seed: not secret, so not amplifying."""
    def poisson_subsample(self, q, rng):
        mask = np.random.default_rng(0).random(len(self._records)) < q
        return PrivateBatch([r for r, keep in zip(self._records, mask) if keep])

    with mock.patch.object(PrivateDataset, "poisson_subsample", poisson_subsample):
        yield


MUTANTS = {"correct": correct, "noise std x 0.5": half_noise, "clip bound ignored": clip_ignored,
           "charge skipped": charge_skipped, "subsample from a fixed seed": fixed_seed_subsample}


def table() -> str:
    rows = ["| mechanism | code | flagged | runs (members) | eps_lb | claim | eps_lb / claim |",
            "|---|---|---|---|---|---|---|"]
    for name, settings in SETTINGS.items():
        for label, mutant in MUTANTS.items():
            with mutant():
                result = run_audit(name)
            ratio = f"{result.eps_lb / result.claimed_epsilon:.2f}" if result.claimed_epsilon > 0 else "-"
            rows.append(f"| {name} (q = {settings['sampling_rate']:g}) | {label} | "
                        f"{'**yes**' if result.violation else 'no'} | {result.runs_per_arm} | "
                        f"{result.eps_lb:.3f} | {result.claimed_epsilon:.3f} | {ratio} |")
    return "\n".join(rows)


if __name__ == "__main__":
    started = time.perf_counter()
    print(table())
    print(f"\n({time.perf_counter() - started:.0f} s)")
