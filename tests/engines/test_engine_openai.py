"""OpenAIEngine against the fault-injecting fake server and the real llama.cpp server."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import traceback
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from dp_textgrad._textgrad import import_textgrad
from dp_textgrad.engines.base import EngineError
from dp_textgrad.engines.openai_engine import OpenAIEngine, OpenAIEngineError, Price
from dp_textgrad.engines.ratelimit import TokenBucket

from tests.conftest_openai import LLAMA_MODEL_ALIAS, gemma_gguf_path  # noqa: F401
from tests.servers import (FaultServer, fake_logprob, free_port, fake_tokens, malformed_json, missing_fields,
                           rate_limited, server_error, slow)

SECRET = "patient 4471 was diagnosed with a rare condition"  # stands in for a private record


def make_engine(server: FaultServer, **kwargs) -> OpenAIEngine:
    options = dict(mode="completions", max_retries=3, backoff_base=0.01, backoff_max=0.05, timeout=5.0)
    options.update(kwargs)
    return OpenAIEngine("fake-model", base_url=server.base_url, **options)


def posts(server: FaultServer) -> list:
    return [r for r in server.requests if r.path.endswith("completions")]


# -- generation and request options -------------------------------------------------------
def test_completions_mode_passes_options_and_counts_usage(fault_server):
    engine = make_engine(fault_server, price=Price(1.0, 2.0))
    text = engine.generate("Say something.", temperature=0.7, seed=3, max_tokens=20, stop=["\n"])
    assert text == " answer to 14 chars"
    (request,) = posts(fault_server)
    assert request.path.endswith("/v1/completions")
    body = request.body
    assert body["model"] == "fake-model" and body["prompt"] == "Say something."
    assert (body["temperature"], body["seed"], body["max_tokens"], body["stop"]) == (0.7, 3, 20, ["\n"])
    prompt_tokens = len(fake_tokens("Say something."))
    completion_tokens = len(fake_tokens(text))
    usage = engine.usage
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, prompt_tokens, completion_tokens)
    assert usage.cost_usd == pytest.approx((prompt_tokens * 1.0 + completion_tokens * 2.0) / 1e6)
    assert usage.seconds > 0 and usage.retries == 0


def test_completions_mode_prepends_only_an_explicit_system_prompt(fault_server):
    engine = make_engine(fault_server)
    engine.generate("Q")
    engine.generate("Q", system_prompt="Be brief.")
    first, second = posts(fault_server)
    assert first.body["prompt"] == "Q"
    assert second.body["prompt"] == "Be brief.\n\nQ"
    assert "seed" not in first.body and "stop" not in first.body


def test_calls_without_max_tokens_get_the_engine_default(fault_server):
    make_engine(fault_server).generate("Q")
    make_engine(fault_server, default_max_tokens=16).generate("Q")
    make_engine(fault_server, default_max_tokens=16).generate("Q", max_tokens=3)
    assert [r.body["max_tokens"] for r in posts(fault_server)] == [256, 16, 3]


def test_chat_mode_sends_messages_with_system_prompt(fault_server):
    engine = make_engine(fault_server, mode="chat", system_prompt="Default system.")
    assert engine("Hello there") == " answer to 11 chars"
    engine.generate("Hi", system_prompt="Custom.")
    first, second = posts(fault_server)
    assert first.path.endswith("/v1/chat/completions")
    assert first.body["messages"] == [{"role": "system", "content": "Default system."},
                                      {"role": "user", "content": "Hello there"}]
    assert second.body["messages"][0] == {"role": "system", "content": "Custom."}


def test_works_inside_textgrad_blackbox_llm(fault_server):
    tg = import_textgrad()
    engine = make_engine(fault_server, mode="chat")
    model = tg.BlackboxLLM(engine, system_prompt="Answer briefly.")
    question = tg.Variable("What is 2+2?", role_description="question", requires_grad=False)
    answer = model(question)
    assert answer.value == " answer to 12 chars"
    assert posts(fault_server)[0].body["messages"][0]["content"] == "Answer briefly."


# -- retries and errors --------------------------------------------------------------------
def test_429_with_retry_after_then_success(fault_server):
    fault_server.script(rate_limited(retry_after=1), rate_limited(retry_after=None))
    engine = make_engine(fault_server, backoff_base=0.01)
    start = time.perf_counter()
    assert engine.generate("hello") == " answer to 5 chars"
    elapsed = time.perf_counter() - start
    assert len(posts(fault_server)) == 3
    assert engine.usage.retries == 2 and engine.usage.calls == 1
    assert elapsed >= 0.95  # Retry-After: 1 honoured, not the 10 ms back-off
    assert elapsed < 3.0


def test_retry_after_is_capped(fault_server):
    fault_server.script(rate_limited(retry_after=3600))
    engine = make_engine(fault_server, retry_after_max=0.2)
    start = time.perf_counter()
    engine.generate("hello")
    assert 0.15 <= time.perf_counter() - start < 2.0


def test_persistent_500_raises_one_error_without_prompt_text(fault_server):
    # The server quotes the prompt in its error body, as some servers do.
    fault_server.script(*[server_error(500, message=f"failed on: {SECRET}")] * 4)
    engine = make_engine(fault_server, max_retries=3)
    with pytest.raises(OpenAIEngineError) as info:
        engine.generate(f"Classify: {SECRET}")
    error = info.value
    assert isinstance(error, EngineError)
    assert error.status_code == 500 and error.attempts == 4
    message = str(error)
    assert "fake-model" in message and "500" in message and "4 attempt" in message
    rendered = "".join(traceback.format_exception(error))
    assert SECRET not in rendered and "4471" not in rendered
    assert len(posts(fault_server)) == 4
    assert engine.usage.retries == 3 and engine.usage.calls == 0


def test_client_errors_are_not_retried(fault_server):
    fault_server.script(server_error(400, message=SECRET))
    engine = make_engine(fault_server)
    with pytest.raises(OpenAIEngineError, match="HTTP 400") as info:
        engine.generate(SECRET)
    assert SECRET not in str(info.value)
    assert len(posts(fault_server)) == 1 and info.value.attempts == 1


def test_slow_response_times_out_then_recovers(fault_server):
    fault_server.script(slow(1.5))
    engine = make_engine(fault_server, timeout=0.3, max_retries=1)
    start = time.perf_counter()
    assert engine.generate("hi") == " answer to 2 chars"
    assert time.perf_counter() - start < 1.4  # the second attempt did not wait for the first
    assert engine.usage.retries == 1


def test_slow_responses_exhaust_retries_with_a_timeout_error(fault_server):
    fault_server.script(slow(1.5), slow(1.5))
    engine = make_engine(fault_server, timeout=0.3, max_retries=1)
    with pytest.raises(OpenAIEngineError, match="timed out after 0.3 s") as info:
        engine.generate(SECRET)
    assert info.value.attempts == 2 and info.value.status_code is None
    assert SECRET not in str(info.value)


def test_connection_refused_is_an_engine_error():
    engine = OpenAIEngine("m", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1,
                          backoff_base=0.01, timeout=2)
    with pytest.raises(OpenAIEngineError, match="could not connect") as info:
        engine.generate(SECRET)
    assert info.value.attempts == 2 and engine.usage.retries == 1


def test_malformed_json_is_an_engine_error_and_not_retried(fault_server):
    fault_server.script(malformed_json())
    engine = make_engine(fault_server)
    with pytest.raises(OpenAIEngineError, match="not valid JSON"):
        engine.generate("hi")
    assert len(posts(fault_server)) == 1


def test_missing_fields_are_named(fault_server):
    fault_server.script(missing_fields())
    engine = make_engine(fault_server)
    with pytest.raises(OpenAIEngineError, match=r"choices\.0\.text"):
        engine.generate("hi")


# -- concurrency and rate limits -------------------------------------------------------------
def test_generate_many_overlaps_requests_and_keeps_order():
    with FaultServer(latency=0.4, reply=lambda p: f"<{p}>") as server:
        engine = make_engine(server, max_concurrency=8)
        prompts = [f"p{i}" for i in range(16)]
        start = time.perf_counter()
        out = engine.generate_many(prompts)
        elapsed = time.perf_counter() - start
    assert out == [f"<p{i}>" for i in range(16)]
    assert 6 <= server.max_in_flight <= 8  # 8 unless the machine is very busy
    assert elapsed < 16 * 0.4 / 3  # sequential would take 6.4 s


def test_max_concurrency_bounds_all_threads_together():
    with FaultServer(latency=0.1) as server:
        engine = make_engine(server, max_concurrency=3)
        threads = [threading.Thread(target=engine.generate_many, args=([f"x{i}"] * 6,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(posts(server)) == 18
    assert 2 <= server.max_in_flight <= 3


def test_generate_many_raises_the_first_failure(fault_server):
    fault_server.script(server_error(401))
    engine = make_engine(fault_server, max_concurrency=1)
    with pytest.raises(OpenAIEngineError, match="HTTP 401.*api_key"):
        engine.generate_many(["a", "b", "c"])


def test_rate_limit_spaces_requests(fault_server):
    engine = make_engine(fault_server, max_concurrency=8, requests_per_minute=600)  # one per 0.1 s
    start = time.perf_counter()
    engine.generate_many([f"q{i}" for i in range(6)])
    elapsed = time.perf_counter() - start
    starts = sorted(r.started for r in posts(fault_server))
    assert elapsed >= 0.45
    assert starts[-1] - starts[0] >= 0.4  # six requests spread over five 0.1 s intervals
    assert np.diff(starts).min() >= 0.03  # never two at once


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_token_bucket_burst_then_steady_rate():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, capacity=3, clock=clock, sleep=clock.sleep)
    waits = [bucket.acquire() for _ in range(7)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3:] == pytest.approx([0.5] * 4)
    assert clock.now == pytest.approx(2.0)
    clock.now += 10.0  # idle: the bucket refills to capacity, not beyond
    assert [bucket.acquire() for _ in range(4)] == pytest.approx([0, 0, 0, 0.5])


def test_token_bucket_serves_concurrent_waiters_at_the_rate():
    bucket = TokenBucket(rate=20.0, capacity=1)
    stamps: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        bucket.acquire()
        with lock:
            stamps.append(time.perf_counter())

    threads = [threading.Thread(target=take) for _ in range(6)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(stamps) - start >= 5 / 20.0 - 0.01


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf])
def test_rate_limit_rejects_bad_rates(bad):
    with pytest.raises(ValueError, match="requests_per_minute"):
        TokenBucket.per_minute(bad)


# -- cache ---------------------------------------------------------------------------------------
def test_cache_is_off_by_default(fault_server):
    engine = make_engine(fault_server)
    engine.generate("same")
    engine.generate("same")
    assert len(posts(fault_server)) == 2 and engine.cache_hits == 0


def test_cache_serves_deterministic_calls_only(fault_server):
    engine = make_engine(fault_server, cache=True)
    assert engine.generate("same") == engine.generate("same")
    assert len(posts(fault_server)) == 1 and engine.cache_hits == 1
    assert engine.usage.calls == 1  # a hit is not a call
    # Sampling without a seed: always a fresh request.
    engine.generate("same", temperature=0.8)
    engine.generate("same", temperature=0.8)
    assert len(posts(fault_server)) == 3
    # Sampling with a seed is reproducible, hence cacheable.
    engine.generate("same", temperature=0.8, seed=1)
    engine.generate("same", temperature=0.8, seed=1)
    assert len(posts(fault_server)) == 4
    # Every field of the key matters.
    engine.generate("same", temperature=0.8, seed=2)
    engine.generate("same", max_tokens=7)
    engine.generate("same", stop=["."])
    engine.generate("same", system_prompt="S")
    engine.generate("other")
    assert len(posts(fault_server)) == 9
    assert engine.cache_hits == 2


def test_cache_is_bounded(fault_server):
    engine = make_engine(fault_server, cache=2)
    for prompt in ["a", "b", "c", "a"]:
        engine.generate(prompt)
    assert engine.cache_size == 2
    assert len(posts(fault_server)) == 4  # "a" was evicted by "c"


# -- scoring: echo ----------------------------------------------------------------------------
PREFS = {"positive": -0.2, "negative": -3.0, "very": -1.1}


def expected_choice_logprob(choice: str) -> float:
    return sum(fake_logprob(t, PREFS) for t in fake_tokens(choice))


def test_score_choices_batch_sums_choice_tokens_from_echo():
    with FaultServer(preferences=PREFS) as server:
        engine = make_engine(server, max_concurrency=4, scoring="echo")
        suffixes = [" great film.\nLabel:", " dull film.\nLabel:"]
        choices = [" positive", " negative", " very positive"]
        scores = engine.score_choices_batch("Review:", suffixes, choices)
    assert scores.shape == (2, 3)
    expected = [expected_choice_logprob(c) for c in choices]
    np.testing.assert_allclose(scores, [expected, expected])
    assert scores[0, 2] == pytest.approx(-1.1 - 0.2)  # multi-token: summed
    sent = {r.body["prompt"] for r in posts(server)}
    assert sent == {"Review:" + s + c for s in suffixes for c in choices}
    assert all(r.body["echo"] is True and r.body["max_tokens"] == 1 and r.body["logprobs"] >= 1
               for r in posts(server))


def test_a_token_straddling_context_and_choice_counts_with_the_choice():
    with FaultServer() as server:
        engine = make_engine(server, scoring="echo")
        score = engine.score_choices("Label: pos", ["itive"])
    # The fake tokenizer reads "Label: positive" as ["Label", ":", " positive"].
    assert score[0] == pytest.approx(fake_logprob(" positive"))


def test_score_choices_rejects_empty_choices(fault_server):
    engine = make_engine(fault_server)
    with pytest.raises(ValueError, match="choices"):
        engine.score_choices("x", [])
    with pytest.raises(ValueError, match="choices"):
        engine.score_choices("x", ["a", ""])


def test_token_logprobs_over_the_text_span():
    with FaultServer(preferences=PREFS) as server:
        engine = make_engine(server)
        result = engine.token_logprobs(" very positive review", context="It was a")
    assert result.tokens == [" very", " positive", " review"]
    np.testing.assert_allclose(result.logprobs, [fake_logprob(t, PREFS) for t in result.tokens])
    assert result.vocab_mean is None and result.vocab_std is None
    assert len(result.top_alternatives) == 3
    assert (" very", -1.1) in result.top_alternatives[0]


def test_token_logprobs_of_empty_text_is_empty_without_a_request(fault_server):
    result = make_engine(fault_server).token_logprobs("", context="Review:")
    assert result.tokens == [] and result.logprobs.shape == (0,)
    assert posts(fault_server) == []


def test_an_over_long_prompt_fails_without_turning_echo_off():
    labels = [" yes", " yes sir"]  # one first token: scoring="auto" scores them through echo
    with FaultServer(context_limit=50) as server:
        engine = make_engine(server)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "falls back" warning either
            with pytest.raises(OpenAIEngineError, match="HTTP 400.*context_length_exceeded") as info:
                engine.score_choices("Note: " + " ".join([SECRET] * 20), labels)
            # the secret's digits may appear in the server's random port: look past the URL
            message = str(info.value).replace(server.base_url, "<server>")
            assert SECRET not in message and "4471" not in message
            server.reset()
            engine.score_choices("Short note.", labels)
        assert [r.body.get("echo") for r in posts(server)] == [True, True]


def test_token_logprobs_first_prompt_token_is_nan(fault_server):
    engine = make_engine(fault_server)
    result = engine.token_logprobs("Hello world")
    assert math.isnan(result.logprobs[0]) and result.logprobs[1] == pytest.approx(fake_logprob(" world"))


def test_scoring_is_cached_when_enabled():
    with FaultServer(preferences=PREFS) as server:
        engine = make_engine(server, cache=True, scoring="echo")
        first = engine.score_choices_batch("Review: ok.", [""], [" positive", " negative"])
        second = engine.score_choices_batch("Review: ok.", [""], [" positive", " negative"])
    np.testing.assert_array_equal(first, second)
    assert len(posts(server)) == 2


# -- scoring: fallbacks without echo --------------------------------------------------------------
TOP = {" positive": -0.5, " negative": -1.6, "positive": -3.0, " neutral": -3.5}


def test_chat_mode_falls_back_to_first_token_top_logprobs():
    with FaultServer(first_token_top=TOP) as server:
        engine = make_engine(server, mode="chat")
        with pytest.warns(RuntimeWarning, match="choice #2 is not among the top"):
            scores = engine.score_choices_batch("Review: fine.\nLabel:", ["", " Really."],
                                                [" positive", "negative", "mixed"])
        request = posts(server)[0]
    assert scores.shape == (2, 3)
    assert scores[0, 0] == pytest.approx(np.logaddexp(-0.5, -3.0))  # " positive" and "positive" merged
    assert scores[0, 1] == pytest.approx(-1.6)
    probs = np.exp(list(TOP.values()))
    assert scores[0, 2] == pytest.approx(math.log(min(probs.min(), 1 - probs.sum())))
    assert scores[0, 2] < scores[0, 1]
    assert len(posts(server)) == 2  # one request per context, not per choice
    assert request.body["logprobs"] is True and request.body["top_logprobs"] == 20
    assert request.body["max_tokens"] == 1


def test_chat_mode_refuses_exact_scoring_and_token_logprobs(fault_server):
    strict = make_engine(fault_server, mode="chat", scoring="echo")
    with pytest.raises(OpenAIEngineError, match="mode='completions'"):
        strict.score_choices("x", ["a"])
    with pytest.raises(OpenAIEngineError, match="token_logprobs needs"):
        make_engine(fault_server, mode="chat").token_logprobs("abc")
    assert posts(fault_server) == []


def test_server_without_echo_falls_back_once_with_a_warning():
    with FaultServer(echo=False, first_token_top=TOP) as server:
        engine = make_engine(server, mode="completions")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scores = engine.score_choices("Label:", [" positive", " negative"])
            again = engine.score_choices("Label:", [" positive", " negative"])
        messages = [str(w.message) for w in caught]
    assert sum("no prompt log-probs" in m for m in messages) == 1
    np.testing.assert_allclose(scores, [np.logaddexp(-0.5, -3.0), -1.6])
    np.testing.assert_allclose(again, scores)
    # After learning the server has no echo, no more echo requests are sent. The two
    # choices are requested concurrently, so one or both may try echo before it learns.
    echo = [bool(r.body.get("echo")) for r in posts(server)]
    n_echo = sum(echo)
    assert 1 <= n_echo <= 2 and echo[:n_echo] == [True] * n_echo
    assert echo[n_echo:] == [False] * (len(echo) - n_echo) and len(echo) - n_echo >= 2


def test_server_without_echo_and_strict_echo_scoring_raises():
    with FaultServer(echo=False) as server:
        engine = make_engine(server, scoring="echo")
        with pytest.raises(OpenAIEngineError, match="echo"):
            engine.score_choices("Label:", [" positive"])
        with pytest.raises(OpenAIEngineError, match="token_logprobs needs"):
            engine.token_logprobs("abc")


def test_echo_rejected_with_400_falls_back_in_auto_mode():
    with FaultServer(first_token_top=TOP) as server:
        server.script(server_error(400))
        engine = make_engine(server, max_concurrency=1)
        with pytest.warns(RuntimeWarning, match="no prompt log-probs"):
            scores = engine.score_choices("Label:", [" negative"])
        sent = [(r.body.get("echo"), r.body.get("logprobs")) for r in posts(server)]
    assert scores[0] == pytest.approx(-1.6)
    # The refused echo, the same prompt without echo (accepted: echo was the problem), the fallback.
    assert sent == [(True, 5), (None, None), (None, 5)]


def test_first_token_scoring_is_forced_by_option():
    with FaultServer(first_token_top=TOP) as server:
        engine = make_engine(server, scoring="first_token")
        scores = engine.score_choices("Label:", [" positive", " negative"])
        body = posts(server)[0].body
    np.testing.assert_allclose(scores, [np.logaddexp(-0.5, -3.0), -1.6])
    assert not body.get("echo") and body["logprobs"] == 5


# -- construction -----------------------------------------------------------------------------
def test_api_key_required_for_openai_but_not_local(monkeypatch, fault_server):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIEngine("gpt-4o-mini")
    engine = make_engine(fault_server)  # a local server: placeholder key
    assert engine.generate("x")


def test_repr_and_errors_hide_credentials(fault_server):
    url = fault_server.base_url.replace("http://", "http://user:hunter2@")
    engine = OpenAIEngine("m", base_url=url, api_key="sk-very-secret", max_retries=0)
    fault_server.script(server_error(503))
    with pytest.raises(OpenAIEngineError) as info:
        engine.generate("x")
    for text in (repr(engine), str(info.value)):
        assert "hunter2" not in text and "sk-very-secret" not in text


@pytest.mark.parametrize(
    "kwargs, field",
    [({"mode": "edit"}, "mode"), ({"max_concurrency": 0}, "max_concurrency"), ({"timeout": 0}, "timeout"),
     ({"max_retries": -1}, "max_retries"), ({"scoring": "maybe"}, "scoring"),
     ({"requests_per_minute": 0}, "requests_per_minute"), ({"cache": -3}, "cache")],
)
def test_bad_options_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        OpenAIEngine("m", base_url="http://127.0.0.1:9/v1", **kwargs)


# -- end to end: the real llama.cpp server with Gemma 3 270M -------------------------------------
# llama-cpp-python's server computes echoed log-probs with a Python sort of the whole
# vocabulary (262,144 tokens for Gemma 3) per prompt token, i.e. roughly 0.2-2 s per
# token on a small CPU. So the prompts are short and the expensive calls are made once,
# in a module fixture, and checked by several tests.
LLAMA_PREFIX = "Review:"
LLAMA_SUFFIXES = [" I loved it! Sentiment:", " I hated it! Sentiment:"]
LLAMA_CHOICES = [" positive", " very negative"]  # the second is several tokens


@pytest.fixture(scope="module")
def llama_run(llama_server):
    tg = import_textgrad()
    engine = OpenAIEngine(LLAMA_MODEL_ALIAS, base_url=llama_server.base_url, mode="completions", scoring="echo",
                          cache=True, max_concurrency=2, timeout=300, max_retries=1, default_max_tokens=8)
    run = SimpleNamespace(engine=engine)
    run.scores = engine.score_choices_batch(LLAMA_PREFIX, LLAMA_SUFFIXES, LLAMA_CHOICES)
    run.usage_scoring = dataclasses.replace(engine.usage)
    # Spans of prompts already scored: the echoes come from the cache, not the server.
    run.choice_tokens = engine.token_logprobs(LLAMA_CHOICES[1], LLAMA_PREFIX + LLAMA_SUFFIXES[1])
    run.review_tokens = engine.token_logprobs(LLAMA_SUFFIXES[0] + LLAMA_CHOICES[0], LLAMA_PREFIX)
    run.usage_cached = dataclasses.replace(engine.usage)
    run.text = engine.generate("The capital of France is", max_tokens=4)
    run.usage_generate = dataclasses.replace(engine.usage)
    question = tg.Variable("Q: What is the capital of France?\nA:", role_description="question",
                           requires_grad=False)
    run.answer = tg.BlackboxLLM(engine)(question)
    yield run
    engine.close()


@pytest.mark.slow
def test_llama_generates_text_and_counts_usage(llama_run):
    assert isinstance(llama_run.text, str) and llama_run.text.strip()
    before, after = llama_run.usage_cached, llama_run.usage_generate
    assert after.calls - before.calls == 1
    assert 1 <= after.completion_tokens - before.completion_tokens <= 4
    assert after.prompt_tokens > before.prompt_tokens and after.seconds > before.seconds


@pytest.mark.slow
def test_llama_label_preferences_are_consistent(llama_run):
    scores = llama_run.scores
    assert scores.shape == (2, 2) and np.all(np.isfinite(scores)) and np.all(scores < 0)
    loved, hated = scores
    # "positive" gains against "very negative" on the loved review relative to the hated one.
    assert loved[0] - loved[1] > hated[0] - hated[1]
    assert hated[1] > loved[1]
    usage = llama_run.usage_scoring
    assert usage.calls == 4 and usage.completion_tokens == 4 and usage.prompt_tokens >= 4 * 8


@pytest.mark.slow
def test_llama_scores_match_in_process_llama_cpp(llama_run):
    """Every score, multi-token choices included, equals log p computed directly with llama_cpp."""
    from llama_cpp import Llama

    # A small context: with logits_all, llama_cpp keeps n_ctx x 262,144 floats of scores.
    llm = Llama(model_path=str(gemma_gguf_path()), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    try:
        for i, suffix in enumerate(LLAMA_SUFFIXES):
            context = LLAMA_PREFIX + suffix
            n_context = len(llm.tokenize(context.encode(), add_bos=True))
            for j, choice in enumerate(LLAMA_CHOICES):
                ids = llm.tokenize((context + choice).encode(), add_bos=True)
                llm.reset()
                llm.eval(ids)
                logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
                logprobs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
                direct = sum(logprobs[t - 1, ids[t]] for t in range(n_context, len(ids)))
                # llama.cpp's floats depend on how the server splits a prompt against its
                # prefix cache (up to ~0.2 nats seen); a wrong token span is off by nats.
                assert llama_run.scores[i, j] == pytest.approx(direct, abs=0.5), (i, j)
    finally:
        llm.close()


@pytest.mark.slow
def test_llama_multi_token_choice_is_the_sum_of_its_token_logprobs(llama_run):
    tokens = llama_run.choice_tokens
    assert "".join(tokens.tokens) == LLAMA_CHOICES[1] and len(tokens.tokens) >= 2
    assert tokens.logprobs.sum() == pytest.approx(llama_run.scores[1, 1])
    assert llama_run.usage_cached.calls == llama_run.usage_scoring.calls  # a cache hit
    assert llama_run.engine.cache_hits >= 1


@pytest.mark.slow
def test_llama_token_logprobs(llama_run):
    result = llama_run.review_tokens
    assert "".join(result.tokens) == LLAMA_SUFFIXES[0] + LLAMA_CHOICES[0]
    assert result.logprobs[-1] == pytest.approx(llama_run.scores[0, 0])
    assert np.all(np.isfinite(result.logprobs)) and np.all(result.logprobs <= 0)
    assert len(result.top_alternatives) == len(result.tokens)
    for logprob, alternatives in zip(result.logprobs, result.top_alternatives):
        values = [value for _, value in alternatives]
        assert 1 <= len(values) <= 5 and values == sorted(values, reverse=True)
        assert values[0] >= logprob - 1e-6
    assert result.vocab_mean is None and result.vocab_std is None


@pytest.mark.slow
def test_llama_inside_textgrad_blackbox_llm(llama_run):
    assert isinstance(llama_run.answer.value, str) and llama_run.answer.value.strip()
    assert llama_run.engine.usage.calls == llama_run.usage_generate.calls + 1
