"""Command line: ``dp-textgrad demo | optimize | budget | report``.

Errors are one clear line (``dp-textgrad --debug ...`` shows the traceback). Exit codes:
0 success, 1 run failure (engine errors, nothing could be released), 2 bad input or
configuration, 130 interrupted (the run stops after a clean checkpoint; resume it with
``dp-textgrad optimize --resume RUN_DIR``).
"""

from __future__ import annotations

import difflib
import math
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Optional

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.console import Console

from dp_textgrad import runs
from dp_textgrad.dp_es.config import DPESConfig

# Tracebacks (--debug) never show local variables: they would print raw private records.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Differentially private prompt optimization (DP-ES on TextGrad).")
console = Console(stderr=False)
err = Console(stderr=True)

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

# What the CLI saves in a run directory so that `optimize --resume` can rebuild the task and engine.
CLI_SETTINGS_NAME = runs.CLI_SETTINGS_NAME

_state: dict[str, bool] = {"debug": False}


def _mount_audit() -> None:
    from dp_textgrad.audit.cli import audit_app

    app.add_typer(audit_app, name="audit")


_mount_audit()


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="show full tracebacks on errors")) -> None:
    _state["debug"] = debug


# -- errors ------------------------------------------------------------------------------
def _fail(exc: BaseException, code: int) -> None:
    if _state["debug"]:
        raise exc
    # One line, no markup interpretation (messages may contain brackets).
    message = " ".join(str(exc).split()) or type(exc).__name__
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from dp_textgrad.privacy.data import PrivateDataError

    return (ValueError, FileNotFoundError, ValidationError, PrivateDataError)


