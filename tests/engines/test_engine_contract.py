"""The contract every dp-textgrad engine meets, run against each engine.

To add an engine: provide a session fixture that returns it (tests/conftest.py or
your own conftest) and append an ``EngineCase`` to ``ENGINE_CASES``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.engines.base import CachesResults, Engine, EngineError, ResultCache, TokenLogprobs


@dataclass(frozen=True)
class EngineCase:
    """How to get one engine and what its scores promise.

    fixture: name of a fixture returning the engine.
    normalised_over_choices: rows are a distribution over the given choices (scripted);
        otherwise entries are the model's own log-probs of each continuation.
    logprob_atol: tolerance when one log-prob is computed by two routes (llama.cpp's
        float results depend slightly on how tokens are split into batches).
    enforces_context_limit: inputs longer than the context window raise EngineError
        (TransformersEngine has no length check yet: such inputs run, slowly).
    """

    fixture: str
    normalised_over_choices: bool
    logprob_atol: float
    enforces_context_limit: bool = True


ENGINE_CASES = [
    pytest.param(EngineCase("scripted_engine", normalised_over_choices=True, logprob_atol=1e-9), id="scripted"),
    pytest.param(EngineCase("llama_engine", normalised_over_choices=False, logprob_atol=0.5), id="llama",
                 marks=pytest.mark.slow),
    pytest.param(EngineCase("openai_fake_engine", normalised_over_choices=False, logprob_atol=1e-9),
                 id="openai-fake"),
    pytest.param(EngineCase("openai_llama_engine", normalised_over_choices=False, logprob_atol=0.5),
                 id="openai-llama", marks=pytest.mark.slow),
    pytest.param(EngineCase("transformers_tiny_engine", normalised_over_choices=False, logprob_atol=1e-4,
                            enforces_context_limit=False), id="transformers"),
]

# Short on purpose: llama-cpp-python's server echoes log-probs at about 1 s per prompt token on
# 2 cores (a Python sort of the 262k-token vocabulary each), and every scoring request echoes it.
PREFIX = "Review sentiment:\n\n"
SUFFIXES = [
    "Review: wonderful.\nSentiment:",
    "Review: boring.\nSentiment:",
    "Review: dull.\nSentiment:",
]
CHOICES = [" positive", " negative"]
SECRET = "Zxqv-Patient-Record-7731"


@pytest.fixture(params=ENGINE_CASES)
def case(request) -> EngineCase:
    return request.param


@pytest.fixture
def engine(case: EngineCase, request) -> Engine:
    return request.getfixturevalue(case.fixture)


def test_generate_returns_text_and_counts_usage(engine: Engine) -> None:
    before = engine.usage.as_dict()
    out = engine.generate("Name a colour:", max_tokens=8)
    after = engine.usage.as_dict()
    assert isinstance(out, str)
    assert after["calls"] == before["calls"] + 1
    assert after["prompt_tokens"] > before["prompt_tokens"]
    assert after["completion_tokens"] >= before["completion_tokens"] + (1 if out else 0)
    assert after["seconds"] > before["seconds"]


def test_call_is_generate(engine: Engine) -> None:
    assert engine("Name a colour:", max_tokens=8) == engine.generate("Name a colour:", max_tokens=8)


def test_temperature_zero_is_deterministic(engine: Engine) -> None:
    first = engine.generate("Count to five: one,", max_tokens=6, temperature=0.0)
    assert engine.generate("Count to five: one,", max_tokens=6, temperature=0.0) == first


def test_works_inside_textgrad(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # textgrad must not leave a ./logs directory of prompts
    tg = import_textgrad()
    model = tg.BlackboxLLM(engine, system_prompt="Answer briefly.")
    question = tg.Variable("Name a colour:", role_description="question to the model", requires_grad=False)
    calls = engine.usage.calls
    answer = model(question)
    assert isinstance(answer.value, str)
    assert engine.usage.calls == calls + 1
    assert list(tmp_path.iterdir()) == []


def test_score_rows_are_logprobs(engine: Engine, case: EngineCase) -> None:
    scores = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    assert scores.shape == (len(SUFFIXES), len(CHOICES))
    assert np.all(np.isfinite(scores))
    assert np.all(scores <= 1e-9)
    total = np.logaddexp.reduce(scores, axis=1)  # log of the probability mass on the choices
    if case.normalised_over_choices:
        np.testing.assert_allclose(total, 0.0, atol=1e-9)
    else:  # distinct continuations, none a prefix of another: mass at most 1
        assert np.all(total <= 1e-9)
    assert engine.score_choices_batch(PREFIX, [], CHOICES).shape == (0, len(CHOICES))


def test_batch_agrees_with_full_context(engine: Engine, case: EngineCase) -> None:
    batch = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    for row, suffix in zip(batch, SUFFIXES):
        full = engine.score_choices(PREFIX + suffix, CHOICES)
        np.testing.assert_allclose(row, full, atol=case.logprob_atol)


def test_batch_rows_do_not_depend_on_order_or_neighbours(engine: Engine) -> None:
    forward = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    backward = engine.score_choices_batch(PREFIX, SUFFIXES[::-1], CHOICES)[::-1]
    alone = np.vstack([engine.score_choices_batch(PREFIX, [s], CHOICES) for s in SUFFIXES])
    np.testing.assert_allclose(forward, backward, atol=1e-9)
    np.testing.assert_allclose(forward, alone, atol=1e-9)


def test_multi_token_choice_is_sum_of_token_logprobs(engine: Engine, case: EngineCase) -> None:
    if case.normalised_over_choices:
        pytest.skip("rows are normalised over the choices, not model log-probs of the text")
    context, choice = PREFIX + SUFFIXES[0], " very good indeed"
    per_token = engine.token_logprobs(choice, context)
    assert len(per_token.tokens) > 1
    combined = engine.score_choices(context, [choice, " positive"])
    np.testing.assert_allclose(combined[0], per_token.logprobs.sum(), atol=case.logprob_atol)
    assert combined[0] < combined[1]  # three specific tokens are less likely than one label


def test_token_logprobs_shapes(engine: Engine) -> None:
    text = " The film was good."
    result = engine.token_logprobs(text, context="Review:")
    n = len(result.tokens)
    assert isinstance(result, TokenLogprobs) and n > 0
    assert "".join(result.tokens) == text
    assert result.logprobs.shape == (n,)
    assert np.all(result.logprobs <= 1e-9)
    assert len(result.top_alternatives) == n
    for k, alternatives in enumerate(result.top_alternatives):
        assert 1 <= len(alternatives) <= 5
        values = [value for _, value in alternatives]
        assert values == sorted(values, reverse=True)
        assert values[0] >= result.logprobs[k] - 1e-6  # the best alternative is at least as likely
    for stat in (result.vocab_mean, result.vocab_std):
        assert stat is None or stat.shape == (n,)
    if result.vocab_std is not None:
        assert np.all(result.vocab_std > 0)
    if result.vocab_mean is not None:  # the mean over a vocabulary sits below its maximum
        assert np.all(result.vocab_mean < np.array([alts[0][1] for alts in result.top_alternatives]))
    empty = engine.token_logprobs("", context="Review:")
    assert empty.tokens == [] and empty.logprobs.shape == (0,)


def _snapshot(*roots: Path) -> set[str]:
    return {str(path) for root in roots if root.exists() for path in root.rglob("*")}


def test_no_files_written(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine (and its model file) exists already; from here on nothing may be written.
    work, home, scratch = tmp_path / "cwd", tmp_path / "home", tmp_path / "tmp"
    for folder in (work, home, scratch):
        folder.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    model_dir = Path(getattr(engine, "model_path", work)).parent
    before = _snapshot(model_dir)
    engine.generate(f"Summarise: {SECRET}", max_tokens=4)
    engine.score_choices_batch(PREFIX, [f"Review: {SECRET}\nSentiment:"], CHOICES[:1])
    engine.token_logprobs(SECRET, context="Note:")
    assert _snapshot(work, home, scratch) == set()
    assert _snapshot(model_dir) == before
    assert not os.path.exists(os.path.join(work, "logs"))


def test_errors_are_engine_errors_without_prompt_text(engine: Engine, case: EngineCase) -> None:
    if not case.enforces_context_limit:
        pytest.skip("this engine does not check inputs against its context window yet")
    too_long = " ".join([SECRET] * 3000)  # beyond every test engine's context window
    calls = [
        lambda: engine.generate(too_long, max_tokens=4),
        lambda: engine.score_choices_batch(PREFIX, [too_long], CHOICES),
        lambda: engine.score_choices(too_long, CHOICES),
        lambda: engine.token_logprobs(too_long, context="Note:"),
    ]
    for call in calls:
        with pytest.raises(EngineError) as caught:
            call()
        assert SECRET not in str(caught.value)
        assert "Zxqv" not in str(caught.value)
    # The engine still works afterwards.
    assert engine.score_choices_batch(PREFIX, SUFFIXES[:1], CHOICES).shape == (1, 2)


def test_result_cache_is_a_bounded_lru_that_counts_hits() -> None:
    cache = ResultCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == (True, 1)  # "a" is now the most recent, so "b" goes first
    cache.put("c", 3)
    assert (cache.get("b"), cache.get("c"), len(cache), cache.hits) == ((False, None), (True, 3), 2, 2)
    cache.clear()
    assert (len(cache), cache.hits) == (0, 2)  # the hit count is usage, kept across clear


def test_a_none_key_is_never_cached() -> None:
    holder = CachesResults()
    holder._cache_put("k", 1)  # no cache: a no-op
    assert (holder._cache_get("k"), holder.cache_hits, holder.cache_size) == ((False, None), 0, 0)
    holder._results = ResultCache(4)
    holder._cache_put(None, 1)  # e.g. a sampled generation
    assert (holder._cache_get(None), holder.cache_size) == ((False, None), 0)
    holder._cache_put("k", 1)
    assert (holder._cache_get("k"), holder.cache_hits, holder.cache_size) == ((True, 1), 1, 1)
    holder.clear_cache()
    assert holder.cache_size == 0
