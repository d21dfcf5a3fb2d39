"""The DP count of a dataset's size: sensitivity 1 under add/remove neighbours, discrete Laplace noise.

``LaplaceCountMechanism`` is re-exported by :mod:`dp_textgrad.privacy.mechanisms` with the other
mechanisms; it lives here to keep that module small. See ``docs/privacy.md``, "The dataset size".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np

from dp_textgrad.privacy.accounting.events import PureDpEvent
from dp_textgrad.privacy.noise import NoiseSource
from dp_textgrad.privacy.validation import positive_finite


@dataclass(frozen=True)
class LaplaceCountMechanism:
    """Release a record count plus discrete Laplace(1 / epsilon) noise, clamped to >= 1.

    Adding or removing one record moves the count by exactly 1 (sensitivity 1), so the
    noisy count is epsilon-DP (discrete Laplace: the ratio of P(k) and P(k + 1) is at most
    exp(1 / scale)); the clamp is post-processing. The event is ``PureDpEvent(epsilon)``:
    shifted by one, a discrete Laplace is exactly the randomized-response pair of epsilon,
    which the accountants read pure events as (RDP and PLD), whereas a continuous
    ``LaplaceDpEvent`` would undercharge it (see ``docs/privacy.md``, "The dataset size").
    """

    epsilon: float

    name = "laplace_count"
    sensitivity = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive_finite(self.epsilon, "epsilon"))

    @property
    def noise_scale(self) -> float:
        return 1.0 / self.epsilon

    def event(self) -> dp_accounting.DpEvent:
        return PureDpEvent(self.epsilon)

    def metadata(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "epsilon": self.epsilon,
            "noise_scale": self.noise_scale,
            "sensitivity": self.sensitivity,
        }

    def release(self, count: int, noise: NoiseSource) -> int:
        """The noisy count, an int >= 1 (charge ``event()`` before calling this)."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count: must be an int >= 0, got {count!r}")
        return max(1, noise.add_discrete_laplace(int(count), self.noise_scale))


__all__ = ["LaplaceCountMechanism"]
