"""The report's audit section (an L2 canary audit's ``audit.json``, as Markdown)."""

from __future__ import annotations

from typing import Any

from dp_textgrad.report.fmt import num, stat_interval

# Table order: leakage measures, then the membership attacks (others after, alphabetically).
_ATTACK_ORDER = (
    "prompt_text",
    "extraction",
    "exposure",
    "loss",
    "zlib",
    "min_k",
    "min_k_pp",
    "reference",
    "recall",
    "grad_norm",
)


def ordered_attacks(attacks: dict[str, Any]) -> list[tuple[str, Any]]:
    rank = {name: i for i, name in enumerate(_ATTACK_ORDER)}
    return sorted(attacks.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))


def audit_markdown(audit: dict[str, Any], roc_image: str | None = None) -> list[str]:
    """The report's audit section (Markdown lines) from an ``audit.json`` payload."""
    claim, bound, canaries = audit["claim"], audit["eps_lb"], audit["canaries"]
    leakage = audit["leakage"]
    gdp = audit.get("gdp_estimate")
    mode = audit.get("mode")
    level = 1 - float(bound["alpha"])
    claimed = (
        num(claim["epsilon"])
        if claim["epsilon"] is not None
        else ("none (fewshot: NOT private)" if mode == "fewshot" else "none (unsafe mode)")
    )
    estimate = f"{num(gdp['epsilon'])} ({gdp['attack']}, pre-registered)" if gdp else "-"
    attack = f" ({bound['attack']})" if bound.get("attack") else ""
    lines = [
        "## Privacy audit (L2: canaries through the whole run)",
        "",
        f"**{audit['verdict']}**",
        "",
        f"- mode: {mode}"
        + {
            "unsafe": " (positive control: raw private records reach the mutator; it must leak)",
            "fewshot": " (positive control, NOT private: no optimisation, the release is the "
            "seed prompt plus raw private records; it must leak)",
        }.get(str(mode), " (the library's DP-ES)"),
        f"- canaries: {canaries['n']} ({canaries['n_members']} members inserted by their Bernoulli(1/2) bit, "
        f"{canaries['n_nonmembers']} non-members), {canaries['share']:.1%} of the private set; "
        f"canary seed {canaries['seed']}, fingerprint `{canaries['fingerprint_sha256'][:16]}`",
        f"- one-run guesses: k_pos = {bound['k_pos']}, k_neg = {bound['k_neg']} (fixed before the run); "
        f"{bound['n_attacks']} attacks, each bound at alpha = {bound['alpha_per_attack']:.4g}"
        + (
            f"; a perfect attack would show eps_lb = {num(bound['ceiling'])} at most with these settings"
            if bound.get("ceiling") is not None
            else ""
        ),
        "",
        "| claimed epsilon (ledger) | eps_lb (one-run, lower bound) | Gaussian-DP (estimate, not a bound) | delta |",
        "|---|---|---|---|",
        f"| {claimed} | {num(bound['epsilon'])} at {level:.0%} confidence{attack} | {estimate} | "
        f"{claim['delta']:.3g} |",
        "",
        f"- secrets verbatim in the released prompt: {leakage['prompt_text']['verbatim_members']} member(s), "
        f"{leakage['prompt_text']['verbatim_nonmembers']} non-member(s); longest common substring up to "
        f"{leakage['prompt_text']['max_lcs_fraction']:.0%} of a secret",
        f"- greedy extraction: {leakage['extraction']['extracted_members']} member(s), "
        f"{leakage['extraction']['extracted_nonmembers']} non-member(s); mean matched share "
        f"{leakage['extraction']['mean_matched_fraction']:.0%}",
        f"- exposure (of at most {leakage['exposure']['max_possible']:.2f} bits, "
        f"{leakage['exposure']['n_references']} references): members {num(leakage['exposure']['mean_members'], 2)}, "
        f"non-members {num(leakage['exposure']['mean_nonmembers'], 2)}",
    ]
    for rate in leakage.get("top_k", []):
        value = rate["token_rate"] if rate["token_rate"] is not None else rate["token_rate_lower_bound"]
        qualifier = "" if rate["token_rate"] is not None else " (lower bound: the engine lists fewer alternatives)"
        lines.append(f"- top-{rate['k']} token hit rate of the secrets: {value:.0%}{qualifier}")
    fpr_targets = []
    for attack in audit["attacks"].values():
        if attack.get("tpr_at_fpr"):
            fpr_targets = [t["target_fpr"] for t in attack["tpr_at_fpr"]]
            break
    header = (
        ["attack", "ROC-AUC [95% CI]", "PR-AUC [95% CI]"]
        + [f"TPR at {f:g} FPR" for f in fpr_targets]
        + ["Cohen's d [95% CI]", "Hedges' g", "one-run eps_lb", "GDP eps (estimate)"]
    )
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, attack in ordered_attacks(audit["attacks"]):
        if not attack.get("available"):
            lines.append(f"| {name} | unavailable: {attack.get('note', '')} |" + " |" * (len(header) - 2))
            continue
        if "auc" not in attack:
            cells = [name, "-", "-"] + ["-"] * len(fpr_targets) + ["-", "-", num(attack["one_run"]["epsilon"]), "-"]
        else:
            tprs = [num(t["tpr"], 2) if t["tpr"] is not None else "n/a" for t in attack["tpr_at_fpr"]]
            cells = (
                [name, stat_interval(attack["auc"]), stat_interval(attack["pr_auc"])]
                + tprs
                + [
                    f"{stat_interval(attack['cohens_d'])} ({attack['magnitude']})",
                    num(attack["hedges_g"]),
                    num(attack["one_run"]["epsilon"]),
                    num(attack["gdp_estimate"]["epsilon"]),
                ]
            )
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "TPR at an FPR needs at least 1/FPR non-members (n/a otherwise).", ""]
    if roc_image is not None:
        lines += [f"![audit_roc.png]({roc_image})", ""]
    for note in audit.get("notes", []):
        lines.append(f"- note: {note}")
    lines += ["", "What this does and does not prove: " + audit.get("statement", ""), ""]
    return lines
