"""Attacks on a released prompt for the L2 audit: every leakage measure and membership
attack on all canaries, scored per attack (AUCs, effect sizes, one-run bound, GDP estimate),
and the audit-wide lower bound ``eps_lb``.

Used by :mod:`~dp_textgrad.audit.end_to_end.canary_audit`, whose docstring describes the audit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.audit.canaries.canary_set import Canary, CanarySet
from dp_textgrad.audit.end_to_end.options import CanaryAuditOptions
from dp_textgrad.audit.membership.inference import AttackScores, membership_scores
from dp_textgrad.audit.membership.leakage import (
    ExposureResult,
    ExtractionResult,
    PromptLeakage,
    TopKHitRate,
    exposure,
    greedy_extraction,
    prompt_leakage,
    topk_hit_rates,
)
from dp_textgrad.audit.statistics.gdp import gaussian_dp_estimate
from dp_textgrad.audit.statistics.metrics import bootstrap_ci, compare_groups, tpr_at_fpr
from dp_textgrad.audit.statistics.one_run import one_run_bound_from_scores, one_run_eps_lower_bound
from dp_textgrad.tasks.base import ClassificationTask, Example

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine


def finite_or_none(value: float | None) -> float | None:
    """``value`` as a float, or ``None`` when it is missing or not finite (JSON has no inf or nan)."""
    return None if value is None or not math.isfinite(value) else float(value)


def _roc_points(members: np.ndarray, nonmembers: np.ndarray) -> dict[str, list[float]]:
    from sklearn.metrics import roc_curve

    labels = np.r_[np.ones(members.size), np.zeros(nonmembers.size)]
    fpr, tpr, _ = roc_curve(labels, np.r_[members, nonmembers])
    return {"fpr": [round(float(x), 6) for x in fpr], "tpr": [round(float(x), 6) for x in tpr]}


def _attack_statistics(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    alpha_each: float,
    k_pos: int,
    k_neg: int,
    options: CanaryAuditOptions,
    seed: int,
) -> dict[str, Any]:
    """Everything one attack's per-canary scores give (members are the positive class)."""
    members, nonmembers = scores[included], scores[~included]
    out: dict[str, Any] = {"available": True, "n_members": int(members.size), "n_nonmembers": int(nonmembers.size)}
    one_run = one_run_bound_from_scores(scores, included, k_pos=k_pos, k_neg=k_neg, delta=delta, alpha=alpha_each)
    out["one_run"] = one_run.to_dict()
    if members.size < 2 or nonmembers.size < 2:
        out["note"] = (
            f"group statistics need at least 2 members and 2 non-members, got {members.size} and "
            f"{nonmembers.size}; only the one-run bound is computed"
        )
        return out
    comparison = compare_groups(members, nonmembers, n_resamples=options.n_resamples, seed=seed)
    pr = bootstrap_ci(members, nonmembers, "pr_auc", n_resamples=options.n_resamples, seed=seed)
    d = bootstrap_ci(members, nonmembers, "cohens_d", n_resamples=options.n_resamples, seed=seed)
    out.update(
        {
            "auc": asdict(comparison.auc),
            "pr_auc": asdict(pr),
            "mean_difference": asdict(comparison.mean_difference),
            "cohens_d": asdict(d),
            "hedges_g": comparison.hedges_g,
            "magnitude": comparison.magnitude,
            "statistically_significant": comparison.statistically_significant,
            "practically_significant": comparison.practically_significant,
            "tpr_at_fpr": [asdict(tpr_at_fpr(members, nonmembers, f)) for f in options.fprs],
            "gdp_estimate": gaussian_dp_estimate(members, nonmembers, delta).to_dict(),
            "roc": _roc_points(members, nonmembers),
        }
    )
    return out


