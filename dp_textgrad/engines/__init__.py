"""Engines: TextGrad ``EngineLM``s that also score continuations."""

from dp_textgrad.engines.base import Engine, EngineError, TokenLogprobs, Usage

__all__ = ["Engine", "EngineError", "TokenLogprobs", "Usage"]
