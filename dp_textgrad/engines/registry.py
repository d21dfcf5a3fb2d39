"""The engines a configuration can name; adding one is a module plus one line here.

Builders import their engine lazily, so reading this registry loads neither
llama.cpp nor torch. The scripted engine is for unit tests and is not offered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast


def _llama_cpp(model: str | None, base_url: str | None, mode: str | None, **options: Any) -> Any:
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine

    return LlamaCppEngine(model_path=model, **options)


def _openai(model: str | None, base_url: str | None, mode: str | None, **options: Any) -> Any:
    from dp_textgrad.engines.openai_engine import ApiMode, OpenAIEngine

    # The engine checks both: a missing model or an unknown mode is a ValueError naming the field.
    return OpenAIEngine(cast(str, model), base_url=base_url, mode=cast(ApiMode, mode or "chat"), **options)


def _transformers(model: str | None, base_url: str | None, mode: str | None, **options: Any) -> Any:
    from dp_textgrad.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model_name_or_path=model, **options)


ENGINES: dict[str, Callable[..., Any]] = {
    "llama_cpp": _llama_cpp,
    "openai": _openai,
    "transformers": _transformers,
}


def build_engine(
    kind: str, *, model: str | None = None, base_url: str | None = None, mode: str | None = None, **options: Any
) -> Any:
    """The engine ``kind`` with its settings; errors name the field to fix."""
    try:
        build = ENGINES[kind]
    except KeyError:
        raise ValueError(f"engine.kind: unknown engine {kind!r}; use one of {sorted(ENGINES)}") from None
    try:
        return build(model, base_url, mode, **options)
    except TypeError as exc:
        raise ValueError(f"engine.options: not accepted by the {kind} engine ({exc})") from None


__all__ = ["ENGINES", "build_engine"]
