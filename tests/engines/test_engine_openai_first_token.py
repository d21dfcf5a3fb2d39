"""OpenAIEngine scores labels by their first token where that is exact, and echoes only where needed.

Against llama.cpp's own server, echoed prompt log-probs cost a sort of the whole vocabulary
per prompt token (10-11 s for a 24-token prompt, against 0.4-0.6 s for a plain completion
with top log-probs). So with ``scoring="auto"`` labels whose first tokens differ (learned from
the server's tokenizer, or a short echo of the public labels) are scored from the first
generated token's top log-probs, one plain request per record, and echo is used only when
labels share a first token. A preflight whose echo cannot answer fails in seconds, naming
``engine.options.scoring``. The fake server records every request: the tests assert on that
log, not on wall time.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest

from dp_textgrad.dp_es.preflight import PreflightError, preflight
from dp_textgrad.engines.openai_engine import OpenAIEngine, OpenAIEngineError
from dp_textgrad.tasks.synthetic import make_support_task
from tests.conftest_openai import LLAMA_MODEL_ALIAS
from tests.servers import FaultServer, fake_logprob, fake_tokens

# The first generated token's top log-probs (the first key is the generated token).
TOP = {" positive": -1.0, " negative": -1.6, " very": -2.0, " neutral": -2.5, "\n": -3.0, " the": -3.5}
LABELS = [" positive", " negative", " neutral", " very mixed", " unclear"]  # five different first tokens
SUFFIXES = [" great film.\nLabel:", " dull film.\nLabel:", " so-so.\nLabel:"]


def make_engine(server: FaultServer, **kwargs) -> OpenAIEngine:
    options = dict(mode="completions", max_retries=5, backoff_base=0.01, backoff_max=0.05, timeout=30.0)
    options.update(kwargs)
    return OpenAIEngine("fake-model", base_url=server.base_url, **options)


def completions(server: FaultServer) -> list:
    return [r for r in server.requests if r.path.endswith("/completions")]


def echoed(server: FaultServer) -> list:
    return [r for r in completions(server) if r.body.get("echo")]


def test_auto_scores_distinct_first_tokens_from_one_plain_request_per_record():
    # Echo is slow here (as on llama-cpp-python's server): it must not be asked for at all.
    with FaultServer(tokenizer=True, first_token_top=TOP, echo_delay=5.0) as server:
        engine = make_engine(server, timeout=2.0)
        with pytest.warns(RuntimeWarning, match="choice #4 is not among the top 5"):
            scores = engine.score_choices_batch("Review:", SUFFIXES, LABELS)
        sent = completions(server)
        tokenizer_calls = [r.path for r in server.requests if "/extras/" in r.path]
    assert echoed(server) == []
    assert sorted(r.body["prompt"] for r in sent) == sorted("Review:" + s for s in SUFFIXES)  # one per record
    assert all(r.body["max_tokens"] == 1 and r.body["logprobs"] == 5 for r in sent)  # k >= number of labels
    assert tokenizer_calls and all(p.endswith(("/extras/tokenize", "/extras/detokenize")) for p in tokenizer_calls)
    # Each label reads its own first token; " unclear" is not among the top 5: the floor
    # log min(p_5, 1 - sum of the top 5) = log p_5 here, below every listed label.
    floor = -3.0
    assert 1 - sum(math.exp(v) for v in list(TOP.values())[:5]) > math.exp(floor)
    expected = [-1.0, -1.6, -2.5, -2.0, floor]
    np.testing.assert_allclose(scores, [expected] * len(SUFFIXES))
    assert engine.label_first_tokens(LABELS) == (" positive", " negative", " neutral", " very", " unclear")


def test_first_tokens_are_learned_once_per_label_set():
    with FaultServer(tokenizer=True, first_token_top=TOP) as server:
        engine = make_engine(server)
        engine.score_choices_batch("Review:", SUFFIXES[:1], LABELS[:2])
        first = len([r for r in server.requests if "/extras/" in r.path])
        engine.score_choices_batch("Review:", SUFFIXES[1:], LABELS[:2])
        again = len([r for r in server.requests if "/extras/" in r.path])
    assert first > 0 and again == first
    assert echoed(server) == []


def test_without_a_tokenizer_a_short_echo_of_the_public_labels_decides():
    with FaultServer(first_token_top=TOP) as server:  # no tokenizer endpoint: 400 there
        engine = make_engine(server)
        scores = engine.score_choices_batch("Review:", SUFFIXES, LABELS[:3])
    probes = echoed(server)
    assert sorted(r.body["prompt"] for r in probes) == sorted("Answer:" + label for label in LABELS[:3])
    assert all("Review:" not in r.body["prompt"] for r in probes)  # public labels only, never a record
    assert len(completions(server)) == len(probes) + len(SUFFIXES)
    np.testing.assert_allclose(scores, [[-1.0, -1.6, -2.5]] * len(SUFFIXES))


PREFS = {"very": -1.1, "good": -0.3, "bad": -2.0}


def test_labels_sharing_a_first_token_still_use_echo():
    labels = [" very good", " very bad"]
    with FaultServer(tokenizer=True, preferences=PREFS, first_token_top=TOP) as server:
        engine = make_engine(server)
        scores = engine.score_choices_batch("Review:", SUFFIXES[:2], labels)
    expected = [sum(fake_logprob(t, PREFS) for t in fake_tokens(label)) for label in labels]
    np.testing.assert_allclose(scores, [expected] * 2)  # the whole label, summed over its tokens
    scoring = completions(server)
    # One echo of public text first (does this server echo?), then 2 records x 2 labels.
    assert scoring[0].body["prompt"] == "Answer: very good"
    assert len(scoring) == 5 and all(r.body.get("echo") is True for r in scoring)


def test_scoring_echo_keeps_echo_for_distinct_first_tokens():
    with FaultServer(tokenizer=True, preferences=PREFS, first_token_top=TOP) as server:
        engine = make_engine(server, scoring="echo")
        scores = engine.score_choices_batch("Review:", SUFFIXES[:1], [" good", " bad"])
    np.testing.assert_allclose(scores, [[-0.3, -2.0]])
    assert len(echoed(server)) == 2 and len(completions(server)) == 2
    assert not [r for r in server.requests if "/extras/" in r.path]  # nothing to decide


def test_top_logprobs_cover_the_labels_within_the_api_cap():
    engine = OpenAIEngine("m", base_url="http://127.0.0.1:9/v1", mode="completions")
    assert (engine.top_k_for(2), engine.top_k_for(7), engine.top_k_for(30)) == (5, 7, 20)
    openai = OpenAIEngine("m", base_url="https://api.openai.com/v1", api_key="sk-test", mode="completions")
    assert openai.top_k_for(7) == 5  # OpenAI's /v1/completions allows 5
    engine.close()
    openai.close()


# -- the preflight: a probe that cannot work fails in seconds, naming the setting ---------------
def test_preflight_with_broken_echo_fails_at_once_naming_the_option():
    task = make_support_task(n_private=20, n_test=5)
    n_labels = len(task.labels)
    # Echo answers after 3 s; the engine waits 2 s per attempt and would retry five times.
    with FaultServer(echo_delay=3.0) as server:
        engine = make_engine(server, scoring="echo", timeout=2.0, probe_timeout=0.5)
        with pytest.raises(PreflightError) as info:
            preflight(engine, task, task.seed_prompt, 16)
        sent = echoed(server)
    message = str(info.value)
    assert "engine.options.scoring: first_token" in message and "before anything was charged" in message
    assert "timed out after 0.5 s" in message
    assert len(sent) == n_labels  # one attempt per label, no retries
    assert engine.usage.retries == 0
    engine.close()


def test_preflight_with_labels_sharing_a_first_token_and_broken_echo_says_why():
    task = make_support_task(n_private=20, n_test=5)
    task = dataclasses.replace(task, verbalizers={label: " the " + label for label in task.labels})
    with FaultServer(tokenizer=True, echo_delay=3.0) as server:
        engine = make_engine(server, timeout=2.0, probe_timeout=0.5)
        with pytest.raises(PreflightError, match="share their first token") as info:
            preflight(engine, task, task.seed_prompt, 16)
        sent = echoed(server)
    assert "engine.options.scoring: first_token" in str(info.value)
    # One echo of public text decides whether the server echoes (it times out: no retry).
    assert len(sent) == 1 and sent[0].body["prompt"].startswith("Answer: the ")
    engine.close()


def test_preflight_without_tokenizer_and_with_broken_echo_fails_at_once():
    task = make_support_task(n_private=20, n_test=5)
    with FaultServer(echo_delay=3.0) as server:  # auto must echo the labels to learn their tokens
        engine = make_engine(server, timeout=2.0, probe_timeout=0.5)
        with pytest.raises(PreflightError, match="could not learn the labels' first tokens") as info:
            preflight(engine, task, task.seed_prompt, 16)
        sent = echoed(server)
    assert "engine.options.scoring: first_token" in str(info.value)
    assert len(sent) == len(task.labels) and all(r.body["prompt"].startswith("Answer:") for r in sent)
    engine.close()


def test_preflight_passes_through_first_token_scoring_with_slow_echo():
    task = make_support_task(n_private=20, n_test=5)
    with FaultServer(tokenizer=True, echo_delay=3.0) as server:
        engine = make_engine(server, timeout=2.0, probe_timeout=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fake's top tokens are not the labels: floors
            preflight(engine, task, task.seed_prompt, 16)
    assert echoed(server) == [] and len(completions(server)) == 1
    engine.close()


def test_chat_mode_with_scoring_echo_is_not_blamed_on_a_slow_server():
    task = make_support_task(n_private=20, n_test=5)
    with FaultServer() as server:
        engine = make_engine(server, mode="chat", scoring="echo")
        with pytest.raises(PreflightError, match="mode='completions'") as info:
            preflight(engine, task, task.seed_prompt, 16)
    assert "did not answer" not in str(info.value)
    engine.close()


# -- the real llama.cpp server ----------------------------------------------------------------------
LLAMA_PREFIX = ("Classify the sentiment of each review as positive or negative.\n\n"
                "Review: A delight.\nSentiment: positive\n\nReview: A bore.\nSentiment: negative\n\n")
LLAMA_RECORDS = ["Review: I loved it, wonderful!\nSentiment:", "Review: I hated it, awful!\nSentiment:",
                 "Review: Great fun.\nSentiment:"]


@pytest.mark.slow
def test_llama_server_scores_a_two_label_task_by_first_token(llama_server):
    """llama-cpp-python's server: its tokenizer says " positive" / " negative" start differently,
    so each record costs one plain completion with top log-probs, and no echo; each score is
    the model's log p(label's first token | prompt + record), as llama.cpp computes it in-process."""
    from llama_cpp import Llama

    from tests.conftest_openai import gemma_gguf_path

    engine = OpenAIEngine(LLAMA_MODEL_ALIAS, base_url=llama_server.base_url, mode="completions",
                          max_concurrency=2, timeout=120, max_retries=1)
    labels = [" positive", " negative"]
    try:
        first = engine.label_first_tokens(labels)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no floor: both labels are among the top tokens
            scores = engine.score_choices_batch(LLAMA_PREFIX, LLAMA_RECORDS, labels)
        calls = engine.usage.calls
    finally:
        engine.close()
    assert first == (" positive", " negative")
    assert calls == len(LLAMA_RECORDS)  # one plain request per record (the tokenizer is not a completion)
    assert scores.shape == (3, 2) and np.all(np.isfinite(scores)) and np.all(scores <= 0)
    loved, hated, fun = scores
    assert loved[0] > loved[1] and hated[1] > hated[0] and fun[0] > fun[1]
    # The same number computed directly (a small context: logits_all keeps n_ctx x 262,144 floats).
    llm = Llama(model_path=str(gemma_gguf_path()), n_ctx=128, logits_all=True, verbose=False, n_threads=1)
    try:
        ids = llm.tokenize((LLAMA_PREFIX + LLAMA_RECORDS[0]).encode(), add_bos=True)
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[len(ids) - 1], dtype=np.float64)
        logprobs = logits - np.logaddexp.reduce(logits)
        for j, label in enumerate(labels):
            token = llm.tokenize(label.encode(), add_bos=False)[0]
            assert scores[0, j] == pytest.approx(logprobs[token], abs=0.5), label
    finally:
        llm.close()
