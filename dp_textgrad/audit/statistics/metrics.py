"""Statistics for membership-inference and leakage results.

Every score is oriented "higher = member". Members are the positive class.

Decision criteria, fixed before any audit runs (see docs/audit.md):

- statistically significant: the bootstrap confidence interval (``level`` = 95%,
  >= 1000 stratified resamples) of the difference excludes zero;
- practically significant: |Cohen's d| >= 0.2 (``PRACTICAL_EFFECT``).

Effect sizes are labelled negligible < 0.2 <= small < 0.5 <= medium < 0.8 <= large.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps
from sklearn.metrics import average_precision_score, roc_auc_score

from dp_textgrad.audit._asdict import AsDict

MIN_RESAMPLES = 1000
CONFIDENCE_LEVEL = 0.95
PRACTICAL_EFFECT = 0.2
Magnitude = Literal["negligible", "small", "medium", "large"]
NamedStatistic = Literal["auc", "pr_auc", "mean_difference", "cohens_d"]
Statistic = NamedStatistic | Callable[[np.ndarray, np.ndarray], float]


def _scores(name: str, values: object, minimum: int = 1) -> np.ndarray:
    array = np.asarray(values, dtype=float).reshape(-1)
    if array.size < minimum:
        raise ValueError(f"{name}: need at least {minimum} score(s), got {array.size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: scores must be finite numbers; drop or fix the non-finite ones")
    return array


# -- discrimination ----------------------------------------------------------------------


def roc_auc(member_scores: object, nonmember_scores: object) -> float:
    """ROC-AUC with members as positives (scikit-learn)."""
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    labels = np.r_[np.ones(members.size), np.zeros(nonmembers.size)]
    return float(roc_auc_score(labels, np.r_[members, nonmembers]))


def pr_auc(member_scores: object, nonmember_scores: object) -> float:
    """PR-AUC (average precision) with members as positives (scikit-learn)."""
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    labels = np.r_[np.ones(members.size), np.zeros(nonmembers.size)]
    return float(average_precision_score(labels, np.r_[members, nonmembers]))


@dataclass(frozen=True)
class TprAtFpr:
    """TPR at a target FPR, or ``None`` with the reason when the sample is too small.

    ``threshold``: members are called when score > threshold (strict);
    ``achieved_fpr``: the FPR realised at that threshold (<= the target).
    """

    target_fpr: float
    tpr: float | None
    threshold: float | None = None
    achieved_fpr: float | None = None
    reason: str | None = None


def tpr_at_fpr(member_scores: object, nonmember_scores: object, fpr: float) -> TprAtFpr:
    """The largest TPR whose FPR does not exceed ``fpr``.

    Needs at least ceil(1 / fpr) non-members: with fewer, an FPR of ``fpr`` cannot be
    told apart from zero and the result is ``None`` with the reason.
    """
    if not 0 < fpr < 1:
        raise ValueError(f"fpr: must be in (0, 1), got {fpr}")
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    needed = math.ceil(1 / fpr - 1e-9)
    if nonmembers.size < needed:
        return TprAtFpr(fpr, None, reason=f"needs at least {needed} non-members for FPR {fpr:g}, got {nonmembers.size}")
    allowed = math.floor(fpr * nonmembers.size + 1e-9)  # false positives we may make
    cut = float(np.sort(nonmembers)[::-1][allowed])  # call members only strictly above it
    return TprAtFpr(fpr, float(np.mean(members > cut)), cut, float(np.mean(nonmembers > cut)))


# -- effect sizes ----------------------------------------------------------------------


def mean_difference(member_scores: object, nonmember_scores: object) -> float:
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    return float(np.mean(members) - np.mean(nonmembers))


def cohens_d(member_scores: object, nonmember_scores: object) -> float:
    """(mean_member - mean_nonmember) / pooled standard deviation (ddof = 1).

    Zero when the means are equal; +-inf when both groups are constant but differ.
    """
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    if members.size + nonmembers.size < 3:
        raise ValueError("member_scores, nonmember_scores: Cohen's d needs at least 3 scores in total")
    return float(_cohens_d_rows(members[None, :], nonmembers[None, :])[0])


def _cohens_d_rows(members: np.ndarray, nonmembers: np.ndarray) -> np.ndarray:
    n1, n2 = members.shape[1], nonmembers.shape[1]
    diff = members.mean(axis=1) - nonmembers.mean(axis=1)
    ss = ((members - members.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) + (
        (nonmembers - nonmembers.mean(axis=1, keepdims=True)) ** 2
    ).sum(axis=1)
    pooled = np.sqrt(ss / (n1 + n2 - 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        d = diff / pooled
    # Exact mean equality gives 0 even when the spread is 0 (identical samples).
    d = np.where(diff == 0, 0.0, d)
    return d


def hedges_g(member_scores: object, nonmember_scores: object) -> float:
    """Cohen's d times Hedges' small-sample correction J = 1 - 3 / (4 (n1 + n2) - 9)."""
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    n = members.size + nonmembers.size
    if n < 4:
        raise ValueError("member_scores, nonmember_scores: Hedges' g needs at least 4 scores in total")
    return cohens_d(members, nonmembers) * (1 - 3 / (4 * n - 9))


def effect_magnitude(d: float) -> Magnitude:
    """negligible < 0.2 <= small < 0.5 <= medium < 0.8 <= large, on |d|."""
    size = abs(d)
    if math.isnan(size):
        raise ValueError("d: effect size is nan")
    if size < 0.2:
        return "negligible"
    if size < 0.5:
        return "small"
    if size < 0.8:
        return "medium"
    return "large"


# -- bootstrap --------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    level: float
    n_resamples: int
    statistic: str

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def excludes_zero(self) -> bool:
        return not self.contains(0.0)


def _auc_rows(members: np.ndarray, nonmembers: np.ndarray) -> np.ndarray:
    """ROC-AUC of each row pair by the Mann-Whitney rank formula (ties count 1/2)."""
    n1, n2 = members.shape[1], nonmembers.shape[1]
    ranks = sps.rankdata(np.concatenate([members, nonmembers], axis=1), axis=1)
    return (ranks[:, :n1].sum(axis=1) - n1 * (n1 + 1) / 2) / (n1 * n2)


def pr_auc_rows(members: np.ndarray, nonmembers: np.ndarray) -> np.ndarray:
    """Average precision of each row pair, as scikit-learn computes it (vectorised).

    AP = sum over distinct thresholds of (R_n - R_{n-1}) P_n: every member contributes
    1 / n_members times the precision at the lowest score of its tie group.
    """
    n1 = members.shape[1]
    scores = np.concatenate([members, nonmembers], axis=1)
    labels = np.concatenate([np.ones_like(members), np.zeros_like(nonmembers)], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=1)
    hits = np.take_along_axis(labels, order, axis=1)
    n = ranked.shape[1]
    positions = np.arange(n)
    is_end = np.ones_like(ranked, dtype=bool)
    is_end[:, :-1] = ranked[:, :-1] != ranked[:, 1:]
    # The last position of each tie group: the first group end at or after each position.
    ends = np.minimum.accumulate(np.where(is_end, positions, n)[:, ::-1], axis=1)[:, ::-1]
    true_positives = np.take_along_axis(np.cumsum(hits, axis=1), ends, axis=1)
    precision = true_positives / (ends + 1)
    return (hits * precision).sum(axis=1) / n1


def _row_statistic(statistic: Statistic) -> tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """A function of (resamples x members, resamples x non-members) -> one value per resample."""
    if callable(statistic):
        name = getattr(statistic, "__name__", "statistic")
        return name, lambda m, n: np.array([float(statistic(a, b)) for a, b in zip(m, n)])
    if statistic == "auc":
        return "auc", _auc_rows
    if statistic == "mean_difference":
        return "mean_difference", lambda m, n: m.mean(axis=1) - n.mean(axis=1)
    if statistic == "cohens_d":
        return "cohens_d", _cohens_d_rows
    if statistic == "pr_auc":
        return "pr_auc", pr_auc_rows
    raise ValueError(f"statistic: use 'auc', 'pr_auc', 'mean_difference', 'cohens_d' or a function, got {statistic!r}")


def _check_bootstrap(n_resamples: int, level: float) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < MIN_RESAMPLES:
        raise ValueError(f"n_resamples: must be an integer >= {MIN_RESAMPLES}, got {n_resamples!r}")
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level}")


def _stratified_indices(
    n_members: int, n_nonmembers: int, n_resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Resample indices (resamples x group size), members and non-members drawn separately."""
    rng = np.random.default_rng(seed)
    m_idx = rng.integers(0, n_members, size=(n_resamples, n_members))
    n_idx = rng.integers(0, n_nonmembers, size=(n_resamples, n_nonmembers))
    return m_idx, n_idx


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    values = values[~np.isnan(values)]
    # Cohen's d of a constant resample is +-inf: interpolating with inf is undefined,
    # so fall back to order statistics (still a percentile interval).
    method: Literal["linear", "inverted_cdf"] = "linear" if np.all(np.isfinite(values)) else "inverted_cdf"
    low, high = np.quantile(values, [tail, 1 - tail], method=method)
    return float(low), float(high)


