"""Argument checks shared by the mechanisms: each error names the field and the rule."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def positive_finite(value: float, field: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{field}: must be a number, got {type(value).__name__}") from None
    if not math.isfinite(number) or number <= 0.0:
        raise ValueError(f"{field}: must be a finite number > 0, got {value!r}")
    return number


def positive_int(value: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{field}: must be >= 1, got {value}")
    return int(value)


def finite_values(values: Sequence[float] | np.ndarray, field: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{field}: must be a non-empty 1-D sequence of numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{field}: every value must be finite (no nan or inf)")
    return array


def check_k(k: int, num_candidates: int, field: str = "k") -> int:
    k = positive_int(k, field)
    if k > num_candidates:
        raise ValueError(f"{field}: must be <= the number of candidates ({num_candidates}), got {k}")
    return k


def check_sampling_rate(q: float) -> float:
    rate = positive_finite(q, "sampling_rate")
    if rate > 1.0:
        raise ValueError(f"sampling_rate: q must be in (0, 1], got {q!r}")
    return rate
