"""Prompts made of several named parts: the instructions of a DSPy program's predictors, the
texts of a GEPA candidate.

A candidate of such a task is still ONE text, so that the population, the scorer, the ledger and
the released files need nothing new: each part follows a header line ``[[name]]``, in the task's
order (:func:`join_components`); the pipeline splits it back (:func:`split_components`) before
it runs. The mutation side (:mod:`dp_textgrad.dp_es.mutation.components`) edits one part of a
parent per child, with that part's own description and public demonstrations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: A header line: ``[[name]]`` alone on its line.
_HEADER = re.compile(r"^\[\[([^\[\]\n]+)\]\]$", re.MULTILINE)


@dataclass(frozen=True)
class PromptComponent:
    """One optimized part of a multi-part prompt (all public).

    ``name``: how the pipeline knows the part (a predictor's name); ``seed``: its starting text;
    ``description``: what the part does, for the mutation operators (its signature's docstring,
    its fields); ``public_examples``: public demonstrations rendered for THIS part (its own
    fields), the demo operators' pool for it; ``render_example``: how a payload becomes one."""

    name: str
    seed: str
    description: str
    public_examples: Sequence[Any] = field(default_factory=tuple)
    render_example: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if not self.name or _HEADER.fullmatch(f"[[{self.name}]]") is None:
            raise ValueError(f"component name: {self.name!r} cannot be a header line ([[name]], no brackets)")


def join_components(texts: Mapping[str, str], order: Sequence[str]) -> str:
    """The one text of a multi-part prompt: each part under its ``[[name]]`` line, in ``order``."""
    missing = [name for name in order if name not in texts]
    if missing or set(texts) - set(order):
        raise ValueError(f"components: expected exactly {', '.join(order)}; got {', '.join(texts)}")
    blocks = []
    for name in order:
        text = str(texts[name]).strip()
        if _HEADER.search(text):
            raise ValueError(f"component {name}: its text holds a header line ([[...]] alone on a line)")
        blocks.append(f"[[{name}]]\n{text}" if text else f"[[{name}]]")
    return "\n\n".join(blocks)


def split_components(text: str, order: Sequence[str]) -> dict[str, str]:
    """The parts of :func:`join_components`'s text, by name; ValueError unless every name of
    ``order`` heads exactly one part, in that order, and nothing precedes the first header."""
    headers = list(_HEADER.finditer(text))
    names = [match.group(1) for match in headers]
    if names != list(order) or (headers and text[: headers[0].start()].strip()):
        raise ValueError(f"a multi-part prompt needs the header lines {', '.join(f'[[{n}]]' for n in order)} in order")
    parts: dict[str, str] = {}
    for position, match in enumerate(headers):
        end = headers[position + 1].start() if position + 1 < len(headers) else len(text)
        parts[match.group(1)] = text[match.end() : end].strip()
    return parts


__all__ = ["PromptComponent", "join_components", "split_components"]
