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
from dp_textgrad.tasks.base import Task


@dataclass
class Evaluation:
    """Test-split scores of the seed and released prompts (research evaluation, not covered by DP).

    ``seed_accuracy`` / ``released_accuracy`` keep their names for old readers: they are the
    mean of the task's metric (``metric``: ``accuracy`` for a classification task, ``exact``,
    ``f1``, ... for a generation task). ``interval`` says how the 95% intervals were made:
    ``wilson`` (binary scores: Wilson for each prompt, Wald on the paired differences and the
    exact McNemar p-value of the discordant pairs) or ``bootstrap`` (other scores: percentile
    bootstrap for each prompt and a paired bootstrap for the difference; no McNemar test).
    """

    seed_accuracy: float
    released_accuracy: float
    n_test: int
    difference: float | None = None
    difference_low: float | None = None
    difference_high: float | None = None
    mcnemar_p: float | None = None
    discordant: tuple[int, int] | None = None  # (released right and seed wrong, the reverse)
    metric: str = "accuracy"
    interval: str = "wilson"
    seed_low: float | None = None
    seed_high: float | None = None
    released_low: float | None = None
    released_high: float | None = None


BOOTSTRAP_RESAMPLES = 9999


def _binary(task: Any, *scores: np.ndarray) -> bool:
    """Wilson and McNemar apply: the task's metric is binary (unknown: assumed) and every score is 0 or 1."""
    declared = bool(getattr(task, "binary_scores", True))
    return declared and all(bool(np.isin(values, (0.0, 1.0)).all()) for values in scores)


def score_interval(values: np.ndarray, binary: bool) -> tuple[float, float]:
    """The 95% interval of the mean of ``values``: Wilson for 0/1 scores, else a percentile bootstrap
    (NaN for fewer than two records, which have no spread to resample)."""
    from dp_textgrad.report.plots import accuracy_ci

    mean = float(values.mean())
    if binary:
        return accuracy_ci(mean, values.size)
    if values.size < 2:
        return float("nan"), float("nan")
    if np.all(values == values[0]):  # no spread: every resample has the same mean
        return mean, mean
    from scipy import stats

    ci = stats.bootstrap(
        (values,), np.mean, confidence_level=0.95, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", random_state=0
    ).confidence_interval
    return float(ci.low), float(ci.high)


def scores_on_test(task: Task, engine: Any, prompt: str) -> np.ndarray:
    """Per-record scores in [0, 1] of ``prompt`` on the task's public test split (charges nothing).

    The scoring is the task's ``public_scores``: a generation task's metric, or 1 for the right
    label and 0 otherwise for a classification task. No private record is read.
    """
    return np.asarray(task.public_scores(engine, prompt, task.test), dtype=float)


def compare_paired(
    first: np.ndarray, second: np.ndarray, *, binary: bool | None = None, metric: str = "accuracy"
) -> Evaluation:
    """``second`` against ``first`` on the same records: each mean with its 95% interval and the
    paired difference. Binary scores (``binary``; default: every score is 0 or 1): Wilson, a Wald
    interval on the differences and McNemar; other scores: bootstrap and a paired bootstrap."""
    from scipy import stats

    first, second = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    diff = second - first
    n = diff.size
    if binary is None:
        binary = _binary(None, first, second)
    better, worse = int(np.sum(diff > 0)), int(np.sum(diff < 0))
    p_value = 1.0 if better + worse == 0 else float(stats.binomtest(better, better + worse, 0.5).pvalue)
    if binary:
        half = 1.959963984540054 * float(np.std(diff, ddof=1)) / np.sqrt(n) if n > 1 else float("nan")
        low, high = float(diff.mean() - half), float(diff.mean() + half)
    elif n < 2:
        low = high = float("nan")
    elif np.all(diff == diff[0]):
        low = high = float(diff[0])
    else:
        ci = stats.bootstrap(
            (first, second),
            lambda a, b, axis=-1: np.mean(b - a, axis=axis),
            paired=True,
            vectorized=True,
            confidence_level=0.95,
            n_resamples=BOOTSTRAP_RESAMPLES,
            method="percentile",
            random_state=0,
        ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    seed_low, seed_high = score_interval(first, binary)
    released_low, released_high = score_interval(second, binary)
    return Evaluation(
        seed_accuracy=float(first.mean()),
        released_accuracy=float(second.mean()),
        n_test=n,
        difference=float(diff.mean()),
        difference_low=low,
        difference_high=high,
        mcnemar_p=p_value if binary else None,
        discordant=(better, worse) if binary else None,
        metric=metric,
        interval="wilson" if binary else "bootstrap",
        seed_low=seed_low,
        seed_high=seed_high,
        released_low=released_low,
        released_high=released_high,
    )


def paired_evaluation(task: Task, engine: Any, seed_prompt: str, released_prompt: str) -> Evaluation:
    """Both prompts on the same test records, compared pairwise (McNemar, paired interval)."""
    seed = scores_on_test(task, engine, seed_prompt)
    released = seed if released_prompt == seed_prompt else scores_on_test(task, engine, released_prompt)
    return compare_paired(seed, released, binary=_binary(task, seed, released), metric=_metric(task))


def _metric(task: Any) -> str:
    return str(getattr(task, "metric_name", "accuracy"))


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


def evaluate_prompts(task: Task, engine: Any, prompts: list[str]) -> list[PromptScore]:
    """Score each prompt on ``task.test`` (public; charges nothing, reads no private record).

    Per prompt its mean score (the task's ``metric_name``: accuracy for a classification task)
    with a Wilson interval for a binary metric, or a percentile bootstrap for any other (or any
    scores not all 0 or 1); every prompt after the first is compared with the first on the same
    records as :func:`paired_evaluation` does (paired bootstrap for a non-binary metric).
    """
    if not task.test:
        raise ValueError("test: the task has no test records to score prompts on; give it a test split")
    scored: dict[str, np.ndarray] = {}
    for prompt in prompts:
        if prompt not in scored:
            scored[prompt] = scores_on_test(task, engine, prompt)
    # One kind of interval for every prompt of the table: binary only when all of them are 0/1.
    binary = _binary(task, *scored.values())
    results: list[PromptScore] = []
    for prompt in prompts:
        values = scored[prompt]
        low, high = score_interval(values, binary)
        against = compare_paired(scored[prompts[0]], values, binary=binary, metric=_metric(task)) if results else None
        interval = "wilson" if binary else "bootstrap"
        results.append(PromptScore(float(values.mean()), low, high, values.size, interval, against))
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
    task: Task,
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
    task: Task,
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
                "task_kind": str(getattr(task, "kind", "classify")),
                "metric": str(getattr(task, "metric_name", "accuracy")),
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
    runs.write_released_text(directory / runs.PROMPT_NAME, result.prompt + "\n")
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
    runs.stamp_released(directory)  # what the run wrote before it failed keeps no time of its private phase


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
        runs.stamp_released(directory)  # completed again (after a kill): heal the times the kill left
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
    runs.stamp_released(directory)  # every released file and folder gets the public time
    return True
