"""Generation tasks from files: (input, reference answer) records in CSV, TSV or JSONL.

The input is a text column (``input_column``); the reference is ``target_column``, which may
be a dotted path (``answer.slots``) into a JSON object: a JSONL record's nested value, or a
CSV/TSV cell that holds JSON. A CSV/TSV target cell that parses as a JSON object or list is
taken as JSON (a ``json_fields`` metric compares its fields); any other cell is text.

As for classification files (:mod:`dp_textgrad.tasks.loaders`), errors name the file, the
column, the line numbers and the fix, never a record's text: these files may be private, and
the errors stop a run while its task is built, before anything is charged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.generation import DEFAULT_GENERATION_TEMPLATE, DEFAULT_STOP, GenerationExample, GenerationTask
from dp_textgrad.tasks.loaders import DEFAULT_ENCODING, MAX_FILE_BYTES, MAX_RECORD_CHARS, subsample
from dp_textgrad.tasks.metrics import Metric
from dp_textgrad.tasks.text_files import LimitedLines, decoding_errors, delimited_records

FileFormat = Literal["csv", "tsv", "jsonl"]
_EXTENSIONS: dict[str, FileFormat] = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
_MAX_LINES_SHOWN = 10
_MISSING = object()


def _lines(numbers: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:_MAX_LINES_SHOWN])
    more = f" and {len(numbers) - _MAX_LINES_SHOWN} more" if len(numbers) > _MAX_LINES_SHOWN else ""
    return f"line(s) {shown}{more}"


def _format_of(path: Path, format: FileFormat | None) -> FileFormat:
    if format is not None:
        if format not in ("csv", "tsv", "jsonl"):
            raise ValueError(f"format: use 'csv', 'tsv' or 'jsonl', got {format!r}")
        return format
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise ValueError(
            f"format: cannot infer the format of {path.name} from its extension; use a .csv, .tsv or "
            "a .jsonl file (or pass format='csv'|'tsv'|'jsonl')"
        )
    return found


def _delimited_rows(path: Path, delimiter: str, encoding: str, max_chars: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line where the record starts, column -> cell) for each record; the header must be unique."""
    with path.open(encoding=encoding, newline="") as handle, decoding_errors(path, encoding):
        records = delimited_records(handle, path, delimiter, max_chars)
        try:
            header = [h.strip() for h in next(records)[1]]
        except StopIteration:
            raise ValueError(f"{path.name}: the file is empty; it needs a header row and records") from None
        short: list[int] = []
        for start, row in records:
            if row:
                if len(row) < len(header):
                    short.append(start)
                else:
                    yield start, dict(zip(header, row, strict=False))
        if short:
            raise ValueError(
                f"{path.name}: {len(short)} record(s) have fewer fields than the header "
                f"({_lines(short)}); check the delimiter and quoting"
            )