def _config_from(settings: dict[str, Any]):
    from dp_textgrad.dp_es.config import ConfigError, format_validation_error

    try:
        return DPESConfig(**{k: v for k, v in settings.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


# -- the configuration file of `optimize` (pydantic at the edge) ------------------------------
class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


DEFAULT_FILE_SEED_PROMPT = "Read the text and name its label."


class TaskSection(_Section):
    """Either a built-in task (``name``) or the user's files (``train`` + ``test``)."""

    name: Optional[Literal["support", "sst2", "banking77"]] = Field(
        None, description="built-in task; its builder's arguments go in `options`")
    train: Optional[Path] = Field(None, description="private training file (.csv, .tsv or .jsonl)")
    test: Optional[Path] = Field(None, description="test file (evaluation only; its labels define the classes)")
    public: Optional[Path] = Field(None, description="public examples that may be shown to the LLM")
    text_column: str = "text"
    label_column: str = "label"
    labels: Optional[list[str]] = Field(None, description="the classes (default: the labels of the test file)")
    description: str = Field("", description="public description of the task, shown to the mutation LLM")
    record_template: Optional[str] = Field(None, description="how a record is shown, with {text}")
    seed_prompt: Optional[str] = Field(None, description="the prompt evolution starts from "
                                       f"(files: default {DEFAULT_FILE_SEED_PROMPT!r})")
    options: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the task builder")

    @model_validator(mode="after")
    def _one_source(self) -> "TaskSection":
        files = {k: getattr(self, k) for k in ("train", "test", "public") if getattr(self, k) is not None}
        if self.name is not None and files:
            raise ValueError(f"give either name or train/test files, not both (got name and {', '.join(files)})")
        if self.name is None and (self.train is None or self.test is None):
            raise ValueError("give name (support, sst2, banking77) or both train and test files")
        return self

    def display_name(self) -> str:
        return self.name if self.name is not None else f"custom ({Path(self.train).name})"


class EngineSection(_Section):
    kind: Literal["llama_cpp", "openai", "transformers"] = Field(
        "llama_cpp",
        description="llama_cpp (embedded local model), openai (any OpenAI-compatible server), transformers")
    model: Optional[str] = Field(
        None, description="GGUF path (llama_cpp), model name (openai), name or path (transformers)")
    base_url: Optional[str] = Field(None, description="openai only: e.g. http://127.0.0.1:8080/v1")
    mode: Optional[Literal["chat", "completions"]] = Field(None, description="openai only")
    options: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the engine")

    @model_validator(mode="after")
    def _consistent(self) -> "EngineSection":
        if self.kind != "openai":
            for key in ("base_url", "mode"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} applies only to kind: openai (kind is {self.kind})")
        if self.kind == "openai" and not self.model:
            raise ValueError("model: kind openai needs a model name (e.g. model: gpt-4o-mini)")
        if "api_key" in self.options:
            # Settings are saved in the run directory: keys belong in the environment.
            raise ValueError("options.api_key: do not put keys in configuration files; set OPENAI_API_KEY")
        return self


class OutputSection(_Section):
    runs_root: Path = Field(Path("runs"), description="where run directories are created")
    evaluate: bool = Field(True, description="report test accuracy of the seed and released prompts (not DP)")


class OptimizeSettings(_Section):
    """The whole configuration file of ``dp-textgrad optimize``."""

    task: TaskSection = Field(default_factory=lambda: TaskSection(name="support"))
    engine: EngineSection = Field(default_factory=EngineSection)
    dp: DPESConfig = Field(default_factory=DPESConfig)
    output: OutputSection = Field(default_factory=OutputSection)


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = OptimizeSettings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def format_settings_error(error: ValidationError) -> str:
    """One clause per problem, naming the key; unknown keys get a spelling suggestion."""
    parts = []
    for item in error.errors():
        loc = tuple(item.get("loc", ()))
        where = ".".join(str(x) for x in loc) or "config"
        if item.get("type") == "extra_forbidden":
            known = _known_keys(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (f"; known keys: {', '.join(known)}" if known else "")
            parts.append(f"{where}: unknown key{hint}")
        else:
            message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
            parts.append(f"{where}: {message}")
    return "config: " + "; ".join(parts)


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw mapping of a YAML or TOML file; relative task paths are made relative to the file."""
    if not path.is_file():
        raise FileNotFoundError(f"config: no file at {path}")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        elif suffix == ".toml":
            import tomllib

            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        else:
            raise ValueError(f"config: use a .yaml, .yml or .toml file, got {path.name}")
    except ValueError:
        raise
    except Exception as exc:  # yaml.YAMLError has no common base with tomllib.TOMLDecodeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"config: {path.name} is not valid {suffix.lstrip('.').upper()}: {first}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"config: {path.name} must hold a mapping of sections (task, engine, dp, output)")
    task = raw.get("task")
    if isinstance(task, dict):
        for key in ("train", "test", "public"):
            value = task.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                task[key] = str((path.parent / value).resolve())
    return raw


def build_settings(raw: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> OptimizeSettings:
    """Merge flag overrides (section -> key -> value, None = not given) into the file, then validate once."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            continue
        current = merged.get(section)
        current = dict(current) if isinstance(current, dict) else {}
        if section == "task":
            # A flag naming the task replaces the file's choice of source.
            if "name" in given:
                for key in ("train", "test", "public"):
                    current.pop(key, None)
            if "train" in given or "test" in given:
                current.pop("name", None)
        if section == "engine" and "kind" in given and given["kind"] != current.get("kind"):
            # Options of another engine kind do not carry over.
            for key in ("base_url", "mode", "options", "model"):
                current.pop(key, None)
        current.update(given)
        merged[section] = current
    dp = merged.get("dp")
    if isinstance(dp, dict) and "feedback" not in dp and not _supports_feedback(dp.get("selection", "gaussian")):
        # DP feedback rides on the Gaussian scores; a charged selection has none unless asked.
        merged["dp"] = {**dp, "feedback": "none"}
    try:
        return OptimizeSettings(**merged)
    except ValidationError as exc:
        from dp_textgrad.dp_es.config import ConfigError

        raise ConfigError(format_settings_error(exc)) from None


def _supports_feedback(selection: Any) -> bool:
    from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES

    strategy = SELECTION_STRATEGIES.get(selection) if isinstance(selection, str) else None
    return strategy is None or strategy.supports_feedback  # an unknown name fails validation later


# -- building the task and the engine ------------------------------------------------------
def build_task(section: TaskSection):
    options = dict(section.options)
    try:
        if section.name is not None:
            from dp_textgrad.tasks.registry import get_task

            return get_task(section.name, **options)
        from dp_textgrad.tasks.loaders import build_task_from_files

        if section.record_template is not None:
            options["record_template"] = section.record_template
        options["seed_prompt"] = section.seed_prompt or DEFAULT_FILE_SEED_PROMPT
        return build_task_from_files(
            "custom", section.train, section.test, public=section.public, labels=section.labels,
            text_column=section.text_column, label_column=section.label_column,
            description=section.description, **options,
        )
    except TypeError as exc:
        raise ValueError(f"task.options: not accepted by the task builder ({exc})") from None


def make_engine(section: EngineSection):
    """The engine a configuration names (tests monkeypatch this factory)."""
    options = dict(section.options)
    try:
        if section.kind == "llama_cpp":
            from dp_textgrad.engines.llama_cpp import LlamaCppEngine

            return LlamaCppEngine(model_path=section.model, **options)
        if section.kind == "openai":
            from dp_textgrad.engines.openai_engine import OpenAIEngine

            return OpenAIEngine(section.model, base_url=section.base_url, mode=section.mode or "chat", **options)
        from dp_textgrad.engines.transformers_engine import TransformersEngine

        return TransformersEngine(model_name_or_path=section.model, **options)
    except TypeError as exc:
        raise ValueError(f"engine.options: not accepted by the {section.kind} engine ({exc})") from None


# -- running with progress, and stopping cleanly on Ctrl-C ------------------------------------
class _StopAfterCheckpoint(Exception):
    """Raised after a generation's checkpoint when the user pressed Ctrl-C."""


class _GracefulStop:
    """First Ctrl-C: finish the current generation (its checkpoint), then stop. Second: stop now."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        typer.echo("\nstopping after this generation's checkpoint (Ctrl-C again to stop at once)", err=True)

    def __enter__(self) -> "_GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


def _run_with_progress(task, engine, config, *, task_name: str, engine_name: str, runs_root: Path,
                       run_dir: Optional[Path] = None, resume: bool = False, evaluate: bool = True,
                       stop: Optional[_GracefulStop] = None):
    from rich.progress import BarColumn, Progress, TextColumn

    from dp_textgrad import workflow

    # Release-safe fields only: no wall time and no private-phase tokens (both time the secret
    # subsample); the public-phase tokens are shown instead.
    progress = Progress(
        TextColumn("[bold]generation {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("best {task.fields[best]}  eps {task.fields[eps]}  public tokens {task.fields[tokens]}"),
        console=console,
        transient=False,
    )
    holder: dict[str, Any] = {}

    def on_start(optimizer) -> None:
        cfg = optimizer.config
        holder["generations"] = cfg.generations
        holder["epsilon"] = cfg.epsilon
        mech = optimizer.plan.describe()
        resumed = f" Resuming at generation {optimizer.generation}." if resume else ""
        console.print(
            f"[bold]Budget[/]: epsilon = {cfg.epsilon}, delta = {cfg.delta:.2e} for the whole run "
            f"({cfg.generations} generations x {cfg.population} candidates, q = {cfg.sampling_rate:.4f}, "
            f"about {cfg.sampling_rate * optimizer.public_dataset_size:.0f} of N = {optimizer.public_dataset_size} "
            "private records (N is public) "
            f"per generation).{resumed}\n[bold]Mechanism[/]: {mech}."
        )
        console.print(f"[bold]Records[/]: private records longer than {cfg.max_record_tokens} engine tokens are "
                      + ("truncated to that public cap (a per-record map, applied before any charge)."
                         if cfg.long_records == "truncate" else "rejected before any charge."))
        if not optimizer.noise.secure:
            console.print(f"[bold red]{optimizer.noise.sampler}.[/]", markup=True, highlight=False)
        if cfg.privacy == "off":
            console.print("[bold red]privacy off: a non-private baseline. NOT differentially private.[/]")
        if cfg.mode == "unsafe":
            console.print("[bold red]UNSAFE mode: raw private examples reach the mutator. NOT differentially private.[/]")
        holder["task"] = progress.add_task("dp-es", total=cfg.generations, completed=optimizer.generation,
                                           best="-", eps="0", tokens=0)
        if console.is_terminal:  # a live bar; elsewhere (logs, nohup) one plain line per generation
            progress.start()

    def on_generation(report) -> None:
        holder["public_tokens"] = (holder.get("public_tokens", 0) + report.public_prompt_tokens
                                   + report.public_completion_tokens)
        progress.update(holder["task"], completed=report.generation + 1, best=f"{report.best_estimate:.3f}",
                        eps=f"{report.epsilon_spent:.3g}/{holder['epsilon']:g}", tokens=holder["public_tokens"])
        if not console.is_terminal:
            console.print(f"generation {report.generation + 1}/{holder['generations']}: best estimate "
                          f"{report.best_estimate:.3f}, epsilon spent {report.epsilon_spent:.3g} of "
                          f"{holder['epsilon']:g}, public tokens {holder['public_tokens']}",
                          markup=False, highlight=False)
        # The checkpoint of this generation is on disk now; after the last one, just finish.
        if stop is not None and stop.requested and report.generation + 1 < holder["generations"]:
            raise _StopAfterCheckpoint

    try:
        return workflow.run(task, engine, config, runs_root=runs_root, run_dir=run_dir, resume=resume,
                            evaluate=evaluate, on_start=on_start, on_generation=on_generation,
                            task_name=task_name, engine_name=engine_name)
    finally:
        progress.stop()


def _print_outcome(outcome) -> None:
    result = outcome.result
    console.print("\n[bold]Released prompt[/]:")
    console.print(result.prompt, markup=False, highlight=False)
    if result.unsafe:
        console.print("[bold red]Privacy: NOT differentially private (unsafe mode).[/]")
    else:
        by = ", ".join(f"{k} {v:.3g}" for k, v in sorted(result.epsilons.items()) if math.isfinite(v))
        console.print(f"[bold]Privacy spent[/]: epsilon = {result.epsilon:.4g}, delta = {result.delta:.2e} "
                      f"(smallest valid bound; {by})")
    if outcome.evaluation is not None:
        ev = outcome.evaluation
        paired = ""
        if ev.difference is not None:
            paired = (f"; difference {ev.difference:+.3f} [95% CI {ev.difference_low:+.3f}, {ev.difference_high:+.3f}], "
                      f"McNemar p = {ev.mcnemar_p:.2g}")
        console.print(f"[bold]Test accuracy[/] (n={ev.n_test}, not covered by DP): seed {ev.seed_accuracy:.3f} -> "
                      f"released {ev.released_accuracy:.3f}{paired}", soft_wrap=True)
    usage = result.public_usage
    console.print(f"[bold]Cost[/] (public figures): {result.generations_run} generations x about "
                  f"{result.planned_private_evaluations:.0f} planned private record evaluations; public phase "
                  f"(mutation, critiques, preflight) {usage.get('calls', 0)} calls, "
                  f"{usage.get('prompt_tokens', 0) + usage.get('completion_tokens', 0)} tokens. The real private-phase "
                  "usage and time are operator-only (operator/ in the run directory: do not share).", soft_wrap=True)
    console.print(f"[bold]Run directory[/]: {outcome.run_dir}\n[bold]Report[/]: {outcome.run_dir / 'report.html'} "
                  "(and report.md)", soft_wrap=True)


def _guarded(action: Callable[[], Any], run_dir: Callable[[], Optional[Path]]) -> Any:
    """Run ``action`` and turn its failures into one line and an exit code."""
    from dp_textgrad.privacy.data import PrivateScoringError
    from dp_textgrad.engines.base import EngineError

    try:
        return action()
    except (KeyboardInterrupt, _StopAfterCheckpoint):
        directory = run_dir()
        if directory is not None and runs.RunDir(directory).checkpoint.exists():
            typer.echo(f"interrupted: checkpoint saved; resume with `dp-textgrad optimize --resume {directory}`",
                       err=True)
        else:
            typer.echo("interrupted before the first checkpoint; nothing to resume", err=True)
        raise typer.Exit(EXIT_INTERRUPTED)
    except typer.Exit:
        raise
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)
    except PrivateScoringError as exc:
        directory = run_dir()
        hint = f"; resume with `dp-textgrad optimize --resume {directory}`" if directory is not None else ""
        _fail(RuntimeError(f"{exc}{hint}"), EXIT_FAILURE)
    except (EngineError, RuntimeError, OSError) as exc:
        _fail(exc, EXIT_FAILURE)
    except Exception as exc:  # a bug: name its type only (its message might quote data)
        if _state["debug"]:
            raise
        _fail(RuntimeError(f"unexpected {type(exc).__name__}; rerun with --debug for the traceback"), EXIT_FAILURE)


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
    delta: Optional[float] = typer.Option(None, help="total delta (default min(1e-5, 1/(10N)))"),
    generations: int = typer.Option(4, help="DP generations"),
    population: int = typer.Option(5, help="candidates per generation"),
    parents: int = typer.Option(2, help="parents per generation"),
    n_private: int = typer.Option(1500, help="size of the built-in private training set"),
    n_test: int = typer.Option(150, help="size of the built-in test split"),
    sampling_rate: Optional[float] = typer.Option(None, help="Poisson sampling rate q (default about 100 records)"),
    seed: int = typer.Option(0, help="seed of the task generator and of non-private choices"),
    runs_root: Path = typer.Option(Path("runs"), help="where run directories are created"),
) -> None:
    """Run DP-ES end to end on the built-in private task with the embedded local model."""
    holder: dict[str, Path] = {}

    def action():
        from dp_textgrad.engines.llama_cpp import LlamaCppEngine
        from dp_textgrad.tasks.synthetic import make_support_task

        task = make_support_task(seed=seed, n_private=n_private, n_test=n_test)
        q = sampling_rate if sampling_rate is not None else min(1.0, 100 / len(task.private_train))
        config = _config_from(dict(epsilon=epsilon, delta=delta, generations=generations, population=population,
                                   parents=parents, sampling_rate=q, seed=seed))
        console.print("Loading the local model (Gemma 3 270M via llama.cpp; first use assembles the GGUF)...")
        engine = LlamaCppEngine()
        settings = OptimizeSettings(
            task=TaskSection(name="support", options=dict(seed=seed, n_private=n_private, n_test=n_test)),
            engine=EngineSection(kind="llama_cpp"), dp=config, output=OutputSection(runs_root=runs_root))
        holder["dir"] = _start_run_dir(runs_root, settings)
        with _GracefulStop() as stop:
            return _run_with_progress(task, engine, config, task_name="support (built-in)",
                                      engine_name=engine.model_string, runs_root=runs_root,
                                      run_dir=holder["dir"], stop=stop)

    _print_outcome(_guarded(action, lambda: holder.get("dir")))


_RESUME_FIXED = ("config", "epsilon", "delta", "generations", "population", "parents", "sampling_rate",
                 "selection", "seed", "task", "train", "test", "runs_root")


@app.command()
def optimize(
    config: Optional[Path] = typer.Option(None, "--config", "-c",
                                          help="YAML or TOML file (sections: task, engine, dp, output)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the run in RUN_DIR from its checkpoint"),
    epsilon: Optional[float] = typer.Option(None, help="total privacy budget epsilon (dp.epsilon)"),
    delta: Optional[float] = typer.Option(None, help="total delta (dp.delta; default min(1e-5, 1/(10N)))"),
    generations: Optional[int] = typer.Option(None, help="DP generations (dp.generations)"),
    population: Optional[int] = typer.Option(None, help="candidates per generation (dp.population)"),
    parents: Optional[int] = typer.Option(None, help="parents per generation (dp.parents)"),
    sampling_rate: Optional[float] = typer.Option(None, help="Poisson sampling rate q (dp.sampling_rate)"),
    selection: Optional[str] = typer.Option(None, help="gaussian | exponential | permute_and_flip (dp.selection)"),
    seed: Optional[int] = typer.Option(None, help="seed of non-private choices (dp.seed); never of DP noise"),
    task: Optional[str] = typer.Option(None, help="built-in task: support | sst2 | banking77 (task.name)"),
    train: Optional[Path] = typer.Option(None, help="private training file .csv/.tsv/.jsonl (task.train)"),
    test: Optional[Path] = typer.Option(None, help="test file (task.test)"),
    engine: Optional[str] = typer.Option(None, help="llama_cpp | openai | transformers (engine.kind)"),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1"),
    model: Optional[str] = typer.Option(None, help="engine.model: GGUF path, model name, or HF name/path"),
    runs_root: Optional[Path] = typer.Option(None, help="where run directories are created (output.runs_root)"),
) -> None:
    """Optimize a prompt with DP-ES on your data and any engine. Flags override the config file."""
    given = dict(config=config, epsilon=epsilon, delta=delta, generations=generations, population=population,
                 parents=parents, sampling_rate=sampling_rate, selection=selection, seed=seed, task=task,
                 train=train, test=test, runs_root=runs_root)
    engine_flags = dict(kind=engine, base_url=base_url, model=model)
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
                raise ConfigError(f"resume: no checkpoint.json in {directory}; is this a run directory?")
            if runs.RunDir(directory).result.is_file():
                raise ConfigError(f"resume: the run in {directory} has finished; rebuild its report with "
                                  "`dp-textgrad report RUN_DIR` or start a new run")
            if not (directory / CLI_SETTINGS_NAME).is_file():
                raise ConfigError(f"resume: no {CLI_SETTINGS_NAME} in {directory} (the run was not started "
                                  "from the command line); resume it with workflow.run(..., resume=True)")
            saved = runs.read_json(directory / CLI_SETTINGS_NAME)
            saved["dp"] = runs.read_json(runs.RunDir(directory).config)["config"]
            settings = build_settings(saved, {"engine": engine_flags})
            holder["dir"] = directory
        else:
            raw = read_config_file(config) if config is not None else {}
            flags = {
                "dp": dict(epsilon=epsilon, delta=delta, generations=generations, population=population,
                           parents=parents, sampling_rate=sampling_rate, selection=selection, seed=seed),
                "task": dict(name=task, train=train.resolve() if train else None,
                             test=test.resolve() if test else None),
                "engine": engine_flags,
                "output": dict(runs_root=runs_root),
            }
            settings = build_settings(raw, flags)
            directory = None
        the_task = build_task(settings.task)
        the_engine = make_engine(settings.engine)
        if directory is None:
            directory = holder["dir"] = _start_run_dir(settings.output.runs_root, settings)
        with _GracefulStop() as stop:
            return _run_with_progress(
                the_task, the_engine, settings.dp, task_name=settings.task.display_name(),
                engine_name=str(getattr(the_engine, "model_string", settings.engine.kind)),
                runs_root=settings.output.runs_root, run_dir=directory, resume=resume is not None,
                evaluate=settings.output.evaluate, stop=stop)

    _print_outcome(_guarded(action, lambda: holder.get("dir")))


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
) -> None:
    """Calibration calculator: the noise for a budget, or the epsilon of a given noise. Reads no data."""
    try:
        from dp_textgrad.privacy.accounting import default_accountants
        from dp_textgrad.dp_es.plan import RunPlan

        if (epsilon is None) == (noise_multiplier is None and selection_epsilon is None):
            raise ValueError("give either --epsilon (to calibrate) or --noise-multiplier/--selection-epsilon "
                             "(to account), not both")
        for name, value in (("noise_multiplier", noise_multiplier), ("selection_epsilon", selection_epsilon)):
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {value}")
        if feedback is None:
            feedback = "dp_confusion" if _supports_feedback(selection) else "none"
        config = _config_from(dict(epsilon=epsilon if epsilon is not None else 1.0, delta=delta,
                                   generations=generations, population=population, parents=parents,
                                   sampling_rate=sampling_rate, selection=selection, feedback=feedback))
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
        event = plan.event
        console.print("epsilon of the whole run under each accountant:")
        values = {}
        for accountant in default_accountants():
            values[accountant.name] = accountant.epsilon([event], delta)
        for name, value in values.items():
            console.print(f"  {name:>10}: {value:.4f}")
        console.print(f"  {'used':>10}: {min(values.values()):.4f} (smallest valid bound)")
    except typer.Exit:
        raise
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run directory under runs/")) -> None:
    """Rebuild report.md and report.html of a finished run."""
    try:
        from dp_textgrad.report import write_report

        if not run_dir.is_dir():
            raise FileNotFoundError(f"run_dir: {run_dir} is not a directory")
        path = write_report(run_dir)
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)
    console.print(f"Report: {path} and {path.with_suffix('.html')}", soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
