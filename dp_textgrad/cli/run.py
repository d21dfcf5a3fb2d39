"""``dp-textgrad demo`` and ``dp-textgrad optimize`` (``--resume`` included): runs through the front door.

Both call :func:`dp_textgrad.optimize` / :func:`dp_textgrad.resume` with observers of the run's
event stream: the console display (or the ``--json`` printer, or ``--quiet``), the trackers
(``--mlflow``) and the Ctrl-C handler. Heavy modules are imported when a command runs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import typer

import dp_textgrad.cli._run_file as run_file
from dp_textgrad.cli._console import EXIT_STOPPED_EARLY, config_from, console, guarded
from dp_textgrad.cli.progress import JSON_HELP, MLFLOW_HELP, QUIET_HELP, GracefulStop, Output

# Measured (docs/benchmarks.md, "The demo"): 3 x 4 candidates on ~50 records, then 500 test records.
DEMO_RECORDS_PER_GENERATION = 50
# The built-in tasks ``demo --task`` runs, with the defaults of the options left out. Generating
# an answer costs more than scoring a label, so the generation demo is smaller (measured in
# docs/tasks.md, "Built-in generation task").
DEMO_DEFAULTS: dict[str, dict[str, int]] = {
    "support": dict(generations=3, population=4, n_private=1500, n_test=500, records=DEMO_RECORDS_PER_GENERATION),
    "support_extract": dict(generations=2, population=4, n_private=600, n_test=200, records=40),
}
DEMO_TITLES = {"support": "support (built-in)", "support_extract": "support_extract (built-in, generation)"}


def _start_run_dir(runs_root: Path, settings) -> Path:
    """A new run directory holding the settings that ``optimize --resume`` rebuilds the task and engine from."""
    from dp_textgrad import runs

    directory = runs.new_run_dir(runs_root)
    # Operator-only: the settings hold the private file's absolute path and name (issue 47).
    runs.write_operator_json(directory, runs.CLI_SETTINGS_NAME, settings.model_dump(mode="json"))
    return directory


def _observers(output: Output, settings, stop: GracefulStop, scoring_actors: int | None = None) -> list[Any]:
    """The run's observers, in the order they see each event: trackers, the display, the Ctrl-C handler."""
    from dp_textgrad.tracking import trackers_for

    return [*trackers_for(settings.output), output.observer(scoring_actors=scoring_actors), stop]


def _finish(outcome) -> None:
    from dp_textgrad.run_events import stopped_early

    if stopped_early(outcome.result.stopped_because):
        raise typer.Exit(EXIT_STOPPED_EARLY)


