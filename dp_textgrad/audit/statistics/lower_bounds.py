"""Empirical epsilon lower bounds (and one estimate) from membership guesses.

A *lower bound* holds with probability >= 1 - alpha over the audit's randomness:
if it exceeds the claimed epsilon, the claim (or its implementation) is wrong. A
small lower bound proves nothing about privacy; it only says this attack, with
this many trials, could not show more.

- ``eps_lower_bound_from_counts`` / ``eps_lower_bound_from_scores``: many independent
  runs (one guess per run), Clopper-Pearson bounds on FPR and FNR.
- ``one_run_eps_lower_bound``: Steinke, Nasr & Jagielski (2023), "Privacy auditing
  with one (1) training run": m canaries each included with probability 1/2 in ONE
  run; r guesses, v of them correct.
- ``gaussian_dp_estimate``: the mu of Gaussian DP that explains an observed TPR/FPR
  trade-off, converted to epsilon at delta. An ESTIMATE, never a bound.

These are LOWER bounds measured by an audit, not the UPPER bounds the accountants
charge (:mod:`dp_textgrad.privacy.accounting.bounds`). The many-run Clopper-Pearson
bounds live here; the one-run bound in :mod:`~dp_textgrad.audit.statistics.one_run`,
the Gaussian-DP estimate in :mod:`~dp_textgrad.audit.statistics.gdp`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps

from dp_textgrad.audit._asdict import AsDict
from dp_textgrad.audit.statistics._bounds_common import as_scores, check_count, check_unit, counts_at, counts_over

# -- Clopper-Pearson over many runs -------------------------------------------------------


def _binomial(successes: int, trials: int, level: float) -> tuple[int, int]:
    """The checked (successes, trials) of a one-sided Clopper-Pearson bound at ``level``."""
    successes, trials = check_count("successes", successes), check_count("trials", trials)
    if trials == 0 or successes > trials:
        raise ValueError(f"trials: need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    check_unit("level", level)
    return successes, trials


def clopper_pearson_upper(successes: int, trials: int, level: float) -> float:
    """Exact one-sided upper bound p+ with P(p > p+) <= level."""
    successes, trials = _binomial(successes, trials, level)
    if successes == trials:
        return 1.0
    return float(sps.beta.ppf(1 - level, successes + 1, trials - successes))


def clopper_pearson_lower(successes: int, trials: int, level: float) -> float:
    """Exact one-sided lower bound p- with P(p < p-) <= level."""
    successes, trials = _binomial(successes, trials, level)
    if successes == 0:
        return 0.0
    return float(sps.beta.ppf(level, successes, trials - successes + 1))


def eps_from_error_rates(fpr: float, fnr: float, delta: float) -> float:
    """max(0, ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR)).

    Any (eps, delta)-DP mechanism has FPR + e^eps FNR >= 1 - delta and the mirror
    inequality, so rates (or their upper bounds) this low force epsilon at least this.
    """
    best = 0.0
    for numerator_rate, denominator in ((fnr, fpr), (fpr, fnr)):
        numerator = 1.0 - delta - numerator_rate
        if numerator <= 0:
            continue
        best = max(best, math.inf if denominator <= 0 else math.log(numerator / denominator))
    return best


@dataclass(frozen=True)
class EpsilonLowerBound(AsDict):
    """A (1 - alpha)-confidence lower bound on epsilon at ``delta``."""

    epsilon: float
    method: str
    alpha: float
    delta: float
    fpr_upper: float | None = None
    fnr_upper: float | None = None
    false_positives: int | None = None
    negatives: int | None = None
    false_negatives: int | None = None
    positives: int | None = None
    threshold: float | None = None
    n_thresholds: int = 1
    note: str = ""


def eps_lower_bound_from_counts(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    *,
    delta: float,
    alpha: float = 0.05,
    n_tests: int = 1,
) -> EpsilonLowerBound:
    """Clopper-Pearson epsilon lower bound from one threshold's error counts.

    ``negatives`` runs without the canary (``false_positives`` of them called member),
    ``positives`` runs with it (``false_negatives`` called non-member). FPR and FNR get
    exact one-sided upper bounds at alpha / 2 each (alpha / (2 n_tests) under a
    Bonferroni correction over ``n_tests`` thresholds).
    """
    check_unit("alpha", alpha)
    check_unit("delta", delta, open_low=False)
    if isinstance(n_tests, bool) or not isinstance(n_tests, int) or n_tests < 1:
        raise ValueError(f"n_tests: must be an integer >= 1, got {n_tests!r}")
    level = alpha / (2 * n_tests)
    fpr_upper = clopper_pearson_upper(false_positives, negatives, level)
    fnr_upper = clopper_pearson_upper(false_negatives, positives, level)
    return EpsilonLowerBound(
        epsilon=eps_from_error_rates(fpr_upper, fnr_upper, delta),
        method="clopper-pearson",
        alpha=alpha,
        delta=delta,
        fpr_upper=fpr_upper,
        fnr_upper=fnr_upper,
        false_positives=int(false_positives),
        negatives=int(negatives),
        false_negatives=int(false_negatives),
        positives=int(positives),
        n_thresholds=n_tests,
    )


def _cp_upper_many(successes: np.ndarray, trials: int, level: float) -> np.ndarray:
    """Vectorised clopper_pearson_upper."""
    upper = sps.beta.ppf(1 - level, successes + 1, np.maximum(trials - successes, 1))
    return np.where(successes >= trials, 1.0, upper)


def eps_lower_bound_from_scores(
    member_scores: object,
    nonmember_scores: object,
    delta: float,
    alpha: float = 0.05,
    threshold_split: float | Literal["bonferroni"] = 0.5,
    *,
    thresholds: Sequence[float] | None = None,
    seed: int = 0,
) -> EpsilonLowerBound:
    """Clopper-Pearson lower bound from per-run scores ("member" iff score >= threshold).

    Each score must come from an independent run (one guess per run): ``member_scores``
    from runs whose private set held the canary, ``nonmember_scores`` from runs whose
    set did not. The threshold must not be tuned on the scores it is evaluated on:

    - ``threshold_split`` = a fraction f in (0, 1): a seeded, stratified random share f
      of each group picks the threshold (best bound there); the bound is computed on
      the rest only.
    - ``threshold_split="bonferroni"``: every threshold in ``thresholds`` (a grid fixed
      BEFORE seeing the scores) is evaluated on all scores at alpha / (2 * len(grid))
      per error rate; the best is reported. A grid taken from the scores themselves
      would not be valid, so ``thresholds`` is required.
    """
    members, nonmembers = as_scores("member_scores", member_scores), as_scores("nonmember_scores", nonmember_scores)
    check_unit("alpha", alpha)
    check_unit("delta", delta, open_low=False)
    if threshold_split == "bonferroni":
        if thresholds is None or len(thresholds) == 0:
            raise ValueError(
                "thresholds: threshold_split='bonferroni' needs a grid of thresholds fixed before the run; "
                "pass thresholds=[...] or use a split fraction such as threshold_split=0.5"
            )
        grid = np.asarray(thresholds, dtype=float)
        if not np.all(np.isfinite(grid)):
            raise ValueError("thresholds: must be finite numbers")
        best: EpsilonLowerBound | None = None
        for t in grid:
            fp, fn = counts_at(members, nonmembers, float(t))
            bound = eps_lower_bound_from_counts(
                fp, nonmembers.size, fn, members.size, delta=delta, alpha=alpha, n_tests=grid.size
            )
            if best is None or bound.epsilon > best.epsilon:
                best = _with(bound, threshold=float(t))
        assert best is not None
        return _with(
            best,
            method="clopper-pearson (bonferroni over thresholds)",
            note=f"Bonferroni over {grid.size} pre-registered thresholds",
        )
    fraction = float(threshold_split)
    check_unit("threshold_split", fraction)
    rng = np.random.default_rng(seed)
    m_perm, n_perm = rng.permutation(members), rng.permutation(nonmembers)
    m_cut, n_cut = round(fraction * members.size), round(fraction * nonmembers.size)
    if not (0 < m_cut < members.size and 0 < n_cut < nonmembers.size):
        raise ValueError(
            f"threshold_split: a {fraction:g} split of {members.size} member and {nonmembers.size} non-member scores "
            "leaves a part empty; collect more runs or use threshold_split='bonferroni' with fixed thresholds"
        )
    m_select, m_eval = m_perm[:m_cut], m_perm[m_cut:]
    n_select, n_eval = n_perm[:n_cut], n_perm[n_cut:]
    # Candidate thresholds: the selection scores themselves; the best bound there wins.
    candidates = np.unique(np.r_[m_select, n_select])
    fp_each, fn_each = counts_over(m_select, n_select, candidates)
    level = alpha / 2
    fpr_upper = _cp_upper_many(fp_each, n_select.size, level)
    fnr_upper = _cp_upper_many(fn_each, m_select.size, level)
    scores = [eps_from_error_rates(a, b, delta) for a, b in zip(fpr_upper, fnr_upper)]
    chosen = float(candidates[int(np.argmax(scores))])
    fp, fn = counts_at(m_eval, n_eval, chosen)
    bound = eps_lower_bound_from_counts(fp, n_eval.size, fn, m_eval.size, delta=delta, alpha=alpha)
    return _with(
        bound,
        threshold=chosen,
        method="clopper-pearson (held-out threshold)",
        note=f"threshold chosen on {m_cut}+{n_cut} scores, bound on the other {m_eval.size}+{n_eval.size}",
    )


def _with(bound: EpsilonLowerBound, **changes: object) -> EpsilonLowerBound:
    return EpsilonLowerBound(**{**asdict(bound), **changes})


__all__ = [
    "EpsilonLowerBound",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "eps_from_error_rates",
    "eps_lower_bound_from_counts",
    "eps_lower_bound_from_scores",
]
