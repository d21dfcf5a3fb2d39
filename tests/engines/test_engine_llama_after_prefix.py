"""Private generation on llama.cpp (``LlamaCppEngine.generate_after_prefix``): one record at a
time after a prefix decoded once, so that an output depends on the prefix and its own record only."""

from __future__ import annotations

import pytest

from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.llama_support import GenerationCache

# Public text only: a few-shot prefix in the generation task's layout and short records.
PREFIX = (
    "Answer with the capital city only.\n\n"
    "Input: France\nOutput: Paris\n\n"
    "Input: Japan\nOutput: Tokyo\n\n"
)
SUFFIXES = [
    "Input: Italy\nOutput:",
    "Input: Spain\nOutput:",
    "Input: Germany\nOutput:",
    "Input: Canada\nOutput:",
    "Input: Egypt\nOutput:",
    "Input: Peru\nOutput:",
]
# Other records to mix in: a long one, an empty one, a repeated one.
OTHERS = ["Input: " + "a very long and winding question about rivers, " * 12 + "\nOutput:", "", SUFFIXES[0]]
# llama.cpp's floats depend on which tokens share a decode (see test_engine_llama_batched.py):
# ``generate`` decodes prefix and record in one batch, this path the prefix and then the record.
# Where the two best next tokens are within rounding, greedy decoding may take the other one.
NEAR_TIE_NATS = 0.5


@pytest.mark.slow
def test_an_output_depends_only_on_the_prefix_and_its_own_record(llama_engine) -> None:
    kwargs = {"max_tokens": 12, "stop": None}
    alone = [llama_engine.generate_after_prefix(PREFIX, [s], **kwargs)[0] for s in SUFFIXES]
    assert all(alone)
    together = llama_engine.generate_after_prefix(PREFIX, SUFFIXES, **kwargs)
    assert together == alone  # exactly equal, not up to rounding
    reversed_order = llama_engine.generate_after_prefix(PREFIX, SUFFIXES[::-1], **kwargs)
    assert reversed_order == alone[::-1]
    mixed = [OTHERS[0], SUFFIXES[2], OTHERS[1], SUFFIXES[0], OTHERS[2], SUFFIXES[4]]
    outputs = llama_engine.generate_after_prefix(PREFIX, mixed, **kwargs)
    assert [outputs[1], outputs[3], outputs[4], outputs[5]] == [alone[2], alone[0], alone[0], alone[4]]
    # Nor on what the engine did before: scoring another prefix, generating elsewhere.
    llama_engine.score_choices_batch("Sentiment.\n\n", ["Review: fine.\nSentiment:"], [" positive", " negative"])
    llama_engine.generate_many(["The capital of France is"], max_tokens=4)
    assert llama_engine.generate_after_prefix(PREFIX, SUFFIXES[3:], **kwargs) == alone[3:]
    # And it leaves label scores after the same prefix as they were (it shares their cache).
    choices = [" Rome", " Madrid"]
    before = llama_engine.score_choices_batch(PREFIX, SUFFIXES[:2], choices)
    llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], **kwargs)
    assert (llama_engine.score_choices_batch(PREFIX, SUFFIXES[:2], choices) == before).all()


def parting_is_a_near_tie(engine, prompt: str, one: str, other: str) -> bool:
    """Whether two greedy texts part at a token where the two choices' log-probs (after the
    common text) are within NEAR_TIE_NATS."""
    a = engine.token_logprobs(one, context=prompt).tokens
    b = engine.token_logprobs(other, context=prompt).tokens
    split = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
    if split is None:  # one a prefix of the other: no tie explains that
        return False
    scores = engine.score_choices(prompt + "".join(a[:split]), [a[split], b[split]])
    return abs(scores[0] - scores[1]) < NEAR_TIE_NATS


@pytest.mark.slow
@pytest.mark.parametrize("stop", [None, ["\n"]])
def test_outputs_equal_generate_on_the_whole_prompt_up_to_near_ties(llama_engine, stop) -> None:
    # What agrees: the texts of generate(prefix + suffix) and generate_after_prefix, equal for
    # most records; where they differ, the first differing token is a near tie. Measured with
    # these 6 records and 16 tokens (1 thread): 5 of 6 equal with and without the stop string; Italy
    # parts at its first token (' Milan' against ' Rome'), a near tie.
    sequential = [llama_engine.generate(PREFIX + s, max_tokens=16, stop=stop) for s in SUFFIXES]
    after = llama_engine.generate_after_prefix(PREFIX, SUFFIXES, max_tokens=16, stop=stop)
    equal = sum(a == b for a, b in zip(sequential, after, strict=True))
    for suffix, one, other in zip(SUFFIXES, sequential, after, strict=True):
        if one != other:
            assert parting_is_a_near_tie(llama_engine, PREFIX + suffix, one, other), (one, other)
    assert equal >= 0.6 * len(SUFFIXES), (equal, sequential, after)


