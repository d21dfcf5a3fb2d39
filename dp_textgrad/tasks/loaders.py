"""Load classification records from CSV, TSV or JSONL files and build tasks from them.

Errors and warnings never quote a record: files given here may be private. They
name the column, the line numbers and the fix instead.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example, ScoreKind
from dp_textgrad.tasks.text_files import LimitedLines, decoding_errors, delimited_records

FileFormat = Literal["csv", "tsv", "jsonl"]
_EXTENSIONS: dict[str, FileFormat] = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
DATA_ENV_VAR = "DP_TEXTGRAD_DATA"

# Size limits: a record (one field or one JSONL line) and a whole file. Reading stops at the
# first excess, so an oversized cell never sits in memory whole.
MAX_RECORD_CHARS = 131_072
MAX_FILE_BYTES = 2 * 1024**3
DEFAULT_ENCODING = "utf-8-sig"

# Warn when the most frequent label has this many times the records of the rarest.
IMBALANCE_RATIO = 10.0
_MAX_LINES_SHOWN = 10


def resolve_data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The benchmark data directory.

    Order: ``path`` if given, else the ``DP_TEXTGRAD_DATA`` environment variable,
    else ``../shared/data`` relative to the current working directory.
    """
    if path is not None:
        candidate, origin = Path(path), "the data_dir argument"
    elif os.environ.get(DATA_ENV_VAR):
        candidate, origin = Path(os.environ[DATA_ENV_VAR]), f"${DATA_ENV_VAR}"
    else:
        candidate, origin = Path("..") / "shared" / "data", "the default ../shared/data"
    if not candidate.is_dir():
        raise FileNotFoundError(
            f"data_dir: {candidate} (from {origin}) is not a directory; pass data_dir=... or set "
            f"{DATA_ENV_VAR} to the folder holding sst2/ and banking77/"
        )
    return candidate


def _infer_format(path: Path, format: FileFormat | None) -> FileFormat:
    if format is not None:
        if format not in ("csv", "tsv", "jsonl"):
            raise ValueError(f"format: use 'csv', 'tsv' or 'jsonl', got {format!r}")
        return format
    inferred = _EXTENSIONS.get(path.suffix.lower())
    if inferred is None:
        raise ValueError(
            f"format: cannot infer the format of {path.name} from its extension; "
            f"use a .csv, .tsv or .jsonl file or pass format='csv'|'tsv'|'jsonl'"
        )
    return inferred


def _lines(numbers: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:_MAX_LINES_SHOWN])
    more = f" and {len(numbers) - _MAX_LINES_SHOWN} more" if len(numbers) > _MAX_LINES_SHOWN else ""
    return f"line(s) {shown}{more}"


def _read_delimited(
    path: Path,
    delimiter: str,
    text_column: str,
    label_column: str,
    encoding: str = DEFAULT_ENCODING,
    max_chars: int = MAX_RECORD_CHARS,
) -> Iterator[tuple[int, object, object]]:
    """Yield (line where the record starts, text, label); quoted multi-line fields are one record."""
    with path.open(encoding=encoding, newline="") as handle, decoding_errors(path, encoding):
        records = delimited_records(handle, path, delimiter, max_chars)
        try:
            _, header = next(records)
        except StopIteration:
            raise ValueError(f"{path.name}: the file is empty; it needs a header row and records") from None
        header = [h.strip() for h in header]
        for column, role in ((text_column, "text_column"), (label_column, "label_column")):
            if column not in header:
                raise ValueError(
                    f"{role}: column {column!r} not found in {path.name}; the columns are {header}; "
                    f"pass {role}=... naming one of them"
                )
        text_at, label_at = header.index(text_column), header.index(label_column)
        short: list[int] = []
        for start, row in records:
            if not row:  # a blank line between records
                continue
            if len(row) <= max(text_at, label_at):
                short.append(start)
            else:
                yield start, row[text_at], row[label_at]
        if short:
            raise ValueError(
                f"{path.name}: {len(short)} record(s) have fewer fields than the header "
                f"({_lines(short)}); check the delimiter and quoting"
            )


