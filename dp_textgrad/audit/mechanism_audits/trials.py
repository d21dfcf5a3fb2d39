"""Shared pieces of the L1 mechanism audits: the result type, the noise controls and the
plumbing of the paired arms (D without the canary vs D plus the canary).

Part of the L1 mechanism audits described in :mod:`dp_textgrad.audit.mechanism_audits`.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import dp_accounting
import numpy as np

from dp_textgrad.audit.statistics.lower_bounds import EpsilonLowerBound, eps_lower_bound_from_scores
from dp_textgrad.privacy.accounting import smallest_bound
from dp_textgrad.privacy.noise import NoiseSource

# Baseline utility sum of every candidate on D (its value is irrelevant; ties are avoided below).
BASELINE_SUM = 5.0
# "Noise off" for the exponential mechanism: eps0 so large that it is an exact argmax.
NOISE_OFF_EPSILON0 = 1e6
# A positive control must reach at least this at 1000 runs per arm (see docs/audit.md).
POSITIVE_CONTROL_FLOOR = 3.0


class ScaledNoise(NoiseSource):
    """BROKEN ON PURPOSE (audit controls only): Gaussian and Gumbel noise times ``factor``."""

    __slots__ = ("_factor",)

    def __init__(self, insecure_seed: int, factor: float) -> None:
        super().__init__(insecure_seed=insecure_seed)
        self._factor = factor

    def normal(self, scale: float, size: Any = None) -> Any:
        return super().normal(scale * self._factor, size)

    def gumbel(self, scale: float, size: Any = None) -> Any:
        return super().gumbel(scale * self._factor, size)


class NoiseOff(NoiseSource):
    """POSITIVE CONTROL ONLY: Gaussian and Gumbel noise are exactly zero."""

    __slots__ = ()

    def normal(self, scale: float, size: Any = None) -> Any:
        return np.zeros(size) if size is not None else 0.0

    def gumbel(self, scale: float, size: Any = None) -> Any:
        return np.zeros(size) if size is not None else 0.0


class RecordingLedger:
    """A ledger that records each charged event and nothing else: an audit charges thousands of
    runs, so it asks the accountants once afterwards, from the recorded events."""

    replayed = 0  # charges adopted on a resume: an audit never resumes

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.unsafe = False

    def spend(self, event: Any, label: str, metadata: Any = None) -> None:
        self.events.append(event)


@dataclass(frozen=True)
class MechanismAuditResult:
    """Claimed epsilon vs empirical lower bound (and the noise-off positive control)."""

    name: str
    claimed_epsilon: float
    delta: float
    alpha: float
    sampling_rate: float
    runs_per_arm: int
    eps_lb: float
    bound: EpsilonLowerBound
    positive_control_eps_lb: float | None
    positive_control: EpsilonLowerBound | None
    seconds: float
    parameters: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def violation(self) -> bool:
        """True when the lower bound exceeds the claim: the claim cannot be right."""
        return self.eps_lb > self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["violation"] = self.violation
        return out


# -- shared pieces ----------------------------------------------------------------------


def _check_runs(runs: int) -> int:
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 20:
        raise ValueError(f"runs: must be an integer >= 20 (runs per arm), got {runs!r}")
    return int(runs)


def _check_rate(q: float) -> float:
    q = float(q)
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"sampling_rate: q must be in (0, 1], got {q}")
    return q


def _check_factor(factor: float) -> float:
    factor = float(factor)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"actual_noise_factor: must be a finite number > 0, got {factor}")
    return factor


def claimed_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """The library's claim for ``event``: the smallest valid bound of the default accountants."""
    return float(smallest_bound([event], delta))


def canary_included(runs: int, q: float, rng: np.random.Generator) -> np.ndarray:
    """Per run of the "with canary" arm: was the canary in the secret Poisson subsample?"""
    return np.ones(runs, dtype=bool) if q == 1.0 else rng.random(runs) < q


def binary_bound(member_hits: np.ndarray, nonmember_hits: np.ndarray, delta: float, alpha: float) -> EpsilonLowerBound:
    """Yes/no statistic: one threshold (0.5), fixed before the runs."""
    return eps_lower_bound_from_scores(
        member_hits.astype(float), nonmember_hits.astype(float), delta, alpha, "bonferroni", thresholds=[0.5]
    )


def continuous_bound(
    member_scores: np.ndarray, nonmember_scores: np.ndarray, delta: float, alpha: float, seed: int
) -> EpsilonLowerBound:
    """Continuous statistic: threshold chosen on a seeded half, bound on the other half."""
    return eps_lower_bound_from_scores(member_scores, nonmember_scores, delta, alpha, 0.5, seed=seed)


def seeded_noise(seed: int) -> tuple[NoiseSource, NoiseSource, np.random.Generator]:
    """The noise of the arm without the canary, of the arm with it, and the generator of the inclusion draws."""
    # Reproducible (insecure) noise is right for an audit: the auditor is not the adversary.
    return (
        NoiseSource(insecure_seed=4 * seed + 1),
        NoiseSource(insecure_seed=4 * seed + 2),
        np.random.default_rng(4 * seed + 3),
    )


@dataclass(frozen=True)
class Trials:
    """The checked settings every L1 audit shares (runs per arm, q, noise factor, delta, alpha, seed)."""

    runs: int
    sampling_rate: float
    noise_factor: float
    delta: float
    alpha: float
    positive_control: bool
    seed: int

    @classmethod
    def checked(
        cls,
        runs: int,
        sampling_rate: float,
        actual_noise_factor: float,
        delta: float,
        alpha: float,
        positive_control: bool,
        seed: int,
    ) -> Trials:
        return cls(
            _check_runs(runs),
            _check_rate(sampling_rate),
            _check_factor(actual_noise_factor),
            delta,
            alpha,
            positive_control,
            seed,
        )

    def result(
        self,
        name: str,
        claim: float,
        bound: EpsilonLowerBound,
        control: EpsilonLowerBound | None,
        *,
        started: float,
        parameters: dict[str, Any],
        note: str,
        delta: float | None = None,
    ) -> MechanismAuditResult:
        """The audit's result; ``seconds`` counts from ``started`` (a perf_counter reading) to now.

        ``delta``: the delta to report, when it is not the one the audit was asked for.
        """
        return MechanismAuditResult(
            name=name,
            claimed_epsilon=claim,
            delta=self.delta if delta is None else delta,
            alpha=self.alpha,
            sampling_rate=self.sampling_rate,
            runs_per_arm=self.runs,
            eps_lb=bound.epsilon,
            bound=bound,
            positive_control_eps_lb=None if control is None else control.epsilon,
            positive_control=control,
            seconds=time.perf_counter() - started,
            parameters=parameters,
            note=note,
        )
