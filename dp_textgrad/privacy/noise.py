"""The random source of DP noise, kept apart from every other random generator.

DP noise must be unpredictable to whoever sees the outputs, so :class:`NoiseSource`
seeds its generator from the operating system (``secrets.randbits(128)``) and never
stores or prints that seed. Non-private randomness (mutation sampling, tournament
selection, Poisson subsampling order in tests) uses a separate, seeded
``np.random.Generator`` owned by the caller.

``insecure_seed`` makes the noise reproducible for tests and research. Anyone who
knows the seed can subtract the noise, so such a source reports ``secure = False``
and every release made with it must be labelled insecure.

Releases go through samplers made for DP: :meth:`NoiseSource.add_gaussian`,
:meth:`NoiseSource.noisy_top_k` and :meth:`NoiseSource.add_discrete_laplace` (integer
counts) use OpenDP (``opendp``), which samples exactly from a
discrete distribution on a fine grid with a cryptographically secure generator and
rounds once, so the released floats do not leak through their low-order bits as
textbook float samplers do (Mironov, CCS 2012). A secure source never uses numpy for a
release. The raw samplers (:meth:`normal`, :meth:`gumbel`, :meth:`uniform`) draw from
numpy's PCG64 and are for audits and simulations that run a mechanism many times.

The secret Poisson subsample is drawn from a second, separate generator
(:attr:`sampling_generator`), so the noise does not shift when the dataset gains a
record (the twin-run test relies on that).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from functools import lru_cache
from typing import Any

import numpy as np

Size = int | tuple[int, ...] | None

INSECURE_NOISE_LABEL = (
    "INSECURE reproducible noise (insecure_noise_seed is set): anyone who knows the seed can "
    "remove the noise; for tests and research only, NOT differentially private in practice"
)


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

    __slots__ = ("_rng", "_sampling_rng", "_secure", "_insecure_seed")

    def __init__(self, insecure_seed: int | None = None) -> None:
        if insecure_seed is None:
            # 128 bits of OS entropy each; the seeds are used once and not kept.
            self._rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
            self._sampling_rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
            self._secure = True
            self._insecure_seed = None
        else:
            if isinstance(insecure_seed, bool) or not isinstance(insecure_seed, (int, np.integer)):
                raise TypeError(f"insecure_seed: must be an int or None, got {type(insecure_seed).__name__}")
            if insecure_seed < 0:
                raise ValueError(f"insecure_seed: must be >= 0, got {insecure_seed}")
            self._rng = np.random.Generator(np.random.PCG64(int(insecure_seed)))
            self._sampling_rng = np.random.Generator(np.random.PCG64([int(insecure_seed), 1]))
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
    def sampler(self) -> str:
        """What draws released noise: a label for the ledger, result.json and the console."""
        return "opendp (exact discrete sampling, CSPRNG)" if self._secure else INSECURE_NOISE_LABEL

    @property
    def generator(self) -> np.random.Generator:
        """The numpy generator behind the raw samplers (audits, simulations)."""
        return self._rng

    @property
    def sampling_generator(self) -> np.random.Generator:
        """The generator of the secret Poisson subsample (amplification by subsampling
        needs the subsample to stay hidden), apart from the noise generator."""
        return self._sampling_rng

    def for_charge(self, key: str) -> NoiseSource:
        """The source of one charge's noise, named by ``key`` (the ledger entry and the part).

        Secure: this source itself (OpenDP draws fresh noise; nothing can be replayed).
        Insecure: a source derived from the seed and ``key`` alone, so that a resumed run
        redraws exactly the noise an uninterrupted run draws for that charge (``docs/privacy.md``,
        "Interruptions"); the subsample generator stays apart (see :func:`charge_generator`).
        """
        if self._secure or type(self) is not NoiseSource:  # a subclass (an audit's control) keeps its draws
            return self
        source = NoiseSource(insecure_seed=self._insecure_seed)
        source._rng = np.random.Generator(np.random.PCG64(_seed_words(str(self._insecure_seed).encode(), key)))
        return source

    def replay_secret(self) -> bytes | None:
        """The insecure seed as the secret of :func:`charge_generator` (None when secure: the run
        keeps its own secret, see ``dp_textgrad.dp_es.replay``)."""
        return None if self._secure else f"insecure-noise-seed:{self._insecure_seed}".encode()

    def __repr__(self) -> str:
        if self._secure:
            return "NoiseSource(secure=True)"
        return f"NoiseSource(insecure_seed={self._insecure_seed}, secure=False)"

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickled secure source would carry its generator state to disk, and
        # whoever reads the checkpoint could replay (and subtract) future noise.
        if self._secure:
            raise TypeError(
                "NoiseSource: a secure noise source cannot be pickled or checkpointed; "
                "create a fresh NoiseSource() when resuming"
            )
        return (
            _restore_insecure,
            (self._insecure_seed, self._rng.bit_generator.state, self._sampling_rng.bit_generator.state),
        )

    # -- releases (floating-point safe when secure) --------------------------------------
    def add_gaussian(self, values: np.ndarray, scale: float) -> np.ndarray:
        """``values`` + N(0, scale^2) noise on each entry, any shape.

        Secure: OpenDP's Gaussian measurement on the values themselves (exact discrete
        sampling, one rounding of the sum). Insecure: numpy, reproducible from the seed.
        """
        array = np.asarray(values, dtype=float)
        scale = _check_scale(scale)
        if not self._secure or scale == 0.0 or array.size == 0:
            return array + self.normal(scale, array.shape)  # through normal(): audit controls override it
        if not np.all(np.isfinite(array)):
            raise ValueError("values: every value must be finite before noise is added")
        release = _opendp_gaussian(array.size, scale)
        return np.asarray(release(array.ravel().tolist()), dtype=float).reshape(array.shape)

    def noisy_top_k(self, utilities: np.ndarray, scale: float, k: int, noise: str = "gumbel") -> list[int]:
        """Indices of the k largest ``utilities + noise``, best first (a monotone selection).

        ``noise="gumbel"``: Gumbel(scale) noise, the exponential mechanism / one-shot top-k;
        ``noise="exponential"``: Exponential(scale) noise, which has the distribution of
        permute-and-flip (k = 1). Secure: OpenDP's noisy top-k; insecure: numpy.
        """
        u = np.asarray(utilities, dtype=float).reshape(-1)
        scale = _check_scale(scale)
        if noise not in ("gumbel", "exponential"):
            raise ValueError(f"noise: use 'gumbel' or 'exponential', got {noise!r}")
        if not 1 <= k <= u.size:
            raise ValueError(f"k: must be in [1, {u.size}], got {k}")
        if not np.all(np.isfinite(u)):
            raise ValueError("utilities: every utility must be finite")
        if self._secure and scale > 0.0:
            return [int(i) for i in _opendp_top_k(u.size, scale, int(k), noise)(u.tolist())]
        draws = self.gumbel(scale, u.size) if noise == "gumbel" else self._rng.exponential(scale, u.size)
        return [int(i) for i in np.argsort(-(u + draws), kind="stable")[:k]]

    def add_discrete_laplace(self, value: int, scale: float) -> int:
        """``value`` + discrete Laplace noise, P(k) proportional to exp(-|k| / scale).

        An integer release (a count) has no low-order bits to leak: secure, OpenDP's
        exact discrete Laplace sampler; insecure, the difference of two geometric draws
        from numpy (the same distribution), reproducible from the seed.
        """
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"value: must be an int, got {type(value).__name__}")
        scale = _check_scale(scale)
        if scale == 0.0:
            return int(value)
        if self._secure:
            return int(_opendp_discrete_laplace(scale)(int(value)))
        # X - Y with X, Y ~ Geometric(1 - exp(-1/scale)) on {0, 1, ...} is discrete Laplace(scale).
        success = -math.expm1(-1.0 / scale)
        draws = self._rng.geometric(success, 2) - 1
        return int(value) + int(draws[0] - draws[1])

    # -- raw samplers (numpy; for audits and simulations, not for releases) -------------
    def normal(self, scale: float, size: Size = None) -> np.ndarray | float:
        """Gaussian noise N(0, scale^2) from numpy (not floating-point safe)."""
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


def _seed_words(secret: bytes, key: str) -> list[int]:
    """256 bits from a keyed BLAKE2b of ``key``: unpredictable without ``secret``, fixed with it."""
    digest = hashlib.blake2b(key.encode("utf-8"), key=secret[:64], digest_size=32).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4)]


def charge_generator(secret: bytes, key: str) -> np.random.Generator:
    """The generator of one charge's secret Poisson subsample, from the run's ``secret`` and the
    charge's ``key``: every attempt at that charge draws the same subsample, and without the
    secret the draws are as unpredictable as the OS-seeded generator's."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("secret: must be at least 16 bytes")
    return np.random.Generator(np.random.PCG64(_seed_words(secret, key)))


def _restore_insecure(seed: int, state: dict, sampling_state: dict | None = None) -> NoiseSource:
    source = NoiseSource(insecure_seed=seed)
    source._rng.bit_generator.state = state
    if sampling_state is not None:
        source._sampling_rng.bit_generator.state = sampling_state
    return source


def _opendp() -> Any:
    import opendp.prelude as dp

    dp.enable_features("contrib")  # the samplers below are contributed, proof-documented code
    return dp


@lru_cache(maxsize=64)
def _opendp_gaussian(size: int, scale: float) -> Any:
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)


@lru_cache(maxsize=64)
def _opendp_top_k(size: int, scale: float, k: int, noise: str) -> Any:
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    # OpenDP picks the noise from the privacy measure: zCDP -> Gumbel, pure DP -> Exponential.
    measure = dp.zero_concentrated_divergence() if noise == "gumbel" else dp.max_divergence()
    return dp.m.make_noisy_top_k(domain, dp.linf_distance(T=float, monotonic=True), measure, k=k, scale=scale)


@lru_cache(maxsize=64)
def _opendp_discrete_laplace(scale: float) -> Any:
    dp = _opendp()
    return dp.m.make_laplace(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=scale)
