"""The L1 mechanism audits by name (:data:`AUDITS`) and :func:`run_mechanism_audits`, which runs
them all at default parameters (``dp-textgrad audit mechanisms``). What the audits measure is
described in :mod:`dp_textgrad.audit.mechanism_audits`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dp_textgrad.audit.mechanism_audits.controller_loop import audit_controller_loop
from dp_textgrad.audit.mechanism_audits.gaussian_scores import audit_gaussian_scores
from dp_textgrad.audit.mechanism_audits.selection import audit_exponential, audit_gumbel_topk
from dp_textgrad.audit.mechanism_audits.trials import MechanismAuditResult

AUDITS: dict[str, Callable[..., MechanismAuditResult]] = {
    "gaussian_scores": audit_gaussian_scores,
    "exponential": audit_exponential,
    "gumbel_top_k": audit_gumbel_topk,
    "controller_loop": audit_controller_loop,
    "controller_loop_exponential": lambda **kw: audit_controller_loop(selection="exponential", **kw),
}


def run_mechanism_audits(
    runs: int = 2000,
    controller_runs: int = 300,
    *,
    delta: float = 1e-5,
    alpha: float = 0.05,
    seed: int = 0,
    only: Sequence[str] | None = None,
) -> list[MechanismAuditResult]:
    """All L1 audits at default parameters (``only``: a subset of :data:`AUDITS` names)."""
    names = list(AUDITS) if only is None else list(only)
    unknown = [n for n in names if n not in AUDITS]
    if unknown:
        raise ValueError(f"only: unknown audit(s) {unknown}; choose from {sorted(AUDITS)}")
    results = []
    for name in names:
        n = controller_runs if name.startswith("controller_loop") else runs
        results.append(AUDITS[name](runs=n, delta=delta, alpha=alpha, seed=seed))
    return results


__all__ = ["AUDITS", "run_mechanism_audits"]