def _per_attack_scores(
    text: PromptLeakage,
    extraction: ExtractionResult,
    exposures: Sequence[ExposureResult],
    membership: dict[str, AttackScores],
) -> tuple[dict[str, np.ndarray | None], dict[str, str]]:
    """Per-canary scores of every attack (``None`` when unavailable) and why each unavailable one is."""
    per_attack_scores: dict[str, np.ndarray | None] = {
        "prompt_text": np.array([mt.lcs_fraction for mt in text.matches]),
        "extraction": np.array([o.matched_chars / o.secret_chars for o in extraction.outcomes]),
        "exposure": np.array([e.exposure for e in exposures]),
    }
    unavailable: dict[str, str] = {}
    for name, result in membership.items():
        if result.scores is None:
            per_attack_scores[name] = None
            unavailable[name] = result.note
        elif not np.all(np.isfinite(result.scores)):
            per_attack_scores[name] = None
            unavailable[name] = "some scores are not finite numbers"
        else:
            per_attack_scores[name] = np.asarray(result.scores, dtype=float)
    return per_attack_scores, unavailable


def _gdp_headline(
    attacks: dict[str, Any], available: list[str], options: CanaryAuditOptions, notes: list[str]
) -> dict[str, Any] | None:
    """The pre-registered attack's Gaussian-DP estimate (another attack's when it has none; a note says so)."""
    primary = options.primary_attack
    if "gdp_estimate" not in attacks.get(primary, {}):
        primary = next((a for a in ("loss", *available) if "gdp_estimate" in attacks.get(a, {})), primary)
    gdp = None
    if "gdp_estimate" in attacks.get(primary, {}):
        gdp = {
            **attacks[primary]["gdp_estimate"],
            "attack": primary,
            "note": "the pre-registered attack's estimate; its threshold is tuned on the same scores, so it "
            "is optimistic with few canaries (noise alone often gives a few units at small delta): "
            "an estimate, never a bound",
        }
        if primary != options.primary_attack:
            notes.append(f"primary attack {options.primary_attack!r} unavailable; the estimate uses {primary!r}")
    return gdp


def _per_canary(
    canaries: Sequence[Canary],
    text: PromptLeakage,
    extraction: ExtractionResult,
    exposures: Sequence[ExposureResult],
    per_attack_scores: dict[str, np.ndarray | None],
) -> list[dict[str, Any]]:
    """One entry per canary: id, inclusion bit, leak flags, exposure rank and every attack's score."""
    per_canary = []
    for i, canary in enumerate(canaries):
        per_canary.append(
            {
                "canary_id": canary.canary_id,
                "included": bool(canary.included),
                "verbatim": bool(text.matches[i].verbatim_normalised),
                "extracted": bool(extraction.outcomes[i].extracted),
                "exposure_rank": int(exposures[i].rank),
                "scores": {
                    name: (None if values is None else float(values[i])) for name, values in per_attack_scores.items()
                },
            }
        )
    return per_canary


def _leakage_summary(
    text: PromptLeakage,
    extraction: ExtractionResult,
    top_k: Sequence[TopKHitRate],
    exposures: Sequence[ExposureResult],
    included: np.ndarray,
    options: CanaryAuditOptions,
) -> dict[str, Any]:
    """The ``leakage`` part of ``audit.json``: counts split by membership, rates and exposure summaries."""

    def count(flags: Sequence[bool], member: bool) -> int:
        return int(sum(1 for flag, inc in zip(flags, included) if flag and bool(inc) == member))

    verbatim = [mt.verbatim_normalised for mt in text.matches]
    extracted = [o.extracted for o in extraction.outcomes]
    exposure_values = np.array([e.exposure for e in exposures])
    return {
        "prompt_text": {
            "verbatim_members": count(verbatim, True),
            "verbatim_nonmembers": count(verbatim, False),
            "verbatim_exact": int(sum(mt.verbatim for mt in text.matches)),
            "verbatim_rate": text.verbatim_rate,
            "max_lcs_fraction": text.max_lcs_fraction,
            "mean_lcs_fraction": text.mean_lcs_fraction,
        },
        "extraction": {
            "extracted_members": count(extracted, True),
            "extracted_nonmembers": count(extracted, False),
            "rate": extraction.rate,
            "mean_matched_fraction": extraction.mean_matched_fraction,
            "max_tokens": options.max_tokens,
        },
        "top_k": [asdict(r) for r in top_k],
        "exposure": {
            "mean_members": finite_or_none(float(exposure_values[included].mean())) if included.any() else None,
            "mean_nonmembers": (
                finite_or_none(float(exposure_values[~included].mean())) if (~included).any() else None
            ),
            "max": float(exposure_values.max()),
            "max_possible": float(exposures[0].max_exposure),
            "n_references": int(exposures[0].universe_size - 1),
        },
    }


