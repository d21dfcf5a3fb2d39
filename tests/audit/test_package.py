"""The audit package's front: every exported name resolves, lazily, to the object its
defining module holds, and importing the package loads none of its modules (no scipy)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import dp_textgrad.audit as audit
from tests.subprocess_driver import run_driver

# Every name the package exported before it was regrouped by concept (docs and users import these).
EXPORTED_BEFORE_THE_REGROUPING = (
    "ATTACKS", "AttackScores", "Canary", "CanaryAuditOptions", "CanaryAuditResult", "CanaryInsertion", "CanarySet",
    "EpsilonLowerBound", "ExposureResult", "ExtractionResult", "GdpEstimate", "GroupComparison", "Interval",
    "LeakageReport", "OneRunBound", "PromptLeakage", "TopKHitRate", "TprAtFpr", "TwinDatasets", "attack_release",
    "bootstrap_ci", "canaries_for_task", "clopper_pearson_lower", "clopper_pearson_upper", "cohens_d",
    "compare_groups", "effect_magnitude", "eps_from_error_rates", "eps_lower_bound_from_counts",
    "eps_lower_bound_from_scores", "exposure", "gaussian_dp_estimate", "gdp_delta", "gdp_epsilon", "gdp_mu",
    "generate_canaries", "greedy_extraction", "hedges_g", "inclusion_mask", "insert_canaries", "insertion_slots",
    "leakage_report", "load_canaries", "longest_common_substring", "loss_score", "membership_scores",
    "min_k_pp_score", "min_k_score", "one_run_bound_from_scores", "one_run_eps_lower_bound", "one_run_guesses",
    "one_run_p_value", "opening_labels_from_examples", "openings_from_examples", "paired_bootstrap_difference",
    "pr_auc", "prompt_leakage", "read_audit", "recall_score", "record_context", "remove_canaries", "roc_auc",
    "run_canary_audit", "save_canaries", "split_by_membership", "topk_hit_rates", "tpr_at_fpr", "twin_datasets",
    "with_private_records", "zlib_score",
)


def test_no_name_exported_before_is_lost() -> None:
    assert not set(EXPORTED_BEFORE_THE_REGROUPING) - set(audit.__all__)
    assert "run_mechanism_audits" in audit.__all__  # the CLI imports it from the package


@pytest.mark.parametrize("name", sorted(audit.__all__))
def test_each_name_is_the_object_its_defining_module_holds(name: str) -> None:
    value = getattr(audit, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        assert value.__module__.startswith("dp_textgrad.audit.")
        assert getattr(importlib.import_module(value.__module__), name) is value
    else:  # a constant: some module of the package binds it under this name
        assert any(vars(m).get(name) is value for m in _audit_modules()), name


def _audit_modules() -> list:
    return [importlib.import_module(info.name)
            for info in pkgutil.walk_packages(audit.__path__, prefix="dp_textgrad.audit.")]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_audit"):
        audit.no_such_audit  # noqa: B018


def test_importing_the_package_loads_none_of_its_modules() -> None:
    # ``dp-textgrad --help`` and ``budget`` import the package: they must not pay for scipy.
    proc = run_driver("import sys\nimport dp_textgrad.audit",
                      "loaded = sorted(m for m in sys.modules if m.startswith('dp_textgrad.audit.'))\n"
                      "print('LOADED', loaded, 'scipy' in sys.modules, 'sklearn' in sys.modules)")
    assert "LOADED [] False False" in proc.stdout, proc.stdout
