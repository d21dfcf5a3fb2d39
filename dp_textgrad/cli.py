"""Command line: ``dp-textgrad demo | optimize | budget | report | ledger | audit | federated...``.

Errors are one clear line (``dp-textgrad --debug ...`` shows the traceback). Exit codes: 0 success,
3 a prompt was released after an early stop (budget exhausted or a callback; the console and
``result.json`` say why), 1 run failure (engine errors, nothing could be released), 2 bad input or
configuration (nothing charged), 130 interrupted (clean checkpoint; ``dp-textgrad optimize --resume RUN_DIR``).
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError

from dp_textgrad import runs
# The task and engine builders live in the library; `cli.make_engine` is the seam tests replace.
from dp_textgrad.builders import build_task, make_engine
# The exit codes are re-exported: callers and tests read them as cli.EXIT_*.
from dp_textgrad.cli_common import (EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED,  # noqa: F401
                                    EXIT_STOPPED_EARLY, _bad_input_types, _fail, _guarded, _state, console)
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.progress import (JSON_HELP, MLFLOW_HELP, QUIET_HELP, GracefulStop, Output,
                                  run_with_progress)
from dp_textgrad.settings import (
    EngineSection,
    OptimizeSettings,
    OutputSection,
    TaskSection,
    supports_feedback,
    build_settings,
    read_config_file,
)
from dp_textgrad.tracking import trackers_for

# Tracebacks (--debug) never show local variables: they would print raw private records.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Differentially private prompt optimization (DP-ES on TextGrad).")

# What the CLI saves in a run directory so that `optimize --resume` can rebuild the task and engine.
CLI_SETTINGS_NAME = runs.CLI_SETTINGS_NAME
# Measured (docs/benchmarks.md, "The demo"): 3 x 4 candidates on ~50 records, then 500 test records.
DEMO_RECORDS_PER_GENERATION = 50


def _mount_commands() -> None:
    from dp_textgrad.audit.cli import audit_app
    from dp_textgrad.cli_federated import federated, federated_app, federated_split
    from dp_textgrad.cli_ledger import ledger
    from dp_textgrad.cli_report import report

    app.add_typer(audit_app, name="audit")
    app.command()(ledger)
    app.command()(report)
    app.command()(federated)
    for name, command in (("federated-split", federated_split), ("federated-app", federated_app)):
        app.command(name)(command)


_mount_commands()


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="show full tracebacks on errors")) -> None:
    _state["debug"] = debug


def _config_from(settings: dict[str, Any]):
    from dp_textgrad.dp_es.config import ConfigError, format_validation_error

    try:
        return DPESConfig(**{k: v for k, v in settings.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def _start_run_dir(runs_root: Path, settings: OptimizeSettings) -> Path:
    from dp_textgrad import runs

    directory = runs.new_run_dir(runs_root)
    saved = settings.model_dump(mode="json")
    runs.write_json(directory / CLI_SETTINGS_NAME, saved)
    return directory


# -- commands ------------------------------------------------------------------------------
@app.command()
def demo(
    epsilon: float = typer.Option(4.0, help="total privacy budget epsilon"),
    delta: Optional[float] = typer.Option(None, help="total delta (default 1e-5; min(1e-5, 1/(10N)) for a declared N)"),
    generations: int = typer.Option(3, help="DP generations"),
    population: int = typer.Option(4, help="candidates per generation"),
    parents: int = typer.Option(2, help="parents per generation"),
    n_private: int = typer.Option(1500, help="size of the built-in private training set"),
    n_test: int = typer.Option(500, help="size of the built-in test split (the paired test needs a few hundred)"),
    sampling_rate: Optional[float] = typer.Option(None, help="Poisson sampling rate q (default about 50 records)"),
    selection: str = typer.Option("gaussian", help="gaussian | exponential | permute_and_flip"),
    seed: int = typer.Option(0, help="seed of the task generator and of non-private choices"),
    runs_root: Path = typer.Option(Path("runs"), help="where run directories are created"),
    mlflow: Optional[str] = typer.Option(None, help=MLFLOW_HELP),
    json_lines: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Run DP-ES end to end on the built-in private task with the embedded local model."""
    holder: dict[str, Path] = {}
    output = Output(console, json_lines=json_lines, quiet=quiet)

    def action():
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
        from dp_textgrad.tasks.synthetic import make_support_task

        task = make_support_task(seed=seed, n_private=n_private, n_test=n_test)
        q = min(1.0, DEMO_RECORDS_PER_GENERATION / len(task.private_train)) if sampling_rate is None else sampling_rate
        config = _config_from(dict(epsilon=epsilon, delta=delta, generations=generations, population=population,
                                   parents=parents, sampling_rate=q, seed=seed, selection=selection,
                                   feedback="dp_confusion" if supports_feedback(selection) else "none"))
        console.print("Loading the local model (Gemma 3 270M via llama.cpp; first use assembles the GGUF)...")
        engine = LlamaCppEngine()
        settings = OptimizeSettings(
            task=TaskSection(name="support", options=dict(seed=seed, n_private=n_private, n_test=n_test)),
            engine=EngineSection(kind="llama_cpp"), dp=config, output=OutputSection(runs_root=runs_root, mlflow=mlflow))
        holder["dir"] = _start_run_dir(runs_root, settings)
        with GracefulStop() as stop:
            return run_with_progress(console, task, engine, config, task_name="support (built-in)",
                                      engine_name=engine.model_string, runs_root=runs_root,
                                      run_dir=holder["dir"], stop=stop, lifetime=settings.output.lifetime(),
                                      events=output.events, trackers=trackers_for(settings.output))

    with output:
        _finish(_guarded(action, lambda: holder.get("dir")), output)


