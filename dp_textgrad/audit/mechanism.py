"""L1 mechanism-level audits: many cheap runs on neighbouring datasets, one guess per run.

Neighbouring datasets (add/remove one record): D, and D plus one *canary* record that
maximally favours one candidate (clipped score C for it, 0 for every other; for the
Gaussian scorer optionally C for every candidate, the worst case of its L2
sensitivity). D is represented by public baseline utility sums ``u``: a
data-independent offset changes no sensitivity, so the guarantee for D = {} with
utilities ``u + sums`` is the guarantee of the mechanism itself. With Poisson
subsampling (q < 1) the canary is included with probability q in each run of the
"with canary" arm, so the audit measures the amplified mechanism the ledger charges.

Each audit returns a :class:`MechanismAuditResult`:

- ``claimed_epsilon``: what the library's own accountants (all five, smallest valid
  bound, :func:`dp_textgrad.privacy.accounting.smallest_bound`) say about the
  mechanism's ``.event(q)`` at ``delta``;
- ``eps_lb``: a (1 - alpha)-confidence Clopper-Pearson lower bound from
  :mod:`dp_textgrad.audit.bounds`, thresholds never tuned on the evaluated scores
  (a fixed threshold for yes/no statistics, a held-out half for continuous ones);
- ``positive_control_eps_lb``: the same audit with the noise switched off. It must
  be large, or the audit could not have seen a violation.

``eps_lb > claimed_epsilon`` is a violation: the mechanism, its accounting or the
code between them is wrong (with probability at most alpha it is a false alarm).
A small ``eps_lb`` proves nothing. The ``actual_noise_factor`` argument releases
with a different noise scale than the one declared (and charged): a deliberately
broken mechanism, for checking that the audit can fail.

The audits live in :mod:`~dp_textgrad.audit.mechanism_gaussian`,
:mod:`~dp_textgrad.audit.mechanism_selection` and :mod:`~dp_textgrad.audit.mechanism_loop`,
their shared pieces in :mod:`~dp_textgrad.audit.mechanism_trials`; this module re-exports
them and runs them all (:func:`run_mechanism_audits`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dp_textgrad.audit.mechanism_gaussian import audit_gaussian_scores
from dp_textgrad.audit.mechanism_loop import audit_controller_loop
from dp_textgrad.audit.mechanism_selection import audit_exponential, audit_gumbel_topk
from dp_textgrad.audit.mechanism_trials import (
    POSITIVE_CONTROL_FLOOR,
    MechanismAuditResult,
    claimed_epsilon,
)

AUDITS: dict[str, Callable[..., MechanismAuditResult]] = {
    "gaussian_scores": audit_gaussian_scores,
    "exponential": audit_exponential,
    "gumbel_top_k": audit_gumbel_topk,
    "controller_loop": audit_controller_loop,
    "controller_loop_exponential": lambda **kw: audit_controller_loop(selection="exponential", **kw),
}


def run_mechanism_audits(runs: int = 2000, controller_runs: int = 300, *, delta: float = 1e-5,
                         alpha: float = 0.05, seed: int = 0,
                         only: Sequence[str] | None = None) -> list[MechanismAuditResult]:
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


__all__ = [
    "AUDITS",
    "POSITIVE_CONTROL_FLOOR",
    "MechanismAuditResult",
    "audit_controller_loop",
    "audit_exponential",
    "audit_gaussian_scores",
    "audit_gumbel_topk",
    "claimed_epsilon",
    "run_mechanism_audits",
]
