"""Batched greedy generation on llama.cpp (``LlamaCppEngine.generate_many``) and the rule that
ends each completion as llama-cpp-python's ``create_completion`` does."""

from __future__ import annotations

import pytest

from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.llama_support import GenerationCache, GreedyCompletion
from dp_textgrad.engines.scripted import ScriptedEngine

END = 0
PIECES = {1: b"Hello", 2: b" world", 3: b".", 4: b"\n", 5: b"\xe2\x82", 6: b"\xac", 7: b" stop"}


def completion(max_tokens: int, stop: list[str] | None = None) -> GreedyCompletion:
    return GreedyCompletion(max_tokens, stop, lambda tokens: b"".join(PIECES[t] for t in tokens), lambda t: t == END)


def run(rule: GreedyCompletion, tokens: list[int]) -> int:
    """Push tokens until the rule ends; return how many it took."""
    for taken, token in enumerate(tokens, 1):
        if rule.push(token):
            return taken
    raise AssertionError("the completion did not end")


def test_completion_ends_at_max_tokens_end_of_generation_or_a_stop_string() -> None:
    rule = completion(3)
    assert run(rule, [1, 2, 3, 4]) == 3 and rule.text == "Hello world." and rule.tokens == [1, 2, 3]
    rule = completion(10)
    assert run(rule, [1, 2, END, 3]) == 3 and rule.text == "Hello world" and rule.tokens == [1, 2]
    rule = completion(10, ["\n"])
    assert run(rule, [1, 4, 2]) == 2 and rule.text == "Hello"
    # Several stop strings in the text at once: the first of the list is cut at, as upstream.
    rule = completion(10, [" stop", "."])
    assert run(rule, [1, 2, 3]) == 3 and rule.text == "Hello world"
    rule = completion(10, [".", "world"])
    assert run(rule, [1, 2, 3]) == 2 and rule.text == "Hello "
    rule = completion(10, ["st", " stop"])  # both appear with one token: "st" is listed first
    assert run(rule, [1, 7]) == 2 and rule.text == "Hello "
    with pytest.raises(RuntimeError, match="ended"):
        rule.push(1)


def test_completion_waits_for_the_rest_of_a_utf8_character() -> None:
    # Token 5 holds the first two bytes of the euro sign; the budget of 2 is reached with it,
    # but the completion goes on until the character is whole (as create_completion does).
    rule = completion(2)
    assert run(rule, [1, 5, 6, 2]) == 3
    assert rule.text == "Hello\u20ac"


def test_engine_default_generate_many_calls_generate_per_prompt_in_order() -> None:
    engine = ScriptedEngine(lambda prompt, system: f"answer to {prompt}. More")
    outputs = engine.generate_many(["a", "b", "c"], "sys", max_tokens=5, stop=["."], temperature=0.0)
    assert outputs == ["answer to a", "answer to b", "answer to c"]
    assert [(c.prompt, c.system_prompt, c.max_tokens, c.stop) for c in engine.history] == [
        (p, "sys", 5, (".",)) for p in "abc"
    ]


PROMPTS = [
    "Message: My order #4471 arrived damaged and I want a refund.\nCategory:",
    "The capital of France is",
    "Q: What is 12 plus 30?\nA:",
    "Write a short greeting for a customer named Ana Lopez.\n",
    "Translate to French: good morning\nFrench:",
]


# llama.cpp's float results depend on which tokens share a decode (on x86 its repacked Q4_K
# weights go through a 4-column GEMM kernel for 4 rows or more and a GEMV kernel below that:
# one call per prompt decodes one row per step, the batched path one row per running sequence).
# Where the two best next tokens are that close, greedy decoding can take the other one and
# the texts part there. Measured on Gemma 3 270M Q4_K_M: 0.2 nats at the one parting among
# these prompts; the engine's own scoring notes up to ~0.3 nats of such noise. A wrong
# sequence id, position or mask would part texts at tokens far apart, or from the start.
NEAR_TIE_NATS = 0.5


