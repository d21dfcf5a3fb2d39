"""The HTTP transport of the OpenAI engine: bounded concurrency, rate limit, retries, usage.

A mixin of :class:`~dp_textgrad.engines.openai_engine.OpenAIEngine`. A request that
fails for good raises one ``OpenAIEngineError`` naming the model, server and status,
never the prompt.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import openai
import tenacity

from dp_textgrad.engines.openai_protocol import (
    MalformedResponse,
    OpenAIEngineError,
    Price,
    error_code,
    is_transient,
    retry_after_seconds,
    usage_tokens,
)

if TYPE_CHECKING:
    from dp_textgrad.engines.ratelimit import TokenBucket

T = TypeVar("T")
R = TypeVar("R")


class Transport:
    """Requests with retries and accounting (mixin; see the module docstring)."""

    _probing = False  # True on the preflight's copy: every request is a quick one

    if TYPE_CHECKING:  # what OpenAIEngine, which mixes this in, provides
        model: str
        price: Price | None
        timeout: float
        probe_timeout: float
        max_concurrency: int
        max_retries: int
        _client: openai.OpenAI
        _slots: threading.BoundedSemaphore
        _rate_limiter: TokenBucket | None
        _state_lock: threading.Lock
        _warned: set[str]
        _backoff_base: float
        _backoff_max: float
        _retry_after_max: float

        def _server_label(self) -> str: ...
        def _count(
            self,
            *,
            calls: int = ...,
            prompt_tokens: int = ...,
            completion_tokens: int = ...,
            seconds: float = ...,
            cost_usd: float = ...,
            retries: int = ...,
        ) -> None: ...
        @contextmanager
        def _timed(self) -> Iterator[dict[str, float]]: ...

    def _request(
        self, endpoint: Literal["chat", "completions"], body: dict[str, Any], what: str, *, quick: bool = False
    ) -> dict:
        """POST one request with retries; return the decoded JSON object; count usage.

        ``quick``: a probe on public text (the labels' tokens, the preflight): ``probe_timeout``
        seconds and no retry after a time-out (a server too slow for it is known in seconds,
        not minutes); a 429/5xx or a refused connection is retried once, after a short wait.
        """
        quick = quick or self._probing
        attempts = 0
        client = self._client.with_options(timeout=self.probe_timeout, max_retries=0) if quick else self._client
        timeout = self.probe_timeout if quick else self.timeout

        def attempt() -> dict:
            nonlocal attempts
            attempts += 1
            with self._slots:  # bound what is in flight, not what is waiting to retry
                if self._rate_limiter is not None:
                    self._rate_limiter.acquire()
                resource = client.chat.completions if endpoint == "chat" else client.completions
                raw = resource.with_raw_response.create(model=self.model, **body)
                content = raw.http_response.content
            try:
                data = json.loads(content)
            except (ValueError, UnicodeDecodeError):
                raise MalformedResponse("the response body is not valid JSON") from None
            if not isinstance(data, dict):
                raise MalformedResponse("the response body is not a JSON object")
            return data

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(min(self.max_retries, 1) + 1 if quick else self.max_retries + 1),
            wait=(lambda state: min(self._retry_wait(state), 2.0)) if quick else self._retry_wait,
            retry=tenacity.retry_if_exception(
                (lambda e: is_transient(e) and not isinstance(e, openai.APITimeoutError)) if quick else is_transient
            ),
            before_sleep=lambda state: self._count(calls=0, retries=1),
            reraise=True,
        )
        with self._timed() as timer:
            try:
                data = retrying(attempt)
            except MalformedResponse as error:
                failure: OpenAIEngineError | None = OpenAIEngineError(
                    f"{self._label()}: {what} failed: {error} (HTTP 200)", status_code=200, attempts=attempts
                )
            except openai.OpenAIError as error:
                failure = self._failure(error, what, attempts, timeout)
            else:
                failure = None
        if failure is not None:
            self._count(calls=0, seconds=timer["seconds"])
            raise failure
        usage = usage_tokens(data)
        cost = self.price.cost(*usage) if self.price else 0.0
        self._count(
            calls=1, prompt_tokens=usage[0], completion_tokens=usage[1], seconds=timer["seconds"], cost_usd=cost
        )
        return data

    def _retry_wait(self, state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        retry_after = retry_after_seconds(error)
        if retry_after is not None:
            return min(retry_after, self._retry_after_max)
        backoff = tenacity.wait_exponential_jitter(
            initial=self._backoff_base, max=self._backoff_max, jitter=self._backoff_base
        )
        return backoff(state)

    def _failure(
        self, error: openai.OpenAIError, what: str, attempts: int, timeout: float | None = None
    ) -> OpenAIEngineError:
        """An error that names model, server and status; the server's message (which may
        quote the prompt) is left out on purpose."""
        status: int | None = None
        if isinstance(error, openai.APITimeoutError):
            reason = f"timed out after {self.timeout if timeout is None else timeout:g} s"
        elif isinstance(error, openai.APIConnectionError):
            reason = "could not connect to the server"
        elif isinstance(error, openai.APIStatusError):
            status = error.status_code
            reason = f"HTTP {status} ({type(error).__name__})"
            code = error_code(error)
            if code:
                reason += f", error code {code!r}"
            reason += {
                401: "; check api_key / OPENAI_API_KEY",
                403: "; the key may lack access to this model",
                404: "; check the model name and base_url",
            }.get(status, "")
        else:
            reason = type(error).__name__
        return OpenAIEngineError(
            f"{self._label()}: {what} failed after {attempts} attempt(s): {reason}",
            status_code=status,
            attempts=attempts,
        )

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

    def _warn_once(self, key: str, message: str) -> None:
        with self._state_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
