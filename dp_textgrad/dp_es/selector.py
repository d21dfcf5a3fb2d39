"""Parent selection: free selectors on released values, and the selection strategies.

Free (post-processing, never charged): :func:`top_k` and :func:`tournament` act on
values that are already differentially private (noisy Gaussian scores, shrunk
estimates). Charging again for them would be double counting. The charged
selection mechanisms are in :mod:`dp_textgrad.privacy.mechanisms`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_textgrad.privacy.mechanisms import _as_values, _check_k, _positive_int


# -- free selectors (post-processing) -------------------------------------------------


def top_k(values: Sequence[float] | np.ndarray, k: int) -> list[int]:
    """Indices of the k largest values, best first (ties: lower index first). Free."""
    array = _as_values(values, "values")
    k = _check_k(k, array.size)
    order = np.argsort(-array, kind="stable")
    return [int(i) for i in order[:k]]


def tournament(values: Sequence[float] | np.ndarray, k: int, size: int, rng: np.random.Generator,
               *, distinct: bool = True) -> list[int]:
    """k tournament winners; each tournament draws ``size`` entrants without replacement. Free.

    ``rng`` is the NON-private seeded generator (selection on noisy values needs no
    secure randomness). With ``distinct`` a winner leaves the pool, so k <= number of
    candidates; otherwise winners may repeat.
    """
    array = _as_values(values, "values")
    k = _check_k(k, array.size) if distinct else _positive_int(k, "k")
    size = _check_k(size, array.size, "size")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng: must be a numpy Generator (np.random.default_rng(seed))")
    pool = list(range(array.size))
    winners: list[int] = []
    for _ in range(k):
        entrants = rng.choice(len(pool), size=min(size, len(pool)), replace=False)
        best = max(entrants, key=lambda j: (array[pool[j]], -pool[j]))
        winners.append(pool[best])
        if distinct:
            pool.pop(best)
    return winners


__all__ = ["top_k", "tournament"]
