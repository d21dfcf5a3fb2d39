"""A prompt's own record format: the paragraph that says where the input goes.

A generation prompt may end with a paragraph holding the placeholder ``{text}``, for
example::

    Copy the account number out of the message.

    Message: {text}
    Account number:

That paragraph (from the last blank line before ``{text}`` to the end) is the prompt's record
format: the model reads ``<the rest of the prompt>\\n\\n<the format with the record in place of
{text}>``, and the prompt's demonstrations are written in the same format. A prompt without
``{text}`` uses its task's ``record_template``. The format is public text like the rest of the
prompt, so the search may change it (the ``record_format_change`` operator) and a released
prompt carries it: the slot says where a deployment puts its input.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SLOT = "{text}"
_BLANK_LINE = re.compile(r"\n[ \t]*\n")

#: Generic formats (input label, answer label) a task may offer: not a default, since with the
#: same demonstrations each scored at or below the built-in task's own template
#: (``benchmarks/record_formats.py``); a task's own field names did better.
GENERIC_RECORD_FORMATS: tuple[str, ...] = (
    "Input: {text}\nOutput:",
    "Text: {text}\nAnswer:",
    "Q: {text}\nA:",
    "Request: {text}\nResponse:",
)


def split_record_format(prompt: str) -> tuple[str, str | None]:
    """``(the prompt before its record format, the format)``; the format is None where the
    prompt holds no ``{text}``. ValueError if the format holds ``{text}`` more than once."""
    at = prompt.rfind(SLOT)
    if at < 0:
        return prompt, None
    breaks = list(_BLANK_LINE.finditer(prompt, 0, at))
    start = breaks[-1].end() if breaks else 0
    record_format = prompt[start:].strip()
    if record_format.count(SLOT) != 1:
        raise ValueError(
            "prompt: its record format (the paragraph holding {text}, to the end) must hold {text} "
            "exactly once; put the input's slot in one place"
        )
    return prompt[:start].rstrip(), record_format


def check_record_format(record_format: str, field_name: str) -> str:
    """``record_format`` stripped, or ValueError naming ``field_name``: it must hold ``{text}``
    once and no blank line (a blank line ends a paragraph of the prompt)."""
    if not isinstance(record_format, str) or record_format.strip().count(SLOT) != 1:
        raise ValueError(f"{field_name}: a record format must hold the placeholder {{text}} exactly once")
    if _BLANK_LINE.search(record_format.strip()):
        raise ValueError(f"{field_name}: a record format must not hold a blank line; use single newlines")
    return record_format.strip()


def fill_record_format(record_format: str, text: str) -> str:
    """The format with ``text`` in place of ``{text}`` (other braces are kept as written)."""
    return record_format.replace(SLOT, text, 1)


def with_record_format(body: str, record_format: str | None) -> str:
    """The prompt of ``body`` ending with ``record_format`` (its paragraph last), or ``body``."""
    if record_format is None:
        return body
    return f"{body.rstrip()}\n\n{record_format}" if body.strip() else record_format


def format_stops(record_format: str | None, stops: Sequence[str]) -> tuple[str, ...]:
    """``stops`` and, for a prompt's own format, its first line's label after a newline (the
    next record a small model starts writing after its answer: ``"\\nQ:"`` for ``"Q: {text}"``)."""
    out = tuple(stops)
    if record_format is None:
        return out
    head = record_format.split(SLOT, 1)[0].strip().split("\n", 1)[0].strip()
    if head and not any(stop in "\n" + head for stop in out):
        out += ("\n" + head,)
    return out


__all__ = [
    "GENERIC_RECORD_FORMATS",
    "SLOT",
    "check_record_format",
    "fill_record_format",
    "format_stops",
    "split_record_format",
    "with_record_format",
]
