"""A run file and the flags that override it: the options naming a task and an engine, and the merge.

Shared by the commands that build a task and an engine from a run file (``optimize``,
``evaluate``): each declares the same options (the ``*_OPTION`` objects below) and reads its
settings with :func:`settings_from`, so a flag means the same in both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

CONFIG_OPTION = typer.Option(None, "--config", "-c", help="YAML or TOML file (sections: task, engine, dp, output)")
# Every built-in task of tasks/registry.py (a test checks the two agree; the registry is not imported
# here, so that --help stays fast).
BUILTIN_TASKS = ("support", "support_extract", "sst2", "banking77", "snips", "gsm8k")
TASK_HELP = (
    "built-in task: support (classification), support_extract (generation), sst2, banking77 (classification "
    "benchmarks), snips, gsm8k (generation benchmarks) (task.name)"
)
TASK_OPTION = typer.Option(None, "--task", help=TASK_HELP)
TRAIN_OPTION = typer.Option(None, "--train", help="private training file .csv/.tsv/.jsonl (task.train)")
TEST_OPTION = typer.Option(None, "--test", help="test file (task.test)")
ENCODING_OPTION = typer.Option(None, "--encoding", help="encoding of the task files, e.g. latin-1 (task.encoding)")
ENGINE_OPTION = typer.Option(None, "--engine", help="llama_cpp | openai | transformers (engine.kind)")
BASE_URL_OPTION = typer.Option(None, "--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1")
MODEL_OPTION = typer.Option(None, "--model", help="engine.model: GGUF path, model name, or HF name/path")


def task_flags(task: str | None, train: Path | None, test: Path | None, encoding: str | None) -> dict[str, Any]:
    """The ``task`` section's overrides from ``--task``, ``--train``, ``--test``, ``--encoding`` (None: not given)."""
    return dict(
        name=task,
        train=train.resolve() if train else None,
        test=test.resolve() if test else None,
        encoding=encoding,
    )


def engine_flags(engine: str | None, base_url: str | None, model: str | None) -> dict[str, Any]:
    """The ``engine`` section's overrides from ``--engine``, ``--base-url``, ``--model``."""
    return dict(kind=engine, base_url=base_url, model=model)


def settings_from(config: Path | None, flags: dict[str, dict[str, Any]]) -> Any:
    """The run file (if any) with ``flags`` merged in, validated once (``OptimizeSettings``).

    A run file without a task section is refused unless a flag names the task: it says what to
    run, and is not quietly given the built-in task (the default without ``--config``).
    """
    from dp_textgrad.dp_es.config import ConfigError
    from dp_textgrad.settings import build_settings, read_config_file

    raw = read_config_file(config) if config is not None else {}
    if raw.get("task", {}) is None:  # "task:" with nothing under it: no task section
        del raw["task"]
    settings = build_settings(raw, flags, source=config)
    named = any(flags.get("task", {}).get(key) is not None for key in ("name", "train", "test"))
    if config is not None and not raw.get("task") and not named:
        raise ConfigError(_no_task_message(config))
    return settings


def _no_task_message(config: Path) -> str:
    # A run file says what to run: an empty or task-less one is refused before anything is charged,
    # not quietly given the built-in task (which stays the default without --config, as documented).
    return (
        f"task: {config.name} has no task section, so there is nothing to run; add task.name (a built-in "
        "task: support, sst2, banking77) or task.train and task.test (your files), or pass --task or "
        "--train/--test; to try the built-in task on the local model, run `dp-textgrad demo`"
    )
