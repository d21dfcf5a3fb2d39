"""Empirical privacy audits: canaries, leakage measures, membership inference,
statistics, empirical epsilon lower bounds, and the end-to-end canary audit of a
whole optimisation run (``run_canary_audit``; see docs/audit.md).

An audit can show that a run leaks (a lower bound above the claimed epsilon means
a bug); it can never prove that a run is private.

The subpackages, one concept each: ``mechanism_audits`` (L1: each mechanism, and the
controller loop, on neighbouring datasets), ``canaries`` (generating and planting them),
``membership`` (leakage measures and membership-inference scores), ``statistics`` (epsilon
lower bounds, the Gaussian-DP estimate, attack metrics) and ``end_to_end`` (L2: the canary
audit of one whole run). Import the public names from this package.

The names below are imported when first used (PEP 562): the audits need scipy and
scikit-learn, and commands that never audit (``dp-textgrad --help``, ``budget``) should not
pay for them.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each module (relative to this package) and the names it exports.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "canaries.canary_set": ("Canary", "CanarySet", "load_canaries", "save_canaries"),
    "canaries.generation": (
        "canaries_for_task",
        "generate_canaries",
        "inclusion_mask",
        "opening_labels_from_examples",
        "openings_from_examples",
    ),
    "canaries.insertion": (
        "CanaryInsertion",
        "TwinDatasets",
        "insert_canaries",
        "insertion_slots",
        "remove_canaries",
        "twin_datasets",
        "with_private_records",
    ),
    "end_to_end.attacks": ("attack_release",),
    "end_to_end.audit_file": ("read_audit",),
    "end_to_end.canary_audit": ("run_canary_audit",),
    "end_to_end.options": ("CanaryAuditOptions", "CanaryAuditResult"),
    "mechanism_audits.controller_loop": ("audit_controller_loop",),
    "mechanism_audits.dp_scorer": ("audit_scorer",),
    "mechanism_audits.gaussian_scores": ("audit_gaussian_scores",),
    "mechanism_audits.selection": ("audit_exponential", "audit_gumbel_topk"),
    "mechanism_audits.suite": ("run_mechanism_audits",),
    "mechanism_audits.trials": ("MechanismAuditResult",),
    "mechanism_audits.token_voting": ("audit_token_voting",),
    "mechanism_audits.voting": ("audit_voting",),
    "membership.inference": (
        "ATTACKS",
        "AttackScores",
        "loss_score",
        "membership_scores",
        "min_k_pp_score",
        "min_k_score",
        "recall_score",
        "split_by_membership",
        "zlib_score",
    ),
    "membership.leakage": (
        "ExposureResult",
        "ExtractionResult",
        "LeakageReport",
        "PromptLeakage",
        "TopKHitRate",
        "exposure",
        "greedy_extraction",
        "leakage_report",
        "longest_common_substring",
        "prompt_leakage",
        "record_context",
        "topk_hit_rates",
    ),
    "statistics.gdp": ("GdpEstimate", "gaussian_dp_estimate", "gdp_delta", "gdp_epsilon", "gdp_mu"),
    "statistics.lower_bounds": (
        "EpsilonLowerBound",
        "clopper_pearson_lower",
        "clopper_pearson_upper",
        "eps_from_error_rates",
        "eps_lower_bound_from_counts",
        "eps_lower_bound_from_scores",
    ),
    "statistics.metrics": (
        "GroupComparison",
        "Interval",
        "TprAtFpr",
        "bootstrap_ci",
        "cohens_d",
        "compare_groups",
        "effect_magnitude",
        "hedges_g",
        "paired_bootstrap_difference",
        "pr_auc",
        "roc_auc",
        "tpr_at_fpr",
    ),
    "statistics.one_run": (
        "OneRunBound",
        "one_run_bound_from_scores",
        "one_run_eps_lower_bound",
        "one_run_guesses",
        "one_run_p_value",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
