"""``audit.json`` of the L2 audit: its parts, writing it (with the report, the operator-only
wall times and the run-log line) and reading it back.

``audit.json`` holds canary ids, inclusion bits, scores and counts; never a secret, a
record or generated text (the canaries are identified by a fingerprint).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dp_textgrad.audit.canaries.canary_set import CanarySet
from dp_textgrad.audit.canaries.insertion import CanaryInsertion
from dp_textgrad.audit.end_to_end.attacks import finite_or_none
from dp_textgrad.audit.end_to_end.options import (
    AUDIT_KIND,
    AUDIT_VERSION,
    FEWSHOT_NOTE,
    STATEMENT,
    AuditMode,
    CanaryAuditOptions,
)
from dp_textgrad.report import AUDIT_FILE_NAME, AUDIT_FORMAT


def canary_fingerprint(canary_set: CanarySet) -> str:
    """SHA-256 of the canary file's JSON: identifies the canaries without storing their secrets."""
    payload = json.dumps(canary_set.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def fewshot_settings(n_demos: int, positions: Sequence[int], insertion: Any) -> dict[str, Any]:
    """What ``audit.json`` says about a few-shot release: positions and canary ids only, no text."""
    shown = dict(zip(insertion.positions, insertion.canary_ids))
    return {
        "n_demos": n_demos,
        "demo_positions": list(positions),
        "member_canaries_shown": [shown[p] for p in positions if p in shown],
        "note": FEWSHOT_NOTE,
    }


def settings_part(
    options: CanaryAuditOptions,
    run_config: Any,
    *,
    n_canaries: int,
    seed: int,
    n_records: int,
    evaluate: bool,
    fewshot: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``settings`` part: the audit's options, the run's config and (fewshot) the demonstrations."""
    return {
        **options.to_dict(),
        "n_canaries": n_canaries,
        "seed": seed,
        "n_records": n_records,
        "config": run_config.model_dump(),
        "evaluate": evaluate,
        "reference_prompt": "the task's seed prompt",
        **({"fewshot": fewshot} if fewshot is not None else {}),
    }


def canaries_part(
    canary_set: CanarySet, insertion: CanaryInsertion, canary_path: str | Path | None, share_warnings: list[str]
) -> dict[str, Any]:
    """The ``canaries`` part: counts, seeds and the fingerprint (no secret)."""
    n_canaries = len(canary_set)
    members = int(canary_set.included_mask.sum())
    return {
        "n": n_canaries,
        "n_members": members,
        "n_nonmembers": n_canaries - members,
        "share": insertion.share,
        "seed": canary_set.seed,
        "mask_seed": canary_set.mask_seed,
        "secret_kind": canary_set.secret_kind,
        "fingerprint_sha256": canary_fingerprint(canary_set),
        "saved_to": str(canary_path) if canary_path is not None else None,
        "share_warnings": share_warnings,
    }


def claim_part(mode: AuditMode, outcome: Any) -> dict[str, Any]:
    """The ``claim`` part: the epsilon the run's ledger claims (``None`` for unsafe and fewshot releases)."""
    result = outcome.result
    claim = finite_or_none(result.epsilon) if not result.unsafe else None
    ledger = getattr(outcome.optimizer, "ledger", None)
    mechanism_epsilon = None
    if ledger is not None and hasattr(ledger, "mechanism_epsilon"):
        mechanism_epsilon = finite_or_none(ledger.mechanism_epsilon())
    return {
        "epsilon": claim,
        "delta": float(result.delta),
        "unsafe": bool(result.unsafe),
        "mechanism_epsilon": mechanism_epsilon,
        "epsilon_by_accountant": {k: finite_or_none(v) for k, v in result.epsilons.items()},
        "source": "none (fewshot mode runs no mechanism)"
        if mode == "fewshot"
        else "the run's privacy ledger (result.json)",
        "note": FEWSHOT_NOTE
        if mode == "fewshot"
        else "unsafe mode: raw private records reached the mutator; no guarantee is claimed"
        if result.unsafe
        else "",
    }


def audit_document(
    mode: AuditMode,
    run_dir: Path,
    *,
    task_name: str,
    engine_name: str,
    settings: dict[str, Any],
    canaries: dict[str, Any],
    claim: dict[str, Any],
    part: dict[str, Any],
    judged: dict[str, Any],
) -> dict[str, Any]:
    """The whole of ``audit.json``: identification, the parts above, the attack results and the verdict."""
    from dp_textgrad import runs

    return {
        "format": AUDIT_FORMAT,
        "version": AUDIT_VERSION,
        "kind": AUDIT_KIND,
        "mode": mode,
        "run_dir": run_dir.name,
        "task": task_name,
        "engine": engine_name,
        "code_version": runs.code_version(),
        "statement": STATEMENT,
        "settings": settings,
        "canaries": canaries,
        "claim": claim,
        **part,
        **judged,
    }


def write_audit(run_dir: Path, audit: dict[str, Any], *, optimise_seconds: float, seconds: float, log: bool) -> None:
    """``audit.json`` into the run directory, the report rebuilt, and (``log``) one run-log line."""
    from dp_textgrad import runs
    from dp_textgrad.report import write_report

    # Wall times include the private scoring phase: operator-only, kept apart from audit.json.
    runs.write_operator_json(
        run_dir,
        runs.AUDIT_SECONDS_NAME,
        {"optimise": optimise_seconds, "attack": seconds - optimise_seconds, "total": seconds},
    )
    runs.write_json(run_dir / AUDIT_FILE_NAME, audit)
    write_report(run_dir)
    if log:
        mode = audit["mode"]
        runs.append_run_log(
            run_dir.parent,
            {
                "kind": AUDIT_KIND,
                "command": "audit canaries",
                "run_dir": run_dir.name,
                "mode": mode,
                **({"private": False, "note": FEWSHOT_NOTE} if mode == "fewshot" else {}),
                "task": audit["task"],
                "engine": audit["engine"],
                "settings": audit["settings"],
                "canaries": {k: v for k, v in audit["canaries"].items() if k != "share_warnings"},
                "claim": audit["claim"],
                "eps_lb": audit["eps_lb"],
                "gdp_estimate": audit["gdp_estimate"],
                "auc": {name: a["auc"]["estimate"] for name, a in audit["attacks"].items() if "auc" in a},
                "verbatim_members": audit["leakage"]["prompt_text"]["verbatim_members"],
                "extracted_members": audit["leakage"]["extraction"]["extracted_members"],
                "violation": audit["violation"],
                "leak_detected": audit["leak_detected"],
                "verdict": audit["verdict"],
                "seconds": seconds,
                "machine": runs.machine_summary(),
            },
            run_dir=run_dir,
            channel="audit_log",
        )
    runs.stamp_released(run_dir)  # the audit's end must not be timed by any released file


def read_audit(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``audit.json`` of a run directory, or ``None`` when it has none (the report reads it too)."""
    from dp_textgrad.report import read_audit as _read

    return _read(Path(run_dir))
