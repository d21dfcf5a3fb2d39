"""``dp-textgrad evaluate``: score prompts on a task's public test split, without a search.

Reads the task and engine of a run file (or the flags ``optimize`` takes for them), scores each
prompt file (and, with ``--seed-prompt``, the task's seed prompt) on ``task.test`` through
:func:`dp_textgrad.workflow.evaluate_prompts`, and prints a table or JSON lines. The test split
is public in this project's threat model: the numbers are outside the DP guarantee; nothing is
charged, and no private training record is scored or shown. Both task families: the measure is
the task's ``metric_name`` (``accuracy`` for classification; ``exact``, ``f1``, ... for a
generation task), shown by its readable name, with Wilson intervals and McNemar for a binary
metric and bootstrap intervals (paired for the difference) for any other. Heavy modules load
when it runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

import dp_textgrad.cli._run_file as run_file
from dp_textgrad.cli._console import console, guarded

SEED_LABEL = "seed prompt"
NOTE = (
    "scored on the public test split: outside the DP guarantee; nothing was charged and no private "
    "training record was scored"
)


def _read_prompts(files: list[Path]) -> list[tuple[str, str]]:
    """(label, text) of each prompt file, or a ValueError naming ``--prompt`` and the fix."""
    prompts = []
    for path in files:
        if not path.is_file():
            raise ValueError(f"--prompt: no file at {path}; give a text file that holds one prompt")
        try:
            text = path.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise ValueError(f"--prompt: {path} is not UTF-8 text; save it as UTF-8") from None
        if not text:
            raise ValueError(f"--prompt: {path} is empty; write the prompt in it")
        prompts.append((str(path), text))
    return prompts


def _number(value: Any) -> Any:
    """JSON has no NaN: a non-finite number (an interval over one record) becomes null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _rows(labels: list[str], scores: list[Any], metric: str) -> list[dict[str, Any]]:
    from dp_textgrad.report.fmt import metric_label

    rows = []
    for label, score in zip(labels, scores, strict=True):
        paired = score.against_first
        row = {
            "prompt": label,
            "metric": metric,
            "metric_label": metric_label(metric),
            "score": score.score,
            "low": score.low,
            "high": score.high,
            "interval": score.interval,
            "n_test": score.n_test,
            "difference": paired.difference if paired else None,
            "difference_low": paired.difference_low if paired else None,
            "difference_high": paired.difference_high if paired else None,
            "mcnemar_p": paired.mcnemar_p if paired else None,
            "discordant": list(paired.discordant) if paired and paired.discordant else None,
            "split": "test",
            "covered_by_dp": False,
        }
        rows.append({key: _number(value) for key, value in row.items()})
    return rows


def _print_table(rows: list[dict[str, Any]], task_name: str, engine_name: str) -> None:
    from rich.table import Table

    from dp_textgrad.report.fmt import INTERVAL_LABELS
    from dp_textgrad.report.fmt import num as fmt_num

    def signed(value: float | None) -> str:
        return "" if value is None else f"{value:+.3f}"

    first = rows[0]
    binary = first["interval"] == "wilson"
    method = INTERVAL_LABELS.get(first["interval"], first["interval"])
    table = Table(
        title=f"{task_name} on {engine_name}: {first['n_test']} test records",
        caption=f"95% intervals: {method} for each prompt, "
        + ("Wald on the paired differences" if binary else "paired bootstrap for the difference"),
    )
    table.add_column("prompt", overflow="fold")
    columns = [first["metric_label"], "95% interval", "difference vs first"] + (["McNemar p"] if binary else [])
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        low, high = signed(row["difference_low"]), signed(row["difference_high"])
        difference = f"{signed(row['difference'])} [{low}, {high}]" if row["difference"] is not None else ""
        cells = [row["prompt"], f"{row['score']:.3f}", f"[{fmt_num(row['low'])}, {fmt_num(row['high'])}]", difference]
        if binary:
            cells.append("" if row["mcnemar_p"] is None else f"{row['mcnemar_p']:.3g}")
        table.add_row(*cells)
    console.print(table)
    console.print(f"Note: {NOTE}.", highlight=False)


def evaluate(
    config: Path | None = run_file.CONFIG_OPTION,
    prompt: list[Path] | None = typer.Option(
        None, "--prompt", "-p", help="a file holding one prompt; repeat to compare (each against the first)"
    ),
    seed_prompt: bool = typer.Option(False, "--seed-prompt", help="score the task's seed prompt too, first"),
    task: str | None = run_file.TASK_OPTION,
    train: Path | None = run_file.TRAIN_OPTION,
    test: Path | None = run_file.TEST_OPTION,
    encoding: str | None = run_file.ENCODING_OPTION,
    engine: str | None = run_file.ENGINE_OPTION,
    base_url: str | None = run_file.BASE_URL_OPTION,
    model: str | None = run_file.MODEL_OPTION,
    json_lines: bool = typer.Option(False, "--json", help="print one JSON object per prompt on stdout"),
    out: Path | None = typer.Option(None, "--out", help="write the result as one JSON file"),
) -> None:
    """Score prompts on the task's public test split (no search, no budget; outside the DP guarantee)."""
    files = list(prompt or [])
    flags = {
        "task": run_file.task_flags(task, train, test, encoding),
        "engine": run_file.engine_flags(engine, base_url, model),
    }

    def action() -> None:
        from dp_textgrad.workflow import evaluate_prompts

        if not files and not seed_prompt:
            raise ValueError("--prompt: give at least one prompt file (--prompt FILE, repeatable) or --seed-prompt")
        prompts = _read_prompts(files)  # before any task or engine is built: a typo fails fast
        settings = run_file.settings_from(config, flags)
        # A judge grades with the run's engine, so it is loaded first; otherwise the files are
        # checked before a model is loaded.
        the_engine = settings.engine.build() if settings.task.needs_engine() else None
        the_task = settings.task.build(the_engine) if the_engine is not None else settings.task.build()
        if not the_task.test:
            raise ValueError(
                "test: the task has no test records to score prompts on; give a test file (task.test in the "
                "run file, or --test FILE) or a built-in task with a test split"
            )
        if seed_prompt:
            if not the_task.seed_prompt.strip():
                raise ValueError("--seed-prompt: the task has no seed prompt; set task.seed_prompt or drop the flag")
            prompts.insert(0, (SEED_LABEL, the_task.seed_prompt))
        if the_engine is None:
            the_engine = settings.engine.build()
        scores = evaluate_prompts(the_task, the_engine, [text for _, text in prompts])
        metric = str(getattr(the_task, "metric_name", "accuracy"))
        rows = _rows([label for label, _ in prompts], scores, metric)
        task_name = settings.task.display_name()
        engine_name = str(getattr(the_engine, "model_string", settings.engine.kind))
        if out is not None:
            document = {"task": task_name, "engine": engine_name, "note": NOTE, "prompts": rows}
            out.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        if json_lines:
            for row in rows:
                typer.echo(json.dumps(row, allow_nan=False))
        else:
            _print_table(rows, task_name, engine_name)

    guarded(action, lambda: None, command="evaluate")
