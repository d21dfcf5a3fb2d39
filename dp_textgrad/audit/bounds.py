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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

# Bisection stops when the bracket is this narrow (well below the 1e-3 we report).
_EPS_TOLERANCE = 1e-9
# Past this, 1 / (1 + e^-eps) is 1.0 in double precision: no finite audit can show more.
_EPS_CEILING = 60.0


def _check_unit(name: str, value: float, *, open_low: bool = True, open_high: bool = True) -> float:
    value = float(value)
    low_ok = value > 0 if open_low else value >= 0
    high_ok = value < 1 if open_high else value <= 1
    if not (math.isfinite(value) and low_ok and high_ok):
        interval = f"{'(' if open_low else '['}0, 1{')' if open_high else ']'}"
        raise ValueError(f"{name}: must be in {interval}, got {value}")
    return value


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
    return int(value)


# -- Clopper-Pearson over many runs -------------------------------------------------------


def clopper_pearson_upper(successes: int, trials: int, level: float) -> float:
    """Exact one-sided upper bound p+ with P(p > p+) <= level."""
    successes, trials = _check_count("successes", successes), _check_count("trials", trials)
    if trials == 0 or successes > trials:
        raise ValueError(f"trials: need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    _check_unit("level", level)
    if successes == trials:
        return 1.0
    return float(sps.beta.ppf(1 - level, successes + 1, trials - successes))


def clopper_pearson_lower(successes: int, trials: int, level: float) -> float:
    """Exact one-sided lower bound p- with P(p < p-) <= level."""
    successes, trials = _check_count("successes", successes), _check_count("trials", trials)
    if trials == 0 or successes > trials:
        raise ValueError(f"trials: need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    _check_unit("level", level)
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
class EpsilonLowerBound:
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

    def to_dict(self) -> dict:
        return asdict(self)


def eps_lower_bound_from_counts(
    false_positives: int, negatives: int, false_negatives: int, positives: int, *,
    delta: float, alpha: float = 0.05, n_tests: int = 1,
) -> EpsilonLowerBound:
    """Clopper-Pearson epsilon lower bound from one threshold's error counts.

    ``negatives`` runs without the canary (``false_positives`` of them called member),
    ``positives`` runs with it (``false_negatives`` called non-member). FPR and FNR get
    exact one-sided upper bounds at alpha / 2 each (alpha / (2 n_tests) under a
    Bonferroni correction over ``n_tests`` thresholds).
    """
    _check_unit("alpha", alpha)
    _check_unit("delta", delta, open_low=False)
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


def _counts_at(members: np.ndarray, nonmembers: np.ndarray, threshold: float) -> tuple[int, int]:
    """(false positives, false negatives) when "member" means score >= threshold."""
    return int(np.sum(nonmembers >= threshold)), int(np.sum(members < threshold))


def _counts_over(members: np.ndarray, nonmembers: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_counts_at for many thresholds at once (sorted search instead of a loop)."""
    fp = nonmembers.size - np.searchsorted(np.sort(nonmembers), thresholds, side="left")
    fn = np.searchsorted(np.sort(members), thresholds, side="left")
    return fp, fn


def _cp_upper_many(successes: np.ndarray, trials: int, level: float) -> np.ndarray:
    """Vectorised clopper_pearson_upper."""
    upper = sps.beta.ppf(1 - level, successes + 1, np.maximum(trials - successes, 1))
    return np.where(successes >= trials, 1.0, upper)


def _as_scores(name: str, values: object) -> np.ndarray:
    array = np.asarray(values, dtype=float).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name}: need at least one score")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: scores must be finite numbers")
    return array


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
    members, nonmembers = _as_scores("member_scores", member_scores), _as_scores("nonmember_scores", nonmember_scores)
    _check_unit("alpha", alpha)
    _check_unit("delta", delta, open_low=False)
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
            fp, fn = _counts_at(members, nonmembers, float(t))
            bound = eps_lower_bound_from_counts(fp, nonmembers.size, fn, members.size,
                                                delta=delta, alpha=alpha, n_tests=grid.size)
            if best is None or bound.epsilon > best.epsilon:
                best = _with(bound, threshold=float(t))
        assert best is not None
        return _with(best, method="clopper-pearson (bonferroni over thresholds)",
                     note=f"Bonferroni over {grid.size} pre-registered thresholds")
    fraction = float(threshold_split)
    _check_unit("threshold_split", fraction)
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
    fp, fn = _counts_over(m_select, n_select, candidates)
    level = alpha / 2
    fpr_upper = _cp_upper_many(fp, n_select.size, level)
    fnr_upper = _cp_upper_many(fn, m_select.size, level)
    scores = [eps_from_error_rates(a, b, delta) for a, b in zip(fpr_upper, fnr_upper)]
    chosen = float(candidates[int(np.argmax(scores))])
    fp, fn = _counts_at(m_eval, n_eval, chosen)
    bound = eps_lower_bound_from_counts(fp, n_eval.size, fn, m_eval.size, delta=delta, alpha=alpha)
    return _with(bound, threshold=chosen, method="clopper-pearson (held-out threshold)",
                 note=f"threshold chosen on {m_cut}+{n_cut} scores, bound on the other "
                      f"{m_eval.size}+{n_eval.size}")


def _with(bound: EpsilonLowerBound, **changes: object) -> EpsilonLowerBound:
    return EpsilonLowerBound(**{**asdict(bound), **changes})


# -- Steinke, Nasr & Jagielski (2023): one run ----------------------------------------


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of "v or more of r guesses correct" under (epsilon, delta)-DP.

    With W ~ Binomial(r, e^eps / (1 + e^eps)) and f(k) = P[W >= k], the paper's
    theorem bounds P[correct >= v] by f(v) + 2 m delta * max_{1<=i<=m} (f(v-i) - f(v)) / i;
    f(v-i) - f(v) = P[v - i <= W < v], and i > v adds nothing (the sum stops growing).
    """
    m, r, v = _check_count("m", m), _check_count("r", r), _check_count("v", v)
    if not v <= r <= m:
        raise ValueError(f"v, r, m: need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: must be a finite number >= 0, got {epsilon}")
    _check_unit("delta", delta, open_low=False, open_high=False)
    q = special.expit(epsilon)  # accuracy of eps-DP randomised response
    beta = float(sps.binom.sf(v - 1, r, q))  # P[W >= v]
    if delta == 0 or v == 0:
        return min(1.0, beta)
    below = sps.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[W = v-1], P[W = v-2], ..., P[W = 0]
    correction = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(1.0, beta + 2 * m * delta * correction)


@dataclass(frozen=True)
class OneRunBound:
    """Steinke-Nasr-Jagielski one-run lower bound and its inputs."""

    epsilon: float
    m: int
    r: int
    v: int
    alpha: float
    delta: float
    method: str = "steinke-nasr-jagielski one-run"

    def to_dict(self) -> dict:
        return asdict(self)


def one_run_eps_lower_bound(m: int, r: int, v: int, delta: float, alpha: float = 0.05) -> OneRunBound:
    """The largest epsilon whose one-run p-value stays below ``alpha`` (bisection).

    ``m`` canaries, each included independently with probability 1/2; the auditor
    guessed in/out for ``r`` of them (abstaining on the rest) and ``v`` guesses were right.
    """
    _check_unit("alpha", alpha)
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return OneRunBound(0.0, m, r, v, alpha, delta)
    low, high = 0.0, 1.0  # invariant: p(low) < alpha <= p(high)
    while one_run_p_value(m, r, v, high, delta) < alpha:
        low, high = high, 2 * high
        if high > _EPS_CEILING:
            return OneRunBound(_EPS_CEILING, m, r, v, alpha, delta)
    while high - low > _EPS_TOLERANCE:
        mid = (low + high) / 2
        if one_run_p_value(m, r, v, mid, delta) < alpha:
            low = mid
        else:
            high = mid
    return OneRunBound(low, m, r, v, alpha, delta)


def one_run_guesses(scores: object, included: object, k_pos: int, k_neg: int) -> tuple[int, int]:
    """(r, v): guess "in" for the ``k_pos`` highest scores, "out" for the ``k_neg`` lowest.

    Fix ``k_pos`` and ``k_neg`` before looking at the scores; picking them afterwards
    to maximise the bound invalidates its confidence level.
    """
    values = _as_scores("scores", scores)
    truth = np.asarray(included, dtype=bool).reshape(-1)
    if truth.size != values.size:
        raise ValueError(f"included: need one inclusion bit per score ({values.size}), got {truth.size}")
    k_pos, k_neg = _check_count("k_pos", k_pos), _check_count("k_neg", k_neg)
    if k_pos + k_neg > values.size:
        raise ValueError(f"k_pos, k_neg: {k_pos} + {k_neg} guesses exceed the {values.size} canaries")
    order = np.argsort(-values, kind="stable")
    guessed_in, guessed_out = order[:k_pos], order[values.size - k_neg:]
    correct = int(truth[guessed_in].sum() + (~truth[guessed_out]).sum())
    return k_pos + k_neg, correct


def one_run_bound_from_scores(scores: object, included: object, *, k_pos: int, k_neg: int,
                              delta: float, alpha: float = 0.05) -> OneRunBound:
    """One-run bound from per-canary membership scores and the inclusion mask."""
    r, v = one_run_guesses(scores, included, k_pos, k_neg)
    return one_run_eps_lower_bound(int(np.asarray(scores).size), r, v, delta, alpha)


# -- Gaussian DP estimate ---------------------------------------------------------------


def gdp_mu(tpr: float, fpr: float) -> float:
    """mu such that mu-GDP's trade-off curve passes through (fpr, tpr): Phi^-1(TPR) - Phi^-1(FPR)."""
    _check_unit("tpr", tpr)
    _check_unit("fpr", fpr)
    return float(sps.norm.ppf(tpr) - sps.norm.ppf(fpr))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    if mu <= 0:
        return 0.0
    a, b = -epsilon / mu + mu / 2, -epsilon / mu - mu / 2
    return float(special.ndtr(a) - math.exp(epsilon + special.log_ndtr(b)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at which mu-GDP is (epsilon, delta)-DP (0 when delta already suffices)."""
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"mu: must be a finite number >= 0, got {mu}")
    _check_unit("delta", delta)
    if mu == 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    high = 1.0
    while gdp_delta(mu, high) > delta:
        high *= 2
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, high, xtol=1e-12))


@dataclass(frozen=True)
class GdpEstimate:
    """Gaussian-DP fit to an observed trade-off: an ESTIMATE, not a bound."""

    mu: float
    epsilon: float
    delta: float
    tpr: float
    fpr: float
    threshold: float
    kind: str = "estimate (not a bound)"

    def to_dict(self) -> dict:
        return asdict(self)


def gaussian_dp_estimate(member_scores: object, nonmember_scores: object, delta: float, *,
                         smoothing: float = 0.5) -> GdpEstimate:
    """The largest mu over thresholds ("member" iff score >= t), converted to epsilon.

    The trivial threshold that calls every score a member is skipped; identical
    scores everywhere give mu = 0.

    Rates are smoothed, (count + smoothing) / (n + 2 smoothing), so that a perfect
    separation gives a finite mu. Tuned on the same scores and without confidence
    intervals: report it as an estimate next to the bounds, never as one.
    """
    members, nonmembers = _as_scores("member_scores", member_scores), _as_scores("nonmember_scores", nonmember_scores)
    if not (math.isfinite(smoothing) and smoothing > 0):
        raise ValueError(f"smoothing: must be a finite number > 0, got {smoothing}")
    _check_unit("delta", delta)
    # The lowest score calls everyone a member (TPR = FPR = 1): no information, but with
    # unequal group sizes smoothing would turn it into a spurious mu > 0. Skip it.
    thresholds = np.unique(np.r_[members, nonmembers])[1:]
    if thresholds.size == 0:  # every score equal: nothing tells members apart
        threshold = float(members[0])
        return GdpEstimate(0.0, 0.0, delta, 1.0, 1.0, threshold)
    fp, fn = _counts_over(members, nonmembers, thresholds)
    tprs = (members.size - fn + smoothing) / (members.size + 2 * smoothing)
    fprs = (fp + smoothing) / (nonmembers.size + 2 * smoothing)
    mus = sps.norm.ppf(tprs) - sps.norm.ppf(fprs)
    best = int(np.argmax(mus))
    mu, tpr, fpr, threshold = max(float(mus[best]), 0.0), float(tprs[best]), float(fprs[best]), float(thresholds[best])
    return GdpEstimate(mu, gdp_epsilon(mu, delta), delta, tpr, fpr, threshold)
