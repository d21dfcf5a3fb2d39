"""The front door: :func:`optimize` runs DP-ES on a task into a run directory, :func:`resume` continues one.

Both are what ``dp-textgrad optimize`` (and ``--resume``) do; the command line calls them, with
its console display, ``--json`` printer and trackers as observers. A thin layer over
:func:`dp_textgrad.workflow.run` that validates the settings first and sends the run's events
(:mod:`dp_textgrad.run_events`: start, lifetime, each generation, finished or failed; released
values only) to the caller's observers. The heavy imports (TextGrad, the optimizer) wait until a
run starts, so ``help(dp_textgrad.optimize)`` and a settings error cost no model or TextGrad import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad.dp_es.config import ConfigError, DPESConfig, config_with
from dp_textgrad.run_events import OBSERVER_METHODS, LifetimeChecked, RunFailed, RunFinished, RunStarted

if TYPE_CHECKING:
    from dp_textgrad.dp_es.reports import GenerationReport
    from dp_textgrad.dp_es.scoring_backends import ScoringFactory
    from dp_textgrad.lifetime_link import LifetimeOptions
    from dp_textgrad.tasks.base import Task
    from dp_textgrad.workflow import RunOutcome

#: An observer: an object with any of ``on_lifetime``, ``on_start``, ``on_generation``,
#: ``on_finish``, ``on_fail`` (see :mod:`dp_textgrad.run_events`), or a plain callable, called
#: with each generation's :class:`~dp_textgrad.dp_es.reports.GenerationReport`.
Observer = Any
GenerationCallback = Callable[["GenerationReport"], Any]


def optimize(
    task: Task,
    engine: Any,
    config: DPESConfig | None = None,
    *,
    run_dir: str | Path | None = None,
    runs_root: str | Path = "runs",
    observers: Iterable[Observer] = (),
    evaluate: bool = True,
    lifetime: LifetimeOptions | None = None,
    task_name: str | None = None,
    engine_name: str | None = None,
    scoring: ScoringFactory | None = None,
    **settings: Any,
) -> RunOutcome:
    """Optimize ``task``'s prompt with DP-ES on ``engine`` and release it under (epsilon, delta).

    The whole run, as ``dp-textgrad optimize`` makes it: plan (calibrate the noise so the
    planned schedule spends at most the budget), charge (every touch of private records is
    charged before it happens: to the dataset's lifetime store, then to the run's ledger), run
    the generations, release the final prompt, evaluate it, and write the run directory.

    Settings: ``config`` (a :class:`DPESConfig`, or None for the defaults) and/or its fields
    as keywords (``epsilon=4.0, generations=6, population=6, parents=2, ...``); keywords
    override ``config``'s values. A bad or unknown field raises :class:`ConfigError` naming
    it, before anything is read or written.

    ``task``: a :class:`~dp_textgrad.tasks.base.ClassificationTask` or a
    :class:`~dp_textgrad.tasks.generation.GenerationTask` (``make_support_task``,
    ``build_task_from_files``); its ``private_train`` records are the private data.
    ``engine``: ``LlamaCppEngine()``, ``OpenAIEngine(...)``, any dp-textgrad engine.
    ``run_dir``: the directory to write (default: a new ``<runs_root>/<id>/``).
    ``observers``: plain callables, each called with every generation's
    :class:`~dp_textgrad.dp_es.reports.GenerationReport` once its checkpoint is on disk,
    or objects with any of ``on_lifetime``, ``on_start``, ``on_generation``, ``on_finish``
    and ``on_fail``, which get every event of the run (:mod:`dp_textgrad.run_events`; the
    command line's display, ``--json`` and MLflow are such observers). Every event holds
    released values only (DP estimates, epsilon spent, public settings and public-phase
    usage); an observer that raises stops the run there, and :func:`resume` continues it.
    ``evaluate``: score the seed and released prompts on ``task.test`` (research
    evaluation, not covered by the guarantee). ``lifetime``: the dataset's lifetime-budget
    options (:class:`~dp_textgrad.lifetime_link.LifetimeOptions`: store, cap, dataset key);
    default: the store ``<runs_root>/operator/lifetime_budget.sqlite``, no cap.
    ``task_name`` / ``engine_name``: public labels for ``config.json`` and the run log
    (default: the task's name, the engine's model string). ``scoring``: where private
    records are scored (default: this process; a ``dp_textgrad.distributed.RayScoringPool``
    spreads them over Ray actors).

    Writes, in the run directory: released files (``config.json``, ``ledger.jsonl``,
    ``metrics.jsonl``, ``checkpoint.json``, ``released_prompt.txt``, ``result.json``,
    ``report.md`` / ``report.html``) and, under ``operator/``, OPERATOR-ONLY files
    (private-phase costs and times, error details: functions of the secret subsample,
    never to be published). Outside it: the run's lines in ``<runs_root>/run_metadata.jsonl``
    and its charges in the dataset's lifetime store (``lifetime``).

    Returns a :class:`~dp_textgrad.workflow.RunOutcome`: ``run_dir``, ``result`` (the
    released prompt, epsilon and delta spent, per-generation history: all released),
    ``evaluation``, ``seconds`` and ``optimizer``. The last two are OPERATOR-ONLY (the
    wall time times the private phase; the optimizer holds the private records).

    Guarantee: the released prompt and everything released (the released files, the
    observers' reports) are (epsilon, delta)-DP with respect to adding or removing one record
    of ``task.private_train``, epsilon being the smallest valid bound of the ledger's
    accountants (docs/privacy.md). Not covered: the test-split evaluation; void under
    ``privacy="off"`` or ``mode="unsafe"`` (``result.unsafe`` says so) and with
    ``insecure_noise_seed`` (seeded noise, for tests). Raises ``BudgetExceeded`` when the budget cannot pay for
    generation 0 and ``PrivateScoringError`` (a message quoting no record) when the engine
    fails on private records.
    """
    resolved = config_with(config, settings)
    if run_dir is not None:
        from dp_textgrad import runs

        if runs.RunDir(Path(run_dir)).checkpoint.is_file():
            raise ConfigError(
                f"run_dir: {run_dir} holds a run already; continue it with "
                "dp_textgrad.resume(run_dir, task, engine) or give a new directory"
            )
    return _run(
        task,
        engine,
        resolved,
        run_dir=run_dir,
        runs_root=runs_root,
        resume=False,
        observers=observers,
        evaluate=evaluate,
        lifetime=lifetime,
        scoring=scoring,
        task_name=task_name or _task_name(task),
        engine_name=engine_name or _engine_name(engine),
    )


def resume(
    run_dir: str | Path,
    task: Task,
    engine: Any,
    *,
    observers: Iterable[Observer] = (),
    evaluate: bool = True,
    lifetime: LifetimeOptions | None = None,
    task_name: str | None = None,
    engine_name: str | None = None,
    scoring: ScoringFactory | None = None,
) -> RunOutcome:
    """Continue the interrupted run in ``run_dir`` from its last checkpoint, then release as :func:`optimize`.

    ``task`` must hold the same private records (the run's ledger and lifetime record are
    keyed to them); the engine may differ (another server for the same model). The budget,
    the schedule and the calibrated plan are read back from the run, never recalibrated, and
    what was spent stays spent: charges of the interrupted generation are taken over where
    that is sound, else charged again (docs/privacy.md, Interruptions). A finished run
    (``result.json`` written) raises :class:`ConfigError` saying it has finished;
    a directory without a checkpoint raises one saying why there is nothing to resume.
    ``lifetime``: the options the run was started with, if not the default store.
    ``observers``, ``task_name``, ``engine_name``, ``scoring``: as for :func:`optimize`.
    """
    from dp_textgrad import runs
    from dp_textgrad.workflow import check_resumable

    directory = runs.RunDir(Path(run_dir))
    check_resumable(directory.path)
    saved = DPESConfig(**directory.saved_config())  # workflow.run reads the checkpoint's own copy
    return _run(
        task,
        engine,
        saved,
        run_dir=directory.path,
        runs_root=directory.path.parent,
        resume=True,
        observers=observers,
        evaluate=evaluate,
        lifetime=lifetime,
        scoring=scoring,
        task_name=task_name or _task_name(task),
        engine_name=engine_name or _engine_name(engine),
    )


def _task_name(task: Any) -> str:
    return str(getattr(task, "name", "custom"))


def _engine_name(engine: Any) -> str:
    return str(getattr(engine, "model_string", type(engine).__name__))


class _GenerationsOnly:
    """A plain callable as an observer: it gets each generation's report."""

    def __init__(self, callback: GenerationCallback) -> None:
        self.on_generation = callback


class EventStream:
    """The run's one event stream: each event goes to every observer that has a method for it, in order.

    A plain callable becomes an observer of the generation reports; anything else raises
    :class:`ConfigError` naming its place in ``observers``.
    """

    def __init__(self, observers: Iterable[Observer]) -> None:
        self.observers: list[Any] = []
        for index, observer in enumerate(observers):
            if any(callable(getattr(observer, name, None)) for name in OBSERVER_METHODS):
                self.observers.append(observer)
            elif callable(observer):
                self.observers.append(_GenerationsOnly(observer))
            else:
                raise ConfigError(
                    f"observers[{index}]: expected a callable taking a GenerationReport or an "
                    f"object with any of {', '.join(OBSERVER_METHODS)}, got {type(observer).__name__}"
                )

    def wants(self, method: str) -> bool:
        return any(callable(getattr(observer, method, None)) for observer in self.observers)

    def send(self, method: str, event: Any) -> None:
        for observer in self.observers:
            handler = getattr(observer, method, None)
            if callable(handler):
                handler(event)


def _run(
    task: Any, engine: Any, config: DPESConfig, *, observers: Iterable[Observer], resume: bool, **options: Any
) -> RunOutcome:
    stream = EventStream(observers)
    from dp_textgrad import workflow  # TextGrad and the optimizer load here, once a run starts

    def on_start(optimizer: Any) -> None:
        stream.send("on_start", RunStarted.of(optimizer, resumed=resume))

    def on_lifetime(status: Any) -> None:
        stream.send("on_lifetime", LifetimeChecked(status))

    def on_generation(report: GenerationReport) -> None:
        stream.send("on_generation", report)

    try:
        outcome = workflow.run(
            task,
            engine,
            config,
            resume=resume,
            on_start=on_start if stream.wants("on_start") else None,
            on_lifetime=on_lifetime if stream.wants("on_lifetime") else None,
            on_generation=on_generation if stream.wants("on_generation") else None,
            **options,
        )
    except BaseException as exc:
        stream.send("on_fail", RunFailed(type(exc).__name__))  # the class only: its text may describe data
        raise
    stream.send("on_finish", RunFinished.of(outcome))
    return outcome


__all__ = ["EventStream", "optimize", "resume"]