def _jsonl_rows(path: Path, encoding: str, max_chars: int) -> Iterator[tuple[int, dict[str, Any]]]:
    bad: list[int] = []
    with path.open(encoding=encoding) as handle, decoding_errors(path, encoding):
        for number, line in enumerate(LimitedLines(handle, path, max_chars), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad.append(number)
                continue
            if not isinstance(record, dict):
                bad.append(number)
                continue
            yield number, record
    if bad:
        raise ValueError(f"{path.name}: {_lines(bad)} are not JSON objects; write one object per line")


def _json_cell(value: Any) -> Any:
    """A CSV/TSV cell that holds a JSON object or list, parsed; anything else as it is."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        if isinstance(parsed, (dict, list)):
            return parsed
    return value


def _lookup(record: Mapping[str, Any], path: str, cells_are_text: bool) -> Any:
    """``record[path]``; else ``path`` as dots into nested JSON (a CSV cell's JSON parsed first)."""
    if path in record:
        return _json_cell(record[path]) if cells_are_text else record[path]
    value: Any = record
    for depth, part in enumerate(path.split(".")):
        if cells_are_text and depth == 1:
            value = _json_cell(value)
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _reference(value: Any) -> Any:
    """A reference as the metrics take it (text, a list of answers, a JSON object), or None when
    it is empty; numbers become text (``42``, not ``42.0``) so a numeric metric reads them."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, (dict, list)):
        return value if value else None
    return None


def load_generation_file(
    path: str | os.PathLike[str],
    input_column: str = "input",
    target_column: str = "target",
    *,
    format: FileFormat | None = None,
    encoding: str = DEFAULT_ENCODING,
    max_record_chars: int = MAX_RECORD_CHARS,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> list[GenerationExample]:
    """Records of a CSV, TSV or JSONL file as ``GenerationExample(input, reference=target)``.

    ``target_column`` may be a dotted path into nested JSON (see the module docstring). Inputs
    are stripped of surrounding white space. Raises ``ValueError`` naming the column and the
    line numbers (never the text) for missing columns, empty inputs and empty or non-scalar
    targets; ``FileNotFoundError`` for a missing file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no file at {path}")
    size = path.stat().st_size
    if size > max_file_bytes:
        raise ValueError(
            f"{path.name}: {size:,} bytes, over the limit of {max_file_bytes:,} bytes per file "
            "(max_file_bytes); split the file or raise the limit"
        )
    fmt = _format_of(path, format)
    rows = (
        _jsonl_rows(path, encoding, max_record_chars)
        if fmt == "jsonl"
        else _delimited_rows(path, "\t" if fmt == "tsv" else ",", encoding, max_record_chars)
    )
    examples: list[GenerationExample] = []
    missing: dict[str, list[int]] = {"input_column": [], "target_column": []}
    empty_input: list[int] = []
    bad_target: list[int] = []
    keys: set[str] = set()
    for line, record in rows:
        keys.update(record)
        text = record.get(input_column, _MISSING)
        target = _lookup(record, target_column, cells_are_text=fmt != "jsonl")
        if text is _MISSING:
            missing["input_column"].append(line)
        if target is _MISSING:
            missing["target_column"].append(line)
        if text is _MISSING or target is _MISSING:
            continue
        if not isinstance(text, str) or not text.strip():
            empty_input.append(line)
            continue
        reference = _reference(target)
        if reference is None:
            bad_target.append(line)
            continue
        examples.append(GenerationExample(text.strip(), reference=reference))
    for role, column in (("input_column", input_column), ("target_column", target_column)):
        if missing[role]:
            raise ValueError(
                f"task.{role}: {column!r} not found in {path.name} at {_lines(missing[role])}; the "
                f"{'keys' if fmt == 'jsonl' else 'columns'} are {sorted(keys)}; set task.{role} to one of "
                "them" + (" (a dotted path such as answer.slots reads nested JSON)" if role == "target_column" else "")
            )
    if empty_input:
        raise ValueError(
            f"task.input_column: {len(empty_input)} record(s) of {path.name} have an empty or non-text input "
            f"({_lines(empty_input)}); remove them or fix input_column"
        )
    if bad_target:
        raise ValueError(
            f"task.target_column: {len(bad_target)} record(s) of {path.name} have an empty target (or not text, "
            f"a number, a JSON object or a list) ({_lines(bad_target)}); fill or drop them, or fix target_column"
        )
    if not examples:
        raise ValueError(f"{path.name}: no records; it needs at least one (input, target) record")
    return examples


def _subset(examples: list[GenerationExample], n: int | None, seed: int) -> list[GenerationExample]:
    """``loaders.subsample`` (chosen by the seed and the count only), typed for generation records."""
    return cast(list[GenerationExample], subsample(examples, n, seed))


def build_generation_task_from_files(
    name: str,
    train: str | os.PathLike[str],
    test: str | os.PathLike[str],
    metric: Metric,
    public: str | os.PathLike[str] | Sequence[GenerationExample] | None = None,
    *,
    input_column: str = "input",
    target_column: str = "target",
    format: FileFormat | None = None,
    description: str = "",
    record_template: str = DEFAULT_GENERATION_TEMPLATE,
    seed_prompt: str = "",
    max_new_tokens: int = 64,
    stop: Sequence[str] = DEFAULT_STOP,
    temperature: float = 0.0,
    clip_bound: float = 1.0,
    n_private: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    encoding: str = DEFAULT_ENCODING,
    max_record_chars: int = MAX_RECORD_CHARS,
    record_formats: Sequence[str] = (),
) -> GenerationTask:
    """A ``GenerationTask`` whose private split is the ``train`` file, scored by ``metric``.

    ``public`` is a file or a list of examples that may be shown to the mutation LLM as
    demonstrations. ``n_private`` / ``n_test`` take uniform random subsets fixed by ``seed``
    (as :func:`dp_textgrad.tasks.loaders.build_task_from_files`). ``record_formats``: the public
    record formats the search may try besides ``record_template`` (:mod:`tasks.record_format`).
    """

    def load(path: str | os.PathLike[str]) -> list[GenerationExample]:
        return load_generation_file(
            path, input_column, target_column, format=format, encoding=encoding, max_record_chars=max_record_chars
        )

    test_examples = load(test)
    train_examples = load(train)
    if public is None:
        public_examples: list[GenerationExample] = []
    elif isinstance(public, (str, os.PathLike)):
        public_examples = load(public)
    else:
        public_examples = list(public)
    return GenerationTask(
        name=name,
        description=description,
        private_train=PrivateDataset(_subset(train_examples, n_private, seed)),
        test=_subset(test_examples, n_test, seed + 1),
        metric=metric,
        public_examples=public_examples,
        record_template=record_template,
        max_new_tokens=max_new_tokens,
        stop=tuple(stop),
        temperature=temperature,
        clip_bound=clip_bound,
        seed_prompt=seed_prompt,
        record_formats=tuple(record_formats),
    )


__all__ = ["build_generation_task_from_files", "load_generation_file"]
