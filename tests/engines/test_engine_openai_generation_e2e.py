"""End to end: a GenerationTask optimized through ``dp_textgrad.optimize`` with the OpenAI-compatible
engine in completions mode, against llama.cpp's own server (``python -m llama_cpp.server`` with the
bundled Gemma 3 270M) on loopback.

Kept short: 12 private records, 2 generations of 2 candidates with sampling rate 0.5, outputs of at
most 6 tokens, no LLM operators (the base model does not follow rewrite instructions). Measured:
27 s with the server start, on 2 cores busy with other work (load average 5.3; the server runs one thread).
"""

from __future__ import annotations

import json

import pytest

import dp_textgrad as dpt
from dp_textgrad.privacy.accounting.ledger import PrivacyLedger
from dp_textgrad.privacy.data import PrivateDataset
from tests.conftest_openai import LLAMA_MODEL_ALIAS

COUNTRIES = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Egypt", "Cairo"),
    ("Peru", "Lima"), ("Germany", "Berlin"), ("Greece", "Athens"), ("Norway", "Oslo"), ("Cuba", "Havana"),
    ("Kenya", "Nairobi"), ("Chile", "Santiago"), ("Austria", "Vienna"), ("Poland", "Warsaw"),
    ("Ireland", "Dublin"), ("Portugal", "Lisbon"), ("Sweden", "Stockholm"), ("Russia", "Moscow"),
    ("China", "Beijing"), ("Canada", "Ottawa"),
]
# Stands in for private data: it must not reach a released file.
SECRET_SUFFIX = "zq-4471"


def examples(pairs: list[tuple[str, str]], marker: str = "") -> list[dpt.GenerationExample]:
    return [dpt.GenerationExample(country + marker, reference=capital) for country, capital in pairs]


@pytest.mark.slow
def test_a_generation_task_runs_end_to_end_on_llama_cpps_server(llama_server, tmp_path) -> None:
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    task = dpt.GenerationTask(
        name="capitals",
        description="Name the capital city of a country.",
        private_train=PrivateDataset(examples(COUNTRIES[:12], f" {SECRET_SUFFIX}")),
        test=examples(COUNTRIES[12:18]),
        metric=dpt.metric_from_name("exact"),
        public_examples=examples(COUNTRIES[18:]),
        max_new_tokens=6,
        seed_prompt="Answer with the capital city only.",
    )
    engine = OpenAIEngine(LLAMA_MODEL_ALIAS, base_url=llama_server.base_url, mode="completions",
                          max_concurrency=2, timeout=300, max_retries=1)
    try:
        outcome = dpt.optimize(task, engine, runs_root=tmp_path / "runs", epsilon=4.0, generations=2,
                               population=2, parents=1, sampling_rate=0.5, llm_operators=False,
                               insecure_noise_seed=3)
    finally:
        engine.close()
    run_dir = outcome.run_dir
    ledger = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    assert ledger.epsilons() == pytest.approx(outcome.optimizer.plan.epsilons(ledger.delta), rel=1e-6)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert result["prompt"] == outcome.result.prompt and result["epsilon"] <= 4.0 + 1e-6
    evaluation = outcome.evaluation
    assert evaluation is not None and evaluation.metric == "exact" and evaluation.n_test == 6
    assert 0.0 <= evaluation.seed_accuracy <= 1.0 and 0.0 <= evaluation.released_accuracy <= 1.0
    assert engine.usage.calls > 0 and engine.usage.completion_tokens > 0
    released = [p for p in run_dir.rglob("*") if p.is_file() and "operator" not in p.relative_to(run_dir).parts]
    assert released and not any(SECRET_SUFFIX in p.read_text(encoding="utf-8", errors="replace") for p in released)