def _eps_lb(
    attacks: dict[str, Any],
    available: list[str],
    *,
    m: int,
    k_pos: int,
    k_neg: int,
    delta: float,
    alpha_each: float,
    options: CanaryAuditOptions,
) -> dict[str, Any]:
    """The ``eps_lb`` part of ``audit.json``: the largest per-attack one-run bound (ties: the first attack)."""
    best_attack = max(available, key=lambda a: (attacks[a]["one_run"]["epsilon"], -available.index(a)))
    best = attacks[best_attack]["one_run"]
    return {
        "epsilon": float(best["epsilon"]),
        "attack": best_attack if best["epsilon"] > 0 else None,
        "alpha": options.alpha,
        "alpha_per_attack": alpha_each,
        "n_attacks": len(available),
        "k_pos": k_pos,
        "k_neg": k_neg,
        "delta": delta,
        # What a perfect attack (every guess right) would show with these m, guesses and alpha:
        # no audit with these settings can report more, whatever the mechanism does.
        "ceiling": one_run_eps_lower_bound(m, k_pos + k_neg, k_pos + k_neg, delta, alpha_each).epsilon,
        "method": "steinke-nasr-jagielski one-run; the largest per-attack bound, each at alpha / n_attacks",
    }


def attack_release(
    engine: Engine,
    task: ClassificationTask,
    prompt: str,
    canary_set: CanarySet,
    *,
    delta: float,
    reference_prompt: str | None = None,
    nonmember_prefix: Sequence[Example] | None = None,
    options: CanaryAuditOptions | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Attack a released ``prompt`` with every measure, for all canaries (members and not).

    Returns the ``leakage``, ``attacks``, ``per_canary``, ``eps_lb`` and ``gdp_estimate``
    parts of ``audit.json`` (numbers, ids and notes only). ``reference_prompt``
    (default: the task's seed prompt) is the baseline of the ``reference`` attack;
    ``delta`` is the run's delta (bounds and estimates are stated at it).
    """
    options = options or CanaryAuditOptions()
    canaries = list(canary_set)
    m = len(canaries)
    included = canary_set.included_mask
    k_pos, k_neg = options.guesses(m)
    notes: list[str] = []

    text = prompt_leakage(prompt, canaries)
    extraction = greedy_extraction(engine, task, prompt, canaries, max_tokens=options.max_tokens)
    top_k = topk_hit_rates(engine, task, prompt, canaries, options.top_ks)
    exposures = exposure(
        engine,
        task,
        prompt,
        canary_set,
        n_references=min(options.n_exposure_references, len(canary_set.reference_secrets)),
    )
    membership = membership_scores(
        engine,
        task,
        prompt,
        [c.text for c in canaries],
        reference_prompt=reference_prompt,
        nonmember_prefix=nonmember_prefix,
        attacks=options.attacks,
    )

    per_attack_scores, unavailable = _per_attack_scores(text, extraction, exposures, membership)
    available = [name for name, values in per_attack_scores.items() if values is not None]
    # Bonferroni over the attacks (fixed by the engine's abilities, not by the scores):
    # the largest of the per-attack bounds then holds at confidence 1 - alpha.
    alpha_each = options.alpha / len(available)
    attacks: dict[str, Any] = {}
    for index, name in enumerate(per_attack_scores):
        values = per_attack_scores[name]
        if values is None:
            attacks[name] = {"available": False, "note": unavailable[name]}
            continue
        attacks[name] = _attack_statistics(
            values,
            included,
            delta=delta,
            alpha_each=alpha_each,
            k_pos=k_pos,
            k_neg=k_neg,
            options=options,
            seed=seed + index,
        )

    gdp = _gdp_headline(attacks, available, options, notes)
    if any(r.token_rate is None for r in top_k):
        notes.extend(sorted({r.note for r in top_k if r.note}))
    return {
        "leakage": _leakage_summary(text, extraction, top_k, exposures, included, options),
        "attacks": attacks,
        "per_canary": _per_canary(canaries, text, extraction, exposures, per_attack_scores),
        "eps_lb": _eps_lb(
            attacks, available, m=m, k_pos=k_pos, k_neg=k_neg, delta=delta, alpha_each=alpha_each, options=options
        ),
        "gdp_estimate": gdp,
        "notes": notes,
    }
