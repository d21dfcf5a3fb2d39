"""The run an L2 audit attacks: canaries planted in the auditor's records, then one real
optimisation run on them (``dp`` / ``unsafe``) or a few-shot release (``fewshot``, NOT
private), written as a run directory.

Used by :func:`dp_textgrad.audit.end_to_end.run_canary_audit`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dp_textgrad.audit.canaries import (
    CanaryInsertion,
    CanarySet,
    canaries_for_task,
    insert_canaries,
    with_private_records,
)
from dp_textgrad.audit.end_to_end_options import (
    FEWSHOT_NOTE,
    AuditMode,
    CanaryAuditOptions,
)
from dp_textgrad.tasks.base import ClassificationTask, Example

if TYPE_CHECKING:
    from dp_textgrad.dp_es.config import DPESConfig
    from dp_textgrad.dp_es.reports import GenerationReport
    from dp_textgrad.engines.base import Engine


def _plant_canaries(task: ClassificationTask, records: Sequence[Example], n_canaries: int, seed: int,
                    options: CanaryAuditOptions) -> tuple[CanarySet, CanaryInsertion, list[str]]:
    """The task's canaries (drawn from ``seed``), the members mixed into ``records``, and the
    share warnings insertion raised (returned, so the caller re-raises them and audit.json keeps them)."""
    canary_set = canaries_for_task(task, n_canaries, seed=seed, secret_kind=options.secret_kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        insertion = insert_canaries(records, canary_set, include="mask",
                                    warn_share=options.warn_share, max_share=options.max_share)
    return canary_set, insertion, [str(w.message) for w in caught]


def _release(mode: AuditMode, task: ClassificationTask, insertion: CanaryInsertion, engine: "Engine",
             config: "DPESConfig", *, n_demos: int, seed: int, runs_root: str | Path, run_dir: str | Path | None,
             evaluate: bool, on_generation: "Callable[[GenerationReport], None] | None", task_name: str,
             engine_name: str) -> tuple[Any, list[int]]:
    """The audited release in a run directory: :func:`dp_textgrad.workflow.run` on the private set
    with the member canaries, or for ``fewshot`` the few-shot prompt. Returns the run's
    :class:`dp_textgrad.workflow.RunOutcome` and the few-shot demo positions (empty otherwise).
    """
    from dp_textgrad import workflow

    audited_task = with_private_records(task, insertion.records)
    if mode == "fewshot":
        return _fewshot_run(task, insertion.records, engine, config, n_demos=n_demos, seed=seed,
                            runs_root=runs_root, run_dir=run_dir, evaluate=evaluate,
                            task_name=task_name, engine_name=engine_name)
    outcome = workflow.run(audited_task, engine, config, runs_root=runs_root, run_dir=run_dir,
                           evaluate=evaluate, on_generation=on_generation, task_name=task_name,
                           engine_name=engine_name)
    return outcome, []


def _fewshot_run(task: ClassificationTask, private: Sequence[Example], engine: "Engine",
                 config: "DPESConfig", *, n_demos: int, seed: int, runs_root: str | Path,
                 run_dir: str | Path | None, evaluate: bool, task_name: str, engine_name: str) -> Any:
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
    positions = sorted(int(i) for i in np.random.default_rng([seed, 0xFE5]).choice(len(private), n_demos,
                                                                                    replace=False))
    parts = [task.seed_prompt.strip()] if task.seed_prompt.strip() else []
    prompt = "\n\n".join(parts + [task.render_demo(private[i]) for i in positions])
    directory = Path(run_dir) if run_dir is not None else runs.new_run_dir(runs_root)
    directory.mkdir(parents=True, exist_ok=True)
    resolved = config.resolved(len(private))
    fewshot = {"n_demos": n_demos, "seed": seed, "note": FEWSHOT_NOTE}
    runs.write_json(runs.RunDir(directory).config, {"task": task_name, "engine": engine_name, "fewshot": fewshot,
                                               "config": {}, "seed_prompt": task.seed_prompt,
                                               "dataset_size": len(private)})
    runs.RunDir(directory).prompt.write_text(prompt + "\n", encoding="utf-8")
    result = SearchResult(prompt=prompt, candidate_id="fewshot", estimate=None, epsilon=math.inf,
                       delta=float(resolved.delta), epsilons={}, generations_run=0,
                       stopped_because="fewshot mode: no optimisation (seed prompt plus raw private records)",
                       unsafe=True)
    evaluation = None
    if evaluate and task.test:
        evaluation = Evaluation(task.accuracy(engine, task.seed_prompt), task.accuracy(engine, prompt), len(task.test))
    seconds = time.perf_counter() - started
    runs.write_released_json(directory, runs.RESULT_NAME, "result", {
        **result.as_dict(), "epsilon": None, "fewshot": fewshot,
        "evaluation": evaluation.__dict__ if evaluation else None, "seconds": seconds})
    runs.append_run_log(directory.parent, {"run_dir": directory.name, "task": task_name, "engine": engine_name,
                                           "fewshot": fewshot, "private": False, "epsilon": None, "unsafe": True,
                                           "seconds": seconds, "machine": runs.machine_summary()},
                        run_dir=directory, channel="audit_log")
    return RunOutcome(directory, result, evaluation, seconds, None), positions  # type: ignore[arg-type]
