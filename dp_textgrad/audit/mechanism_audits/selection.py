"""L1 audits of the selection mechanisms: the exponential mechanism and one-shot Gumbel top-k.

Part of the L1 mechanism audits described in :mod:`dp_textgrad.audit.mechanism_audits`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dp_textgrad.audit.mechanism_audits.trials import (
    BASELINE_SUM,
    NOISE_OFF_EPSILON0,
    MechanismAuditResult,
    NoiseOff,
    Trials,
    binary_bound,
    canary_included,
    claimed_epsilon,
    seeded_noise,
)
from dp_textgrad.privacy.mechanisms import ExponentialMechanism, GumbelTopK
from dp_textgrad.privacy.noise import NoiseSource


def _selection_audit(
    name: str,
    trials: Trials,
    make: Callable[[float], Any],
    control_mechanism: Callable[[], tuple[Any, NoiseSource | None]],
    *,
    epsilon0: float,
    num_candidates: int,
    sensitivity: float,
    parameters: dict[str, Any],
) -> MechanismAuditResult:
    """Candidate 0 trails the others by C/2 on D and leads by C/2 on D + canary.

    The statistic is "candidate 0 released first" (one fixed threshold). ``make(eps0)``
    builds the mechanism; ``control_mechanism()`` gives the noise-off one and, when
    noise must be switched off at the source, the noise source to use.
    """
    runs, q, factor = trials.runs, trials.sampling_rate, trials.noise_factor
    delta, alpha, seed = trials.delta, trials.alpha, trials.seed
    if num_candidates < 2:
        raise ValueError(f"num_candidates: need at least 2 candidates to select among, got {num_candidates}")
    started = time.perf_counter()
    declared = make(epsilon0)
    claim = claimed_epsilon(declared.event(q), delta)
    u = np.full(num_candidates, BASELINE_SUM)
    u[0] -= 0.5 * sensitivity  # ties never decide

    def hits(
        mechanism: Any, noise_d: NoiseSource, noise_plus: NoiseSource, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        included = canary_included(runs, q, rng)
        without = mechanism.sample(u, noise_d, runs)[:, 0] == 0
        u_plus = u.copy()
        u_plus[0] += sensitivity
        # Runs whose subsample missed the canary see D's utilities.
        picks_in = mechanism.sample(u_plus, noise_plus, runs)[:, 0] == 0
        picks_out = mechanism.sample(u, noise_plus, runs)[:, 0] == 0
        return np.where(included, picks_in, picks_out), without

    noise_d, noise_plus, rng = seeded_noise(seed)
    members, nonmembers = hits(make(epsilon0 / factor), noise_d, noise_plus, rng)
    bound = binary_bound(members, nonmembers, delta, alpha)
    control = None
    if trials.positive_control:
        mechanism, off = control_mechanism()
        noise_d, noise_plus, rng = seeded_noise(seed)
        members, nonmembers = hits(mechanism, off or noise_d, off or noise_plus, rng)
        control = binary_bound(members, nonmembers, delta, alpha)
    return trials.result(
        name,
        claim,
        bound,
        control,
        started=started,
        parameters={
            "epsilon0": float(epsilon0),
            "num_candidates": num_candidates,
            "sensitivity": float(sensitivity),
            "actual_noise_factor": factor,
            "seed": seed,
            **parameters,
        },
        note="statistic: candidate 0 released first; one pre-registered threshold",
    )


def audit_exponential(
    *,
    epsilon0: float = 1.0,
    num_candidates: int = 4,
    sensitivity: float = 1.0,
    sampling_rate: float = 1.0,
    runs: int = 2000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit :class:`ExponentialMechanism` (noise off: eps0 = 1e6, an exact argmax)."""
    trials = Trials.checked(runs, sampling_rate, actual_noise_factor, delta, alpha, positive_control, seed)
    return _selection_audit(
        "exponential",
        trials,
        lambda e: ExponentialMechanism(e, sensitivity),
        lambda: (ExponentialMechanism(NOISE_OFF_EPSILON0, sensitivity), None),
        epsilon0=epsilon0,
        num_candidates=num_candidates,
        sensitivity=sensitivity,
        parameters={},
    )


def audit_gumbel_topk(
    *,
    epsilon0: float = 0.5,
    k: int = 2,
    num_candidates: int = 6,
    sensitivity: float = 1.0,
    sampling_rate: float = 0.5,
    runs: int = 2000,
    delta: float = 1e-5,
    alpha: float = 0.05,
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
) -> MechanismAuditResult:
    """Audit one-shot :class:`GumbelTopK` under Poisson subsampling (default q = 0.5).

    Noise off: the same mechanism with zero Gumbel noise (an exact top-k).
    """
    trials = Trials.checked(runs, sampling_rate, actual_noise_factor, delta, alpha, positive_control, seed)
    return _selection_audit(
        "gumbel_top_k",
        trials,
        lambda e: GumbelTopK(e, k, sensitivity),
        lambda: (GumbelTopK(epsilon0, k, sensitivity), NoiseOff(0)),
        epsilon0=epsilon0,
        num_candidates=num_candidates,
        sensitivity=sensitivity,
        parameters={"k": k},
    )