def bootstrap_ci(
    member_scores: object,
    nonmember_scores: object,
    statistic: Statistic = "auc",
    *,
    n_resamples: int = MIN_RESAMPLES,
    level: float = CONFIDENCE_LEVEL,
    seed: int = 0,
) -> Interval:
    """Stratified percentile bootstrap CI: members and non-members resampled separately."""
    _check_bootstrap(n_resamples, level)
    members, nonmembers = _scores("member_scores", member_scores), _scores("nonmember_scores", nonmember_scores)
    name, rows = _row_statistic(statistic)
    estimate = float(rows(members[None, :], nonmembers[None, :])[0])
    m_idx, n_idx = _stratified_indices(members.size, nonmembers.size, n_resamples, seed)
    low, high = _percentiles(rows(members[m_idx], nonmembers[n_idx]), level)
    return Interval(estimate, low, high, level, n_resamples, name)


def paired_bootstrap_difference(
    members_a: object,
    nonmembers_a: object,
    members_b: object,
    nonmembers_b: object,
    statistic: Statistic = "auc",
    *,
    n_resamples: int = MIN_RESAMPLES,
    level: float = CONFIDENCE_LEVEL,
    seed: int = 0,
) -> Interval:
    """CI of statistic(a) - statistic(b) when a and b score the SAME items.

    Item i of ``members_a`` and of ``members_b`` is the same record (e.g. two attacks,
    or two runs, on the same canaries); each resample draws one set of indices
    (stratified) and uses it for both, so the shared item-level noise cancels.
    """
    _check_bootstrap(n_resamples, level)
    ma, na = _scores("members_a", members_a), _scores("nonmembers_a", nonmembers_a)
    mb, nb = _scores("members_b", members_b), _scores("nonmembers_b", nonmembers_b)
    if ma.size != mb.size or na.size != nb.size:
        raise ValueError("members_b, nonmembers_b: a paired bootstrap needs the same items in a and b (same sizes)")
    name, rows = _row_statistic(statistic)
    estimate = float(rows(ma[None, :], na[None, :])[0] - rows(mb[None, :], nb[None, :])[0])
    m_idx, n_idx = _stratified_indices(ma.size, na.size, n_resamples, seed)
    diffs = rows(ma[m_idx], na[n_idx]) - rows(mb[m_idx], nb[n_idx])
    low, high = _percentiles(diffs, level)
    return Interval(estimate, low, high, level, n_resamples, f"{name} difference (paired)")


