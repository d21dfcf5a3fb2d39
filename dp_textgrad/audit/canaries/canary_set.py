"""Canary and CanarySet, the types of a canary set, and its JSON file format.

A canary is a synthetic record: a public-looking ``prefix``, then a high-entropy
``secret``; a canary set adds the never-inserted reference secrets that give the
exposure metric its denominator. The file (``save_canaries`` / ``load_canaries``) is
validated with pydantic on load. Exported by :mod:`dp_textgrad.audit`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dp_textgrad import _io
from dp_textgrad.tasks.base import Example

SecretKind = Literal["digits", "words", "mixed"]
IncludeMode = Literal["all", "mask"]

CANARY_FILE_FORMAT = "dp-textgrad-canaries"
CANARY_FILE_VERSION = 1


@dataclass(frozen=True)
class Canary:
    """One canary record: ``prefix`` (public-looking text) then `` secret``.

    ``text`` is the record as inserted; ``continuation`` is what an extraction
    attack must produce after ``prefix``. ``included`` is the one-run inclusion bit.
    """

    canary_id: str
    prefix: str
    secret: str
    label: str
    included: bool = True

    @property
    def continuation(self) -> str:
        # The separating space starts the continuation, so piece boundaries are token boundaries.
        return " " + self.secret

    @property
    def text(self) -> str:
        return f"{self.prefix}{self.continuation}."

    @property
    def example(self) -> Example:
        return Example(text=self.text, label=self.label)


@dataclass(frozen=True)
class CanarySet:
    """A seeded set of canaries plus the reference secrets used for exposure."""

    canaries: tuple[Canary, ...]
    reference_secrets: tuple[str, ...]
    seed: int
    mask_seed: int
    secret_kind: SecretKind

    def __len__(self) -> int:
        return len(self.canaries)

    def __iter__(self) -> Iterator[Canary]:
        return iter(self.canaries)

    def __getitem__(self, index: int) -> Canary:
        return self.canaries[index]

    @property
    def included_mask(self) -> np.ndarray:
        return np.array([c.included for c in self.canaries], dtype=bool)

    def members(self) -> list[Canary]:
        """Canaries whose inclusion bit is set (inserted in a one-run audit)."""
        return [c for c in self.canaries if c.included]

    def non_members(self) -> list[Canary]:
        return [c for c in self.canaries if not c.included]

    def examples(self, include: IncludeMode = "all") -> list[Example]:
        chosen = self.canaries if include == "all" else self.members()
        return [c.example for c in chosen]

    def to_dict(self) -> dict:
        return {
            "format": CANARY_FILE_FORMAT,
            "version": CANARY_FILE_VERSION,
            "seed": self.seed,
            "mask_seed": self.mask_seed,
            "secret_kind": self.secret_kind,
            "canaries": [dataclasses.asdict(c) for c in self.canaries],
            "reference_secrets": list(self.reference_secrets),
        }

    @classmethod
    def from_dict(cls, payload: dict) -> CanarySet:
        parsed = _CanarySetFile.model_validate(payload)
        return cls(
            canaries=tuple(Canary(**c.model_dump()) for c in parsed.canaries),
            reference_secrets=tuple(parsed.reference_secrets),
            seed=parsed.seed,
            mask_seed=parsed.mask_seed,
            secret_kind=parsed.secret_kind,
        )


# -- file schema (pydantic at the edge) ------------------------------------------------


class _CanaryModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    canary_id: str = Field(min_length=1)
    prefix: str
    secret: str = Field(min_length=1)
    label: str = Field(min_length=1)
    included: bool


class _CanarySetFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["dp-textgrad-canaries"]
    version: Literal[1]
    seed: int
    mask_seed: int
    secret_kind: SecretKind
    canaries: list[_CanaryModel] = Field(min_length=1)
    reference_secrets: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> _CanarySetFile:
        ids = [c.canary_id for c in self.canaries]
        if len(set(ids)) != len(ids):
            raise ValueError("canaries: canary ids must be unique")
        secrets_ = {c.secret for c in self.canaries}
        if len(secrets_) != len(self.canaries):
            raise ValueError("canaries: canary secrets must be unique")
        if secrets_ & set(self.reference_secrets):
            raise ValueError("reference_secrets: must not contain an inserted canary secret")
        if len(set(self.reference_secrets)) != len(self.reference_secrets):
            raise ValueError("reference_secrets: must be unique")
        return self


def save_canaries(path: str | Path, canary_set: CanarySet) -> None:
    """Write the canary set as JSON (atomically)."""
    _io.atomic_write_json(path, canary_set.to_dict())


def load_canaries(path: str | Path) -> CanarySet:
    return CanarySet.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