def _finish(outcome, output: Output) -> None:
    from dp_textgrad.workflow import stopped_early

    output.finish(outcome)
    if stopped_early(outcome.result.stopped_because):
        raise typer.Exit(EXIT_STOPPED_EARLY)


_RESUME_FIXED = ("config", "epsilon", "delta", "generations", "population", "parents", "sampling_rate",
                 "selection", "seed", "task", "train", "test", "runs_root", "encoding")


@app.command()
def optimize(
    config: Optional[Path] = typer.Option(None, "--config", "-c",
                                          help="YAML or TOML file (sections: task, engine, dp, output)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the run in RUN_DIR from its checkpoint"),
    epsilon: Optional[float] = typer.Option(None, help="total privacy budget epsilon (dp.epsilon)"),
    delta: Optional[float] = typer.Option(None, help="total delta (dp.delta; default 1e-5; min(1e-5, 1/(10N)) for a declared N)"),
    generations: Optional[int] = typer.Option(None, help="DP generations (dp.generations)"),
    population: Optional[int] = typer.Option(None, help="candidates per generation (dp.population)"),
    parents: Optional[int] = typer.Option(None, help="parents per generation (dp.parents)"),
    sampling_rate: Optional[float] = typer.Option(None, help="Poisson sampling rate q (dp.sampling_rate)"),
    selection: Optional[str] = typer.Option(None, help="gaussian | exponential | permute_and_flip (dp.selection)"),
    seed: Optional[int] = typer.Option(None, help="seed of non-private choices (dp.seed); never of DP noise"),
    task: Optional[str] = typer.Option(None, help="built-in task: support | sst2 | banking77 (task.name)"),
    train: Optional[Path] = typer.Option(None, help="private training file .csv/.tsv/.jsonl (task.train)"),
    test: Optional[Path] = typer.Option(None, help="test file (task.test)"),
    encoding: Optional[str] = typer.Option(None, help="encoding of the task files, e.g. latin-1 (task.encoding)"),
    engine: Optional[str] = typer.Option(None, help="llama_cpp | openai | transformers (engine.kind)"),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1"),
    model: Optional[str] = typer.Option(None, help="engine.model: GGUF path, model name, or HF name/path"),
    runs_root: Optional[Path] = typer.Option(None, help="where run directories are created (output.runs_root)"),
    lifetime_cap: Optional[float] = typer.Option(None, help="refuse to push the dataset's lifetime epsilon past "
                                                             "this (output.lifetime_cap)"),
    override_lifetime_cap: bool = typer.Option(False, "--override-lifetime-cap",
                                               help="run even past the lifetime cap (recorded in the ledger)"),
    lifetime_store: Optional[Path] = typer.Option(None, help="lifetime budget store (output.lifetime_store; "
                                                              "default RUNS_ROOT/operator/lifetime_budget.sqlite)"),
    dataset_key: Optional[str] = typer.Option(None, help="name the dataset in the lifetime store, shared by its "
                                                          "versions (output.dataset_key; public)"),
    lifetime_delta: Optional[float] = typer.Option(None, help="the dataset's lifetime delta (output.lifetime_delta; "
                                                              "default: fixed by its first run)"),
    mlflow: Optional[str] = typer.Option(None, help=MLFLOW_HELP + " (output.mlflow)"),
    distributed: bool = typer.Option(False, "--distributed", help="score on Ray actors (distributed.enabled)"),
    actors: Optional[int] = typer.Option(None, help="Ray actors, one partition each (distributed.actors)"),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster address (distributed.address; default local)"),
    json_lines: bool = typer.Option(False, "--json", help=JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Optimize a prompt with DP-ES on your data and any engine. Flags override the config file."""
    output = Output(console, json_lines=json_lines, quiet=quiet)
    given = dict(config=config, epsilon=epsilon, delta=delta, generations=generations, population=population,
                 parents=parents, sampling_rate=sampling_rate, selection=selection, seed=seed, task=task,
                 train=train, test=test, runs_root=runs_root, encoding=encoding)
    engine_flags = dict(kind=engine, base_url=base_url, model=model)
    lifetime_flags = dict(lifetime_cap=lifetime_cap, override_lifetime_cap=override_lifetime_cap or None,
                          lifetime_store=lifetime_store, dataset_key=dataset_key, lifetime_delta=lifetime_delta,
                          mlflow=mlflow)
    scale_flags = dict(enabled=distributed or None, actors=actors, address=ray_address)
    holder: dict[str, Path] = {}

    def action():
        from dp_textgrad import runs
        from dp_textgrad.dp_es.config import ConfigError

        if resume is not None:
            fixed = [f"--{k.replace('_', '-')}" for k in _RESUME_FIXED if given[k] is not None]
            if fixed:
                raise ConfigError(f"resume: {', '.join(fixed)} cannot be given with --resume; the task, budget "
                                  "and schedule of a run are fixed by its checkpoint (only --engine, "
                                  "--base-url, --model may change)")
            directory = resume
            if not runs.RunDir(directory).checkpoint.is_file():
                raise ConfigError(runs.RunDir(directory).missing_checkpoint_message())
            if runs.RunDir(directory).result.is_file():
                from dp_textgrad.workflow import complete_finished

                restored = complete_finished(directory)  # a kill after result.json: finish the run log
                raise ConfigError(f"resume: the run in {directory} has finished"
                                  + ("; its missing run-log line was restored" if restored else "")
                                  + "; rebuild its report with `dp-textgrad report RUN_DIR` or start a new run")
            if not (directory / CLI_SETTINGS_NAME).is_file():
                raise ConfigError(f"resume: no {CLI_SETTINGS_NAME} in {directory} (the run was not started "
                                  "from the command line); resume it with dp_textgrad.resume(RUN_DIR, task, engine)")
            saved = runs.read_json(directory / CLI_SETTINGS_NAME)
            saved["dp"] = runs.RunDir(directory).saved_config()
            settings = build_settings(saved, {"engine": engine_flags, "output": lifetime_flags,
                                              "distributed": scale_flags})
            holder["dir"] = directory
        else:
            raw = read_config_file(config) if config is not None else {}
            if raw.get("task", {}) is None:  # "task:" with nothing under it: no task section
                del raw["task"]
            flags = {
                "dp": dict(epsilon=epsilon, delta=delta, generations=generations, population=population,
                           parents=parents, sampling_rate=sampling_rate, selection=selection, seed=seed),
                "task": dict(name=task, train=train.resolve() if train else None,
                             test=test.resolve() if test else None, encoding=encoding),
                "engine": engine_flags,
                "output": dict(runs_root=runs_root, **lifetime_flags),
                "distributed": scale_flags,
            }
            settings = build_settings(raw, flags, source=config)
            if config is not None and not raw.get("task") and task is None and train is None and test is None:
                raise ConfigError(_no_task_message(config))
            directory = None
        the_task = build_task(settings.task)
        the_engine = make_engine(settings.engine)
        if directory is None:
            directory = holder["dir"] = _start_run_dir(settings.output.runs_root, settings)
        pool = settings.distributed.pool(settings.engine) if settings.distributed.enabled else None
        with GracefulStop() as stop, (pool or contextlib.nullcontext()):
            return run_with_progress(console, the_task, the_engine, settings.dp, task_name=settings.task.display_name(),
                engine_name=str(getattr(the_engine, "model_string", settings.engine.kind)),
                runs_root=settings.output.runs_root, run_dir=directory, resume=resume is not None,
                evaluate=settings.output.evaluate, stop=stop, lifetime=settings.output.lifetime(),
                events=output.events, trackers=trackers_for(settings.output), scoring=pool)

    with output:
        _finish(_guarded(action, lambda: holder.get("dir")), output)


@app.command()
def budget(
    epsilon: Optional[float] = typer.Option(None, help="target epsilon: prints the calibrated noise"),
    delta: float = typer.Option(1e-5, help="delta"),
    generations: int = typer.Option(6, help="DP generations T"),
    population: int = typer.Option(6, help="candidates per generation K"),
    parents: int = typer.Option(2, help="parents per generation k"),
    sampling_rate: float = typer.Option(0.1, help="Poisson sampling rate q"),
    selection: str = typer.Option("gaussian", help="gaussian | exponential | permute_and_flip"),
    feedback: Optional[str] = typer.Option(None, help="dp_confusion | none (default: dp_confusion where the "
                                                      "selection supports it)"),
    noise_multiplier: Optional[float] = typer.Option(None, help="given noise: prints epsilon under every accountant"),
    selection_epsilon: Optional[float] = typer.Option(None, help="given epsilon0 (charged selections): prints "
                                                                  "epsilon"),
    llm_operators: Optional[bool] = typer.Option(
        None, "--llm-operators/--no-llm-operators",
        help="whether LLM operators read the DP feedback (default: as optimize decides it for the engine: off "
             "for the built-in base model, whose runs charge no feedback; on for openai, transformers or your "
             "own GGUF)"),
    engine: Optional[str] = typer.Option(None, help="the engine the run will use: llama_cpp (default) | openai | "
                                                   "transformers (engine.kind); decides --llm-operators"),
    model: Optional[str] = typer.Option(None, help="engine.model, as given to optimize (a GGUF of your own is "
                                                  "taken as instruction-tuned)"),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="a run file: the plan is for its engine "
                                                                       "section (and its dp.llm_operators)"),
    dataset_size: Optional[int] = typer.Option(
        None, help="the public N you declare; without it the run spends --size-epsilon-share of epsilon on a DP "
                   "count of N first, and this plan includes it"),
    size_epsilon_share: float = typer.Option(0.05, help="share of epsilon for the DP count of N (N not declared)"),
) -> None:
    """Calibration calculator: the noise for a budget, or the epsilon of a given noise. Reads no data."""
    try:
        from dp_textgrad.privacy.accounting import default_accountants
        from dp_textgrad.dp_es.plan import RunPlan

        if epsilon is None and noise_multiplier is None and selection_epsilon is None:
            raise ValueError("budget: give --epsilon EPS for the noise that budget buys (e.g. dp-textgrad budget "
                             "--epsilon 4), or --noise-multiplier Z (--selection-epsilon E0 for exponential and "
                             "permute_and_flip) for the epsilon that noise costs")
        if (epsilon is None) == (noise_multiplier is None and selection_epsilon is None):
            raise ValueError("give either --epsilon (to calibrate) or --noise-multiplier/--selection-epsilon "
                             "(to account), not both")
        if llm_operators is None:  # as optimize decides it: from the engine the run will use
            llm_operators = _planned_llm_operators(config, engine, model)
        for name, value in (("noise_multiplier", noise_multiplier), ("selection_epsilon", selection_epsilon)):
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {value}")
        if feedback is None:
            feedback = "dp_confusion" if supports_feedback(selection) else "none"
        config = _config_from(dict(epsilon=epsilon if epsilon is not None else 1.0, delta=delta,
                                   generations=generations, population=population, parents=parents,
                                   sampling_rate=sampling_rate, selection=selection, feedback=feedback,
                                   llm_operators=llm_operators, dataset_size=dataset_size,
                                   size_epsilon_share=size_epsilon_share))
        # The strategy says which parameter the budget decides: a noise multiplier or a per-pick epsilon0.
        parameter = RunPlan(config, None).strategy.calibrates
        if epsilon is not None:
            plan = RunPlan.calibrated(config)
            what = f"noise multiplier z = {plan.value:.4f}" if parameter == "noise_multiplier" \
                else f"epsilon0 = {plan.value:.5f} per selection"
            console.print(f"For epsilon = {epsilon}, delta = {delta:g}: {what}")
        else:
            field, value = ("noise_multiplier", noise_multiplier) if parameter == "noise_multiplier" \
                else ("selection_epsilon", selection_epsilon)
            if value is None:
                raise ValueError(f"{field}: selection {config.selection} is accounted from "
                                 f"--{field.replace('_', '-')}")
            plan = RunPlan.with_value(config, value)
            if plan.size_count is not None:  # the count takes a share of the budget that this noise implies
                search = min(plan.epsilons(delta, default_accountants()).values()) - config.size_epsilon
                total = search / (1.0 - config.size_epsilon_share)
                plan = RunPlan.with_value(config.model_copy(update={"epsilon": total}), value)
                config = plan.config
        if plan.size_count is not None:  # the run's stage 1 (docs/privacy.md, "The dataset size")
            console.print(f"N not declared: a DP count of N (discrete Laplace, pure DP) spends epsilon "
                          f"{config.size_epsilon:.4g} first; the search is calibrated to the remaining "
                          f"{config.search_epsilon:.4g}, and the two add up (basic composition)")
        console.print("epsilon of the whole run under each accountant:")
        values = plan.epsilons(delta, default_accountants())
        for name, value in values.items():
            console.print(f"  {name:>10}: {value:.4f}")
        console.print(f"  {'used':>10}: {min(values.values()):.4f} (smallest valid bound)")
    except typer.Exit:
        raise
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)


def _no_task_message(config: Path) -> str:
    # A run file says what to run: an empty or task-less one is refused before anything is charged,
    # not quietly given the built-in task (which stays the default without --config, as documented).
    return (f"task: {config.name} has no task section, so there is nothing to run; add task.name (a built-in "
            "task: support, sst2, banking77) or task.train and task.test (your files), or pass --task or "
            "--train/--test; to try the built-in task on the local model, run `dp-textgrad demo`")


def _planned_llm_operators(config: Optional[Path], engine: Optional[str], model: Optional[str]) -> bool:
    """``llm_operators`` of a run with this engine, decided from its section without loading the model."""
    from dp_textgrad.builders import engine_follows_instructions

    raw = read_config_file(config) if config is not None else {}
    raw.pop("task", None)  # the plan reads no data: a run file's task section does not matter here
    settings = build_settings(raw, {"engine": dict(kind=engine, model=model)}, source=config)
    if settings.dp.llm_operators is not None:
        return settings.dp.llm_operators
    return engine_follows_instructions(settings.engine)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
