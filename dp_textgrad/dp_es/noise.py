"""The random source of DP noise, kept apart from every other random generator.

DP noise must be unpredictable to whoever sees the outputs, so :class:`NoiseSource`
seeds its generator from the operating system (``secrets.randbits(128)``) and never
stores or prints that seed. Non-private randomness (mutation sampling, tournament
selection, Poisson subsampling order in tests) uses a separate, seeded
``np.random.Generator`` owned by the caller.

``insecure_seed`` makes the noise reproducible for tests and research. Anyone who
knows the seed can subtract the noise, so such a source reports ``secure = False``
and every release made with it must be labelled insecure.

Limits (documented, not hidden): numpy's PCG64 is a statistical generator, not a
cryptographic one, and floating-point samplers leak through their low-order bits
(Mironov 2012). Both are standard in research DP code; OpenDP samplers are the fix
when that matters.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

Size = int | tuple[int, ...] | None


def _check_scale(scale: float, field: str = "scale") -> float:
    value = float(scale)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{field}: must be a finite number >= 0, got {scale!r}")
    return value


class NoiseSource:
    """DP noise from an OS-seeded numpy Generator.

    ``NoiseSource()`` is secure (fresh OS entropy, seed never kept);
    ``NoiseSource(insecure_seed=7)`` is reproducible and has ``secure == False``.
    """

    __slots__ = ("_rng", "_secure", "_insecure_seed")

    def __init__(self, insecure_seed: int | None = None) -> None:
        if insecure_seed is None:
            # 128 bits of OS entropy; the seed is used once and not kept.
            self._rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
            self._secure = True
            self._insecure_seed = None
        else:
            if isinstance(insecure_seed, bool) or not isinstance(insecure_seed, (int, np.integer)):
                raise TypeError(f"insecure_seed: must be an int or None, got {type(insecure_seed).__name__}")
            if insecure_seed < 0:
                raise ValueError(f"insecure_seed: must be >= 0, got {insecure_seed}")
            self._rng = np.random.Generator(np.random.PCG64(int(insecure_seed)))
            self._secure = False
            self._insecure_seed = int(insecure_seed)

    @property
    def secure(self) -> bool:
        """False when the noise is reproducible from a known seed (not private)."""
        return self._secure

    @property
    def insecure_seed(self) -> int | None:
        return self._insecure_seed

    @property
    def generator(self) -> np.random.Generator:
        """The underlying generator, for other DP randomness such as the secret Poisson
        subsample (amplification by subsampling needs the subsample to stay hidden)."""
        return self._rng

    def __repr__(self) -> str:
        if self._secure:
            return "NoiseSource(secure=True)"
        return f"NoiseSource(insecure_seed={self._insecure_seed}, secure=False)"

    def __reduce__(self):
        # A pickled secure source would carry its generator state to disk, and
        # whoever reads the checkpoint could replay (and subtract) future noise.
        if self._secure:
            raise TypeError("NoiseSource: a secure noise source cannot be pickled or checkpointed; "
                            "create a fresh NoiseSource() when resuming")
        return (_restore_insecure, (self._insecure_seed, self._rng.bit_generator.state))

    # -- samplers -------------------------------------------------------------------
    def normal(self, scale: float, size: Size = None) -> np.ndarray | float:
        """Gaussian noise N(0, scale^2)."""
        return self._rng.normal(0.0, _check_scale(scale), size)

    def gumbel(self, scale: float, size: Size = None) -> np.ndarray | float:
        """Gumbel(0, scale) noise (the exponential mechanism's noisy-max form)."""
        return self._rng.gumbel(0.0, _check_scale(scale), size)

    def uniform(self, size: Size = None) -> np.ndarray | float:
        """Uniform on [0, 1)."""
        return self._rng.random(size)

    def bernoulli(self, p: float | np.ndarray) -> bool | np.ndarray:
        """True with probability ``p`` (elementwise for an array of probabilities)."""
        probs = np.asarray(p, dtype=float)
        if not np.all(np.isfinite(probs)) or np.any(probs < 0.0) or np.any(probs > 1.0):
            raise ValueError("p: probabilities must be finite and in [0, 1]")
        draws = self._rng.random(probs.shape) < probs
        return bool(draws) if draws.ndim == 0 else draws


def _restore_insecure(seed: int, state: dict) -> NoiseSource:
    source = NoiseSource(insecure_seed=seed)
    source._rng.bit_generator.state = state
    return source
