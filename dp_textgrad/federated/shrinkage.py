"""James-Stein shrinkage and drift removal for the silos' noisy per-candidate estimates.

Everything here is post-processing of DP outputs: its inputs are values that a silo (or
the coordinator) has already noised, and public numbers (noise stds, public silo sizes).
No function reads a record, so none changes a guarantee (docs/federated.md).

- :func:`james_stein`: positive-part James-Stein shrinkage of one noisy vector x
  (dimension K, known noise variance v per coordinate) toward a target t:
  t + max(0, 1 - (K - d) v / |x - t|^2) (x - t), with d = 2 for a fixed target and
  d = 3 when the target is x's own mean (Lindley's version). Dominates x in total
  squared error when K > d.
- :func:`shrink_toward_pooled` (coordinator, across silos): each silo's vector toward
  the pooled estimate.
- :func:`shrink_within` (per silo, across candidates): toward the silo's own mean.
- :func:`remove_drift` (control variate): subtract from each silo's vector its
  reference candidate's deviation from the pooled reference, the silo's label-mix drift
  as seen by a prompt every silo scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def james_stein(x: np.ndarray, noise_var: float, target: np.ndarray | float, own_mean: bool = False) -> np.ndarray:
    """Positive-part James-Stein estimate of the mean of ``x`` (one noisy draw) toward ``target``."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 1:
        raise ValueError("x: shrink one vector at a time")
    if not np.isfinite(noise_var) or noise_var < 0:
        raise ValueError(f"noise_var: must be finite and >= 0, got {noise_var}")
    d = 3 if own_mean else 2
    deviation = x - target
    spread = float(deviation @ deviation)
    if x.size <= d or noise_var == 0.0 or spread == 0.0:
        return x.copy()
    factor = max(0.0, 1.0 - (x.size - d) * noise_var / spread)
    return target + factor * deviation


def pooled(estimates: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """The pooled per-candidate estimate: the silos' estimates weighted by their public sizes."""
    w = np.asarray(weights, dtype=float)
    return (w[:, None] * np.asarray(estimates, dtype=float)).sum(axis=0) / w.sum()


def shrink_toward_pooled(
    estimates: np.ndarray, noise_stds: Sequence[float] | np.ndarray, weights: Sequence[float]
) -> np.ndarray:
    """Each silo's noisy estimate vector (row) shrunk toward the pooled one (coordinator JSE)."""
    estimates = np.asarray(estimates, dtype=float)
    centre = pooled(estimates, weights)
    return np.stack([james_stein(row, float(std) ** 2, centre) for row, std in zip(estimates, noise_stds)])


def shrink_within(estimate: np.ndarray, noise_std: float) -> np.ndarray:
    """One silo's noisy estimate vector shrunk toward its own mean across candidates (silo JSE)."""
    estimate = np.asarray(estimate, dtype=float)
    return james_stein(estimate, float(noise_std) ** 2, float(estimate.mean()), own_mean=True)


def remove_drift(estimates: np.ndarray, weights: Sequence[float], reference: int = 0) -> np.ndarray:
    """Subtract each silo's drift, its reference candidate's deviation from the pooled reference.

    Under pooling weighted by ``weights`` the drifts sum to zero, so the pooled estimate is
    unchanged; what changes is each silo's vector, which then differs from the pooled
    one by noise and by genuine disagreement only (what coordinator shrinkage needs).
    """
    estimates = np.asarray(estimates, dtype=float)
    if not 0 <= reference < estimates.shape[1]:
        raise ValueError(f"reference: candidate index {reference} is outside [0, {estimates.shape[1]})")
    drift = estimates[:, reference] - pooled(estimates, weights)[reference]
    return estimates - drift[:, None]


__all__ = ["james_stein", "pooled", "remove_drift", "shrink_toward_pooled", "shrink_within"]
