"""L1 audit of the Gaussian noisy-score mechanism (all K noisy utility sums released).

Part of the L1 mechanism audits described in :mod:`dp_textgrad.audit.mechanism_audits`.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np

from dp_textgrad.audit.mechanism_audits.trials import (
    BASELINE_SUM,
    MechanismAuditResult,
    NoiseOff,
    Trials,
    canary_included,
    claimed_epsilon,
    continuous_bound,
    seeded_noise,
)
from dp_textgrad.privacy.mechanisms import GaussianScoreMechanism
from dp_textgrad.privacy.noise import NoiseSource


def audit_gaussian_scores(
    *,
    noise_multiplier: float = 2.0,
    num_candidates: int = 4,
    clip_bound: float = 1.0,
    sampling_rate: float = 1.0,
    runs: int = 2000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    favour: Literal["one", "all"] = "all",
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit :class:`GaussianScoreMechanism` (all K noisy sums) on D vs D + canary.

    The canary adds C to candidate 0 (``favour="one"``) or to every candidate
    (``"all"``, the worst case: shift C*sqrt(K) in L2). The statistic is the release
    projected on that shift, the most powerful test for a Gaussian.
    """
    trials = Trials.checked(runs, sampling_rate, actual_noise_factor, delta, alpha, positive_control, seed)
    runs, q, factor = trials.runs, trials.sampling_rate, trials.noise_factor
    if favour not in ("one", "all"):
        raise ValueError(f"favour: use 'one' or 'all', got {favour!r}")
    started = time.perf_counter()
    declared = GaussianScoreMechanism(noise_multiplier, clip_bound, num_candidates)
    claim = claimed_epsilon(declared.event(q), delta)
    released_by = GaussianScoreMechanism(noise_multiplier * factor, clip_bound, num_candidates)
    u = np.full(num_candidates, BASELINE_SUM)
    shift = clip_bound * (np.ones(num_candidates) if favour == "all" else np.eye(num_candidates)[0])
    direction = shift / np.linalg.norm(shift)

    def arm_scores(
        mechanism: GaussianScoreMechanism, noise_d: NoiseSource, noise_plus: NoiseSource, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        included = canary_included(runs, q, rng)
        sums_plus = u[None, :] + included[:, None] * shift[None, :]
        without = (mechanism.release(np.tile(u, (runs, 1)), noise_d) - u) @ direction
        with_canary = (mechanism.release(sums_plus, noise_plus) - u) @ direction
        return with_canary, without

    noise_d, noise_plus, rng = seeded_noise(seed)
    members, nonmembers = arm_scores(released_by, noise_d, noise_plus, rng)
    bound = continuous_bound(members, nonmembers, delta, alpha, seed)
    control = None
    if positive_control:
        _, _, rng = seeded_noise(seed)
        members, nonmembers = arm_scores(released_by, NoiseOff(0), NoiseOff(0), rng)
        control = continuous_bound(members, nonmembers, delta, alpha, seed)
    return trials.result(
        "gaussian_scores",
        claim,
        bound,
        control,
        started=started,
        parameters={
            "noise_multiplier": float(noise_multiplier),
            "num_candidates": num_candidates,
            "clip_bound": float(clip_bound),
            "favour": favour,
            "actual_noise_factor": factor,
            "seed": seed,
        },
        note="statistic: release projected on the canary's shift; threshold on a held-out half",
    )
