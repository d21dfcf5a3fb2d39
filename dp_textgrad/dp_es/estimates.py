"""Released scores and their free post-processing (empirical-Bayes shrinkage).

Everything here acts on values a mechanism already released: no private record and
no charge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize

# A 95% normal interval for released noisy estimates (what each one covers is said where it is shown).
Z95 = 1.959964


@dataclass
class ReleasedScores:
    """What one scoring round releases: DP in a private run, exact in a ``privacy='off'`` baseline.

    ``estimates`` = noisy_sums / (q*N): mean clipped score per record, public
    denominator. ``confusion`` (if requested) has shape (m, *task.feedback.shape): for each
    feedback candidate, the task's noisy feedback counts on the same subsample ([gold label,
    predicted label] for a classification task; failure categories for a generation task).
    """

    candidate_ids: list[str]
    noisy_sums: np.ndarray
    estimates: np.ndarray
    noise_std_sum: float
    noise_std_estimate: float
    expected_batch_size: float
    confusion: np.ndarray | None = None
    confusion_candidate_ids: list[str] | None = None
    confusion_noise_std: float | None = None
    secure_noise: bool = True
    # The noisy count of sampled records whose scoring failed (dp.max_error_share), and its noise std.
    noisy_errors: float | None = None
    error_noise_std: float | None = None

    @property
    def error_share(self) -> float | None:
        """The noisy share of failed records, over the public q*N (None when not released)."""
        return None if self.noisy_errors is None else self.noisy_errors / self.expected_batch_size

    @property
    def error_share_std(self) -> float | None:
        return None if self.error_noise_std is None else self.error_noise_std / self.expected_batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (everything in it is already DP-released)."""
        return {
            "candidate_ids": list(self.candidate_ids),
            "noisy_sums": [float(v) for v in self.noisy_sums],
            "estimates": [float(v) for v in self.estimates],
            "noise_std_sum": float(self.noise_std_sum),
            "noise_std_estimate": float(self.noise_std_estimate),
            "expected_batch_size": float(self.expected_batch_size),
            "confusion": None if self.confusion is None else np.asarray(self.confusion).tolist(),
            "confusion_candidate_ids": self.confusion_candidate_ids,
            "confusion_noise_std": self.confusion_noise_std,
            "secure_noise": self.secure_noise,
            "noisy_errors": self.noisy_errors,
            "error_noise_std": self.error_noise_std,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReleasedScores:
        confusion = data.get("confusion")
        return cls(
            candidate_ids=list(data["candidate_ids"]),
            noisy_sums=np.asarray(data["noisy_sums"], dtype=float),
            estimates=np.asarray(data["estimates"], dtype=float),
            noise_std_sum=float(data["noise_std_sum"]),
            noise_std_estimate=float(data["noise_std_estimate"]),
            expected_batch_size=float(data["expected_batch_size"]),
            confusion=None if confusion is None else np.asarray(confusion, dtype=float),
            confusion_candidate_ids=data.get("confusion_candidate_ids"),
            confusion_noise_std=data.get("confusion_noise_std"),
            secure_noise=bool(data.get("secure_noise", True)),
            noisy_errors=None if data.get("noisy_errors") is None else float(data["noisy_errors"]),
            error_noise_std=None if data.get("error_noise_std") is None else float(data["error_noise_std"]),
        )


def shrink_estimates(
    means: Sequence[float] | np.ndarray, variances: Sequence[float] | np.ndarray | float
) -> np.ndarray:
    """Empirical-Bayes (James-Stein, positive part) shrinkage of noisy estimates. Free.

    Model: theta_k ~ N(mu, tau^2), x_k | theta_k ~ N(theta_k, v_k), v_k known (the DP
    noise variance, possibly different per candidate, e.g. after pooling several
    generations). tau^2 is the Paule-Mandel moment estimate (solve
    sum_k (x_k - mu_w)^2 / (v_k + tau^2) = K - 1, tau^2 >= 0), mu_w the
    precision-weighted grand mean with weights 1/(v_k + tau^2). Each estimate moves
    towards mu_w by B_k = min(1, (K-3)/(K-1) * v_k / (v_k + tau^2)) (Morris's
    correction for estimating mu and tau^2). With equal variances and spread above
    the noise this is exactly the positive-part James-Stein estimator with estimated
    mean, B = (K-3) v / sum (x - mean)^2. Fewer than 4 estimates: returned unchanged.
    """
    x = np.asarray(means, dtype=float).reshape(-1)
    v = (
        np.broadcast_to(np.asarray(variances, dtype=float), x.shape).astype(float)
        if np.ndim(variances) == 0
        else np.asarray(variances, dtype=float).reshape(-1)
    )
    if v.shape != x.shape:
        raise ValueError(f"variances: need one variance per estimate ({x.size}), got {v.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("means: every estimate must be finite")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("variances: every variance must be finite and >= 0")
    count = x.size
    if count < 4 or not np.any(v > 0):
        return x.copy()
    # Exact (noiseless) estimates get a negligible variance instead of 0, so the
    # weights stay finite; they then barely move, as they should.
    v = np.maximum(v, 1e-12 * v.max())

    def weighted(tau2: float) -> tuple[np.ndarray, float]:
        w = 1.0 / (v + tau2)
        return w, float(np.sum(w * x) / np.sum(w))

    def excess_spread(tau2: float) -> float:  # decreasing in tau2
        w, mu = weighted(tau2)
        return float(np.sum(w * (x - mu) ** 2)) - (count - 1)

    if excess_spread(0.0) <= 0.0:
        tau2 = 0.0  # no spread beyond the noise: shrink as far as allowed
    else:
        # Q(t) <= sum (x - mean)^2 / t, so Q <= K - 1 at t = S / (K - 1): a bracket.
        upper = float(np.sum((x - x.mean()) ** 2)) / (count - 1)
        tau2 = optimize.brentq(excess_spread, 0.0, upper) if excess_spread(upper) < 0.0 else upper
    _, grand_mean = weighted(tau2)
    factor = np.minimum(1.0, (count - 3) / (count - 1) * v / (v + tau2))
    return x - factor * (x - grand_mean)


__all__ = ["ReleasedScores", "shrink_estimates"]
