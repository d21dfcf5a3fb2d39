"""Engines: TextGrad ``EngineLM``s that also score continuations.

Optional back-ends import their heavy dependencies only when an engine is created.
"""

from dp_textgrad.engines.base import Engine, EngineError, TokenLogprobs, Usage
from dp_textgrad.engines.llama_cpp import GenerationCache, LlamaCppEngine
from dp_textgrad.engines.scripted import ScriptedEngine

__all__ = ["Engine", "EngineError", "GenerationCache", "LlamaCppEngine", "ScriptedEngine", "TokenLogprobs", "Usage"]
