"""The coordinator's view of the private records: a public count, no records.

The DP-ES optimizer takes a task whose ``private_train`` it never reads itself once a
scoring backend is given. On the coordinator that attribute is a :class:`RemoteRecords`:
its length is the public total N (the sum of the silos' public sizes), it iterates as
empty (the silos validate their own records), and any attempt to read or sample a record
fails loudly instead of touching data the coordinator must not hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dp_textgrad.privacy.data import PrivateDataError


class RemoteRecords:
    """``len()`` is public; the records themselves live at the silos."""

    __slots__ = ("_size",)
    _size: int

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"silo sizes: the silos hold no records (total {size!r})")
        object.__setattr__(self, "_size", size)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __getitem__(self, index: int) -> Any:
        raise PrivateDataError("private records live at the silos; the coordinator holds none")

    def poisson_subsample(self, q: float, rng: Any) -> Any:
        raise PrivateDataError("private records live at the silos; score through the federated backend")

    def fingerprint(self, key: bytes) -> str:
        raise PrivateDataError("private records live at the silos; each silo fingerprints its own")

    def __repr__(self) -> str:
        return f"RemoteRecords(n={self._size}, at the silos)"


__all__ = ["RemoteRecords"]
