"""A small public corpus for the built-in support tasks: help-centre articles.

Forty-one short articles of a fictional bank-and-telecom provider's help centre, on the topics of
the ``support`` task's messages (billing, technical faults, cancelling, fraud, account details).
They were written for this package and hold no personal data: they are PUBLIC, and a retriever
over them (``dspy.retrievers.Embeddings(corpus=help_centre_articles(), ...)``) may be declared
public to ``DPES`` (docs/integrations.md, "Retrieval over a public corpus").

The articles ship as package data (``dp_textgrad/tasks/data/help_centre.jsonl``, one JSON object
a line with ``id``, ``title`` and ``text``) and are read with :mod:`importlib.resources`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

HELP_CENTRE_FILE = "data/help_centre.jsonl"


@dataclass(frozen=True)
class HelpArticle:
    """One help-centre article."""

    id: str
    title: str
    text: str

    def as_passage(self) -> str:
        """The article as one retrieval passage: its title, a colon, its text."""
        return f"{self.title}: {self.text}"


def help_centre_records() -> list[HelpArticle]:
    """The help-centre articles, in file order (their ``id`` is ``<topic>-<number>``)."""
    path = resources.files("dp_textgrad.tasks").joinpath(HELP_CENTRE_FILE)
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            records.append(HelpArticle(id=str(row["id"]), title=str(row["title"]), text=str(row["text"])))
    return records


def help_centre_articles() -> list[str]:
    """The help-centre articles as retrieval passages (``"<title>: <text>"``), in file order."""
    return [article.as_passage() for article in help_centre_records()]


#: Words the hashed embedder leaves out: they match every article.
_STOPWORDS = frozenset("a an and for her his i in is it my of on or our since the to was we you your".split())


def hashed_word_embedder(dim: int = 256) -> Callable[[Sequence[str]], np.ndarray]:
    """A small in-process embedder with no model to download, for examples, tests and benchmarks
    over the help centre: each word but a stopword hashed (CRC-32) into one of ``dim`` buckets and
    counted. Deterministic; use a real embedding model for real retrieval."""
    if dim < 1:
        raise ValueError(f"dim: must be >= 1, got {dim}")

    def embed(texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in str(text).lower().translate(str.maketrans(",.:?", "    ")).split():
                if word not in _STOPWORDS:
                    vectors[row, zlib.crc32(word.encode()) % dim] += 1.0
        return vectors

    return embed


__all__ = ["HELP_CENTRE_FILE", "HelpArticle", "hashed_word_embedder", "help_centre_articles", "help_centre_records"]
