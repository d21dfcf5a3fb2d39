"""Checks on a dp-textgrad engine an integration will run private records through."""

from __future__ import annotations

from typing import Any

from dp_textgrad.dp_es.config import ConfigError


def refuse_disk_cache(engine: Any, field: str) -> None:
    """Raise :class:`ConfigError` when ``engine`` keeps its generations in a cache directory.

    An integration sends private records through the engine's plain ``generate`` (a DSPy call,
    a GEPA task call), whose outputs a cache directory would keep on disk; dp-textgrad's own
    scoring paths avoid it, an integration cannot. In-memory caches are fine (they die with
    the process, like the records)."""
    cache = getattr(engine, "cache", None)
    if getattr(cache, "directory", None) is not None:
        raise ConfigError(
            f"{field}: the engine keeps its generations in a cache directory, which would hold outputs "
            "computed from private records on disk; build it with cache=None or cache='memory'"
        )


__all__ = ["refuse_disk_cache"]