def assert_same_up_to_near_ties(engine, prompts, sequential, batched, *, min_identical: float) -> None:
    """Each pair of texts is equal, or parts at a token where the two choices' log-probs
    (scored after the common text) are within NEAR_TIE_NATS; at least ``min_identical`` equal."""
    identical = 0
    for prompt, one, many in zip(prompts, sequential, batched, strict=True):
        if one == many:
            identical += 1
            continue
        a, b = engine.token_logprobs(one, context=prompt).tokens, engine.token_logprobs(many, context=prompt).tokens
        split = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
        assert split is not None, (one, many)  # one text a prefix of the other: no tie explains that
        scores = engine.score_choices(prompt + "".join(a[:split]), [a[split], b[split]])
        assert abs(scores[0] - scores[1]) < NEAR_TIE_NATS, (one, many, a[split], b[split], scores)
    assert identical >= min_identical * len(prompts), (identical, len(prompts))


@pytest.mark.slow
@pytest.mark.parametrize("stop", [None, ["\n"]])
def test_batched_greedy_generation_matches_one_call_per_prompt(llama_engine, stop) -> None:
    sequential = [llama_engine.generate(p, max_tokens=16, stop=stop) for p in PROMPTS]
    usage_before = llama_engine.usage.completion_tokens
    batched = llama_engine.generate_many(PROMPTS, max_tokens=16, stop=stop)
    assert llama_engine.usage.completion_tokens > usage_before
    assert_same_up_to_near_ties(llama_engine, PROMPTS, sequential, batched, min_identical=0.6)
    assert llama_engine.generate_many(PROMPTS, max_tokens=16, stop=stop) == batched  # the same call, the same texts
    # A system prompt is prepended as in generate.
    few = PROMPTS[:2]
    assert_same_up_to_near_ties(
        llama_engine,
        [f"Answer briefly.\n\n{p}" for p in few],
        [llama_engine.generate(p, "Answer briefly.", max_tokens=8, stop=stop) for p in few],
        llama_engine.generate_many(few, "Answer briefly.", max_tokens=8, stop=stop),
        min_identical=0.5,
    )


@pytest.mark.slow
def test_more_prompts_than_sequences_and_cells_queue_and_keep_their_order(llama_engine) -> None:
    # 20 prompts: more than the 16 sequences; and the 512-cell context cannot hold all of them
    # with their budgets at once, so finished sequences make room for the waiting prompts.
    prompts = [f"Item {i}: the number after {i} is" for i in range(20)]
    batched = llama_engine.generate_many(prompts, max_tokens=24)
    sequential = [llama_engine.generate(p, max_tokens=24) for p in prompts]
    assert_same_up_to_near_ties(llama_engine, prompts, sequential, batched, min_identical=0.6)


@pytest.mark.slow
def test_batched_generation_leaves_scores_unchanged_and_uses_the_cache(llama_engine) -> None:
    prefix, suffixes = "Sentiment of the review.\n\n", ["Review: great.\nSentiment:"]
    choices = [" positive", " negative"]
    before = llama_engine.score_choices_batch(prefix, suffixes, choices)
    first = llama_engine.generate_many(PROMPTS[:3], max_tokens=4)
    assert (llama_engine.score_choices_batch(prefix, suffixes, choices) == before).all()
    cache = GenerationCache()
    llama_engine.cache = cache
    try:
        assert llama_engine.generate_many(PROMPTS[:3], max_tokens=4) == first
        assert (cache.hits, cache.misses) == (0, 3)
        assert llama_engine.generate_many(PROMPTS[2::-1], max_tokens=4) == first[::-1]
        assert llama_engine.generate(PROMPTS[0], max_tokens=4) == first[0]  # the same entries
        assert (cache.hits, cache.misses) == (4, 3)
    finally:
        llama_engine.cache = None
    # A prompt that does not fit: an error without its length (prompts may be private).
    with pytest.raises(EngineError, match=r"context holds \(512\)") as caught:
        llama_engine.generate_many(["Hi.", "word " * 600], max_tokens=4)
    assert "600" not in str(caught.value)
