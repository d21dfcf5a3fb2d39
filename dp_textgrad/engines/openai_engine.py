"""An engine for the OpenAI API and OpenAI-compatible servers (vLLM, Ollama, llama.cpp).

Generation goes through ``/v1/chat/completions`` (``mode="chat"``) or
``/v1/completions`` (``mode="completions"``; use it for base models such as Gemma 3
270M behind ``python -m llama_cpp.server``, which answer chat requests with empty
text). Requests are bounded in flight (``max_concurrency``), spaced by an optional
client-side token bucket (``requests_per_minute``) and retried with exponential
back-off and jitter on 408/409/429/5xx, time-outs and connection errors, honouring
``Retry-After``. A request that still fails raises one :class:`OpenAIEngineError`
naming the model, server and status, never the prompt.

Scoring (``score_choices_batch``, ``token_logprobs``) needs the log-probabilities of
*prompt* tokens. Servers that support ``echo=True`` with ``logprobs`` on
``/v1/completions`` (llama.cpp, vLLM, legacy OpenAI models) give them exactly: the
prompt ``prefix + suffix + choice`` is echoed with one log-prob per token, and the
choice's log-prob is the sum over the tokens whose text overlaps the choice (found
by the echoed character offsets; a token straddling the boundary between context
and choice is counted with the choice). Chat-only APIs (api.openai.com today) give
no prompt log-probs, so ``scoring="auto"`` then falls back to an approximation:

    log p(choice | context) ~= log sum of p(t) over the top-k first generated tokens t
                               whose whitespace-stripped text equals the stripped choice

which is exact only for choices that are a single token. A choice not among the
top-k tokens gets the floor ``log min(p_k, 1 - sum of the top-k probabilities)``
(the most probability it could have) and a ``RuntimeWarning``. ``scoring="echo"``
refuses the approximation with an :class:`OpenAIEngineError`; ``"first_token"``
always uses it. ``token_logprobs`` has no approximation and needs echo.

Nothing is cached unless ``cache`` is set; the cache is in memory only, and sampling
calls (temperature > 0 without a seed) are never served from it.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import numpy as np
import openai
import tenacity
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dp_textgrad.engines.base import Engine, EngineError, TokenLogprobs
from dp_textgrad.engines.ratelimit import TokenBucket

Mode = Literal["chat", "completions"]
Scoring = Literal["auto", "echo", "first_token"]
T = TypeVar("T")
R = TypeVar("R")

_OPENAI_HOST = "api.openai.com"
_LOCAL_PLACEHOLDER_KEY = "sk-no-key-needed"  # local servers ignore the key, the SDK wants one
_RETRYABLE_STATUS = frozenset({408, 409, 429})
_ERROR_CODE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # server error codes are identifiers, not text


class OpenAIEngineError(EngineError):
    """A request failed for good. ``status_code`` is the last HTTP status, if any."""

    def __init__(self, message: str, *, status_code: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.attempts = attempts


@dataclass(frozen=True)
class Price:
    """USD per million prompt / completion tokens (check your provider's current prices)."""

    prompt_per_million: float
    completion_per_million: float

    def __post_init__(self) -> None:
        for name in ("prompt_per_million", "completion_per_million"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0 (USD), got {value!r}")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt_per_million + completion_tokens * self.completion_per_million) / 1e6


# -- response schemas (the edge: validate what the server sent, ignore extras) ---------
class _Schema(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _UsageFields(_Schema):
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0


class _CompletionLogprobs(_Schema):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] | None = None


class _CompletionChoice(_Schema):
    text: str
    logprobs: _CompletionLogprobs | None = None


class _CompletionResponse(_Schema):
    choices: list[_CompletionChoice] = Field(min_length=1)


class _ChatTopLogprob(_Schema):
    token: str
    logprob: float


class _ChatTokenLogprob(_Schema):
    token: str
    logprob: float
    top_logprobs: list[_ChatTopLogprob] = Field(default_factory=list)


class _ChatLogprobs(_Schema):
    content: list[_ChatTokenLogprob] | None = None


class _ChatMessage(_Schema):
    content: str | None = None  # None for refusals / tool calls: read as empty text


class _ChatChoice(_Schema):
    message: _ChatMessage
    logprobs: _ChatLogprobs | None = None


class _ChatResponse(_Schema):
    choices: list[_ChatChoice] = Field(min_length=1)


@dataclass(frozen=True)
class _EchoToken:
    """One echoed prompt token: its character span in the prompt and log-probs."""

    start: int
    end: int
    text: str
    logprob: float | None
    top: tuple[tuple[str, float], ...]


class _MalformedResponse(Exception):
    """The server answered 2xx with something that is not the expected JSON."""


class _EchoUnavailable(Exception):
    """The server gave no log-probs for the prompt tokens, or refused the echo request
    (``rejection``: its 400/422 error, which may also be about the prompt itself)."""

    def __init__(self, prompt: str = "", rejection: OpenAIEngineError | None = None) -> None:
        super().__init__("no prompt log-probs")
        self.prompt = prompt
        self.rejection = rejection


class _ResponseCache:
    """A bounded in-memory LRU map, safe across threads."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple[bool, Any]:
        with self._lock:
            if key not in self._items:
                return False, None
            self._items.move_to_end(key)
            return True, self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class OpenAIEngine(Engine):
    """Generation and scoring through an OpenAI-compatible HTTP API.

    Parameters
    ----------
    model: the model name sent with each request.
    base_url: e.g. ``"http://127.0.0.1:8080/v1"``; ``None`` means api.openai.com.
    api_key: defaults to ``$OPENAI_API_KEY``; for servers other than api.openai.com a
        placeholder is used when neither is set.
    mode: ``"chat"`` (default) or ``"completions"`` (base models, and needed for exact
        scoring through ``echo``).
    max_concurrency: most requests in flight at once, across all threads.
    requests_per_minute: client-side rate limit (token bucket, ``rate_limit_burst``
        requests may go at once); ``None`` for none.
    timeout: seconds per HTTP request (per attempt).
    max_retries: retries after the first attempt on transient failures.
    price: USD per million tokens, for ``usage.cost_usd``; ``None`` counts no cost.
    cache: ``False`` (default), ``True`` (4096 entries) or a maximum number of entries
        of an in-memory cache of deterministic requests.
    scoring: ``"auto"``, ``"echo"`` or ``"first_token"`` (see the module docstring).
    top_logprobs: alternatives asked for per token (OpenAI's /v1/completions allows 5).
    system_prompt: the chat-mode system prompt used when a call gives none.
    default_max_tokens: ``max_tokens`` of calls that give none (e.g. from TextGrad).
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        mode: Mode = "chat",
        max_concurrency: int = 8,
        requests_per_minute: float | None = None,
        rate_limit_burst: int = 1,
        timeout: float = 60.0,
        max_retries: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_max: float = 120.0,
        price: Price | tuple[float, float] | None = None,
        cache: bool | int = False,
        scoring: Scoring = "auto",
        top_logprobs: int = 5,
        system_prompt: str | None = None,
        default_max_tokens: int = 256,
    ) -> None:
        super().__init__()
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model: must be a non-empty model name, got {model!r}")
        if mode not in ("chat", "completions"):
            raise ValueError(f"mode: must be 'chat' or 'completions', got {mode!r}")
        if scoring not in ("auto", "echo", "first_token"):
            raise ValueError(f"scoring: must be 'auto', 'echo' or 'first_token', got {scoring!r}")
        _check_int("max_concurrency", max_concurrency, minimum=1)
        _check_int("max_retries", max_retries, minimum=0)
        _check_int("top_logprobs", top_logprobs, minimum=1)
        _check_int("rate_limit_burst", rate_limit_burst, minimum=1)
        _check_int("default_max_tokens", default_max_tokens, minimum=1)
        for name, value in (("timeout", timeout), ("backoff_base", backoff_base),
                            ("backoff_max", backoff_max), ("retry_after_max", retry_after_max)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
        if isinstance(cache, bool):
            cache_entries = 4096 if cache else 0
        else:
            _check_int("cache", cache, minimum=0)
            cache_entries = cache

        self.model = model
        self.model_string = model
        self.base_url = base_url.rstrip("/") if base_url else None
        self.mode: Mode = mode
        self.scoring: Scoring = scoring
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = float(timeout)
        self.top_logprobs = top_logprobs
        self.default_max_tokens = default_max_tokens
        self.price = Price(*price) if isinstance(price, tuple) else price
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self._backoff_base = float(backoff_base)
        self._backoff_max = float(backoff_max)
        self._retry_after_max = float(retry_after_max)
        self._rate_limiter = (
            TokenBucket.per_minute(requests_per_minute, rate_limit_burst)
            if requests_per_minute is not None else None
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._cache = _ResponseCache(cache_entries) if cache_entries else None
        self.cache_hits = 0
        self._state_lock = threading.Lock()
        self._echo_unavailable = False
        self._warned: set[str] = set()
        self._client = openai.OpenAI(
            api_key=self._resolve_api_key(api_key),
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,  # retries are ours: counted, jittered and honouring Retry-After
        )

    # -- construction helpers -----------------------------------------------------
    def _resolve_api_key(self, api_key: str | None) -> str:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if key:
            return key
        if self._is_openai_host():
            raise ValueError(
                "api_key: no key given and OPENAI_API_KEY is not set; pass api_key=... or "
                "set the environment variable (or give base_url= for a local server)"
            )
        return _LOCAL_PLACEHOLDER_KEY

    def _is_openai_host(self) -> bool:
        return self.base_url is None or urlsplit(self.base_url).hostname == _OPENAI_HOST

    def _server_label(self) -> str:
        if self.base_url is None:
            return _OPENAI_HOST
        parts = urlsplit(self.base_url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"  # no user:password@

    def __repr__(self) -> str:
        return (f"OpenAIEngine(model={self.model!r}, base_url={self._server_label()!r}, "
                f"mode={self.mode!r}, max_concurrency={self.max_concurrency})")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def cache_size(self) -> int:
        return len(self._cache) if self._cache is not None else 0

    def clear_cache(self) -> None:
        if self._cache is not None:
            self._cache.clear()

    # -- generation -----------------------------------------------------------------
    def generate(self, prompt: str, system_prompt: str | None = None, *,
                 max_tokens: int | None = None, **kwargs: Any) -> str:
        """As ``Engine.generate``; ``max_tokens=None`` means ``default_max_tokens`` (callers
        such as TextGrad's ``BlackboxLLM`` pass none, and API tokens cost money)."""
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        return super().generate(prompt, system_prompt, max_tokens=max_tokens, **kwargs)

    def _generate(
        self,
        prompt: str,
        *,
        system_prompt: str | None,
        temperature: float,
        max_tokens: int,
        seed: int | None,
        stop: list[str] | None,
    ) -> str:
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
        _check_int("max_tokens", max_tokens, minimum=1)
        if self.mode == "chat":
            system = system_prompt if system_prompt is not None else self.system_prompt
        else:
            system = system_prompt  # a base model has no system role: prepend only when asked
        key = ("generate", self.model, self.base_url, self.mode, prompt, system,
               float(temperature), seed, max_tokens, tuple(stop) if stop else None)
        cacheable = temperature == 0 or seed is not None  # sampling is never served from cache
        hit, value = self._cache_get(key, cacheable)
        if hit:
            return value

        options: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if seed is not None:
            options["seed"] = seed
        if stop:
            options["stop"] = stop
        if self.mode == "chat":
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            data = self._request("chat", {"messages": messages, **options}, "generate")
            text = _validate(_ChatResponse, data, self, "generate").choices[0].message.content or ""
        else:
            full_prompt = f"{system}\n\n{prompt}" if system else prompt
            data = self._request("completions", {"prompt": full_prompt, **options}, "generate")
            text = _validate(_CompletionResponse, data, self, "generate").choices[0].text
        self._cache_put(key, cacheable, text)
        return text

    def generate_many(self, prompts: Sequence[str], system_prompt: str | None = None, **kwargs: Any) -> list[str]:
        """``generate`` for each prompt, ``max_concurrency`` at a time; results in input order."""
        prompts = list(prompts)
        return self._map(lambda p: self.generate(p, system_prompt, **kwargs), prompts)

    # -- scoring --------------------------------------------------------------------
    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        choices = list(choices)
        suffixes = list(suffixes)
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choices: must be a non-empty list of non-empty strings")
        if not all(isinstance(s, str) for s in suffixes):
            raise TypeError("suffixes: must be strings")
        contexts = [prefix + s for s in suffixes]
        if not contexts:
            return np.zeros((0, len(choices)))
        if self._use_echo("score_choices_batch"):
            pairs = [(i, j) for i in range(len(contexts)) for j in range(len(choices))]
            try:
                values = self._map(lambda ij: self._choice_logprob_echo(contexts[ij[0]], choices[ij[1]]), pairs)
                return np.array(values, dtype=float).reshape(len(contexts), len(choices))
            except _EchoUnavailable as why:
                self._echo_is_unavailable(why, "score_choices_batch")
        rows = self._map(lambda c: self._choice_logprobs_first_token(c, choices), contexts)
        return np.array(rows, dtype=float).reshape(len(contexts), len(choices))

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        if not isinstance(text, str) or not isinstance(context, str):
            raise TypeError("text and context: must be strings")
        if not text:
            return TokenLogprobs(tokens=[], logprobs=np.zeros(0), top_alternatives=[])
        if not self._use_echo("token_logprobs", approximable=False):
            raise self._no_echo_error("token_logprobs")
        try:
            echoed = self._echo(context + text)
        except _EchoUnavailable as why:
            self._echo_is_unavailable(why, "token_logprobs")
            raise self._no_echo_error("token_logprobs") from None
        span = _tokens_overlapping(echoed, len(context), len(context) + len(text))
        return TokenLogprobs(
            tokens=[t.text for t in span],
            # The very first token of a prompt has no context and no log-prob: NaN.
            logprobs=np.array([math.nan if t.logprob is None else t.logprob for t in span], dtype=float),
            top_alternatives=[list(t.top) for t in span],
            vocab_mean=None,  # the full-vocabulary distribution is not available over HTTP
            vocab_std=None,
        )

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
            + ("" if what == "token_logprobs" else ", or scoring='auto'/'first_token' for the "
               "first-token approximation")
        )

    def _echo_is_unavailable(self, why: _EchoUnavailable, what: str) -> None:
        """Record that this server gives no prompt log-probs, after making sure a refusal
        (400/422) was about echo and not about the prompt (too long, say): the same
        prompt without echo decides, and if it fails too, its error is raised."""
        if why.rejection is not None:
            self._request("completions", {"prompt": why.prompt, "max_tokens": 1, "temperature": 0.0},
                          "a request without echo")
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
        span = _tokens_overlapping(echoed, len(context), len(context) + len(choice))
        if not span:
            raise OpenAIEngineError(f"{self._label()}: the echoed tokens do not cover the choice text")
        if any(t.logprob is None for t in span):
            raise OpenAIEngineError(
                f"{self._label()}: the server gave no log-prob for the first prompt token; "
                "score choices after a non-empty context"
            )
        return float(sum(t.logprob for t in span))  # type: ignore[misc]

    def _echo(self, prompt: str) -> list[_EchoToken]:
        """The prompt's tokens with their log-probs, from one echo request (cached if enabled)."""
        key = ("echo", self.model, self.base_url, prompt, self.top_logprobs)
        hit, value = self._cache_get(key, True)
        if hit:
            return value
        body = {"prompt": prompt, "echo": True, "logprobs": self.top_logprobs,
                "max_tokens": 1, "temperature": 0.0}
        try:
            data = self._request("completions", body, "echo scoring")
        except OpenAIEngineError as error:
            # Some APIs reject echo together with logprobs outright (400/422).
            if self.scoring == "auto" and error.status_code in (400, 422):
                raise _EchoUnavailable(prompt, rejection=error) from None
            raise
        choice = _validate(_CompletionResponse, data, self, "echo scoring").choices[0]
        tokens = _echoed_prompt_tokens(prompt, choice.text, choice.logprobs, self.top_logprobs)
        self._cache_put(key, True, tokens)
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
        hit, value = self._cache_get(key, True)
        if hit:
            return value
        if self.mode == "chat":
            body = {"messages": [{"role": "user", "content": context}], "max_tokens": 1,
                    "temperature": 0.0, "logprobs": True,
                    "top_logprobs": 20}  # OpenAI's maximum: the more candidates, the fewer floors
            data = self._request("chat", body, "first-token scoring")
            logprobs = _validate(_ChatResponse, data, self, "first-token scoring").choices[0].logprobs
            content = logprobs.content if logprobs else None
            top = [(t.token, t.logprob) for t in content[0].top_logprobs] if content else []
        else:
            body = {"prompt": context, "max_tokens": 1, "temperature": 0.0, "logprobs": self.top_logprobs}
            data = self._request("completions", body, "first-token scoring")
            logprobs = _validate(_CompletionResponse, data, self, "first-token scoring").choices[0].logprobs
            first = logprobs.top_logprobs[0] if logprobs and logprobs.top_logprobs else None
            top = list(first.items()) if first else []
        self._cache_put(key, True, top)
        return top

    # -- transport: concurrency, rate limit, retries, usage ---------------------------
    def _request(self, endpoint: Literal["chat", "completions"], body: dict[str, Any], what: str) -> dict:
        """POST one request with retries; return the decoded JSON object; count usage."""
        attempts = 0

        def attempt() -> dict:
            nonlocal attempts
            attempts += 1
            with self._slots:  # bound what is in flight, not what is waiting to retry
                if self._rate_limiter is not None:
                    self._rate_limiter.acquire()
                resource = self._client.chat.completions if endpoint == "chat" else self._client.completions
                raw = resource.with_raw_response.create(model=self.model, **body)
                content = raw.http_response.content
            try:
                data = json.loads(content)
            except (ValueError, UnicodeDecodeError):
                raise _MalformedResponse("the response body is not valid JSON") from None
            if not isinstance(data, dict):
                raise _MalformedResponse("the response body is not a JSON object")
            return data

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=self._retry_wait,
            retry=tenacity.retry_if_exception(_is_transient),
            before_sleep=lambda state: self._count(calls=0, retries=1),
            reraise=True,
        )
        with self._timed() as timer:
            try:
                data = retrying(attempt)
            except _MalformedResponse as error:
                failure: OpenAIEngineError | None = OpenAIEngineError(
                    f"{self._label()}: {what} failed: {error} (HTTP 200)", status_code=200, attempts=attempts)
            except openai.OpenAIError as error:
                failure = self._failure(error, what, attempts)
            else:
                failure = None
        if failure is not None:
            self._count(calls=0, seconds=timer["seconds"])
            raise failure
        usage = _usage_tokens(data)
        cost = self.price.cost(*usage) if self.price else 0.0
        self._count(calls=1, prompt_tokens=usage[0], completion_tokens=usage[1],
                    seconds=timer["seconds"], cost_usd=cost)
        return data

    def _retry_wait(self, state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        retry_after = _retry_after_seconds(error)
        if retry_after is not None:
            return min(retry_after, self._retry_after_max)
        backoff = tenacity.wait_exponential_jitter(
            initial=self._backoff_base, max=self._backoff_max, jitter=self._backoff_base)
        return backoff(state)

    def _failure(self, error: openai.OpenAIError, what: str, attempts: int) -> OpenAIEngineError:
        """An error that names model, server and status; the server's message (which may
        quote the prompt) is left out on purpose."""
        status: int | None = None
        if isinstance(error, openai.APITimeoutError):
            reason = f"timed out after {self.timeout:g} s"
        elif isinstance(error, openai.APIConnectionError):
            reason = "could not connect to the server"
        elif isinstance(error, openai.APIStatusError):
            status = error.status_code
            reason = f"HTTP {status} ({type(error).__name__})"
            code = _error_code(error)
            if code:
                reason += f", error code {code!r}"
            reason += {401: "; check api_key / OPENAI_API_KEY",
                       403: "; the key may lack access to this model",
                       404: "; check the model name and base_url"}.get(status, "")
        else:
            reason = type(error).__name__
        return OpenAIEngineError(
            f"{self._label()}: {what} failed after {attempts} attempt(s): {reason}",
            status_code=status, attempts=attempts)

    def _label(self) -> str:
        return f"OpenAIEngine(model={self.model!r}, server={self._server_label()!r})"

    # -- helpers --------------------------------------------------------------------
    def _map(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """``[fn(x) for x in items]`` on up to ``max_concurrency`` threads, in order."""
        if len(items) <= 1 or self.max_concurrency == 1:
            return [fn(item) for item in items]
        workers = min(self.max_concurrency, len(items))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dp-textgrad-openai") as pool:
            futures = [pool.submit(fn, item) for item in items]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:  # fail fast: drop what has not started
                    future.cancel()
                raise

    def _cache_get(self, key: Hashable, cacheable: bool) -> tuple[bool, Any]:
        if self._cache is None or not cacheable:
            return False, None
        hit, value = self._cache.get(key)
        if hit:
            with self._state_lock:
                self.cache_hits += 1
        return hit, value

    def _cache_put(self, key: Hashable, cacheable: bool, value: Any) -> None:
        if self._cache is not None and cacheable:
            self._cache.put(key, value)

    def _warn_once(self, key: str, message: str) -> None:
        with self._state_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# -- module helpers ------------------------------------------------------------------
def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _validate(schema: type[BaseModel], data: dict, engine: OpenAIEngine, what: str) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        # Name the fields only: pydantic's messages quote the offending values.
        fields = sorted({".".join(str(p) for p in e["loc"]) or "<root>" for e in error.errors()})
        raise OpenAIEngineError(
            f"{engine._label()}: {what} got a response with missing or malformed fields: "
            f"{', '.join(fields[:5])}", status_code=200) from None


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code in _RETRYABLE_STATUS or error.status_code >= 500
    return False


def _retry_after_seconds(error: BaseException | None) -> float | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            value = float(millis) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
        except ValueError:
            pass
    header = headers.get("retry-after")
    if not header:
        return None
    try:
        value = float(header)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    try:  # an HTTP date
        return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _error_code(error: openai.APIStatusError) -> str | None:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        code = inner.get("code") if isinstance(inner, dict) else None
        if isinstance(code, str) and _ERROR_CODE.match(code):
            return code
    return None


def _usage_tokens(data: dict) -> tuple[int, int]:
    """(prompt, completion) tokens from the response's usage field; 0 where absent."""
    try:
        usage = _UsageFields.model_validate(data.get("usage") or {})
    except ValidationError:
        return 0, 0
    return max(usage.prompt_tokens or 0, 0), max(usage.completion_tokens or 0, 0)


def _echoed_prompt_tokens(
    prompt: str, text: str, logprobs: _CompletionLogprobs | None, top_k: int
) -> list[_EchoToken]:
    """The tokens of ``prompt`` (not the generated one) with character spans and log-probs.

    Raises ``_EchoUnavailable`` when the server did not echo: no log-probs, or a text that
    neither starts with the prompt nor is spelled out by the returned tokens.
    """
    if logprobs is None or not logprobs.tokens:
        raise _EchoUnavailable
    if not text.startswith(prompt) and not "".join(logprobs.tokens).startswith(prompt):
        raise _EchoUnavailable
    tokens = logprobs.tokens
    n = len(tokens)
    if len(logprobs.token_logprobs) != n:
        raise _EchoUnavailable
    offsets = logprobs.text_offset
    if offsets is None or len(offsets) != n:
        offsets, position = [], 0
        for token in tokens:  # reconstruct from the token texts
            offsets.append(position)
            position += len(token)
    tops = logprobs.top_logprobs if logprobs.top_logprobs and len(logprobs.top_logprobs) == n else [None] * n
    result: list[_EchoToken] = []
    for i, (token, start) in enumerate(zip(tokens, offsets)):
        if start >= len(prompt):
            break  # the generated continuation
        end = offsets[i + 1] if i + 1 < n and offsets[i + 1] >= start else start + len(token)
        end = min(max(end, start + len(token)), len(prompt))
        if not token:
            continue  # zero-width tokens (BOS) carry no prompt text
        # Best first, at most top_k (llama.cpp adds the actual token beyond its top k).
        top = tuple(sorted(((str(k), float(v)) for k, v in (tops[i] or {}).items()),
                           key=lambda kv: -kv[1])[:top_k])
        result.append(_EchoToken(start, end, token, logprobs.token_logprobs[i], top))
    # Without echo a server returns only generated tokens (offsets at or past the prompt's end).
    if not result or (len(result) > 1 and all(t.logprob is None for t in result)):
        raise _EchoUnavailable
    return result


def _tokens_overlapping(tokens: list[_EchoToken], start: int, end: int) -> list[_EchoToken]:
    """Tokens whose character span meets [start, end); a straddling token counts."""
    return [t for t in tokens if t.end > start and t.start < end]
