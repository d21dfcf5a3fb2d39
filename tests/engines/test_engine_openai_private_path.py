"""OpenAIEngine on the private path: generation one request per record, and a scoring route that
is fixed from public inputs and never changed by a record.

Under ``scoring="auto"`` the route of a label set (echo, first token, approximation) is decided
the first time the set is scored (the preflight's public probe, before any charge) from the
labels, the server's tokenizer and echoes of public text. An echo that fails on a record (a
long record refused with 400/422, say) raises an error; it must not turn echo off for the
records after it, since a private record would then choose how other records are scored.
"""

from __future__ import annotations

import re

import warnings
from typing import Any

import numpy as np
import pytest

from dp_textgrad.engines.openai_engine import OpenAIEngine, OpenAIEngineError
from tests.servers import FaultServer, PromptTooLong, fake_logprob, fake_tokens

SECRET = "patient 4471 was diagnosed with a rare condition"  # stands in for a private record
LABELS = [" very good", " very bad"]  # one first token: scoring="auto" needs echo
PREFIX = "Rate the review.\n\n"
SHORT = ["Review: fine.\nLabel:", "Review: dull.\nLabel:"]
LONG = "Review: " + " ".join([SECRET] * 12) + "\nLabel:"
ECHO_LIMIT = 200  # characters: this server refuses echo (not plain completions) above it


class EchoLimitServer(FaultServer):
    """A server whose echo refuses long prompts (HTTP 400) while plain completions accept them:
    the case where a record's length could decide whether echo "works"."""

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("echo") and len(body.get("prompt", "")) > ECHO_LIMIT:
            raise PromptTooLong(f"echo with logprobs is limited to {ECHO_LIMIT} characters: {body['prompt'][:80]}")
        return super().answer(path, body)


class EchoDropServer(FaultServer):
    """A server that answers an echo of a prompt holding the secret without prompt log-probs."""

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("echo") and SECRET in body.get("prompt", ""):
            body = {**body, "echo": False}
        return super().answer(path, body)


def make_engine(server: FaultServer, **kwargs: Any) -> OpenAIEngine:
    options: dict[str, Any] = dict(mode="completions", max_retries=1, backoff_base=0.01, backoff_max=0.05,
                                   timeout=10.0)
    options.update(kwargs)
    return OpenAIEngine("fake-model", base_url=server.base_url, **options)


def wait_until_quiet(server: FaultServer, quiet: float = 0.5, limit: float = 10.0) -> None:
    """Wait until the server has had no new request for ``quiet`` seconds (a request still in
    flight when an error was raised must not be counted after a reset; seen under load)."""
    import time

    deadline = time.monotonic() + limit
    seen, since = len(server.requests), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if len(server.requests) != seen:
            seen, since = len(server.requests), time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def completions(server: FaultServer) -> list:
    return [r for r in server.requests if r.path.endswith("completions")]


def expected_echo_scores(n_records: int) -> np.ndarray:
    row = [sum(fake_logprob(t) for t in fake_tokens(label)) for label in LABELS]
    return np.array([row] * n_records)


@pytest.mark.parametrize("server_class", [EchoLimitServer, EchoDropServer])
def test_an_echo_failing_on_a_record_raises_and_keeps_echo_for_later_records(server_class) -> None:
    with server_class() as server:
        engine = make_engine(server, max_concurrency=2)
        # The preflight's public probe fixes the route (labels echoed after a public context).
        np.testing.assert_allclose(engine.probe_scores(PREFIX, SHORT[:1], LABELS), expected_echo_scores(1))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "falls back" warning either
            with pytest.raises(OpenAIEngineError, match="route is fixed before scoring") as info:
                engine.score_choices_batch(PREFIX, [SHORT[0], LONG, SHORT[1]], LABELS)
            message = str(info.value)
            # The engine's name holds the server's address, whose random port may contain any digits.
            said = re.sub(r"server='[^']*'", "server=<address>", message)
            assert SECRET not in said and "4471" not in said and str(len(PREFIX + LONG)) not in said
            assert "engine.options.scoring: first_token" in message
            wait_until_quiet(server)
            server.reset()
            later = engine.score_choices_batch(PREFIX, SHORT, LABELS)
        np.testing.assert_allclose(later, expected_echo_scores(2))  # still the whole label, through echo
        sent = completions(server)
        assert len(sent) == 4 and all(r.body.get("echo") is True for r in sent)
        engine.close()


