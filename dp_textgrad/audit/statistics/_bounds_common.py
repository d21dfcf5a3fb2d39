"""Input checks and threshold counting shared by the epsilon bounds and the Gaussian-DP estimate."""

from __future__ import annotations

import math

import numpy as np


def check_unit(name: str, value: float, *, open_low: bool = True, open_high: bool = True) -> float:
    value = float(value)
    low_ok = value > 0 if open_low else value >= 0
    high_ok = value < 1 if open_high else value <= 1
    if not (math.isfinite(value) and low_ok and high_ok):
        interval = f"{'(' if open_low else '['}0, 1{')' if open_high else ']'}"
        raise ValueError(f"{name}: must be in {interval}, got {value}")
    return value


def check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
    return int(value)


def as_scores(name: str, values: object) -> np.ndarray:
    array = np.asarray(values, dtype=float).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name}: need at least one score")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: scores must be finite numbers")
    return array


def counts_at(members: np.ndarray, nonmembers: np.ndarray, threshold: float) -> tuple[int, int]:
    """(false positives, false negatives) when "member" means score >= threshold."""
    return int(np.sum(nonmembers >= threshold)), int(np.sum(members < threshold))


def counts_over(members: np.ndarray, nonmembers: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """counts_at for many thresholds at once (sorted search instead of a loop)."""
    fp = nonmembers.size - np.searchsorted(np.sort(nonmembers), thresholds, side="left")
    fn = np.searchsorted(np.sort(members), thresholds, side="left")
    return fp, fn
