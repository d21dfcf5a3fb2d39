"""Fixtures for the OpenAI-compatible engine: the fault server and a real llama.cpp server.

Not a conftest plugin by itself: test modules import the fixtures they use
(``from tests.conftest_openai import fault_server, ...``), or the root conftest lists
this module in ``pytest_plugins``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import FaultServer, LlamaCppServer

LLAMA_MODEL_ALIAS = "gemma-3-270m"


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


def gemma_gguf_path() -> Path:
    """The Gemma 3 270M GGUF, assembled (and sha256-checked) into the cache dir once."""
    from dp_textgrad.engines.model_files import default_model_path

    return default_model_path()


def llama_server_importable() -> str | None:
    """None when ``llama_cpp.server`` imports, else why not."""
    try:
        importlib.import_module("llama_cpp.server.app")
    except ImportError as error:
        return f"{error.name or error}"
    return None


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaCppServer]:
    """The real ``python -m llama_cpp.server`` with Gemma 3 270M, once per session."""
    missing = llama_server_importable()
    if missing is not None:
        pytest.skip(f"llama_cpp.server is not importable (missing {missing}); "
                    "pip install 'llama-cpp-python[server]'")
    from dp_textgrad.engines.model_files import LocalModelUnavailable

    try:
        model = gemma_gguf_path()
    except LocalModelUnavailable as error:
        pytest.skip(str(error))
    server = LlamaCppServer(model, model_alias=LLAMA_MODEL_ALIAS, n_ctx=2048)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def openai_fake_engine() -> Iterator:
    """An ``OpenAIEngine`` (exact echo scoring) against the fake server (fast; its model is a
    fixed rule), with a 2048-token context so that over-long prompts fail like on a real server."""
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    with FaultServer(context_limit=2048) as server:
        engine = OpenAIEngine("fake-model", base_url=server.base_url, mode="completions", scoring="echo",
                              max_retries=1, backoff_base=0.01, timeout=30)
        yield engine
        engine.close()


@pytest.fixture(scope="session")
def openai_llama_engine(llama_server: LlamaCppServer) -> Iterator:
    """An ``OpenAIEngine`` (completions mode, exact echo scoring) against the real server.

    The cache is on: llama-cpp-python's echo costs a Python sort of Gemma's 262k-token
    vocabulary per prompt token, and llama.cpp's floats depend slightly on how much of
    the KV cache a request could reuse, so identical prompts are served once.
    """
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    engine = OpenAIEngine(LLAMA_MODEL_ALIAS, base_url=llama_server.base_url, mode="completions", scoring="echo",
                          cache=True, max_concurrency=2, timeout=600, max_retries=1, default_max_tokens=16)
    try:
        yield engine
    finally:
        engine.close()
