"""The verdict of an L2 audit: violation (DP mode), leak signals (positive controls) and the
one-line verdict, from the attack results of :func:`~dp_textgrad.audit.end_to_end.attack_release`.
"""

from __future__ import annotations

from typing import Any

from dp_textgrad.audit.end_to_end_options import AuditMode


def _judge(mode: AuditMode, claim: float | None, part: dict[str, Any]) -> dict[str, Any]:
    """Violation, leak signals and a one-line verdict from the attack results."""
    leakage, eps_lb = part["leakage"], part["eps_lb"]["epsilon"]
    signals = []
    if leakage["prompt_text"]["verbatim_members"]:
        signals.append(f"{leakage['prompt_text']['verbatim_members']} member secret(s) verbatim in the release")
    if leakage["extraction"]["extracted_members"]:
        signals.append(f"{leakage['extraction']['extracted_members']} member secret(s) extracted by greedy decoding")
    if eps_lb > 0:
        signals.append(f"one-run eps_lb {eps_lb:.3f} > 0 ({part['eps_lb']['attack']})")
    significant = sorted(name for name, a in part["attacks"].items()
                         if a.get("available") and "auc" in a and a["auc"]["low"] > 0.5)
    violation = False
    reasons = []
    if mode == "dp":
        if claim is not None and eps_lb > claim:
            violation = True
            reasons.append(f"eps_lb {eps_lb:.3f} exceeds the claimed epsilon {claim:.3f}")
        ceiling = part["eps_lb"].get("ceiling")
        if claim is not None and ceiling is not None and ceiling <= claim:
            part.setdefault("notes", []).append(
                f"with these settings even a perfect attack shows at most eps_lb {ceiling:.3f} <= the claim "
                f"{claim:.3f}: the bound cannot flag a violation here (more canaries can)")
        if leakage["prompt_text"]["verbatim_members"]:
            # No private text reaches the mutator of a DP run: a copied secret is a bug, not noise.
            violation = True
            reasons.append("a member's secret appears verbatim in the release of a DP run")
        if violation:
            verdict = "VIOLATION: " + "; ".join(reasons)
        else:
            verdict = (f"no violation shown: eps_lb {eps_lb:.3f} <= claimed epsilon "
                       f"{claim:.3f}" if claim is not None else "no violation shown")
            verdict += " (this proves nothing about privacy)"
    else:
        control = "the few-shot positive control, NOT private," if mode == "fewshot" else "the positive control"
        verdict = (f"LEAK DETECTED ({control} works): " + "; ".join(signals) if signals else
                   f"NO LEAK DETECTED: {control} failed to show a leak (see docs/audit.md)")
    return {"violation": violation, "leak_detected": bool(signals), "leak_signals": signals,
            "significant_auc_attacks": significant, "verdict": verdict}
