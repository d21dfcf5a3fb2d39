"""Empirical privacy audits: canaries, leakage measures, membership inference,
statistics, empirical epsilon lower bounds, and the end-to-end canary audit of a
whole optimisation run (``run_canary_audit``; see docs/audit.md).

An audit can show that a run leaks (a lower bound above the claimed epsilon means
a bug); it can never prove that a run is private.
"""

from dp_textgrad.audit.bounds import (
    EpsilonLowerBound,
    GdpEstimate,
    OneRunBound,
    clopper_pearson_lower,
    clopper_pearson_upper,
    eps_from_error_rates,
    eps_lower_bound_from_counts,
    eps_lower_bound_from_scores,
    gaussian_dp_estimate,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    one_run_bound_from_scores,
    one_run_eps_lower_bound,
    one_run_guesses,
    one_run_p_value,
)
from dp_textgrad.audit.canaries import (
    Canary,
    CanaryInsertion,
    CanarySet,
    TwinDatasets,
    canaries_for_task,
    generate_canaries,
    inclusion_mask,
    insert_canaries,
    insertion_slots,
    load_canaries,
    opening_labels_from_examples,
    openings_from_examples,
    remove_canaries,
    save_canaries,
    twin_datasets,
    with_private_records,
)
from dp_textgrad.audit.end_to_end import (
    CanaryAuditOptions,
    CanaryAuditResult,
    attack_release,
    read_audit,
    run_canary_audit,
)
from dp_textgrad.audit.leakage import (
    ExposureResult,
    ExtractionResult,
    LeakageReport,
    PromptLeakage,
    TopKHitRate,
    exposure,
    greedy_extraction,
    leakage_report,
    longest_common_substring,
    prompt_leakage,
    record_context,
    topk_hit_rates,
)
from dp_textgrad.audit.membership import (
    ATTACKS,
    AttackScores,
    loss_score,
    membership_scores,
    min_k_pp_score,
    min_k_score,
    recall_score,
    split_by_membership,
    zlib_score,
)
from dp_textgrad.audit.stats import (
    GroupComparison,
    Interval,
    TprAtFpr,
    bootstrap_ci,
    cohens_d,
    compare_groups,
    effect_magnitude,
    hedges_g,
    paired_bootstrap_difference,
    pr_auc,
    roc_auc,
    tpr_at_fpr,
)

__all__ = [
    "ATTACKS", "AttackScores", "Canary", "CanaryAuditOptions", "CanaryAuditResult", "CanaryInsertion", "CanarySet",
    "EpsilonLowerBound", "ExposureResult", "attack_release", "read_audit", "run_canary_audit",
    "ExtractionResult", "GdpEstimate", "GroupComparison", "Interval", "LeakageReport", "OneRunBound",
    "PromptLeakage", "TopKHitRate", "TprAtFpr", "TwinDatasets", "bootstrap_ci", "canaries_for_task",
    "clopper_pearson_lower", "clopper_pearson_upper", "cohens_d", "compare_groups", "effect_magnitude",
    "eps_from_error_rates", "eps_lower_bound_from_counts", "eps_lower_bound_from_scores", "exposure",
    "gaussian_dp_estimate", "gdp_delta", "gdp_epsilon", "gdp_mu", "generate_canaries", "greedy_extraction",
    "hedges_g", "inclusion_mask", "insert_canaries", "insertion_slots", "leakage_report", "load_canaries",
    "longest_common_substring", "loss_score", "membership_scores", "min_k_pp_score", "min_k_score",
    "one_run_bound_from_scores", "one_run_eps_lower_bound", "one_run_guesses", "one_run_p_value",
    "opening_labels_from_examples", "openings_from_examples", "paired_bootstrap_difference", "pr_auc",
    "prompt_leakage", "recall_score", "record_context", "remove_canaries", "roc_auc", "save_canaries",
    "split_by_membership", "topk_hit_rates", "tpr_at_fpr", "twin_datasets", "with_private_records", "zlib_score",
]
