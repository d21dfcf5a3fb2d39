"""Reading a task file's text safely: lines read with a length limit, and decoding errors
that name the file, the line and the fix (``task.encoding``).

These errors name rows of the data owner's files: they stop a run while its task is built,
before anything is charged (docs/privacy.md, "Errors, warnings and tracebacks").
"""

from __future__ import annotations

import codecs
import contextlib
import csv
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


class LimitedLines:
    """Lines of a text file, each read with a length limit (a huge line is never read whole)."""

    def __init__(self, handle: TextIO, path: Path, limit: int) -> None:
        self.handle, self.path, self.limit, self.number = handle, path, limit, 0

    def __iter__(self) -> LimitedLines:
        return self

    def __next__(self) -> str:
        line = self.handle.readline(self.limit + 1)
        if not line:
            raise StopIteration
        self.number += 1
        if len(line) > self.limit and not line.endswith("\n"):
            raise ValueError(
                f"{self.path.name}: line {self.number} is longer than the limit of {self.limit:,} "
                "characters per record; shorten or drop that record (max_record_chars)"
            )
        return line


def delimited_records(handle: TextIO, path: Path, delimiter: str, max_chars: int) -> Iterator[tuple[int, list[str]]]:
    """(line where the record starts, its fields) for each row of a CSV/TSV file, header first.

    Strict quoting: a quote that is never closed would otherwise swallow the rest of the file
    into one field, silently; here it stops the load, naming the line where that record starts
    (a quote inside an unquoted field, ``He said "hi"``, stays literal text). Each field is also
    held to ``max_chars`` (csv's own field limit is process-wide state; a quoted field spanning
    lines is bounded per line by :class:`LimitedLines` and in total here).
    """
    reader = csv.reader(LimitedLines(handle, path, max_chars), delimiter=delimiter, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                raise ValueError(
                    f"{path.name}: the record starting at line {start} opens a quote that is never closed, so "
                    "it would run to the end of the file; close the quote (or double a quote inside a quoted "
                    'field: "")'
                ) from None
            raise ValueError(
                f"{path.name}: the record starting at line {start} cannot be parsed ({exc}); check its quoting, "
                f"or shorten it below {max_chars:,} characters (max_record_chars)"
            ) from None
        if any(len(field) > max_chars for field in row):
            raise ValueError(
                f"{path.name}: the record starting at line {start} has a field longer than the limit "
                f"of {max_chars:,} characters; shorten or drop it (max_record_chars)"
            )
        yield start, row


def decoding_errors(path: Path, encoding: str) -> contextlib.AbstractContextManager[None]:
    """Turn a decoding failure into an error that names the file and the fix."""

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        try:
            yield
        except UnicodeDecodeError:
            # The decoder's position is inside its read buffer, not a line: find the line again.
            line = first_undecodable_line(path, encoding)
            where = f"line {line} is not" if line is not None else "not"
            raise ValueError(
                f"{path.name}: {where} valid {encoding} text; if the file uses another encoding "
                f"set task.encoding in the run file or pass --encoding, e.g. --encoding latin-1 "
                f"(encoding= in Python)"
            ) from None

    return guard()


def first_undecodable_line(path: Path, encoding: str) -> int | None:
    """The 1-based physical line where ``path`` stops being valid ``encoding`` text (None if
    it decodes whole). Reads the bytes in pieces that end at a newline byte, so a huge line is
    never held whole; lines are counted on the decoded text (exact for encodings in which a
    newline is one byte, such as UTF-8 and the latin and Windows code pages)."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    newlines = 0
    with path.open("rb") as handle:
        while True:
            piece = handle.readline(65_536)
            try:
                newlines += decoder.decode(piece, final=not piece).count("\n")
            except UnicodeDecodeError:
                return newlines + 1
            if not piece:
                return None


__all__ = ["LimitedLines", "decoding_errors", "delimited_records", "first_undecodable_line"]
