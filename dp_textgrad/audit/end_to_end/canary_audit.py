"""L2 end-to-end canary audit: plant canaries, run the real optimiser, attack the release.

One audit is one optimisation run (a one-run audit, Steinke, Nasr & Jagielski 2023):

1. ``m`` canaries are generated for the task (:func:`canaries_for_task`); each has a
   Bernoulli(1/2) inclusion bit. The included ones (members) are inserted evenly
   among the auditor's canary-free private records (``include="mask"``); the
   excluded ones (non-members) never reach the optimiser.
2. :func:`dp_textgrad.workflow.run` optimises a prompt on that private set into a run
   directory (``mode="dp"``: the library's DP-ES; ``mode="unsafe"``: the same loop with
   ``config.unsafe_examples`` raw private records, canaries included, shown to the
   mutator, the positive control that must leak; ``mode="fewshot"``: no optimisation, the
   release is the seed prompt plus ``n_demos`` raw private records, what a naive few-shot
   prompt builder ships: NOT private, the positive control that checks the attacks and the
   audit's plumbing on the real model).
3. The released prompt is attacked, for ALL canaries: secret in the prompt text
   (verbatim, longest common substring), greedy extraction, top-k token hit rates,
   exposure, and the membership scores of :func:`membership_scores` (LOSS, zlib,
   Min-K%, Min-K%++, reference = released vs seed prompt, ReCaLL).
4. Per attack: ROC-AUC and PR-AUC with stratified bootstrap CIs, TPR at low FPR where
   the sample allows, Cohen's d (with CI) / Hedges' g with magnitude, the one-run
   lower bound, and a Gaussian-DP *estimate*.
5. ``eps_lb`` (the largest one-run bound over the attacks, each at alpha / number of
   attacks, so the maximum holds at confidence 1 - alpha) is compared with the
   epsilon the run's ledger claims; ``audit.json`` is written into the run directory,
   the run report gains an audit section, and one line goes to the run log.

What the result means: ``eps_lb`` above the claim, or a member's secret in the
release of a DP run (whose mutator never sees private text), is a bug. Anything
else proves nothing about privacy: a few dozen canaries in one run can only show
small lower bounds, whatever the mechanism. ``audit.json`` holds canary ids,
inclusion bits, scores and counts; never a secret, a record or generated text.

This module runs the audit: it plants the canaries, produces the release (one real
optimisation run, or the few-shot release) and judges the attack results. Settings and
result types are in :mod:`~dp_textgrad.audit.end_to_end.options`, the attacks and their
statistics in :mod:`~dp_textgrad.audit.end_to_end.attacks`, ``audit.json`` in
:mod:`~dp_textgrad.audit.end_to_end.audit_file`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.audit.canaries.canary_set import CanarySet, save_canaries
from dp_textgrad.audit.canaries.generation import canaries_for_task
from dp_textgrad.audit.canaries.insertion import CanaryInsertion, insert_canaries, with_private_records
from dp_textgrad.audit.end_to_end.attacks import attack_release
from dp_textgrad.audit.end_to_end.audit_file import (
    audit_document,
    canaries_part,
    claim_part,
    fewshot_settings,
    settings_part,
    write_audit,
)
from dp_textgrad.audit.end_to_end.options import (
    AUDIT_MODES,
    DEFAULT_FEWSHOT_DEMOS,
    FEWSHOT_NOTE,
    AuditMode,
    CanaryAuditOptions,
    CanaryAuditResult,
)
from dp_textgrad.tasks.base import ClassificationTask, Example

if TYPE_CHECKING:
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.reports import GenerationReport
    from dp_textgrad.engines.base import Engine


def run_canary_audit(
    task: ClassificationTask,
    engine: Engine,
    config: DPESConfig,
    *,
    records: Sequence[Example],
    n_canaries: int,
    seed: int = 0,
    mode: AuditMode = "dp",
    options: CanaryAuditOptions | None = None,
    runs_root: str | Path = "runs",
    run_dir: str | Path | None = None,
    evaluate: bool = False,
    task_name: str = "custom",
    engine_name: str | None = None,
    canary_path: str | Path | None = None,
    on_generation: Callable[[GenerationReport], None] | None = None,
    log: bool = True,
    n_demos: int = DEFAULT_FEWSHOT_DEMOS,
) -> CanaryAuditResult:
    """One L2 audit: canaries into ``records``, one optimisation run, attacks on the release.

    ``records``: the auditor's canary-free private records (the task's own private set
    is never read; the run uses ``records`` plus the member canaries). ``n_canaries``
    canaries are generated from ``seed`` (their inclusion bits too). ``mode="dp"`` runs
    ``config`` as is (its ``mode`` must be ``"public"``); ``mode="unsafe"`` sets
    ``config.mode = "unsafe"``: the positive control, NOT differentially private;
    ``config.unsafe_examples`` private records (canary or not, drawn at random; all
    of them when it is at least the private set's size) then reach the mutator.
    ``mode="fewshot"`` runs no optimisation: the release is the task's seed prompt plus
    ``n_demos`` records of the audited private set (members included, drawn at random by
    ``seed``, rendered with ``task.render_demo``), what a naive few-shot prompt builder
    ships: a positive control that checks the attacks end to end, NOT private (``config``
    only gives delta).
    Writes ``audit.json`` into the run directory, rebuilds the report with its audit
    section, and appends one ``"kind": "audit_l2"`` line to the run log of the run's
    parent directory (``log=False``: no line). ``canary_path``: where to save the
    canary file (it holds the secrets: keep it out of the run directory and away
    from anything released); by default it is not saved, since ``seed`` rebuilds it.
    """
    options = options or CanaryAuditOptions()
    if mode not in AUDIT_MODES:
        raise ValueError(f"mode: use 'dp', 'unsafe' or 'fewshot', got {mode!r}")
    if mode == "dp" and config.mode != "public":
        raise ValueError(
            "mode: a 'dp' audit needs config.mode='public' (the config asks for unsafe mode); "
            "use mode='unsafe' for the positive control"
        )
    if isinstance(n_canaries, bool) or not isinstance(n_canaries, int) or n_canaries < 1:
        raise ValueError(f"n_canaries: must be an integer >= 1, got {n_canaries!r}")
    if isinstance(n_demos, bool) or not isinstance(n_demos, int) or n_demos < 1:
        raise ValueError(f"n_demos: must be an integer >= 1, got {n_demos!r}")
    records = list(records)
    if mode == "fewshot" and n_demos > len(records):
        raise ValueError(f"n_demos: {n_demos} demonstrations need at least {n_demos} records, got {len(records)}")
    if len(records) < n_canaries:
        raise ValueError(
            f"records: {n_canaries} canaries need at least {n_canaries} canary-free records to be "
            f"spread over, got {len(records)}"
        )
    started = time.perf_counter()
    canary_set, insertion, share_warnings = _plant_canaries(task, records, n_canaries, seed, options)
    for message in share_warnings:
        warnings.warn(message, stacklevel=2)
    if canary_path is not None:
        save_canaries(canary_path, canary_set)
    run_config = config.model_copy(update={"mode": "unsafe"}) if mode == "unsafe" else config
    engine_name = engine_name or str(getattr(engine, "model_string", type(engine).__name__))
    outcome, demo_positions = _release(
        mode,
        task,
        insertion,
        engine,
        run_config,
        n_demos=n_demos,
        seed=seed,
        runs_root=runs_root,
        run_dir=run_dir,
        evaluate=evaluate,
        on_generation=on_generation,
        task_name=task_name,
        engine_name=engine_name,
    )
    optimise_seconds = time.perf_counter() - started
    result = outcome.result
    reference = task.seed_prompt
    part = attack_release(
        engine,
        task,
        result.prompt,
        canary_set,
        delta=float(result.delta),
        reference_prompt=reference,
        options=options,
        seed=seed,
    )
    claim = claim_part(mode, outcome)
    judged = judge(mode, claim["epsilon"], part)
    seconds = time.perf_counter() - started
    fewshot = fewshot_settings(n_demos, demo_positions, insertion) if mode == "fewshot" else None
    audit = audit_document(
        mode,
        outcome.run_dir,
        task_name=task_name,
        engine_name=engine_name,
        settings=settings_part(
            options,
            run_config,
            n_canaries=n_canaries,
            seed=seed,
            n_records=len(records),
            evaluate=evaluate,
            fewshot=fewshot,
        ),
        canaries=canaries_part(canary_set, insertion, canary_path, share_warnings),
        claim=claim,
        part=part,
        judged=judged,
    )
    write_audit(outcome.run_dir, audit, optimise_seconds=optimise_seconds, seconds=seconds, log=log)
    return CanaryAuditResult(outcome.run_dir, audit, seconds)


# -- the audited release ---------------------------------------------------------------


def _plant_canaries(
    task: ClassificationTask, records: Sequence[Example], n_canaries: int, seed: int, options: CanaryAuditOptions
) -> tuple[CanarySet, CanaryInsertion, list[str]]:
    """The task's canaries (drawn from ``seed``), the members mixed into ``records``, and the
    share warnings insertion raised (returned, so the caller re-raises them and audit.json keeps them)."""
    canary_set = canaries_for_task(task, n_canaries, seed=seed, secret_kind=options.secret_kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        insertion = insert_canaries(
            records, canary_set, include="mask", warn_share=options.warn_share, max_share=options.max_share
        )
    return canary_set, insertion, [str(w.message) for w in caught]


def _release(
    mode: AuditMode,
    task: ClassificationTask,
    insertion: CanaryInsertion,
    engine: Engine,
    config: DPESConfig,
    *,
    n_demos: int,
    seed: int,
    runs_root: str | Path,
    run_dir: str | Path | None,
    evaluate: bool,
    on_generation: Callable[[GenerationReport], None] | None,
    task_name: str,
    engine_name: str,
) -> tuple[Any, list[int]]:
    """The audited release in a run directory: :func:`dp_textgrad.workflow.run` on the private set
    with the member canaries, or for ``fewshot`` the few-shot prompt. Returns the run's
    :class:`dp_textgrad.workflow.RunOutcome` and the few-shot demo positions (empty otherwise).
    """
    from dp_textgrad import workflow

    audited_task = with_private_records(task, insertion.records)
    if mode == "fewshot":
        return _fewshot_run(
            task,
            insertion.records,
            engine,
            config,
            n_demos=n_demos,
            seed=seed,
            runs_root=runs_root,
            run_dir=run_dir,
            evaluate=evaluate,
            task_name=task_name,
            engine_name=engine_name,
        )
    outcome = workflow.run(
        audited_task,
        engine,
        config,
        runs_root=runs_root,
        run_dir=run_dir,
        evaluate=evaluate,
        on_generation=on_generation,
        task_name=task_name,
        engine_name=engine_name,
    )
    return outcome, []


def _fewshot_run(
    task: ClassificationTask,
    private: Sequence[Example],
    engine: Engine,
    config: DPESConfig,
    *,
    n_demos: int,
    seed: int,
    runs_root: str | Path,
    run_dir: str | Path | None,
    evaluate: bool,
    task_name: str,
    engine_name: str,
) -> Any:
    """The ``fewshot`` release written as a run directory (no optimisation; NOT private).

    ``n_demos`` of the audited ``private`` records (the auditor's list, members included),
    drawn at random by ``seed`` and kept in their order, are appended to the seed prompt with
    ``task.render_demo``. Returns a :class:`dp_textgrad.workflow.RunOutcome` (``optimizer=None``)
    and the drawn positions.
    """
    from dp_textgrad import runs
    from dp_textgrad.dp_es.reports import SearchResult
    from dp_textgrad.workflow import Evaluation, RunOutcome

    started = time.perf_counter()
    positions = sorted(
        int(i) for i in np.random.default_rng([seed, 0xFE5]).choice(len(private), n_demos, replace=False)
    )
    parts = [task.seed_prompt.strip()] if task.seed_prompt.strip() else []
    prompt = "\n\n".join(parts + [task.render_demo(private[i]) for i in positions])
    directory = Path(run_dir) if run_dir is not None else runs.new_run_dir(runs_root)
    directory.mkdir(parents=True, exist_ok=True)
    resolved = config.resolved(len(private))
    if resolved.auto_sampling_rate:  # the few-shot control runs no search: q is only recorded
        resolved = resolved.model_copy(update={"sampling_rate": None}).resolved(len(private))
    assert resolved.delta is not None  # resolved() sets it
    fewshot = {"n_demos": n_demos, "seed": seed, "note": FEWSHOT_NOTE}
    runs.write_json(
        runs.RunDir(directory).config,
        {
            "task": task_name,
            "engine": engine_name,
            "fewshot": fewshot,
            "config": {},
            "seed_prompt": task.seed_prompt,
            "dataset_size": len(private),
        },
    )
    runs.write_released_text(runs.RunDir(directory).prompt, prompt + "\n")
    result = SearchResult(
        prompt=prompt,
        candidate_id="fewshot",
        estimate=None,
        epsilon=math.inf,
        delta=float(resolved.delta),
        epsilons={},
        generations_run=0,
        stopped_because="fewshot mode: no optimisation (seed prompt plus raw private records)",
        unsafe=True,
    )
    evaluation = None
    if evaluate and task.test:
        evaluation = Evaluation(task.accuracy(engine, task.seed_prompt), task.accuracy(engine, prompt), len(task.test))
    seconds = time.perf_counter() - started
    runs.write_released_json(
        directory,
        runs.RESULT_NAME,
        "result",
        {
            **result.as_dict(),
            "epsilon": None,
            "fewshot": fewshot,
            "evaluation": evaluation.__dict__ if evaluation else None,
            "seconds": seconds,
        },
    )
    runs.append_run_log(
        directory.parent,
        {
            "run_dir": directory.name,
            "task": task_name,
            "engine": engine_name,
            "fewshot": fewshot,
            "private": False,
            "epsilon": None,
            "unsafe": True,
            "seconds": seconds,
            "machine": runs.machine_summary(),
        },
        run_dir=directory,
        channel="audit_log",
    )
    runs.stamp_released(directory)  # the evaluation's end must not be timed by any released file
    return RunOutcome(directory, result, evaluation, seconds, None), positions  # type: ignore[arg-type]


# -- the verdict -------------------------------------------------------------------------


def judge(mode: AuditMode, claim: float | None, part: dict[str, Any]) -> dict[str, Any]:
    """Violation, leak signals and a one-line verdict from the attack results."""
    leakage, eps_lb = part["leakage"], part["eps_lb"]["epsilon"]
    signals = []
    if leakage["prompt_text"]["verbatim_members"]:
        signals.append(f"{leakage['prompt_text']['verbatim_members']} member secret(s) verbatim in the release")
    if leakage["extraction"]["extracted_members"]:
        signals.append(f"{leakage['extraction']['extracted_members']} member secret(s) extracted by greedy decoding")
    if eps_lb > 0:
        signals.append(f"one-run eps_lb {eps_lb:.3f} > 0 ({part['eps_lb']['attack']})")
    significant = sorted(
        name for name, a in part["attacks"].items() if a.get("available") and "auc" in a and a["auc"]["low"] > 0.5
    )
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
                f"{claim:.3f}: the bound cannot flag a violation here (more canaries can)"
            )
        if leakage["prompt_text"]["verbatim_members"]:
            # No private text reaches the mutator of a DP run: a copied secret is a bug, not noise.
            violation = True
            reasons.append("a member's secret appears verbatim in the release of a DP run")
        if violation:
            verdict = "VIOLATION: " + "; ".join(reasons)
        else:
            verdict = (
                f"no violation shown: eps_lb {eps_lb:.3f} <= claimed epsilon {claim:.3f}"
                if claim is not None
                else "no violation shown"
            )
            verdict += " (this proves nothing about privacy)"
    else:
        control = "the few-shot positive control, NOT private," if mode == "fewshot" else "the positive control"
        verdict = (
            f"LEAK DETECTED ({control} works): " + "; ".join(signals)
            if signals
            else f"NO LEAK DETECTED: {control} failed to show a leak (see docs/audit.md)"
        )
    return {
        "violation": violation,
        "leak_detected": bool(signals),
        "leak_signals": signals,
        "significant_auc_attacks": significant,
        "verdict": verdict,
    }


__all__ = ["judge", "run_canary_audit"]
