"""DpEvents to and from JSON, through a whitelist of known event types."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import attr
from dp_accounting import dp_event as dpe

from dp_textgrad.privacy.accounting.events import GumbelTopKDpEvent, PureDpEvent


def _event_registry() -> dict[str, type]:
    registry: dict[str, type] = {}
    for value in vars(dpe).values():
        if isinstance(value, type) and issubclass(value, dpe.DpEvent) and attr.has(value):
            registry[value.__name__] = value
    registry["PureDpEvent"] = PureDpEvent
    registry["GumbelTopKDpEvent"] = GumbelTopKDpEvent
    return registry


def _encode_value(value: Any) -> Any:
    if isinstance(value, dpe.DpEvent):
        return event_to_dict(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else {"float": repr(v)}  # strict JSON has no inf/nan
    if isinstance(value, tuple):
        return {"tuple": [_encode_value(v) for v in value]}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    raise TypeError(f"event field: cannot serialise a value of type {type(value).__name__}")


def event_to_dict(event: dpe.DpEvent) -> dict[str, Any]:
    """JSON-able form of a DpEvent: ``{"type": class name, <fields>}``, nested events inline."""
    cls = type(event)
    if not isinstance(event, dpe.DpEvent) or not attr.has(cls):
        raise TypeError(f"event: expected an attrs DpEvent, got {cls.__name__}")
    name = type(event).__name__
    if _event_registry().get(name) is not type(event):
        raise TypeError(f"event: {name} is not a known dp-accounting or dp-textgrad event type")
    out: dict[str, Any] = {"type": name}
    for f in attr.fields(cls):
        out[f.name] = _encode_value(getattr(event, f.name))
    return out


def _decode_value(value: Any, registry: Mapping[str, type]) -> Any:
    if isinstance(value, dict):
        if "type" in value:
            return _event_from_dict(value, registry)
        if set(value) == {"float"}:
            return float(value["float"])
        if set(value) == {"tuple"}:
            return tuple(_decode_value(v, registry) for v in value["tuple"])
        raise ValueError(f"event field: unrecognised object {sorted(value)}")
    if isinstance(value, list):
        return [_decode_value(v, registry) for v in value]
    return value


def _event_from_dict(data: Mapping[str, Any], registry: Mapping[str, type]) -> dpe.DpEvent:
    name = data.get("type")
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:  # whitelist only: never import a module named by a file
        raise ValueError(f"event.type: unknown event type {name!r}")
    fields = {f.name for f in attr.fields(cls)}
    extra = set(data) - fields - {"type"}
    if extra:
        raise ValueError(f"event: unknown fields {sorted(extra)} for {name}")
    kwargs = {k: _decode_value(v, registry) for k, v in data.items() if k != "type"}
    return cls(**kwargs)


def event_from_dict(data: Mapping[str, Any]) -> dpe.DpEvent:
    """Inverse of :func:`event_to_dict` (only known event types are rebuilt)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"event: expected a mapping, got {type(data).__name__}")
    return _event_from_dict(data, _event_registry())


def encode_float(x: float) -> float | str:
    return x if math.isfinite(x) else repr(float(x))


def decode_float(x: float | str) -> float:
    return float(x)