def test_later_records_are_scored_the_same_whether_or_not_a_long_record_came_before() -> None:
    """Twin engines: one meets a record whose echo is refused, the other does not; the records
    after it get the same scores through the same requests."""
    results = []
    for with_long_record in (False, True):
        with EchoLimitServer() as server:
            engine = make_engine(server, max_concurrency=1)
            engine.probe_scores(PREFIX, SHORT[:1], LABELS)
            if with_long_record:
                with pytest.raises(OpenAIEngineError):
                    engine.score_choices_batch(PREFIX, [LONG], LABELS)
            server.reset()
            scores = engine.score_choices_batch(PREFIX, SHORT, LABELS)
            results.append((scores, [(r.body["prompt"], r.body.get("echo")) for r in completions(server)]))
            engine.close()
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]


def test_a_prompt_refused_for_itself_reports_the_refusal_without_turning_echo_off() -> None:
    with FaultServer(context_limit=40) as server:
        engine = make_engine(server)
        engine.probe_scores(PREFIX, SHORT[:1], LABELS)
        with pytest.raises(OpenAIEngineError, match="HTTP 400.*context_length_exceeded") as info:
            engine.score_choices_batch(PREFIX, [LONG], LABELS)
        assert SECRET not in str(info.value)
        server.reset()
        engine.score_choices_batch(PREFIX, SHORT[:1], LABELS)
        assert all(r.body.get("echo") is True for r in completions(server))
        engine.close()


def test_whether_the_server_echoes_is_learned_from_public_text_only() -> None:
    # The server's tokenizer shows the labels share their first token; echo is then tried once on
    # the public probe context, never on a record, and the records are scored by first token.
    with FaultServer(tokenizer=True, echo=False) as server:
        engine = make_engine(server)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.score_choices_batch(PREFIX, [SECRET + "\nLabel:"] + SHORT, LABELS)
        assert any("no prompt log-probs" in str(w.message) for w in caught)
        sent = completions(server)
        echoed = [r.body["prompt"] for r in sent if r.body.get("echo")]
        assert echoed == ["Answer: very good"]  # the probe context and the first label
        assert [r.body.get("logprobs") for r in sent[1:]] == [5, 5, 5]  # one first-token request per record
        engine.close()


def test_the_public_probe_may_still_learn_that_echo_fails() -> None:
    # The preflight's probe record is public (and as long as a record may be): an echo refused
    # for it moves the label set to the first-token route before any charge, with a warning.
    with EchoLimitServer() as server:
        engine = make_engine(server)
        with pytest.warns(RuntimeWarning, match="no prompt log-probs"):
            engine.probe_scores(PREFIX, ["Review: " + "word " * 60 + "\nLabel:"], LABELS)
        server.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # floors: the fake's top tokens are not the labels
            engine.score_choices_batch(PREFIX, SHORT, LABELS)
        assert [r.body.get("echo") for r in completions(server)] == [None, None]
        engine.close()


def test_generate_after_prefix_sends_one_request_per_record_concurrently() -> None:
    with FaultServer(latency=0.2, reply=lambda prompt: f" out {prompt.split('#')[-1]}") as server:
        engine = make_engine(server, max_concurrency=4)
        suffixes = [f"Input: record #{i}" for i in range(8)]
        outputs = engine.generate_after_prefix(PREFIX, suffixes, max_tokens=12, stop=["\n"], temperature=0.0)
        assert outputs == [f" out {i}" for i in range(8)]
        sent = completions(server)
        assert sorted(r.body["prompt"] for r in sent) == sorted(PREFIX + s for s in suffixes)
        assert all((r.body["max_tokens"], r.body["stop"], r.body["temperature"]) == (12, ["\n"], 0.0) for r in sent)
        assert server.max_in_flight > 1
        # An output is that of its own record: alone, or among others in any order.
        assert engine.generate_after_prefix(PREFIX, suffixes[3:4], max_tokens=12, stop=["\n"]) == outputs[3:4]
        assert engine.generate_after_prefix(PREFIX, suffixes[::-1], max_tokens=12, stop=["\n"]) == outputs[::-1]
        assert engine.generate_after_prefix(PREFIX, [], max_tokens=12) == []
        engine.close()


def test_generate_for_prefixes_sends_one_request_per_prompt_concurrently() -> None:
    with FaultServer(latency=0.2, reply=lambda prompt: f" out {prompt.split('#')[1][0]}") as server:
        engine = make_engine(server, max_concurrency=4)
        prefixes = [f"Prompt #{k}.\n\n" for k in range(6)]
        outputs = engine.generate_for_prefixes(prefixes, "Input: one record", max_tokens=12, stop=["\n"])
        assert outputs == [f" out {k}" for k in range(6)]
        sent = completions(server)
        assert sorted(r.body["prompt"] for r in sent) == sorted(p + "Input: one record" for p in prefixes)
        assert all((r.body["max_tokens"], r.body["stop"]) == (12, ["\n"]) for r in sent)
        assert server.max_in_flight > 1
        assert engine.generate_for_prefixes([], "Input: one record", max_tokens=12) == []
        engine.close()
