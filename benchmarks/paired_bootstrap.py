"""Paired bootstrap over test records and seeds for the privacy-utility benchmark.

Every method of a regime is evaluated on the same test records, so differences between
methods are paired: one bootstrap replicate draws the test records once (shared by all
methods) and, for each method, its runs (seeds) with replacement. The spread therefore
counts both sources of chance: which test records (the evaluation) and which random
seed (the optimizer, and its noise for DP methods).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def decode_outcomes(bits: str) -> np.ndarray:
    """``"0110..."`` (one character per test record: 1 = correct) as a float array."""
    return np.frombuffer(bits.encode("ascii"), dtype=np.uint8).astype(float) - ord("0")


def encode_outcomes(correct: np.ndarray) -> str:
    return "".join("1" if c else "0" for c in np.asarray(correct, dtype=bool))


def _percentile_interval(values: np.ndarray, level: float) -> tuple[float, float] | None:
    finite = values[np.isfinite(values)]
    if finite.size < 0.9 * values.size:  # e.g. a ratio whose denominator crosses zero too often
        return None
    tail = 100 * (1 - level) / 2
    return float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))


def paired_bootstrap(outcomes: Mapping[str, np.ndarray], *, reference: str = "seed", ceiling: str = "nonprivate",
                     baselines: Mapping[str, str] | None = None, replicates: int = 2000, level: float = 0.95,
                     seed: int = 0) -> dict[str, dict[str, object]]:
    """Intervals of each method's accuracy, its difference to ``reference`` and ``ceiling``, and its retained gain.

    ``outcomes[method]`` is a (runs x test records) 0/1 matrix, all on the same records.
    Retained gain is (acc_method - acc_reference) / (acc_ceiling - acc_reference), computed
    within each replicate; its interval is None when the ceiling's gain is too often <= 0.
    ``baselines`` maps a method to the one it is an ablation of: its row gains
    ``vs_baseline`` (method - baseline) and that difference's interval.
    """
    matrices = {m: np.atleast_2d(np.asarray(v, dtype=float)) for m, v in outcomes.items()}
    sizes = {v.shape[1] for v in matrices.values()}
    if len(sizes) != 1:
        raise ValueError(f"outcomes: every method needs the same test records, got sizes {sorted(sizes)}")
    n = sizes.pop()
    rng = np.random.default_rng(seed)
    draws = {m: np.empty(replicates) for m in matrices}
    for b in range(replicates):
        records = rng.integers(n, size=n)
        for method, matrix in matrices.items():
            runs = rng.integers(matrix.shape[0], size=matrix.shape[0])
            draws[method][b] = matrix[np.ix_(runs, records)].mean()
    result: dict[str, dict[str, object]] = {}
    for method, acc in draws.items():
        row: dict[str, object] = {"accuracy": float(matrices[method].mean()),
                                  "accuracy_ci": _percentile_interval(acc, level)}
        for name, other in (("vs_" + reference, reference), ("vs_" + ceiling, ceiling)):
            if other in draws and other != method:
                row[name] = float(matrices[method].mean() - matrices[other].mean())
                row[name + "_ci"] = _percentile_interval(acc - draws[other], level)
        baseline = (baselines or {}).get(method)
        if baseline in draws:
            row["baseline"] = baseline
            row["vs_baseline"] = float(matrices[method].mean() - matrices[baseline].mean())
            row["vs_baseline_ci"] = _percentile_interval(acc - draws[baseline], level)
        if reference in draws and ceiling in draws and method not in (reference, ceiling):
            gain = matrices[ceiling].mean() - matrices[reference].mean()
            row["retained_gain"] = None if gain <= 0 else float((matrices[method].mean() - matrices[reference].mean()) / gain)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = (acc - draws[reference]) / (draws[ceiling] - draws[reference])
            ratio[(draws[ceiling] - draws[reference]) <= 0] = np.nan
            row["retained_gain_ci"] = _percentile_interval(ratio, level)
        result[method] = row
    return result
