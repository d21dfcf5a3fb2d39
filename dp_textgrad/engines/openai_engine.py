"""An engine for the OpenAI API and OpenAI-compatible servers (vLLM, Ollama, llama.cpp).

Generation goes through ``/v1/chat/completions`` (``mode="chat"``) or
``/v1/completions`` (``mode="completions"``; use it for base models such as Gemma 3
270M behind ``python -m llama_cpp.server``, which answer chat requests with empty
text). Requests are bounded in flight (``max_concurrency``), spaced by an optional
client-side token bucket (``requests_per_minute``) and retried with exponential
back-off and jitter on 408/409/429/5xx, time-outs and connection errors, honouring
``Retry-After``. A request that still fails raises one :class:`OpenAIEngineError`
naming the model, server and status, never the prompt.

Scoring (``score_choices_batch``) takes one of three routes, chosen once per label set
from the public labels only (``openai_scoring``):

- **first token** (``scoring="auto"`` or ``"first_token"``, ``mode="completions"``, when
  the server's tokenizer, or a short echo of the labels, shows that the labels' first
  tokens differ): one plain request per record with ``max_tokens=1`` and the top ``k``
  log-probs of the generated token (``k`` = max(``top_logprobs``, number of labels), at
  most 20, 5 on api.openai.com's /v1/completions); a label scores the log-prob of its own
  first token. That ranks the labels as the model's first step does; for a multi-token
  label it is an upper bound of the label's log-prob, not the log-prob itself.
- **echo** (``scoring="echo"``, or ``"auto"`` when the labels share a first token):
  servers that support ``echo=True`` with ``logprobs`` on ``/v1/completions`` (llama.cpp,
  vLLM, legacy OpenAI models) give prompt log-probs: the prompt ``prefix + suffix +
  choice`` is echoed with one log-prob per token, and the choice's log-prob is the sum
  over the tokens whose text overlaps the choice (found by the echoed character offsets;
  a token straddling the boundary between context and choice is counted with the choice).
- **approximate** (chat mode, or no echo and no tokenizer): the first-token request, with
  labels matched by text::

    log p(choice | context) ~= log sum of p(t) over the top-k first generated tokens t
                               whose whitespace-stripped text equals the stripped choice

  which is exact only for choices that are a single token.

A label not among the top-k tokens gets the floor ``log max(min(p_k, 1 - sum of the top-k
probabilities), 1e-12)`` (the most probability it could have) and a ``RuntimeWarning``.
``scoring="echo"`` refuses the other routes with an :class:`OpenAIEngineError`;
``token_logprobs`` has no approximation and needs echo. ``probe_scores`` (the preflight's
check on public text) gives each request ``probe_timeout`` seconds and no retry after a
time-out and, when echo does not answer, says which setting to change.

Nothing is cached unless ``cache`` is set; the cache is in memory only, and sampling
calls (temperature > 0 without a seed) are never served from it.
"""

from __future__ import annotations

import copy
import math
import os
import threading
from collections.abc import Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import numpy as np
import openai

from dp_textgrad.engines.base import CachesResults, Engine, ResultCache, TokenLogprobs
from dp_textgrad.engines.openai_protocol import (
    OPENAI_HOST,
    ChatResponse,
    CompletionResponse,
    EchoUnavailable,
    OpenAIEngineError,
    Price,
    check_int,
    tokens_overlapping,
    validate_response,
)
from dp_textgrad.engines.openai_scoring import EchoScoring, Route
from dp_textgrad.engines.openai_transport import Transport
from dp_textgrad.engines.ratelimit import TokenBucket

ApiMode = Literal["chat", "completions"]
Scoring = Literal["auto", "echo", "first_token"]
T = TypeVar("T")
R = TypeVar("R")

_LOCAL_PLACEHOLDER_KEY = "sk-no-key-needed"  # local servers ignore the key, the SDK wants one


