"""One optimization run end to end: calibrate, optimize, evaluate, save, report.

Call :func:`dp_textgrad.optimize` / :func:`dp_textgrad.resume` (``dp_textgrad/front.py``): they
validate the settings, take this road and send its events to observers (the command line's
``demo`` and ``optimize`` go through them too). :func:`check_resumable` is the one check of
whether a run directory can be resumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp_textgrad import lifetime_link, runs
from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.dp_es.config import ConfigError, DPESConfig
from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy
from dp_textgrad.dp_es.reports import GenerationReport, SearchResult
from dp_textgrad.dp_es.scoring_backends import ScoringFactory
from dp_textgrad.lifetime_link import LifetimeOptions, LifetimeStatus
from dp_textgrad.privacy.accounting.ledger import BudgetExceeded
from dp_textgrad.privacy.data import PrivateScoringError
from dp_textgrad.run_events import stopped_early
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


def scores_on_test(task: ClassificationTask, engine: Any, prompt: str) -> np.ndarray:
    """Per-record scores in [0, 1] of ``prompt`` on the task's public test split (charges nothing).

    The scoring is the task's: a task with ``public_scores(engine, prompt, records)`` (a
    generation task and its metric) is asked for them; a classification task scores 1 for the
    right label and 0 otherwise. No private record is read.
    """
    own = getattr(task, "public_scores", None)
    if own is not None:
        return np.asarray(own(engine, prompt, task.test), dtype=float)
    outcomes = task.public_outcomes(engine, prompt, task.test)
    return np.asarray(outcomes.predicted == outcomes.gold, dtype=float)


def compare_paired(first: np.ndarray, second: np.ndarray) -> Evaluation:
    """``second`` against ``first`` on the same records: the paired difference and, for 0/1 scores, McNemar."""
    from scipy import stats

    diff = second - first
    n = diff.size
    binary = bool(np.isin(first, (0.0, 1.0)).all() and np.isin(second, (0.0, 1.0)).all())
    better, worse = int(np.sum(diff > 0)), int(np.sum(diff < 0))
    p_value = 1.0 if better + worse == 0 else float(stats.binomtest(better, better + worse, 0.5).pvalue)
    half = 1.959963984540054 * float(np.std(diff, ddof=1)) / np.sqrt(n) if n > 1 else float("nan")
    return Evaluation(
        seed_accuracy=float(first.mean()),
        released_accuracy=float(second.mean()),
        n_test=n,
        difference=float(diff.mean()),
        difference_low=float(diff.mean() - half),
        difference_high=float(diff.mean() + half),
        mcnemar_p=p_value if binary else None,
        discordant=(better, worse) if binary else None,
    )


def paired_evaluation(task: ClassificationTask, engine: Any, seed_prompt: str, released_prompt: str) -> Evaluation:
    """Both prompts on the same test records, compared pairwise (McNemar, paired interval)."""
    seed = scores_on_test(task, engine, seed_prompt)
    released = seed if released_prompt == seed_prompt else scores_on_test(task, engine, released_prompt)
    return compare_paired(seed, released)


@dataclass
class PromptScore:
    """One prompt's mean score on the public test split with its 95% interval (not covered by DP).

    ``interval``: ``wilson`` for 0/1 scores (accuracy), else ``bootstrap`` (percentile).
    ``against_first``: the paired comparison with the first prompt scored (None for the first).
    """

    score: float
    low: float
    high: float
    n_test: int
    interval: str
    against_first: Evaluation | None = None


def evaluate_prompts(task: ClassificationTask, engine: Any, prompts: list[str]) -> list[PromptScore]:
    """Score each prompt on ``task.test`` (public; charges nothing, reads no private record).

    Per prompt its mean score (accuracy for a classification task) with a Wilson interval, or a
    bootstrap one for scores that are not all 0 or 1; every prompt after the first is compared
    with the first on the same records as :func:`paired_evaluation` does.
    """
    from scipy import stats

    from dp_textgrad.report.plots import accuracy_ci

    if not task.test:
        raise ValueError("test: the task has no test records to score prompts on; give it a test split")
    scored: dict[str, np.ndarray] = {}
    results: list[PromptScore] = []
    for prompt in prompts:
        if prompt not in scored:
            scored[prompt] = scores_on_test(task, engine, prompt)
        values = scored[prompt]
        mean = float(values.mean())
        if np.isin(values, (0.0, 1.0)).all():
            (low, high), interval = accuracy_ci(mean, values.size), "wilson"
        else:
            ci = stats.bootstrap((values,), np.mean, confidence_level=0.95, method="percentile", random_state=0)
            low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
            interval = "bootstrap"
        against = compare_paired(scored[prompts[0]], values) if results else None
        results.append(PromptScore(mean, low, high, values.size, interval, against))
    return results


@dataclass
class RunOutcome:
    """A finished run, as :func:`dp_textgrad.optimize` and :func:`run` return it.

    Released: ``run_dir``, ``result`` (the prompt, epsilon and delta spent, the per-generation
    history), ``evaluation`` (the public test split; not covered by DP) and, for a federated run
    (:func:`dp_textgrad.federated.run.run_federated`), ``federation`` (what ``federation.json``
    holds). OPERATOR-ONLY: ``seconds`` (the wall time times the private phase) and ``optimizer``
    (it holds the records; a federated run's coordinator holds none).
    """

    run_dir: Path
    result: SearchResult
    evaluation: Evaluation | None
    seconds: float
    optimizer: DPEvolutionStrategy
    federation: dict[str, Any] | None = None


def build_optimizer(
    task: ClassificationTask,
    engine: Any,
    config: DPESConfig,
    run_dir: Path,
    seed_prompt: str | None = None,
    resume: bool = False,
    scoring: ScoringFactory | None = None,
    ledger: Any = None,
) -> DPEvolutionStrategy:
    tg = import_textgrad()
    prompt = tg.Variable(
        seed_prompt if seed_prompt is not None else task.seed_prompt,
        role_description="instruction prompt for the classifier",
        requires_grad=True,
    )
    if resume:
        return DPEvolutionStrategy.resume(run_dir, [prompt], task=task, engine=engine, scoring=scoring)
    return DPEvolutionStrategy(
        [prompt], task=task, engine=engine, config=config, checkpoint_dir=run_dir, scoring=scoring, ledger=ledger
    )


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
    lifetime: LifetimeOptions | None = None,
    on_lifetime: Callable[[LifetimeStatus], None] | None = None,
    scoring: ScoringFactory | None = None,
    ledger: Any = None,
) -> RunOutcome:
    """Run (or resume) DP-ES on ``task`` into a run directory and release its prompt.

    ``lifetime`` links the run to its dataset's lifetime budget (default: the store
    ``<runs_root>/operator/lifetime_budget.sqlite``, no cap); ``on_lifetime`` sees its status before
    the first charge. The run log gets a line when the run starts and one when it ends.
    ``scoring`` builds where private records are scored (default: in this process; see
    ``dp_textgrad.distributed.RayScoringPool``). ``ledger``: a fresh run's ledger that already holds
    a completed stage (a federated run's silo counts of N, ``dp_textgrad.federated.run``).
    """
    started = time.perf_counter()
    started_at = runs.utc_now()  # before any private record is read: times nothing private
    directory = Path(run_dir) if run_dir is not None else runs.new_run_dir(runs_root)
    directory.mkdir(parents=True, exist_ok=True)
    runs.check_writable(directory)
    if resume:
        check_resumable(directory)
    options = lifetime or LifetimeOptions()
    # A fresh run that counts N charges the count first: its ledger goes to the lifetime store before.
    link = (
        None
        if resume
        else lifetime_link.link_before_count(
            config, task, options, runs_root=directory.parent, run_id=directory.name, label=task_name, ledger=ledger
        )
    )
    optimizer = build_optimizer(
        task,
        engine,
        config,
        directory,
        seed_prompt=seed_prompt,
        resume=resume,
        scoring=scoring,
        ledger=link.ledger if link is not None else ledger,
    )
    status = lifetime_link.attach(
        optimizer,
        task,
        options,
        runs_root=directory.parent,
        run_id=directory.name,
        label=task_name,
        resume=resume,
        link=link,
    )
    if status is not None and on_lifetime is not None:
        on_lifetime(status)
    # A resumed run killed between its first checkpoint and config.json ran no generation: its prompt is the seed.
    written = resume and runs.RunDir(directory).config.is_file()
    seed_text = runs.read_json(directory / runs.CONFIG_NAME)["seed_prompt"] if written else optimizer.variable.value
    if not written:
        runs.write_released_json(
            directory,
            runs.CONFIG_NAME,
            "config",
            {
                "task": task_name,
                "engine": engine_name,
                "config": optimizer.config.model_dump(),
                "seed_prompt": seed_text,
                "noise_multiplier": optimizer.noise_multiplier,
                "selection_epsilon": optimizer.selection_epsilon,
                "dataset_size": optimizer.public_dataset_size,
                "noise": optimizer.noise.sampler,
            },
        )
    if not resume:
        runs.append_run_log(
            directory.parent,
            {
                "event": "started",
                "run_dir": directory.name,
                "task": task_name,
                "engine": engine_name,
                "config": optimizer.config.model_dump(),
                "started": started_at,
            },
            run_dir=directory,
        )
    else:
        runs.append_run_log(
            directory.parent,
            {
                "event": "resumed",
                "run_dir": directory.name,
                "generation": optimizer.generation,
                "epsilon": optimizer.ledger.epsilon(),
                "started": started_at,
            },
            run_dir=directory,
        )
    if on_start is not None:
        on_start(optimizer)
    try:
        result = optimizer.run(progress=on_generation)
    except PrivateScoringError as exc:
        # The one-line message is release-safe; the original error may quote a record.
        runs.append_operator_text(directory, runs.ERRORS_LOG_NAME, f"{exc.label}: {exc.operator_detail}")
        _log_failure(directory, optimizer, "engine failure while scoring private records")
        raise
    except BudgetExceeded:
        _log_failure(directory, optimizer, "budget exhausted before generation 0 finished: nothing released")
        raise
    (directory / runs.PROMPT_NAME).write_text(result.prompt + "\n", encoding="utf-8")
    evaluation = None
    if evaluate and task.test:
        evaluation = paired_evaluation(task, engine, seed_text, result.prompt)
    seconds = time.perf_counter() - started
    runs.write_released_json(
        directory,
        runs.RESULT_NAME,
        "result",
        {
            **result.as_dict(),
            "evaluation": evaluation.__dict__ if evaluation else None,
            "seconds": seconds,
            "engine_usage": engine.usage.as_dict() if hasattr(engine, "usage") else None,
        },
    )
    complete_finished(directory, seconds=seconds)
    return RunOutcome(directory, result, evaluation, seconds, optimizer)


def _log_failure(directory: Path, optimizer: DPEvolutionStrategy, why: str) -> None:
    runs.append_run_log(
        directory.parent,
        {
            "event": "failed",
            "run_dir": directory.name,
            "why": why,
            "generations_run": optimizer.generation,
            "epsilon": optimizer.ledger.epsilon(),
            "epsilon_by_accountant": optimizer.ledger.epsilons(),
        },
        run_dir=directory,
    )


def check_resumable(directory: str | Path) -> None:
    """Raise :class:`ConfigError` unless ``directory`` holds a run that can be resumed.

    A directory without a checkpoint has nothing to resume; a finished run (``result.json``
    written) is completed first (a kill after ``result.json``: its report and run-log line),
    then refused, since resuming it would run nothing.
    """
    run_dir = runs.RunDir(Path(directory))
    if run_dir.result.is_file():
        restored = complete_finished(run_dir.path)
        raise ConfigError(
            f"resume: the run in {run_dir.path} has finished"
            + ("; its missing run-log line was restored" if restored else "")
            + "; rebuild its report with `dp-textgrad report RUN_DIR` or start a new run"
        )
    if not run_dir.checkpoint.is_file():
        raise ConfigError(run_dir.missing_checkpoint_message())


def complete_finished(directory: str | Path, seconds: float | None = None) -> bool:
    """The steps after ``result.json``: the report and the run log's 'finished' line.

    Idempotent, so a run killed after its result was written is completed by calling it
    again (``optimize --resume`` does); returns whether the run-log line had to be written.
    """
    directory = Path(directory)
    result = runs.read_json(directory / runs.RESULT_NAME)
    saved = runs.read_json(directory / runs.CONFIG_NAME)
    from dp_textgrad.report import write_report  # plotting is imported only when a report is written

    if not (directory / runs.REPORT_NAME).is_file() or seconds is not None:
        write_report(directory)
    if any(
        line.get("event") == "finished" and line.get("run_dir") == directory.name
        for line in runs.read_run_log(directory.parent)
    ):
        return False
    stopped = str(result.get("stopped_because") or "")
    runs.append_run_log(
        directory.parent,
        {
            "event": "finished",
            "run_dir": directory.name,
            "task": saved.get("task"),
            "engine": saved.get("engine"),
            "config": saved.get("config"),
            "noise_seeded_insecurely": (saved.get("config") or {}).get("insecure_noise_seed") is not None,
            "noise": saved.get("noise"),
            "epsilon": result.get("epsilon"),
            "delta": result.get("delta"),
            "epsilon_by_accountant": result.get("epsilons"),
            "accountant": "smallest valid bound",
            "unsafe": result.get("unsafe"),
            "generations_run": result.get("generations_run"),
            "stopped_because": stopped,
            "stopped_early": stopped_early(stopped),
            "seconds": seconds,
            "machine": runs.machine_summary(),
        },
        run_dir=directory,
    )
    return True
