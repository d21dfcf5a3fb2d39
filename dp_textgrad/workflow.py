"""One optimization run end to end: calibrate, optimize, evaluate, save, report.

The CLI's ``demo`` and ``optimize`` commands are thin wrappers around :func:`run`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp_textgrad import runs
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy
from dp_textgrad.dp_es.reports import GenerationReport, RunResult
from dp_textgrad.privacy.data import PrivateScoringError
from dp_textgrad.tasks.base import ClassificationTask


@dataclass
class Evaluation:
    """Test-split accuracy of the seed and released prompts (research evaluation, not covered by DP).

    With per-record outcomes (:func:`paired_evaluation`): the difference released - seed with
    its 95% interval (Wald on the paired differences) and the exact McNemar p-value of the
    discordant pairs.
    """

    seed_accuracy: float
    released_accuracy: float
    n_test: int
    difference: float | None = None
    difference_low: float | None = None
    difference_high: float | None = None
    mcnemar_p: float | None = None
    discordant: tuple[int, int] | None = None  # (released right and seed wrong, the reverse)


def paired_evaluation(task: ClassificationTask, engine: Any, seed_prompt: str, released_prompt: str) -> Evaluation:
    """Both prompts on the same test records, compared pairwise (McNemar, paired interval)."""
    from scipy import stats

    seed = task.public_outcomes(engine, seed_prompt, task.test)
    released = seed if released_prompt == seed_prompt else task.public_outcomes(engine, released_prompt, task.test)
    seed_right = np.asarray(seed.predicted == seed.gold, dtype=float)
    released_right = np.asarray(released.predicted == released.gold, dtype=float)
    diff = released_right - seed_right
    n = diff.size
    better, worse = int(np.sum(diff > 0)), int(np.sum(diff < 0))
    p_value = 1.0 if better + worse == 0 else float(stats.binomtest(better, better + worse, 0.5).pvalue)
    half = 1.959963984540054 * float(np.std(diff, ddof=1)) / np.sqrt(n) if n > 1 else float("nan")
    return Evaluation(
        seed_accuracy=float(seed_right.mean()), released_accuracy=float(released_right.mean()), n_test=n,
        difference=float(diff.mean()), difference_low=float(diff.mean() - half),
        difference_high=float(diff.mean() + half), mcnemar_p=p_value, discordant=(better, worse),
    )


@dataclass
class RunOutcome:
    run_dir: Path
    result: RunResult
    evaluation: Evaluation | None
    seconds: float
    optimizer: DPEvolutionStrategy


def build_optimizer(task: ClassificationTask, engine: Any, config: DPESConfig, run_dir: Path,
                    seed_prompt: str | None = None, resume: bool = False) -> DPEvolutionStrategy:
    tg = import_textgrad()
    prompt = tg.Variable(seed_prompt if seed_prompt is not None else task.seed_prompt,
                         role_description="instruction prompt for the classifier", requires_grad=True)
    if resume:
        return DPEvolutionStrategy.resume(run_dir, [prompt], task=task, engine=engine)
    return DPEvolutionStrategy([prompt], task=task, engine=engine, config=config, checkpoint_dir=run_dir)


def run(
    task: ClassificationTask,
    engine: Any,
    config: DPESConfig,
    *,
    runs_root: str | Path = "runs",
    run_dir: str | Path | None = None,
    resume: bool = False,
    evaluate: bool = True,
    seed_prompt: str | None = None,
    on_start: Callable[[DPEvolutionStrategy], None] | None = None,
    on_generation: Callable[[GenerationReport], None] | None = None,
    task_name: str = "custom",
    engine_name: str = "custom",
) -> RunOutcome:
    started = time.perf_counter()
    started_at = runs.utc_now()  # before any private record is read: times nothing private
    directory = Path(run_dir) if run_dir is not None else runs.new_run_dir(runs_root)
    directory.mkdir(parents=True, exist_ok=True)
    optimizer = build_optimizer(task, engine, config, directory, seed_prompt=seed_prompt, resume=resume)
    seed_text = optimizer.variable.value if not resume else runs.read_json(directory / runs.CONFIG_NAME)["seed_prompt"]
    if not resume:
        runs.write_released_json(directory, runs.CONFIG_NAME, "config", {
            "task": task_name,
            "engine": engine_name,
            "config": optimizer.config.model_dump(),
            "seed_prompt": seed_text,
            "noise_multiplier": optimizer.noise_multiplier,
            "selection_epsilon": optimizer.selection_epsilon,
            "dataset_size": optimizer.public_dataset_size,
            "noise": optimizer.noise.sampler,
        })
    if on_start is not None:
        on_start(optimizer)
    try:
        result = optimizer.run(progress=on_generation)
    except PrivateScoringError as exc:
        # The one-line message is release-safe; the original error may quote a record.
        runs.append_operator_text(directory, "errors.log", f"{exc.label}: {exc.operator_detail}")
        raise
    (directory / runs.PROMPT_NAME).write_text(result.prompt + "\n", encoding="utf-8")
    evaluation = None
    if evaluate and task.test:
        evaluation = paired_evaluation(task, engine, seed_text, result.prompt)
    seconds = time.perf_counter() - started
    runs.write_released_json(directory, runs.RESULT_NAME, "result", {
        **result.as_dict(),
        "evaluation": evaluation.__dict__ if evaluation else None,
        "seconds": seconds,
        "engine_usage": engine.usage.as_dict() if hasattr(engine, "usage") else None,
    })
    from dp_textgrad.report import write_report  # plotting is imported only when a report is written

    write_report(directory)
    runs.append_run_log(Path(directory).parent, {
        "run_dir": directory.name,
        "task": task_name,
        "engine": engine_name,
        "config": optimizer.config.model_dump(),
        "noise_seeded_insecurely": optimizer.config.insecure_noise_seed is not None,
        "noise": optimizer.noise.sampler,
        "epsilon": result.epsilon,
        "delta": result.delta,
        "epsilon_by_accountant": result.epsilons,
        "accountant": "smallest valid bound",
        "unsafe": result.unsafe,
        "started": started_at,
        "seconds": seconds,
        "machine": runs.machine_summary(),
    }, run_dir=directory)
    return RunOutcome(directory, result, evaluation, seconds, optimizer)
