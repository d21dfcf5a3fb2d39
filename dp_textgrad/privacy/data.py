"""The structural barrier between private records and anything that is released.

Private records travel inside :class:`Private` / :class:`PrivateDataset`. Neither
can be turned into text by accident: ``str()``, ``format()`` and f-strings raise,
``repr()`` is redacted, and pickling is refused. Only code that is part of a DP
mechanism (the scorer, the DP feedback statistics) calls :meth:`Private.unwrap`.

Text that may reach a mutation LLM is :class:`PublicText`, which carries its
provenance. Prompt builders (see ``dp_es/mutation/barrier.py``) accept only ``PublicText`` and
candidate prompts, so private text cannot be formatted into a mutation prompt
without an explicit, greppable ``unwrap()`` call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

import numpy as np

T = TypeVar("T")


class PrivateDataError(TypeError):
    """Raised when private data is used where only public data is allowed."""


class PrivateScoringError(RuntimeError):
    """Reading private records failed after the mechanism was charged.

    The message is fixed text plus the mechanism's public label: no record text and no
    number derived from private data (token counts, positions). The original error is
    kept in :attr:`operator_detail` for the operator-only area of a run, never printed.
    """

    def __init__(self, label: str, original: BaseException) -> None:
        super().__init__(
            f"{label}: scoring the private records failed (engine or task error); the charge for "
            "this step stays in the ledger"
        )
        self.label = label
        self.operator_detail = f"{type(original).__name__}: {original}"


class Private(Generic[T]):
    """A private value. It refuses every implicit conversion to text."""

    __slots__ = ("_value",)
    _value: T

    def __init__(self, value: T) -> None:
        object.__setattr__(self, "_value", value)

    def unwrap(self) -> T:
        """Return the raw value. Only DP mechanisms may call this."""
        return self._value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Private values are immutable")

    def __repr__(self) -> str:
        return "Private(<redacted>)"

    def __str__(self) -> str:
        raise PrivateDataError("a private record cannot be converted to text; only DP mechanisms may read it")

    def __format__(self, spec: str) -> str:
        raise PrivateDataError("a private record cannot be formatted into text; only DP mechanisms may read it")

    def __reduce__(self) -> NoReturn:  # pickling would write raw records to disk
        raise PrivateDataError("private records cannot be pickled or checkpointed")


class PrivateDataset(Generic[T]):
    """The private training set D. Its size N is private unless declared (docs/privacy.md, "The dataset size")."""

    __slots__ = ("_records",)
    _records: list[Private[T]]

    def __init__(self, records: Sequence[T]) -> None:
        records = list(records)
        if not records:
            raise ValueError("private_records: the private dataset is empty; give at least one record")
        object.__setattr__(self, "_records", [Private(r) for r in records])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("PrivateDataset is immutable")

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Private[T]]:
        return iter(self._records)

    def __getitem__(self, index: int) -> Private[T]:
        return self._records[index]

    def __repr__(self) -> str:
        return f"PrivateDataset(n={len(self)}, <redacted>)"

    def __str__(self) -> str:
        raise PrivateDataError("a private dataset cannot be converted to text")

    def __format__(self, spec: str) -> str:
        raise PrivateDataError("a private dataset cannot be formatted into text")

    def __reduce__(self) -> NoReturn:
        raise PrivateDataError("private datasets cannot be pickled or checkpointed")

    def fingerprint(self, key: bytes) -> str:
        """Keyed, order-independent hash of the records' content: the lifetime store's key for D.

        A function of every record, so it is operator-only (it stays in the lifetime store).
        """
        digests = sorted(hashlib.sha256(_canonical(r.unwrap())).digest() for r in self._records)
        mac = hmac.new(key, b"dp-textgrad-dataset-v1", hashlib.sha256)
        for digest in digests:
            mac.update(digest)
        return mac.hexdigest()

    def poisson_subsample(self, q: float, rng: np.random.Generator) -> PrivateBatch[T]:
        """Include each record independently with probability ``q``."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"sampling_rate: q must be in (0, 1], got {q}")
        mask = rng.random(len(self._records)) < q
        return PrivateBatch([r for r, keep in zip(self._records, mask) if keep])


def _canonical(record: object) -> bytes:
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        record = dataclasses.asdict(record)
    return json.dumps(record, sort_keys=True, default=repr, ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class PrivateBatch(Generic[T]):
    """A Poisson subsample. Its realised size is private: never divide by it in a release."""

    records: list[Private[T]]

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Private[T]]:
        return iter(self.records)

    def __repr__(self) -> str:
        return "PrivateBatch(<redacted>)"

    def __str__(self) -> str:
        raise PrivateDataError("a private batch cannot be converted to text")

    def __format__(self, spec: str) -> str:
        raise PrivateDataError("a private batch cannot be formatted into text")


class PublicText(str):
    """Text that may reach a mutation LLM, tagged with where it came from.

    ``source`` is one of: ``"user"`` (given by the user as public), ``"candidate"``
    (a candidate prompt), ``"dp"`` (rendered from a DP-released statistic),
    ``"phrase_bank"`` (built-in public phrases), ``"public_example"`` (a record of the
    public split), ``"llm"`` (output of an LLM that saw only public text) and
    ``"unsafe"`` (raw private text, allowed only in unsafe mode).
    """

    SOURCES = frozenset({"user", "candidate", "dp", "phrase_bank", "public_example", "llm", "unsafe"})
    source: str

    def __new__(cls, text: str, source: str) -> PublicText:
        if isinstance(text, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError("private data cannot be declared public")
        if source not in cls.SOURCES:
            raise ValueError(f"source: unknown provenance {source!r}; use one of {sorted(cls.SOURCES)}")
        obj = super().__new__(cls, text)
        obj.source = source
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (PublicText, (str(self), self.source))
