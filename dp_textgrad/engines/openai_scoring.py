"""Label scores over HTTP: the first generated token's top log-probs, or prompt log-probs through ``echo``.

A mixin of :class:`~dp_textgrad.engines.openai_engine.OpenAIEngine`: it uses the
engine's transport (``_request``), cache and warnings.

Which route a set of labels takes is decided once per label set, from public inputs only
(never from a record), and then kept: the server's tokenizer (llama-cpp-python's
``/extras/tokenize``, llama.cpp's ``/tokenize``), else one short echo of each label after a
fixed public context, gives each label's first token. When those differ, one plain
completion per record (``max_tokens=1`` with top log-probs) scores every label by its
first token; otherwise (``scoring="auto"``) echo scores the whole label if an echo of public
text shows that the server gives prompt log-probs, and the first-token approximation if not.

Whether the server echoes is learned from public text only (the labels' echo, the
preflight's probe). An echo refused (400/422) or answered without prompt log-probs while
records are scored raises an error and never turns echo off for later records: a private
record (a long one, say) must not choose how the records after it are scored.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx
import numpy as np

if TYPE_CHECKING:
    import openai

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

T = TypeVar("T")
R = TypeVar("R")
Route = Literal["echo", "first_token", "approximate"]

# The public context a label is echoed after to learn its first token when the server has
# no tokenizer endpoint: it ends like the usual record templates ("...\nLabel:").
PROBE_CONTEXT = "Answer:"
# Most top log-probs asked for: OpenAI's /v1/completions allows 5, its chat API and vLLM 20.
MAX_TOP_LOGPROBS = 20
OPENAI_COMPLETIONS_TOP_LOGPROBS = 5


class EchoScoring:
    """Log-probabilities of prompt tokens (mixin; see the module docstring)."""

    if TYPE_CHECKING:  # what OpenAIEngine, which mixes this in, provides (transport, cache, settings)
        model: str
        base_url: str | None
        mode: Literal["chat", "completions"]
        scoring: Literal["auto", "echo", "first_token"]
        top_logprobs: int
        probe_timeout: float
        _state_lock: threading.Lock
        _echo_unavailable: bool
        _echo_verified: bool
        _first_tokens: dict[tuple[str, ...], tuple[str, ...] | None]
        _routes: dict[tuple[str, ...], tuple[Route, tuple[str, ...] | None]]
        _probing: bool
        _client: openai.OpenAI

        def _request(
            self, endpoint: Literal["chat", "completions"], body: dict[str, Any], what: str, *, quick: bool = False
        ) -> dict: ...
        def _map(self, fn: Callable[[T], R], items: list[T]) -> list[R]: ...
        def _is_openai_host(self) -> bool: ...
        def _label(self) -> str: ...
        def _warn_once(self, key: str, message: str) -> None: ...
        def _cache_get(self, key: Hashable | None) -> tuple[bool, Any]: ...
        def _cache_put(self, key: Hashable | None, value: Any) -> None: ...

    # -- which route a label set takes (public labels only) ---------------------------
    def _route(self, choices: Sequence[str]) -> tuple[Route, tuple[str, ...] | None]:
        """How to score ``choices``, and their first tokens when the first-token route is exact.

        ``echo``: prompt log-probs of the whole label (asked for, or the labels share a first
        token and the server echoes). ``first_token``: the top log-probs of the first generated
        token, read at each label's own first token. ``approximate``: the same request, matched
        by text (chat mode, or no way to learn the labels' tokens, or no echo).

        Decided the first time a label set is scored (the preflight's public probe, before any
        charge), from public inputs only, and kept for the engine's life.
        """
        key = tuple(choices)
        with self._state_lock:
            decided = self._routes.get(key)
        if decided is not None:
            return decided
        decided = self._decide_route(key)
        with self._state_lock:
            return self._routes.setdefault(key, decided)

    def _decide_route(self, choices: tuple[str, ...]) -> tuple[Route, tuple[str, ...] | None]:
        if self.scoring == "echo":
            return "echo", None
        if self.mode == "chat":  # a chat reply's first token is not the completion's: match by text
            return "approximate", None
        first = self.label_first_tokens(choices)
        if first is not None and len(set(first)) == len(first):
            return "first_token", first
        if self.scoring == "auto" and self._public_echo_works(choices):
            return "echo", None
        return "approximate", None

    def _public_echo_works(self, choices: tuple[str, ...]) -> bool:
        """Whether the server gives prompt log-probs, from what public echoes showed so far, else
        from one short echo of the first label after the fixed public context."""
        with self._state_lock:
            if self._echo_unavailable or self._echo_verified:
                return not self._echo_unavailable
        try:
            self._echo(PROBE_CONTEXT + choices[0], quick=True)
        except EchoUnavailable as why:
            self._echo_is_unavailable(why, "score_choices_batch")
            return False
        except OpenAIEngineError as error:
            raise OpenAIEngineError(
                f"{self._label()}: the labels share their first token, so scoring='auto' needs echo (prompt "
                f"log-probs), and an echo of the public labels failed ({error}); set engine.options.scoring: "
                "first_token (scoring='first_token' in Python) to score each label by its first token's top "
                "log-probs, matched by text, or fix the server's echo",
                status_code=error.status_code,
                attempts=error.attempts,
            ) from None
        with self._state_lock:
            self._echo_verified = True
        return True

    def label_first_tokens(self, choices: Sequence[str]) -> tuple[str, ...] | None:
        """Each label's first token as the server spells it in top log-probs, learned once per
        label set from the public labels: the server's tokenizer, else (``scoring="auto"``) a
        short echo of each label after a fixed public context. ``None`` when neither works."""
        key = tuple(choices)
        with self._state_lock:
            if key in self._first_tokens:
                return self._first_tokens[key]
        first = self._tokenizer_first_tokens(key)
        if first is None and self.scoring == "auto" and self.mode == "completions":
            first = self._echo_first_tokens(key)
        with self._state_lock:
            self._first_tokens[key] = first
        return first

    def _server_root(self) -> str | None:
        if self.base_url is None or self._is_openai_host():
            return None
        root = self.base_url.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root

    def _tokenizer_first_tokens(self, choices: tuple[str, ...]) -> tuple[str, ...] | None:
        """First tokens from the server's tokenizer endpoint, or ``None`` if it has none.

        llama-cpp-python: ``POST /extras/tokenize`` (ids, BOS included) and
        ``/extras/detokenize`` of the first id; llama.cpp's ``llama-server``: ``POST /tokenize``
        with ``with_pieces``. A short time-out and no retries: this is a probe.
        """
        root = self._server_root()
        if root is None:
            return None
        headers = {"Authorization": f"Bearer {self._client.api_key}"}

        def post(path: str, body: dict[str, Any]) -> Any:
            response = httpx.post(root + path, json=body, headers=headers, timeout=self.probe_timeout)
            response.raise_for_status()
            return response.json()

        def ids(data: Any) -> list[Any]:
            tokens = data.get("tokens") if isinstance(data, dict) else None
            if not isinstance(tokens, list):
                raise ValueError("no tokens")
            return tokens

        try:  # llama-cpp-python
            bos = ids(post("/extras/tokenize", {"input": "", "model": self.model}))
            first: list[str] = []
            for choice in choices:
                tokens = ids(post("/extras/tokenize", {"input": choice, "model": self.model}))
                tokens = tokens[len(bos) :] if tokens[: len(bos)] == bos else tokens
                if not tokens or not isinstance(tokens[0], int):
                    return None
                text = post("/extras/detokenize", {"tokens": [tokens[0]], "model": self.model}).get("text")
                if not isinstance(text, str) or not text:
                    return None
                first.append(text)
            return tuple(first)
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        try:  # llama.cpp's llama-server
            first = []
            for choice in choices:
                body = {"content": choice, "add_special": False, "with_pieces": True}
                tokens = ids(post("/tokenize", body))
                piece = tokens[0].get("piece") if tokens and isinstance(tokens[0], dict) else None
                if not isinstance(piece, str) or not piece:
                    return None
                first.append(piece)
            return tuple(first)
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def _echo_first_tokens(self, choices: tuple[str, ...]) -> tuple[str, ...] | None:
        """First tokens from one short echo per label (``PROBE_CONTEXT + label``, public text),
        each within ``probe_timeout`` and not retried after a time-out. ``None`` if the server
        does not echo (then remembered); an echo that fails otherwise (a time-out, say) raises,
        naming the setting to change."""

        def first(choice: str) -> str | None:
            tokens = self._echo(PROBE_CONTEXT + choice, quick=True)
            span = tokens_overlapping(tokens, len(PROBE_CONTEXT), len(PROBE_CONTEXT) + len(choice))
            return span[0].text if span else None

        try:
            found = self._map(first, list(choices))
        except EchoUnavailable as why:  # no echo here: remembered, as on the first scoring call
            self._echo_is_unavailable(why, "score_choices_batch")
            return None
        except OpenAIEngineError as error:
            raise OpenAIEngineError(
                f"{self._label()}: scoring='auto' could not learn the labels' first tokens: the server has no "
                f"tokenizer endpoint and an echo of the public labels failed ({error}); set "
                "engine.options.scoring: first_token (scoring='first_token' in Python) to score each label by "
                "its first token's top log-probs, matched by text, or fix the server's echo",
                status_code=error.status_code,
                attempts=error.attempts,
            ) from None
        with self._state_lock:
            self._echo_verified = True  # public labels echoed: this server gives prompt log-probs
        if any(f is None for f in found):
            return None
        return tuple(f for f in found if f is not None)

    def top_k_for(self, n_choices: int) -> int:
        """Top log-probs asked for in first-token scoring: at least the number of labels (and
        ``top_logprobs``), at most what the API allows (OpenAI's /v1/completions 5, else 20)."""
        if self.mode == "completions" and self._is_openai_host():
            cap = OPENAI_COMPLETIONS_TOP_LOGPROBS
        else:
            cap = MAX_TOP_LOGPROBS
        return min(max(self.top_logprobs, n_choices), cap)

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
        """Record that this server gives no prompt log-probs (from an echo of PUBLIC text only),
        after making sure a refusal (400/422) was about echo and not about the prompt (too long,
        say): the same prompt without echo decides, and if it fails too, its error is raised."""
        self._check_refusal(why)
        self._mark_echo_unavailable(what)

    def _check_refusal(self, why: EchoUnavailable) -> None:
        """After a refused echo (400/422): send the same prompt without echo, so that a refusal
        of the prompt itself (too long, say) raises its own error."""
        if why.rejection is not None:
            self._request(
                "completions", {"prompt": why.prompt, "max_tokens": 1, "temperature": 0.0}, "a request without echo"
            )

    def _echo_failed_on_a_record(self, why: EchoUnavailable, what: str) -> OpenAIEngineError:
        """The error for an echo that fails while records are scored. Echo stays on: the route
        was fixed from public text, and a record must not change how other records are scored."""
        self._check_refusal(why)
        if self.scoring == "echo":
            return self._no_echo_error(what)
        status = why.rejection.status_code if why.rejection is not None else None
        reason = f"was refused (HTTP {status})" if status is not None else "came back without prompt log-probs"
        return OpenAIEngineError(
            f"{self._label()}: {what}: an echo request {reason} after public echoes had worked; the scoring "
            "route is fixed before scoring and is not changed by a record, so this call fails; set "
            "engine.options.scoring: first_token (scoring='first_token' in Python) if the server's echo is "
            "unreliable, or fix the server",
            status_code=status,
            attempts=why.rejection.attempts if why.rejection is not None else 0,
        )

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

    def _echo(self, prompt: str, *, quick: bool = False) -> list[EchoToken]:
        """The prompt's tokens with their log-probs, from one echo request (cached if enabled)."""
        key = ("echo", self.model, self.base_url, prompt, self.top_logprobs)
        hit, value = self._cache_get(key)
        if hit:
            return value
        body = {"prompt": prompt, "echo": True, "logprobs": self.top_logprobs, "max_tokens": 1, "temperature": 0.0}
        try:
            data = self._request("completions", body, "echo scoring", quick=quick)
        except OpenAIEngineError as error:
            # Some APIs reject echo together with logprobs outright (400/422).
            if self.scoring == "auto" and error.status_code in (400, 422):
                raise EchoUnavailable(prompt, rejection=error) from None
            raise
        choice = validate_response(CompletionResponse, data, self, "echo scoring").choices[0]
        tokens = echoed_prompt_tokens(prompt, choice.text, choice.logprobs, self.top_logprobs)
        self._cache_put(key, tokens)
        return tokens

    def _choice_logprobs_first_token(
        self, context: str, choices: list[str], first_tokens: tuple[str, ...] | None = None
    ) -> list[float]:
        """Each label's log-prob from the top log-probs of the first generated token.

        With ``first_tokens`` (the labels' own first tokens, all different), a label scores the
        log-prob of its first token. Without, the approximation: the log of the summed
        probabilities of the top tokens whose stripped text equals the stripped label. A label
        not found gets the floor ``log max(min(p_k, 1 - sum of the top-k p), 1e-12)``: the most
        probability an unlisted token can have, finite, and never above a listed label's.
        """
        top = self._first_token_top(context, self.top_k_for(len(choices)))
        if not top:
            raise OpenAIEngineError(f"{self._label()}: the server returned no top log-probs")
        scores = []
        top_probs = [math.exp(lp) for _, lp in top]
        floor = math.log(max(min(min(top_probs), 1.0 - sum(top_probs)), 1e-12))
        for index, choice in enumerate(choices):
            if first_tokens is not None:
                matches = [lp for token, lp in top if token == first_tokens[index]]
            else:
                wanted = choice.strip()
                matches = [lp for token, lp in top if token.strip() == wanted]
            if matches:
                scores.append(float(np.logaddexp.reduce(matches)))
            else:
                self._warn_once(
                    f"floor-{index}",
                    f"{self._label()}: choice #{index} is not among the top {len(top)} first tokens; "
                    "it gets a floor log-prob"
                    + ("" if first_tokens is not None else " (multi-token choices cannot be scored without echo)"),
                )
                scores.append(floor)
        return scores

    def _first_token_top(self, context: str, k: int) -> list[tuple[str, float]]:
        key = ("first_token", self.model, self.base_url, self.mode, context, k)
        hit, value = self._cache_get(key)
        if hit:
            return value
        if self.mode == "chat":
            body = {
                "messages": [{"role": "user", "content": context}],
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": True,
                "top_logprobs": MAX_TOP_LOGPROBS,  # OpenAI's maximum: the more candidates, the fewer floors
            }
            data = self._request("chat", body, "first-token scoring")
            logprobs = validate_response(ChatResponse, data, self, "first-token scoring").choices[0].logprobs
            content = logprobs.content if logprobs else None
            top = [(t.token, t.logprob) for t in content[0].top_logprobs] if content else []
        else:
            body = {"prompt": context, "max_tokens": 1, "temperature": 0.0, "logprobs": k}
            data = self._request("completions", body, "first-token scoring")
            logprobs = validate_response(CompletionResponse, data, self, "first-token scoring").choices[0].logprobs
            first = logprobs.top_logprobs[0] if logprobs and logprobs.top_logprobs else None
            # Best first, at most k (llama.cpp adds the generated token beyond its top k).
            top = sorted(first.items(), key=lambda kv: -kv[1])[:k] if first else []
        self._cache_put(key, top)
        return top
