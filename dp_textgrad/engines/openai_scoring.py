"""Prompt log-probabilities over HTTP: exact through ``echo``, else the first-token approximation.

A mixin of :class:`~dp_textgrad.engines.openai_engine.OpenAIEngine`: it uses the
engine's transport (``_request``), cache and warnings.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dp_textgrad.engines.openai_protocol import (
    ChatResponse,
    CompletionResponse,
    EchoToken,
    EchoUnavailable,
    OpenAIEngineError,
    echoed_prompt_tokens,
    tokens_overlapping,
    validate_response,
)


class EchoScoring:
    """Log-probabilities of prompt tokens (mixin; see the module docstring)."""

    if TYPE_CHECKING:  # what OpenAIEngine, which mixes this in, provides (transport, cache, settings)
        model: str
        base_url: str | None
        mode: Literal["chat", "completions"]
        scoring: Literal["auto", "echo", "first_token"]
        top_logprobs: int
        _state_lock: threading.Lock

        def _request(self, endpoint: Literal["chat", "completions"], body: dict[str, Any], what: str) -> dict: ...
        def _label(self) -> str: ...
        def _warn_once(self, key: str, message: str) -> None: ...
        def _cache_get(self, key: Hashable | None) -> tuple[bool, Any]: ...
        def _cache_put(self, key: Hashable | None, value: Any) -> None: ...

    def _use_echo(self, what: str, *, approximable: bool = True) -> bool:
        """Whether to ask for echoed prompt log-probs (else the first-token approximation)."""
        if self.scoring == "first_token" and approximable:
            return False
        if self.mode != "completions":
            if self.scoring == "echo" or not approximable:
                raise self._no_echo_error(what)
            return False
        with self._state_lock:
            unavailable = self._echo_unavailable
        if unavailable and (self.scoring == "echo" or not approximable):
            raise self._no_echo_error(what)
        return not unavailable

    def _no_echo_error(self, what: str) -> OpenAIEngineError:
        return OpenAIEngineError(
            f"{self._label()}: {what} needs the log-probs of prompt tokens (echo=True with logprobs "
            f"on /v1/completions), which mode={self.mode!r} against this server does not give; use "
            "mode='completions' with a server that supports echo (llama.cpp, vLLM)"
            + (
                ""
                if what == "token_logprobs"
                else ", or scoring='auto'/'first_token' for the first-token approximation"
            )
        )

    def _echo_is_unavailable(self, why: EchoUnavailable, what: str) -> None:
        """Record that this server gives no prompt log-probs, after making sure a refusal
        (400/422) was about echo and not about the prompt (too long, say): the same
        prompt without echo decides, and if it fails too, its error is raised."""
        if why.rejection is not None:
            self._request(
                "completions", {"prompt": why.prompt, "max_tokens": 1, "temperature": 0.0}, "a request without echo"
            )
        self._mark_echo_unavailable(what)

    def _mark_echo_unavailable(self, what: str) -> None:
        with self._state_lock:
            self._echo_unavailable = True
        if self.scoring == "echo":
            raise self._no_echo_error(what)
        self._warn_once(
            "no-echo",
            f"{self._label()}: the server gives no prompt log-probs (echo); scoring falls back to "
            "the top log-probs of the first generated token, exact only for single-token choices",
        )

    def _choice_logprob_echo(self, context: str, choice: str) -> float:
        echoed = self._echo(context + choice)
        span = tokens_overlapping(echoed, len(context), len(context) + len(choice))
        if not span:
            raise OpenAIEngineError(f"{self._label()}: the echoed tokens do not cover the choice text")
        if any(t.logprob is None for t in span):
            raise OpenAIEngineError(
                f"{self._label()}: the server gave no log-prob for the first prompt token; "
                "score choices after a non-empty context"
            )
        return float(sum(t.logprob for t in span))  # type: ignore[misc]

    def _echo(self, prompt: str) -> list[EchoToken]:
        """The prompt's tokens with their log-probs, from one echo request (cached if enabled)."""
        key = ("echo", self.model, self.base_url, prompt, self.top_logprobs)
        hit, value = self._cache_get(key)
        if hit:
            return value
        body = {"prompt": prompt, "echo": True, "logprobs": self.top_logprobs, "max_tokens": 1, "temperature": 0.0}
        try:
            data = self._request("completions", body, "echo scoring")
        except OpenAIEngineError as error:
            # Some APIs reject echo together with logprobs outright (400/422).
            if self.scoring == "auto" and error.status_code in (400, 422):
                raise EchoUnavailable(prompt, rejection=error) from None
            raise
        choice = validate_response(CompletionResponse, data, self, "echo scoring").choices[0]
        tokens = echoed_prompt_tokens(prompt, choice.text, choice.logprobs, self.top_logprobs)
        self._cache_put(key, tokens)
        return tokens

    def _choice_logprobs_first_token(self, context: str, choices: list[str]) -> list[float]:
        top = self._first_token_top(context)
        if not top:
            raise OpenAIEngineError(f"{self._label()}: the server returned no top log-probs")
        scores = []
        top_probs = [math.exp(lp) for _, lp in top]
        floor = math.log(max(min(min(top_probs), 1.0 - sum(top_probs)), 1e-12))
        for index, choice in enumerate(choices):
            wanted = choice.strip()
            matches = [lp for token, lp in top if token.strip() == wanted]
            if matches:
                scores.append(float(np.logaddexp.reduce(matches)))
            else:
                self._warn_once(
                    f"floor-{index}",
                    f"{self._label()}: choice #{index} is not among the top {len(top)} first tokens; "
                    "it gets a floor log-prob (multi-token choices cannot be scored without echo)",
                )
                scores.append(floor)
        return scores

    def _first_token_top(self, context: str) -> list[tuple[str, float]]:
        key = ("first_token", self.model, self.base_url, self.mode, context)
        hit, value = self._cache_get(key)
        if hit:
            return value
        if self.mode == "chat":
            body = {
                "messages": [{"role": "user", "content": context}],
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": True,
                "top_logprobs": 20,  # OpenAI's maximum: the more candidates, the fewer floors
            }
            data = self._request("chat", body, "first-token scoring")
            logprobs = validate_response(ChatResponse, data, self, "first-token scoring").choices[0].logprobs
            content = logprobs.content if logprobs else None
            top = [(t.token, t.logprob) for t in content[0].top_logprobs] if content else []
        else:
            body = {"prompt": context, "max_tokens": 1, "temperature": 0.0, "logprobs": self.top_logprobs}
            data = self._request("completions", body, "first-token scoring")
            logprobs = validate_response(CompletionResponse, data, self, "first-token scoring").choices[0].logprobs
            first = logprobs.top_logprobs[0] if logprobs and logprobs.top_logprobs else None
            top = list(first.items()) if first else []
        self._cache_put(key, top)
        return top
