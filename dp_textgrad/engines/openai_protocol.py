"""The OpenAI wire format as the engine sees it: response schemas, errors and helpers.

Everything the server sends is validated here before the engine uses it; error
messages name fields, statuses and codes, never prompt text.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dp_textgrad.engines.base import EngineError

OPENAI_HOST = "api.openai.com"
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


class CompletionResponse(_Schema):
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


class ChatResponse(_Schema):
    choices: list[_ChatChoice] = Field(min_length=1)


@dataclass(frozen=True)
class EchoToken:
    """One echoed prompt token: its character span in the prompt and log-probs."""

    start: int
    end: int
    text: str
    logprob: float | None
    top: tuple[tuple[str, float], ...]


class MalformedResponse(Exception):
    """The server answered 2xx with something that is not the expected JSON."""


class EchoUnavailable(Exception):
    """The server gave no log-probs for the prompt tokens, or refused the echo request
    (``rejection``: its 400/422 error, which may also be about the prompt itself)."""

    def __init__(self, prompt: str = "", rejection: OpenAIEngineError | None = None) -> None:
        super().__init__("no prompt log-probs")
        self.prompt = prompt
        self.rejection = rejection


# -- module helpers ------------------------------------------------------------------
def check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def validate_response(schema: type[BaseModel], data: dict, engine: Any, what: str) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        # Name the fields only: pydantic's messages quote the offending values.
        fields = sorted({".".join(str(p) for p in e["loc"]) or "<root>" for e in error.errors()})
        raise OpenAIEngineError(
            f"{engine._label()}: {what} got a response with missing or malformed fields: {', '.join(fields[:5])}",
            status_code=200,
        ) from None


def is_transient(error: BaseException) -> bool:
    if isinstance(error, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code in _RETRYABLE_STATUS or error.status_code >= 500
    return False


def retry_after_seconds(error: BaseException | None) -> float | None:
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


def error_code(error: openai.APIStatusError) -> str | None:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        code = inner.get("code") if isinstance(inner, dict) else None
        if isinstance(code, str) and _ERROR_CODE.match(code):
            return code
    return None


def usage_tokens(data: dict) -> tuple[int, int]:
    """(prompt, completion) tokens from the response's usage field; 0 where absent."""
    try:
        usage = _UsageFields.model_validate(data.get("usage") or {})
    except ValidationError:
        return 0, 0
    return max(usage.prompt_tokens or 0, 0), max(usage.completion_tokens or 0, 0)


def echoed_prompt_tokens(prompt: str, text: str, logprobs: _CompletionLogprobs | None, top_k: int) -> list[EchoToken]:
    """The tokens of ``prompt`` (not the generated one) with character spans and log-probs.

    Raises ``EchoUnavailable`` when the server did not echo: no log-probs, or a text that
    neither starts with the prompt nor is spelled out by the returned tokens.
    """
    if logprobs is None or not logprobs.tokens:
        raise EchoUnavailable
    if not text.startswith(prompt) and not "".join(logprobs.tokens).startswith(prompt):
        raise EchoUnavailable
    tokens = logprobs.tokens
    n = len(tokens)
    if len(logprobs.token_logprobs) != n:
        raise EchoUnavailable
    offsets = logprobs.text_offset
    if offsets is None or len(offsets) != n:
        offsets, position = [], 0
        for token in tokens:  # reconstruct from the token texts
            offsets.append(position)
            position += len(token)
    tops = logprobs.top_logprobs if logprobs.top_logprobs and len(logprobs.top_logprobs) == n else [None] * n
    result: list[EchoToken] = []
    for i, (token, start) in enumerate(zip(tokens, offsets)):
        if start >= len(prompt):
            break  # the generated continuation
        end = offsets[i + 1] if i + 1 < n and offsets[i + 1] >= start else start + len(token)
        end = min(max(end, start + len(token)), len(prompt))
        if not token:
            continue  # zero-width tokens (BOS) carry no prompt text
        # Best first, at most top_k (llama.cpp adds the actual token beyond its top k).
        top = tuple(sorted(((str(k), float(v)) for k, v in (tops[i] or {}).items()), key=lambda kv: -kv[1])[:top_k])
        result.append(EchoToken(start, end, token, logprobs.token_logprobs[i], top))
    # Without echo a server returns only generated tokens (offsets at or past the prompt's end).
    if not result or (len(result) > 1 and all(t.logprob is None for t in result)):
        raise EchoUnavailable
    return result


def tokens_overlapping(tokens: list[EchoToken], start: int, end: int) -> list[EchoToken]:
    """Tokens whose character span meets [start, end); a straddling token counts."""
    return [t for t in tokens if t.end > start and t.start < end]
