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

The pieces: settings and result types in :mod:`~dp_textgrad.audit.end_to_end_options`,
planting the canaries and producing the release in :mod:`~dp_textgrad.audit.end_to_end_run`,
the attacks and their statistics in :mod:`~dp_textgrad.audit.end_to_end_attacks`, the
verdict in :mod:`~dp_textgrad.audit.end_to_end_verdict`, ``audit.json`` in
:mod:`~dp_textgrad.audit.end_to_end_file`; the public names are re-exported here.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dp_textgrad.audit.canaries import save_canaries
from dp_textgrad.audit.end_to_end_attacks import attack_release
from dp_textgrad.audit.end_to_end_file import (
    AUDIT_FILE_NAME,
    _audit_document,
    _canaries_part,
    _claim_part,
    _fewshot_settings,
    _settings_part,
    _write_audit,
    canary_fingerprint,
    read_audit,
)
from dp_textgrad.audit.end_to_end_options import (
    AUDIT_KIND,
    AUDIT_MODES,
    AUDIT_VERSION,
    DEFAULT_FEWSHOT_DEMOS,
    DEFAULT_FPRS,
    FEWSHOT_NOTE,
    LEAKAGE_ATTACKS,
    STATEMENT,
    AuditMode,
    CanaryAuditOptions,
    CanaryAuditResult,
)
from dp_textgrad.audit.end_to_end_run import _plant_canaries, _release
from dp_textgrad.audit.end_to_end_verdict import _judge
from dp_textgrad.tasks.base import ClassificationTask, Example

if TYPE_CHECKING:
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.reports import GenerationReport
    from dp_textgrad.engines.base import Engine


def run_canary_audit(
    task: ClassificationTask,
    engine: "Engine",
    config: "DPESConfig",
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
    on_generation: "Callable[[GenerationReport], None] | None" = None,
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
        raise ValueError("mode: a 'dp' audit needs config.mode='public' (the config asks for unsafe mode); "
                         "use mode='unsafe' for the positive control")
    if isinstance(n_canaries, bool) or not isinstance(n_canaries, int) or n_canaries < 1:
        raise ValueError(f"n_canaries: must be an integer >= 1, got {n_canaries!r}")
    if isinstance(n_demos, bool) or not isinstance(n_demos, int) or n_demos < 1:
        raise ValueError(f"n_demos: must be an integer >= 1, got {n_demos!r}")
    records = list(records)
    if mode == "fewshot" and n_demos > len(records):
        raise ValueError(f"n_demos: {n_demos} demonstrations need at least {n_demos} records, got {len(records)}")
    if len(records) < n_canaries:
        raise ValueError(f"records: {n_canaries} canaries need at least {n_canaries} canary-free records to be "
                         f"spread over, got {len(records)}")
    started = time.perf_counter()
    canary_set, insertion, share_warnings = _plant_canaries(task, records, n_canaries, seed, options)
    for message in share_warnings:
        warnings.warn(message, stacklevel=2)
    if canary_path is not None:
        save_canaries(canary_path, canary_set)
    run_config = config.model_copy(update={"mode": "unsafe"}) if mode == "unsafe" else config
    engine_name = engine_name or str(getattr(engine, "model_string", type(engine).__name__))
    outcome, demo_positions = _release(mode, task, insertion, engine, run_config, n_demos=n_demos, seed=seed,
                                       runs_root=runs_root, run_dir=run_dir, evaluate=evaluate,
                                       on_generation=on_generation, task_name=task_name, engine_name=engine_name)
    optimise_seconds = time.perf_counter() - started
    result = outcome.result
    reference = task.seed_prompt
    part = attack_release(engine, task, result.prompt, canary_set, delta=float(result.delta),
                          reference_prompt=reference, options=options, seed=seed)
    claim = _claim_part(mode, outcome)
    judged = _judge(mode, claim["epsilon"], part)
    seconds = time.perf_counter() - started
    fewshot = _fewshot_settings(n_demos, demo_positions, insertion) if mode == "fewshot" else None
    audit = _audit_document(
        mode, outcome.run_dir, task_name=task_name, engine_name=engine_name,
        settings=_settings_part(options, run_config, n_canaries=n_canaries, seed=seed, n_records=len(records),
                                evaluate=evaluate, fewshot=fewshot),
        canaries=_canaries_part(canary_set, insertion, canary_path, share_warnings),
        claim=claim, part=part, judged=judged,
    )
    _write_audit(outcome.run_dir, audit, optimise_seconds=optimise_seconds, seconds=seconds, log=log)
    return CanaryAuditResult(outcome.run_dir, audit, seconds)


__all__ = [
    "AUDIT_FILE_NAME", "AUDIT_MODES", "AuditMode", "CanaryAuditOptions", "CanaryAuditResult", "DEFAULT_FEWSHOT_DEMOS",
    "LEAKAGE_ATTACKS", "STATEMENT",
    "attack_release", "canary_fingerprint", "read_audit", "run_canary_audit",
    # constants of audit.json, defined in end_to_end_options
    "AUDIT_KIND", "AUDIT_VERSION", "DEFAULT_FPRS", "FEWSHOT_NOTE",
]