@pytest.mark.slow
def test_stop_strings_max_tokens_and_empty_parts(llama_engine) -> None:
    free = llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=24)
    assert all("\n" in text for text in free)  # the model goes on to the next example...
    stopped = llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=24, stop=["\n"])
    assert [text.split("\n")[0] for text in free] == stopped  # ...and the stop string cuts there
    before = llama_engine.usage.completion_tokens
    one = llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=1)
    assert llama_engine.usage.completion_tokens - before == 2
    assert [free[i].startswith(one[i]) and llama_engine.count_tokens(one[i]) == 1 for i in range(2)] == [True, True]
    # An empty prefix, an empty record, no records.
    assert llama_engine.generate_after_prefix("", ["The capital of France is"], max_tokens=4)[0]
    assert isinstance(llama_engine.generate_after_prefix(PREFIX + SUFFIXES[0], [""], max_tokens=4)[0], str)
    assert llama_engine.generate_after_prefix(PREFIX, [], max_tokens=4) == []
    with pytest.raises(ValueError, match="max_tokens"):
        llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:1], max_tokens=0)
    # Sampling goes through generate, one record at a time.
    assert len(llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=4, temperature=0.7)) == 2


@pytest.mark.slow
def test_context_overflow_and_the_budget_left_by_a_long_record(llama_engine) -> None:
    n_ctx = llama_engine.n_ctx  # 512 in the fixture
    long_record = "word " * 600
    with pytest.raises(EngineError, match=rf"no room to generate in the context \({n_ctx} tokens\)") as caught:
        llama_engine.generate_after_prefix(PREFIX, [SUFFIXES[0], long_record], max_tokens=4)
    message = str(caught.value)
    n_long = llama_engine.count_tokens(long_record)
    assert str(n_long) not in message and str(n_long + llama_engine.count_tokens(PREFIX)) not in message
    # A record that leaves a few cells: it ends where the context does, like generate.
    prefix_tokens = len(llama_engine.tokenize(PREFIX, bos=True))
    fill = "Input:"
    while n_ctx - prefix_tokens - llama_engine.count_tokens(fill + " one") > 8:
        fill += " one"
    room = n_ctx - prefix_tokens - llama_engine.count_tokens(fill)
    assert 0 < room < 24
    before = llama_engine.usage.completion_tokens
    llama_engine.generate_after_prefix(PREFIX, [fill], max_tokens=64)
    assert 0 < llama_engine.usage.completion_tokens - before <= room + 3  # + a UTF-8 character's tail


@pytest.mark.slow
def test_the_generation_cache_serves_repeated_records(llama_engine) -> None:
    first = llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=6)
    cache = GenerationCache()
    llama_engine.cache = cache
    try:
        assert llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=6) == first
        assert (cache.hits, cache.misses) == (0, 2)
        assert llama_engine.generate_after_prefix(PREFIX, SUFFIXES[1::-1], max_tokens=6) == first[::-1]
        assert (cache.hits, cache.misses) == (2, 2)
    finally:
        llama_engine.cache = None


@pytest.mark.slow
def test_a_cache_directory_never_receives_private_generations(llama_engine, tmp_path) -> None:
    """The private paths keep outputs in memory only: a cache directory would hold them on disk."""
    cache = GenerationCache(tmp_path / "cache")
    llama_engine.cache = cache
    try:
        llama_engine.generate_after_prefix(PREFIX, SUFFIXES[:2], max_tokens=4)
        llama_engine.generate_for_prefixes([PREFIX, PREFIX + "Note: be brief.\n\n"], SUFFIXES[0], max_tokens=4)
        assert (cache.hits, cache.misses) == (0, 0)
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
        llama_engine.generate("public text", max_tokens=2)  # the public path still uses it
        assert cache.misses == 1
    finally:
        llama_engine.cache = None