def demo(
    epsilon: float = typer.Option(4.0, help="total privacy budget epsilon"),
    delta: float | None = typer.Option(None, help="total delta (default 1e-5; min(1e-5, 1/(10N)) for a declared N)"),
    task: str = typer.Option(
        "support", "--task", help="built-in task: support (classification) or support_extract (generation)"
    ),
    generations: int | None = typer.Option(None, help="DP generations (default 3; support_extract 2)"),
    population: int | None = typer.Option(None, help="candidates per generation (default 4)"),
    parents: int = typer.Option(2, help="parents per generation"),
    n_private: int | None = typer.Option(
        None, help="size of the built-in private training set (default 1500; support_extract 600)"
    ),
    n_test: int | None = typer.Option(
        None, help="size of the built-in test split (default 500; support_extract 200; the paired test needs hundreds)"
    ),
    sampling_rate: float | None = typer.Option(
        None, help="Poisson sampling rate q (default about 50 records; support_extract about 40)"
    ),
    selection: str = typer.Option("gaussian", help="gaussian | exponential | permute_and_flip"),
    seed: int = typer.Option(0, help="seed of the task generator and of non-private choices"),
    runs_root: Path = typer.Option(Path("runs"), help="where run directories are created"),
    mlflow: str | None = typer.Option(None, help=MLFLOW_HELP),
    json_lines: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Run DP-ES end to end on a built-in private task with the embedded local model."""
    holder: dict[str, Path] = {}
    output = Output(console, json_lines=json_lines, quiet=quiet)

    def action():
        from dp_textgrad.dp_es.config import ConfigError
        from dp_textgrad.front import optimize as run_optimize
        from dp_textgrad.settings import EngineSection, OptimizeSettings, OutputSection, TaskSection, supports_feedback

        if task not in DEMO_DEFAULTS:
            raise ConfigError(f"--task: unknown demo task {task!r}; the demo knows {', '.join(DEMO_DEFAULTS)}")
        defaults = DEMO_DEFAULTS[task]
        sizes = dict(
            seed=seed,
            n_private=defaults["n_private"] if n_private is None else n_private,
            n_test=defaults["n_test"] if n_test is None else n_test,
        )
        task_section = TaskSection(name=task, options=sizes)
        the_task = task_section.build()
        records = defaults["records"]
        q = min(1.0, records / len(the_task.private_train)) if sampling_rate is None else sampling_rate
        config = config_from(
            dict(
                epsilon=epsilon,
                delta=delta,
                generations=defaults["generations"] if generations is None else generations,
                population=defaults["population"] if population is None else population,
                parents=parents,
                sampling_rate=q,
                seed=seed,
                selection=selection,
                feedback="dp_confusion" if supports_feedback(selection) else "none",
            )
        )
        console.print("Loading the local model (Gemma 3 270M via llama.cpp; first use assembles the GGUF)...")
        settings = OptimizeSettings(
            task=task_section,
            engine=EngineSection(kind="llama_cpp"),
            dp=config,
            output=OutputSection(runs_root=runs_root, mlflow=mlflow),
        )
        engine = settings.engine.build()
        holder["dir"] = _start_run_dir(runs_root, settings)
        with GracefulStop() as stop:
            return run_optimize(
                the_task,
                engine,
                config,
                run_dir=holder["dir"],
                runs_root=runs_root,
                observers=_observers(output, settings, stop),
                lifetime=settings.output.lifetime(),
                task_name=DEMO_TITLES[task],
                engine_name=engine.model_string,
            )

    with output:
        _finish(guarded(action, lambda: holder.get("dir")))


_RESUME_FIXED = (
    "config",
    "epsilon",
    "delta",
    "generations",
    "population",
    "parents",
    "sampling_rate",
    "max_private_evaluations",
    "selection",
    "seed",
    "task",
    "train",
    "test",
    "runs_root",
    "encoding",
)


def optimize(
    config: Path | None = run_file.CONFIG_OPTION,
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in RUN_DIR from its checkpoint"),
    epsilon: float | None = typer.Option(None, help="total privacy budget epsilon (dp.epsilon)"),
    delta: float | None = typer.Option(
        None, help="total delta (dp.delta; default 1e-5; min(1e-5, 1/(10N)) for a declared N)"
    ),
    generations: int | None = typer.Option(None, help="DP generations (dp.generations)"),
    population: int | None = typer.Option(None, help="candidates per generation (dp.population)"),
    parents: int | None = typer.Option(None, help="parents per generation (dp.parents)"),
    sampling_rate: str | None = typer.Option(
        None,
        help="Poisson sampling rate q, or auto: the q that gives each candidate's mean score the least noise "
        "within --max-private-evaluations (dp.sampling_rate)",
    ),
    max_private_evaluations: int | None = typer.Option(
        None, help="cap on the planned private record evaluations q N K T (dp.max_private_evaluations)"
    ),
    selection: str | None = typer.Option(None, help="gaussian | exponential | permute_and_flip (dp.selection)"),
    seed: int | None = typer.Option(None, help="seed of non-private choices (dp.seed); never of DP noise"),
    task: str | None = run_file.TASK_OPTION,
    train: Path | None = run_file.TRAIN_OPTION,
    test: Path | None = run_file.TEST_OPTION,
    encoding: str | None = run_file.ENCODING_OPTION,
    engine: str | None = run_file.ENGINE_OPTION,
    base_url: str | None = run_file.BASE_URL_OPTION,
    model: str | None = run_file.MODEL_OPTION,
    runs_root: Path | None = typer.Option(None, help="where run directories are created (output.runs_root)"),
    lifetime_cap: float | None = typer.Option(
        None, help="refuse to push the dataset's lifetime epsilon past this (output.lifetime_cap)"
    ),
    override_lifetime_cap: bool = typer.Option(
        False, "--override-lifetime-cap", help="run even past the lifetime cap (recorded in the ledger)"
    ),
    lifetime_store: Path | None = typer.Option(
        None, help="lifetime budget store (output.lifetime_store; default RUNS_ROOT/operator/lifetime_budget.sqlite)"
    ),
    dataset_key: str | None = typer.Option(
        None, help="name the dataset in the lifetime store, shared by its versions (output.dataset_key; public)"
    ),
    lifetime_delta: float | None = typer.Option(
        None, help="the dataset's lifetime delta (output.lifetime_delta; default: fixed by its first run)"
    ),
    mlflow: str | None = typer.Option(None, help=MLFLOW_HELP + " (output.mlflow)"),
    distributed: bool = typer.Option(False, "--distributed", help="score on Ray actors (distributed.enabled)"),
    actors: int | None = typer.Option(None, help="Ray actors, one partition each (distributed.actors)"),
    ray_address: str | None = typer.Option(None, help="Ray cluster address (distributed.address; default local)"),
    json_lines: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Optimize a prompt with DP-ES on your data and any engine. Flags override the config file."""
    output = Output(console, json_lines=json_lines, quiet=quiet)
    given = dict(
        config=config,
        epsilon=epsilon,
        delta=delta,
        generations=generations,
        population=population,
        parents=parents,
        sampling_rate=sampling_rate,
        max_private_evaluations=max_private_evaluations,
        selection=selection,
        seed=seed,
        task=task,
        train=train,
        test=test,
        runs_root=runs_root,
        encoding=encoding,
    )
    engine_section = run_file.engine_flags(engine, base_url, model)
    lifetime_flags = dict(
        lifetime_cap=lifetime_cap,
        override_lifetime_cap=override_lifetime_cap or None,
        lifetime_store=lifetime_store,
        dataset_key=dataset_key,
        lifetime_delta=lifetime_delta,
        mlflow=mlflow,
    )
    scale_flags = dict(enabled=distributed or None, actors=actors, address=ray_address)
    holder: dict[str, Path] = {}

    def action():
        from dp_textgrad import runs
        from dp_textgrad.dp_es.config import ConfigError
        from dp_textgrad.settings import build_settings

        if resume is not None:
            fixed = [f"--{k.replace('_', '-')}" for k in _RESUME_FIXED if given[k] is not None]
            if fixed:
                raise ConfigError(
                    f"resume: {', '.join(fixed)} cannot be given with --resume; the task, budget "
                    "and schedule of a run are fixed by its checkpoint (only --engine, "
                    "--base-url, --model may change)"
                )
            from dp_textgrad.workflow import check_resumable

            directory = resume
            check_resumable(directory)  # before the engine loads: a finished run or no checkpoint is refused
            saved_settings = runs.RunDir(directory).cli_settings
            if not saved_settings.is_file():
                raise ConfigError(
                    f"resume: no {runs.OPERATOR_DIR}/{runs.CLI_SETTINGS_NAME} in {directory} (the run was not "
                    "started from the command line); resume it with dp_textgrad.resume(RUN_DIR, task, engine)"
                )
            saved = runs.read_json(saved_settings)
            saved["dp"] = runs.RunDir(directory).saved_config()
            settings = build_settings(
                saved, {"engine": engine_section, "output": lifetime_flags, "distributed": scale_flags}
            )
            holder["dir"] = directory
        else:
            flags = {
                "dp": dict(
                    epsilon=epsilon,
                    delta=delta,
                    generations=generations,
                    population=population,
                    parents=parents,
                    sampling_rate=sampling_rate,
                    max_private_evaluations=max_private_evaluations,
                    selection=selection,
                    seed=seed,
                ),
                "task": run_file.task_flags(task, train, test, encoding),
                "engine": engine_section,
                "output": dict(runs_root=runs_root, **lifetime_flags),
                "distributed": scale_flags,
            }
            settings = run_file.settings_from(config, flags)
            directory = None
        if settings.task.needs_engine():  # a judge grades with the run's engine: it is loaded first
            the_engine = settings.engine.build()
            the_task = settings.task.build(the_engine)
        else:  # the files are checked before a model is loaded
            the_task = settings.task.build()
            the_engine = settings.engine.build()
        if directory is None:
            directory = holder["dir"] = _start_run_dir(settings.output.runs_root, settings)
        pool = settings.distributed.build(settings.engine) if settings.distributed.enabled else None
        names = dict(
            task_name=settings.task.display_name(),
            engine_name=str(getattr(the_engine, "model_string", settings.engine.kind)),
        )
        with GracefulStop() as stop, pool or contextlib.nullcontext():
            observers = _observers(output, settings, stop, scoring_actors=pool.actors if pool is not None else None)
            common = dict(
                observers=observers,
                evaluate=settings.output.evaluate,
                lifetime=settings.output.lifetime(),
                scoring=pool,
                **names,
            )
            if resume is not None:
                from dp_textgrad.front import resume as run_resume

                return run_resume(directory, the_task, the_engine, **common)
            from dp_textgrad.front import optimize as run_optimize

            return run_optimize(
                the_task, the_engine, settings.dp, run_dir=directory, runs_root=settings.output.runs_root, **common
            )

    with output:
        _finish(guarded(action, lambda: holder.get("dir")))
