"""``to_dict`` for the audit's frozen result dataclasses (one definition, many result types)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


class AsDict:
    """Mixin for dataclasses: ``to_dict()`` is :func:`dataclasses.asdict` of the instance."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]