# -- one-stop comparison ----------------------------------------------------------------


@dataclass(frozen=True)
class GroupComparison(AsDict):
    """Member vs non-member scores of one attack, with the pre-registered decisions."""

    n_members: int
    n_nonmembers: int
    auc: Interval
    pr_auc: float
    tpr_at_1pct_fpr: TprAtFpr
    tpr_at_01pct_fpr: TprAtFpr
    mean_difference: Interval
    cohens_d: float
    hedges_g: float
    magnitude: Magnitude
    statistically_significant: bool
    practically_significant: bool


def compare_groups(
    member_scores: object,
    nonmember_scores: object,
    *,
    n_resamples: int = MIN_RESAMPLES,
    level: float = CONFIDENCE_LEVEL,
    seed: int = 0,
) -> GroupComparison:
    """AUCs, TPR at low FPR, effect sizes and the two decisions for one attack.

    Statistically significant: the CI of the mean score difference excludes zero.
    Practically significant: |Cohen's d| >= 0.2. (Needs >= 2 scores per group.)
    """
    members = _scores("member_scores", member_scores, minimum=2)
    nonmembers = _scores("nonmember_scores", nonmember_scores, minimum=2)
    difference = bootstrap_ci(members, nonmembers, "mean_difference", n_resamples=n_resamples, level=level, seed=seed)
    d = cohens_d(members, nonmembers)
    return GroupComparison(
        n_members=int(members.size),
        n_nonmembers=int(nonmembers.size),
        auc=bootstrap_ci(members, nonmembers, "auc", n_resamples=n_resamples, level=level, seed=seed),
        pr_auc=pr_auc(members, nonmembers),
        tpr_at_1pct_fpr=tpr_at_fpr(members, nonmembers, 0.01),
        tpr_at_01pct_fpr=tpr_at_fpr(members, nonmembers, 0.001),
        mean_difference=difference,
        cohens_d=d,
        hedges_g=hedges_g(members, nonmembers),
        magnitude=effect_magnitude(d),
        statistically_significant=difference.excludes_zero(),
        practically_significant=abs(d) >= PRACTICAL_EFFECT,
    )
