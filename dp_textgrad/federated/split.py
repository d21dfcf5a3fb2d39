"""Non-IID silos for experiments: split labelled records by Dirichlet label skew.

For each label, the shares of its records across the S silos are drawn from
Dirichlet(alpha, ..., alpha): a small alpha (0.3) gives silos dominated by one or two
labels, a large one (10) nearly the pooled label mix. The split is a benchmark and
simulation tool: it reads labels, so a real federation never runs it on private data
(each silo simply holds what it holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def dirichlet_label_split(
    labels: Sequence[Any], silos: int, alpha: float, rng: np.random.Generator, min_records: int = 1
) -> list[np.ndarray]:
    """Indices of each silo's records; every record goes to exactly one silo, and every silo
    gets at least ``min_records`` (topped up from the largest silo when the draw left it short).
    """
    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise ValueError(f"silos: need at least one silo, got {silos!r}")
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha: the Dirichlet concentration must be > 0, got {alpha}")
    labels = list(labels)
    if len(labels) < silos * min_records:
        raise ValueError(
            f"silos: {silos} silos of at least {min_records} records need {silos * min_records} "
            f"records, got {len(labels)}"
        )
    by_label: dict[Any, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    parts: list[list[int]] = [[] for _ in range(silos)]
    for label in sorted(by_label, key=str):
        indices = np.asarray(by_label[label])
        rng.shuffle(indices)
        shares = rng.dirichlet(np.full(silos, float(alpha)))
        cuts = (np.cumsum(shares)[:-1] * len(indices)).round().astype(int)
        for silo, chunk in enumerate(np.split(indices, cuts)):
            parts[silo].extend(int(i) for i in chunk)
    # A small alpha can leave a silo (almost) empty: top it up with random records of the
    # largest silo, which keeps the skew of every other silo.
    for silo in range(silos):
        while len(parts[silo]) < min_records:
            largest = max(range(silos), key=lambda s: len(parts[s]))
            moved = parts[largest].pop(int(rng.integers(len(parts[largest]))))
            parts[silo].append(moved)
    return [np.sort(np.asarray(p, dtype=int)) for p in parts]


def label_mix(labels: Sequence[Any], parts: Sequence[np.ndarray], classes: Sequence[Any]) -> np.ndarray:
    """Share of each class in each silo, shape (S, L): how non-IID a split is."""
    values = np.asarray(list(labels), dtype=object)
    mix = np.zeros((len(parts), len(classes)))
    for s, part in enumerate(parts):
        for c, name in enumerate(classes):
            mix[s, c] = np.mean(values[part] == name) if len(part) else 0.0
    return mix


__all__ = ["dirichlet_label_split", "label_mix"]