class OpenAIEngine(EchoScoring, Transport, CachesResults, Engine):
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
    probe_timeout: seconds per request of the probes on public text (the labels' first
        tokens, the preflight's scoring check), each sent once.
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
        mode: ApiMode = "chat",
        max_concurrency: int = 8,
        requests_per_minute: float | None = None,
        rate_limit_burst: int = 1,
        timeout: float = 60.0,
        probe_timeout: float = 20.0,
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
        check_int("max_concurrency", max_concurrency, minimum=1)
        check_int("max_retries", max_retries, minimum=0)
        check_int("top_logprobs", top_logprobs, minimum=1)
        check_int("rate_limit_burst", rate_limit_burst, minimum=1)
        check_int("default_max_tokens", default_max_tokens, minimum=1)
        for name, value in (
            ("timeout", timeout),
            ("probe_timeout", probe_timeout),
            ("backoff_base", backoff_base),
            ("backoff_max", backoff_max),
            ("retry_after_max", retry_after_max),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
        if isinstance(cache, bool):
            cache_entries = 4096 if cache else 0
        else:
            check_int("cache", cache, minimum=0)
            cache_entries = cache

        self.model = model
        self.model_string = model
        self.base_url = base_url.rstrip("/") if base_url else None
        self.mode: ApiMode = mode
        self.scoring: Scoring = scoring
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = float(timeout)
        self.probe_timeout = float(probe_timeout)
        self.top_logprobs = top_logprobs
        self.default_max_tokens = default_max_tokens
        self.price = Price(*price) if isinstance(price, tuple) else price
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self._backoff_base = float(backoff_base)
        self._backoff_max = float(backoff_max)
        self._retry_after_max = float(retry_after_max)
        self._rate_limiter = (
            TokenBucket.per_minute(requests_per_minute, rate_limit_burst) if requests_per_minute is not None else None
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._results = ResultCache(cache_entries) if cache_entries else None
        self._state_lock = threading.Lock()
        # What public echoes showed (never a record's request): see openai_scoring.
        self._echo_unavailable = False
        self._echo_verified = False
        self._first_tokens: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        self._routes: dict[tuple[str, ...], tuple[Route, tuple[str, ...] | None]] = {}
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
        return self.base_url is None or urlsplit(self.base_url).hostname == OPENAI_HOST

    def _server_label(self) -> str:
        if self.base_url is None:
            return OPENAI_HOST
        parts = urlsplit(self.base_url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"  # no user:password@

    def __repr__(self) -> str:
        return (
            f"OpenAIEngine(model={self.model!r}, base_url={self._server_label()!r}, "
            f"mode={self.mode!r}, max_concurrency={self.max_concurrency})"
        )

    def close(self) -> None:
        self._client.close()

    def check_reachable(self, connect_timeout: float = 10.0) -> None:
        """Raise :class:`OpenAIEngineError` at once if nothing answers at ``base_url``.

        One request (``GET /models``) without retries and with a short connect time-out: a
        refused connection, an unknown host or a host that does not answer is a setting to
        fix, not a transient failure to retry with back-off for minutes. Any HTTP answer,
        an error status included, shows that a server is there (the scoring probe that
        follows reports what it says). Called by the preflight, before any charge.
        """
        timeout = openai.Timeout(self.timeout, connect=min(self.timeout, connect_timeout))
        try:
            self._client.with_options(timeout=timeout, max_retries=0).models.list()
        except openai.APIStatusError:
            return
        except openai.APIConnectionError as error:  # APITimeoutError included
            where = self._server_label()
            what = (
                "no answer within the connect time-out"
                if isinstance(error, openai.APITimeoutError)
                else "could not connect"
            )
            raise OpenAIEngineError(
                f"engine.base_url = {where!r}: {what}; check that the server is running and listening at "
                "that host and port, that the URL ends with the API prefix (usually /v1), and any proxy or "
                "firewall between (base_url=... in Python, --base-url on the command line)",
                attempts=1,
            ) from None

    # -- generation -----------------------------------------------------------------
    def generate(
        self, prompt: str, system_prompt: str | None = None, *, max_tokens: int | None = None, **kwargs: Any
    ) -> str:
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
        check_int("max_tokens", max_tokens, minimum=1)
        system: str | None
        if self.mode == "chat":
            system = system_prompt if system_prompt is not None else self.system_prompt
        else:
            system = system_prompt  # a base model has no system role: prepend only when asked
        cacheable = temperature == 0 or seed is not None  # sampling is never served from cache
        key = (
            (
                "generate",
                self.model,
                self.base_url,
                self.mode,
                prompt,
                system,
                float(temperature),
                seed,
                max_tokens,
                tuple(stop) if stop else None,
            )
            if cacheable
            else None
        )
        hit, value = self._cache_get(key)
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
            text = validate_response(ChatResponse, data, self, "generate").choices[0].message.content or ""
        else:
            full_prompt = f"{system}\n\n{prompt}" if system else prompt
            data = self._request("completions", {"prompt": full_prompt, **options}, "generate")
            text = validate_response(CompletionResponse, data, self, "generate").choices[0].text
        self._cache_put(key, text)
        return text

    def generate_many(self, prompts: Sequence[str], system_prompt: str | None = None, **kwargs: Any) -> list[str]:
        """``generate`` for each prompt, ``max_concurrency`` at a time; results in input order."""
        prompts = list(prompts)
        return self._map(lambda p: self.generate(p, system_prompt, **kwargs), prompts)

    def generate_after_prefix(
        self,
        prefix: str,
        suffixes: Sequence[str],
        *,
        max_tokens: int,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> list[str]:
        """``generate(prefix + suffix)`` for each suffix, ``max_concurrency`` requests at a time,
        in input order: the private path of generation tasks. Each request carries one record and
        is answered on its own, so an output depends on the prefix and its own record only, as
        far as the server computes each request by itself (a server that reuses the KV cache of
        the request before, as llama.cpp's does, can move floats by rounding)."""
        suffixes = list(suffixes)
        if not isinstance(prefix, str) or not all(isinstance(s, str) for s in suffixes):
            raise TypeError("prefix and suffixes: must be texts")
        options: dict[str, Any] = {"max_tokens": max_tokens, "stop": stop, "temperature": temperature}
        return self._map(lambda suffix: self.generate(prefix + suffix, **options), suffixes)

    def generate_for_prefixes(
        self,
        prefixes: Sequence[str],
        suffix: str,
        *,
        max_tokens: int,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> list[str]:
        """``generate(prefix + suffix)`` for each prefix (one record under several prompts),
        ``max_concurrency`` requests at a time, in input order; one request per prefix, each
        carrying this record only (see :meth:`generate_after_prefix`)."""
        prefixes = list(prefixes)
        if not isinstance(suffix, str) or not all(isinstance(p, str) for p in prefixes):
            raise TypeError("prefixes and suffix: must be texts")
        options: dict[str, Any] = {"max_tokens": max_tokens, "stop": stop, "temperature": temperature}
        return self._map(lambda prefix: self.generate(prefix + suffix, **options), prefixes)

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
        route, first_tokens = self._route(choices)  # fixed per label set, from public inputs
        if route == "echo" and (self.scoring != "echo" or self._use_echo("score_choices_batch")):
            pairs = [(i, j) for i in range(len(contexts)) for j in range(len(choices))]
            try:
                values = self._map(lambda ij: self._choice_logprob_echo(contexts[ij[0]], choices[ij[1]]), pairs)
                return np.array(values, dtype=float).reshape(len(contexts), len(choices))
            except EchoUnavailable as why:
                if not self._probing:  # records: the route stays, the call fails
                    raise self._echo_failed_on_a_record(why, "score_choices_batch") from None
                # The preflight's probe is public text: learning here that echo fails is allowed,
                # and the label set is scored by its first token from now on.
                self._echo_is_unavailable(why, "score_choices_batch")
                with self._state_lock:
                    self._routes[tuple(choices)] = ("approximate", None)
        rows = self._map(lambda c: self._choice_logprobs_first_token(c, choices, first_tokens), contexts)
        return np.array(rows, dtype=float).reshape(len(contexts), len(choices))

    def probe_scores(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        """``score_choices_batch`` for the preflight's probe on public text: every request has
        ``probe_timeout`` seconds and is not retried after a time-out, so a scoring route that
        cannot work on this server fails in seconds; when it is echo, the error names
        ``engine.options.scoring`` and the fix."""
        probe = copy.copy(self)  # shares the cache, usage, warnings and learned first tokens
        probe._probing = True
        route: str | None = None
        try:
            route, _ = self._route(list(choices))
            scores = probe.score_choices_batch(prefix, suffixes, choices)
        except OpenAIEngineError as error:
            # A time-out, a lost connection or a server error of echo: a setting to change. A
            # refusal (4xx: a prompt over the context, say) is reported as it is.
            refused = error.status_code is not None and error.status_code < 500
            if route != "echo" or self.mode != "completions" or refused:
                raise
            why = (
                "scoring='echo' asks for it"
                if self.scoring == "echo"
                else "the labels share their first token, so scoring='auto' needs echo"
            )
            raise OpenAIEngineError(
                f"{error} -- echo scoring (prompt log-probs) did not answer a public probe within "
                f"{self.probe_timeout:g} s per request ({why}); set engine.options.scoring: first_token "
                "(scoring='first_token' in Python) to score each label by its first token's top "
                "log-probs, exact in ranking when the labels' first tokens differ (give the labels different "
                "first words), or use a server with fast echo (vLLM) and raise engine.options.probe_timeout",
                status_code=error.status_code,
                attempts=error.attempts,
            ) from None
        finally:
            with self._state_lock:
                self._echo_unavailable = self._echo_unavailable or probe._echo_unavailable
                self._echo_verified = self._echo_verified or probe._echo_verified
        return scores

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        if not isinstance(text, str) or not isinstance(context, str):
            raise TypeError("text and context: must be strings")
        if not text:
            return TokenLogprobs(tokens=[], logprobs=np.zeros(0), top_alternatives=[])
        if not self._use_echo("token_logprobs", approximable=False):
            raise self._no_echo_error("token_logprobs")
        try:
            echoed = self._echo(context + text)
        except EchoUnavailable as why:
            # The text may be private: what it showed does not change later requests.
            self._check_refusal(why)
            raise self._no_echo_error("token_logprobs") from None
        span = tokens_overlapping(echoed, len(context), len(context) + len(text))
        return TokenLogprobs(
            tokens=[t.text for t in span],
            # The very first token of a prompt has no context and no log-prob: NaN.
            logprobs=np.array([math.nan if t.logprob is None else t.logprob for t in span], dtype=float),
            top_alternatives=[list(t.top) for t in span],
            vocab_mean=None,  # the full-vocabulary distribution is not available over HTTP
            vocab_std=None,
        )


__all__ = ["OpenAIEngine", "OpenAIEngineError", "Price"]