def _read_jsonl(
    path: Path, text_column: str, label_column: str, encoding: str = DEFAULT_ENCODING, max_chars: int = MAX_RECORD_CHARS
) -> Iterator[tuple[int, object, object]]:
    """Yield (line, text, label) as it reads; problems are collected and raised at the end."""
    bad_json: list[int] = []
    missing: dict[str, list[int]] = {text_column: [], label_column: []}
    keys_seen: set[str] = set()
    with path.open(encoding=encoding) as handle, decoding_errors(path, encoding):
        for number, line in enumerate(LimitedLines(handle, path, max_chars), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad_json.append(number)
                continue
            if not isinstance(obj, dict):
                bad_json.append(number)
                continue
            keys_seen.update(obj)
            for column in missing:
                if column not in obj:
                    missing[column].append(number)
            if text_column in obj and label_column in obj:
                yield number, obj[text_column], obj[label_column]
    if bad_json:
        raise ValueError(f"{path.name}: {_lines(bad_json)} are not JSON objects; write one object per line")
    for column, role in ((text_column, "text_column"), (label_column, "label_column")):
        if missing[column]:
            raise ValueError(
                f"{role}: key {column!r} missing in {path.name} at {_lines(missing[column])}; "
                f"keys found are {sorted(keys_seen)}; pass {role}=... naming one of them"
            )


def _label_to_str(raw: object) -> str | None:
    if isinstance(raw, bool) or raw is None:
        return None if raw is None else str(raw).lower()
    if isinstance(raw, float) and raw.is_integer():
        return str(int(raw))  # JSON 1.0 and 1 mean the same class
    if isinstance(raw, (str, int, float)):
        return str(raw).strip()
    return None


def load_classification_file(
    path: str | os.PathLike[str],
    text_column: str = "text",
    label_column: str = "label",
    format: FileFormat | None = None,
    labels: Sequence[str] | None = None,
    label_names: Mapping[str, str] | None = None,
    drop_other_labels: bool = False,
    warn_imbalance: bool = True,
    encoding: str = DEFAULT_ENCODING,
    max_record_chars: int = MAX_RECORD_CHARS,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> list[Example]:
    """Records of a CSV, TSV or JSONL file as ``Example(text, label)``.

    ``format`` is inferred from the extension (.csv, .tsv, .jsonl) when not given.
    ``label_names`` maps raw labels to label names (``{"0": "negative", "1": "positive"}``);
    raw labels are compared as text, so JSON ``0`` matches ``"0"``. ``labels``, if given,
    is the list of allowed (mapped) labels; records with other labels are an error, or are
    skipped when ``drop_other_labels`` is True (to keep a subset of classes). Texts are
    stripped of surrounding white space.
    Raises ``ValueError`` naming the line numbers (never the text) for empty texts,
    unknown labels, missing columns or malformed rows; warns on heavy label imbalance.
    Files are read as a stream in ``encoding``; a record longer than ``max_record_chars``
    or a file larger than ``max_file_bytes`` is an error naming the file and the line.
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
    fmt = _infer_format(path, format)
    if label_names is not None:
        label_names = {str(k): str(v) for k, v in label_names.items()}
    allowed = None if labels is None else set(labels)

    if fmt == "jsonl":
        rows = _read_jsonl(path, text_column, label_column, encoding, max_record_chars)
    else:
        rows = _read_delimited(
            path, "\t" if fmt == "tsv" else ",", text_column, label_column, encoding, max_record_chars
        )

    examples: list[Example] = []
    empty: list[int] = []
    bad_label: list[int] = []
    unmapped: list[int] = []
    unknown: list[int] = []
    for line, raw_text, raw_label in rows:
        text = raw_text.strip() if isinstance(raw_text, str) else None
        label = _label_to_str(raw_label)
        if not text:
            empty.append(line)
            continue
        if label is None or label == "":
            bad_label.append(line)
            continue
        if label_names is not None:
            if label not in label_names:
                unmapped.append(line)
                continue
            label = label_names[label]
        if allowed is not None and label not in allowed:
            if not drop_other_labels:
                unknown.append(line)
            continue
        examples.append(Example(text=text, label=label))

    if empty:
        raise ValueError(
            f"{text_column}: {len(empty)} record(s) of {path.name} have empty or non-text text "
            f"({_lines(empty)}); remove them or fix text_column"
        )
    if bad_label:
        raise ValueError(
            f"{label_column}: {len(bad_label)} record(s) of {path.name} have an empty or non-scalar label "
            f"({_lines(bad_label)}); fix the labels or label_column"
        )
    if unmapped and label_names is not None:  # unmapped records exist only with label_names
        raise ValueError(
            f"label_names: {len(unmapped)} record(s) of {path.name} have a raw label outside "
            f"{sorted(label_names)} ({_lines(unmapped)}); add those raw labels to label_names"
        )
    if unknown and allowed is not None:  # unknown labels exist only with a labels list
        # Label values are not quoted: with a wrong label_column they would be private text.
        raise ValueError(
            f"labels: {len(unknown)} record(s) of {path.name} have a label outside {sorted(allowed)} "
            f"({_lines(unknown)}); fix the labels, the labels list or label_names"
        )
    if not examples:
        raise ValueError(
            f"{path.name}: no records after the header"
            + (" with a label in the labels list" if allowed is not None else "")
        )
    if warn_imbalance:
        _warn_if_imbalanced(examples, path.name)
    return examples


def _warn_if_imbalanced(examples: Sequence[Example], source: str) -> None:
    counts = Counter(ex.label for ex in examples)
    if len(counts) < 2:
        warnings.warn(f"{source}: every record has the same label; a classifier cannot be scored on it", stacklevel=3)
        return
    (top, top_n), (rare, rare_n) = counts.most_common()[0], counts.most_common()[-1]
    if top_n >= IMBALANCE_RATIO * rare_n:
        # Only label names, no counts: the file may be private.
        warnings.warn(
            f"{source}: labels are heavily imbalanced ({top!r} has at least {IMBALANCE_RATIO:g}x the records "
            f"of {rare!r}); accuracy will mostly reward predicting the frequent label",
            stacklevel=3,
        )


def _warn_of_classes_missing_from_test(labels: Sequence[str], test_examples: Sequence[Example], source: str) -> None:
    """Warn of each listed class that the (public) test file never uses. Only the test file is
    read for this: whether the private train file has a class is a statistic of it."""
    present = {ex.label for ex in test_examples}
    for label in labels:
        if label not in present:
            warnings.warn(
                f"task.labels: class {label!r} never occurs in the test file {source}, so its accuracy "
                "cannot be measured; add test records of it or drop it from the labels",
                stacklevel=3,
            )


def subsample(examples: Sequence[Example], n: int | None, seed: int) -> list[Example]:
    """A uniform random subset of ``n`` examples in file order (all of them when ``n`` is None).

    The choice depends only on the seed and the number of records, never on their content.
    """
    if n is None or n >= len(examples):
        return list(examples)
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), size=n, replace=False))
    return [examples[i] for i in keep]


def build_task_from_files(
    name: str,
    train: str | os.PathLike[str],
    test: str | os.PathLike[str],
    public: str | os.PathLike[str] | Sequence[Example] | None = None,
    labels: Sequence[str] | None = None,
    *,
    text_column: str = "text",
    label_column: str = "label",
    format: FileFormat | None = None,
    label_names: Mapping[str, str] | None = None,
    description: str = "",
    verbalizers: Mapping[str, str] | None = None,
    record_template: str = "Text: {text}\nLabel:",
    score_kind: ScoreKind = "accuracy",
    clip_bound: float = 1.0,
    seed_prompt: str = "",
    n_private: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    drop_other_labels: bool = False,
    encoding: str = DEFAULT_ENCODING,
    max_record_chars: int = MAX_RECORD_CHARS,
) -> ClassificationTask:
    """A ``ClassificationTask`` whose private split is the ``train`` file.

    ``public`` is a file or a list of examples that may be shown to the mutation LLM.
    ``labels`` defaults to the labels of the test file (never derived from the private
    file). Records whose label is outside ``labels`` are an error, or are skipped with
    ``drop_other_labels=True`` (to keep a subset of classes).
    ``n_private`` / ``n_test`` take uniform random subsets fixed by ``seed``.
    """

    def load(path: str | os.PathLike[str], allowed: Sequence[str] | None, warn: bool = True) -> list[Example]:
        return load_classification_file(
            path,
            text_column,
            label_column,
            format,
            allowed,
            label_names,
            drop_other_labels,
            warn,
            encoding,
            max_record_chars,
        )

    test_examples = load(test, labels)
    if labels is None:
        labels = sorted({ex.label for ex in test_examples})
    else:
        _warn_of_classes_missing_from_test(labels, test_examples, Path(test).name)
    # No imbalance warning for the private file: which label dominates is a statistic of it.
    train_examples = load(train, labels, warn=False)
    if public is None:
        public_examples: list[Example] = []
    elif isinstance(public, (str, os.PathLike)):
        public_examples = load(public, labels, warn=False)  # a few demos need not be balanced
    else:
        public_examples = list(public)
    return ClassificationTask(
        name=name,
        description=description,
        labels=list(labels),
        private_train=PrivateDataset(subsample(train_examples, n_private, seed)),
        test=subsample(test_examples, n_test, seed + 1),
        public_examples=public_examples,
        verbalizers=dict(verbalizers) if verbalizers else {},
        record_template=record_template,
        score_kind=score_kind,
        clip_bound=clip_bound,
        seed_prompt=seed_prompt,
    )
