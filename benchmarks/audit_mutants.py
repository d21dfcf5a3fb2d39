"""Mutant-kill table: each privacy bug patched into the real code, audited by ``audit_scorer``
(the real scorer, per channel), ``audit_controller_loop`` (the whole controller at q < 1) and
``audit_voting`` (the teacher vote: keyed partition, charge, histogram, GNMax / confident GNMax)
and ``audit_token_voting`` (the token vote of DP answers: charge, partition, teacher prompts, public
candidates, votes, release).

    python benchmarks/audit_mutants.py            # prints the markdown table for docs/audit.md
    python benchmarks/audit_mutants.py --voting   # the voting rows alone (seconds)
    python benchmarks/audit_mutants.py --tokens   # the token-vote rows alone (about a minute)

Each mutant is a context manager that patches the library's own code (not a copy);
``tests/audit/mechanism_audits/test_dp_scorer_mutants.py``, ``test_voting_mutants.py`` and
``test_token_voting_mutants.py`` use the
same mutants and settings and fail if a mutant passes or the correct code is flagged. Seeded
(insecure noise): deterministic.
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
from dp_textgrad.audit.mechanism_audits.token_voting import audit_token_voting  # noqa: E402
from dp_textgrad.audit.mechanism_audits.voting import audit_voting  # noqa: E402
from dp_textgrad.dp_es import dp_answers  # noqa: E402
from dp_textgrad.dp_es import scorer as scorer_module  # noqa: E402
from dp_textgrad.dp_es import scoring_backends as scoring_module  # noqa: E402
from dp_textgrad.privacy import mechanisms, token_voting, voting  # noqa: E402
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
    # Runs per arm: half of the earlier 40000 (failures), 12000 (exponential) and 6000 (controller) flag
    # every mutant still (2026-12-07, docs/audit.md) in half the time; the Gaussian rows need all 40000.
    "failures": dict(mechanism="failures", sampling_rate=0.1, noise_multiplier=6.0, feedback_noise_multiplier=1.0,
                     positions=4, runs=20000),
    "exponential": dict(mechanism="exponential", sampling_rate=0.25, epsilon0=2.0, candidates=20, runs=6000),
    # The whole DP-ES controller (calibration to epsilon 0.9, mutation, the real DPScorer at
    # q = 0.3, release) with the ScriptedEngine; statistic: the released prompt is the seed,
    # which the canary favours, among 16 candidates.
    "controller": dict(selection="exponential", sampling_rate=0.3, epsilon=0.9, generations=1, population=16,
                       parents=1, n_background=3, positions=2, runs=3000, positive_control=False),
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


# The teacher vote (GNMax, confident GNMax): one public input per labelling phase, no subsampling
# (every teacher votes). The claim is read at delta = 1e-3: a binary statistic over 20000 runs sees
# tails down to about 1e-3, and a claim at 1e-5 would leave every mutant below it.
VOTING_SETTINGS = {
    # Label 0 leads by 6 of 8 votes on D; the canary moves its teacher's vote 0 -> 1 (L2 sqrt(2)).
    "gnmax": dict(mechanism="gnmax", teachers=8, sigma=3.0, lead=6, runs=20000, delta=1e-3),
    # Every teacher abstains on D; the canary's teacher votes, so the max count moves 0 -> 1. The
    # answer's noise (sigma2 = 16) is large, so the threshold step is most of the claim.
    "confident": dict(mechanism="confident", teachers=4, sigma=16.0, threshold=4.75, threshold_sigma=3.0,
                      runs=20000, delta=1e-3),
}


def run_voting_audit(name: str):
    """The audit of row ``name`` of :data:`VOTING_SETTINGS`."""
    return audit_voting(**VOTING_SETTINGS[name])


@contextlib.contextmanager
def voting_half_noise() -> Iterator[None]:
    """Noise std x 0.5 on the counts (GNMax) and on the max count (the threshold step)."""
    with mock.patch.object(voting.GNMax, "noise_std", property(lambda self: 0.5 * self.sigma)), \
            mock.patch.object(voting.ConfidentGNMax, "threshold_noise_std",
                              property(lambda self: 0.5 * self.threshold_sigma)):
        yield


@contextlib.contextmanager
def votes_counted_twice() -> Iterator[None]:
    """Sensitivity x 2: every vote adds 2 to its cell (one teacher moves a count by 2)."""
    histograms = voting.vote_histograms
    with mock.patch.object(voting, "vote_histograms", lambda *args, **kwargs: 2.0 * histograms(*args, **kwargs)):
        yield


@contextlib.contextmanager
def voting_charge_skipped() -> Iterator[None]:
    """The labelling runs without charging the ledger."""
    with mock.patch.object(voting, "_charge", lambda *args, **kwargs: None):
        yield


@contextlib.contextmanager
def partition_by_position() -> Iterator[None]:
    """Teachers hold contiguous chunks of the dataset (by position, not keyed by the record): one
    record more shifts the chunk boundaries, and many teachers' groups change."""
    def by_position(dataset, key, teachers):
        return [i * teachers // len(dataset) for i in range(len(dataset))]

    with mock.patch.object(voting, "_assign", by_position):
        yield


@contextlib.contextmanager
def threshold_not_charged() -> Iterator[None]:
    """Confident GNMax charges the answer (GNMax) only, as if the threshold step were free."""
    with mock.patch.object(voting.ConfidentGNMax, "event", lambda self, queries=1: self.answer.event(queries)):
        yield


VOTING_MUTANTS = {"correct": correct, "noise std x 0.5": voting_half_noise,
                  "votes counted twice": votes_counted_twice, "charge skipped": voting_charge_skipped,
                  "partition by position": partition_by_position,
                  "threshold step not charged": threshold_not_charged}
# The mutants each voting row must flag (a row where a mutant changes nothing is not listed for it:
# the gnmax row charges no threshold step; in the confident row every background teacher abstains,
# so a partition by position moves no vote).
VOTING_CAUGHT = {
    "gnmax": ("noise std x 0.5", "votes counted twice", "charge skipped", "partition by position"),
    "confident": ("noise std x 0.5", "votes counted twice", "charge skipped", "threshold step not charged"),
}


# The token vote of DP answers: one token per answer, every teacher votes (q = 1). Row "b": "a" leads
# by 6 of 8 votes on D, the canary moves its teacher's vote a -> b. Row "c": the canary's answer is a
# token no public source proposes (correct code never releases it). Claims at delta = 1e-3, as above.
TOKEN_SETTINGS = {
    "b": dict(canary_answer="b", teachers=8, sigma=3.0, lead=6, runs=8000, delta=1e-3),
    "c": dict(canary_answer="c", teachers=8, sigma=3.0, lead=6, runs=8000, delta=1e-3),
    # The span vote (one vote per answer over the public input's spans), the same canaries.
    "span b": dict(canary_answer="b", vote="span", teachers=8, sigma=3.0, lead=6, runs=8000, delta=1e-3),
    "span c": dict(canary_answer="c", vote="span", teachers=8, sigma=3.0, lead=6, runs=8000, delta=1e-3),
}


def run_token_audit(name: str):
    """The audit of row ``name`` of :data:`TOKEN_SETTINGS`."""
    return audit_token_voting(**TOKEN_SETTINGS[name])


@contextlib.contextmanager
def token_half_noise() -> Iterator[None]:
    """The released token's noise std x 0.5 (the charge is the declared sigma's)."""
    release = token_voting.TokenGNMax.release

    def half(self, histogram, noise):
        return release(token_voting.TokenGNMax(0.5 * self.sigma, self.max_tokens, self.sampling_rate), histogram,
                       noise)

    with mock.patch.object(token_voting.TokenGNMax, "release", half):
        yield


@contextlib.contextmanager
def token_votes_counted_twice() -> Iterator[None]:
    """Sensitivity x 2: every vote adds 2 to its candidate's count."""
    histograms = token_voting.vote_histograms
    with mock.patch.object(token_voting, "vote_histograms", lambda *args, **kwargs: 2.0 * histograms(*args, **kwargs)):
        yield


@contextlib.contextmanager
def token_charge_skipped() -> Iterator[None]:
    """The answers are voted without charging the ledger."""
    with mock.patch.object(token_voting, "_charge", lambda *args, **kwargs: None):
        yield


@contextlib.contextmanager
def private_token_candidate() -> Iterator[None]:
    """The candidate set takes the answers the teachers' prompts show (private records), not
    public sources alone."""
    def leaky(candidates):
        def with_shown(self, answer):
            shown = [line.split("Output:", 1)[1].strip() for prefix in self._prefixes if prefix is not None
                     for line in prefix.splitlines() if "Output:" in line and line.split("Output:", 1)[1].strip()]
            return [*candidates(self, answer), *dict.fromkeys(shown)]
        return with_shown

    with mock.patch.object(dp_answers.TeacherAnswers, "candidates", leaky(dp_answers.TeacherAnswers.candidates)), \
            mock.patch.object(dp_answers.SpanTeacherAnswers, "candidates",
                              leaky(dp_answers.SpanTeacherAnswers.candidates)):
        yield


TOKEN_MUTANTS = {"correct": correct, "noise std x 0.5": token_half_noise,
                 "votes counted twice": token_votes_counted_twice, "charge skipped": token_charge_skipped,
                 "partition by position": partition_by_position,
                 "private token in the candidate set": private_token_candidate}
# Row "c" sees only the leaky candidate set: with public candidates its canary moves no vote.
TOKEN_CAUGHT = {
    "b": ("noise std x 0.5", "votes counted twice", "charge skipped", "partition by position"),
    "c": ("private token in the candidate set",),
    "span b": ("noise std x 0.5", "votes counted twice", "charge skipped", "partition by position"),
    "span c": ("private token in the candidate set",),
}


def token_table() -> str:
    return _caught_table(TOKEN_SETTINGS, TOKEN_CAUGHT, TOKEN_MUTANTS, run_token_audit,
                         lambda name: f"{'span' if name.startswith('span') else 'token'} vote, canary answer "
                         f"{name.split()[-1]!r}")


def _row(label: str, code: str, result) -> str:
    ratio = f"{result.eps_lb / result.claimed_epsilon:.2f}" if result.claimed_epsilon > 0 else "-"
    return (f"| {label} | {code} | {'**yes**' if result.violation else 'no'} | {result.runs_per_arm} | "
            f"{result.eps_lb:.3f} | {result.claimed_epsilon:.3f} | {ratio} |")


def table() -> str:
    rows = ["| mechanism | code | flagged | runs (members) | eps_lb | claim | eps_lb / claim |",
            "|---|---|---|---|---|---|---|"]
    for name, settings in SETTINGS.items():
        for label, mutant in MUTANTS.items():
            with mutant():
                result = run_audit(name)
            rows.append(_row(f"{name} (q = {settings['sampling_rate']:g})", label, result))
    return "\n".join(rows) + "\n\n" + voting_table() + "\n\n" + token_table()


def voting_table() -> str:
    return _caught_table(VOTING_SETTINGS, VOTING_CAUGHT, VOTING_MUTANTS, run_voting_audit, lambda name: f"voting {name}")


def _caught_table(settings, caught, mutants, run, describe) -> str:
    """One row per audit row and code: the correct code, then each mutant that row must flag."""
    rows = ["| mechanism | code | flagged | runs (members) | eps_lb | claim | eps_lb / claim |",
            "|---|---|---|---|---|---|---|"]
    for name, setting in settings.items():
        for label in ("correct", *caught[name]):
            with mutants[label]():
                result = run(name)
            rows.append(_row(f"{describe(name)} (delta = {setting['delta']:g})", label, result))
    return "\n".join(rows)


if __name__ == "__main__":
    started = time.perf_counter()
    if sys.argv[1:] == ["--voting"]:
        print(voting_table())
    elif sys.argv[1:] == ["--tokens"]:
        print(token_table())
    else:
        print(table())
    print(f"\n({time.perf_counter() - started:.0f} s)")
