"""Test servers for the HTTP engine.

``FaultServer``: a small OpenAI-compatible server (standard library only, in a thread
on 127.0.0.1) with a deterministic fake model and a script of faults for the next
requests: 429 with Retry-After, 5xx, slow answers, malformed JSON, missing fields.
It records every request and the largest number of requests in flight at once.

``LlamaCppServer``: the real ``python -m llama_cpp.server`` as a subprocess on a free
port, started once and always killed at teardown.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# -- the fake model -------------------------------------------------------------------
_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


def fake_tokens(text: str) -> list[str]:
    """Words and punctuation, each with its leading whitespace (like BPE's ' word')."""
    return _TOKEN.findall(text)


def fake_logprob(token: str, preferences: dict[str, float] | None = None) -> float:
    """The fake model's log p of a token: a per-word preference, else -0.25 per letter - 0.5."""
    word = token.strip()
    if preferences and word in preferences:
        return preferences[word]
    return -0.25 * len(word) - 0.5


@dataclass(frozen=True)
class Fault:
    """What to do with one request instead of (or before) answering normally."""

    status: int = 200
    delay: float = 0.0
    body: bytes | None = None  # raw body to send instead of the normal answer
    headers: dict[str, str] = field(default_factory=dict)


def rate_limited(retry_after: float | str | None = None) -> Fault:
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    body = json.dumps({"error": {"message": "slow down", "type": "rate_limit", "code": "rate_limit_exceeded"}})
    return Fault(status=429, headers=headers, body=body.encode())


def server_error(status: int = 500, message: str = "internal error") -> Fault:
    body = json.dumps({"error": {"message": message, "type": "server_error", "code": None}})
    return Fault(status=status, body=body.encode())


def slow(delay: float) -> Fault:
    return Fault(delay=delay)


def malformed_json() -> Fault:
    return Fault(body=b'{"id": "cmpl-1", "choices": [{"text": "trunc')


def missing_fields() -> Fault:
    return Fault(body=json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0}]}).encode())


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    body: dict[str, Any]
    started: float  # time.perf_counter() when the request arrived


class FaultServer:
    """An OpenAI-compatible fake on 127.0.0.1; use as a context manager.

    ``latency``: seconds every answer waits (the artificial model latency).
    ``preferences``: word -> log-prob overrides of the fake model.
    ``echo``: whether /v1/completions honours ``echo`` (False: like a server that ignores it).
    ``first_token_top``: the top log-probs of the first generated token (for the
    no-echo fallback); the first key is the generated token.
    ``reply``: prompt text -> generated text.
    ``context_limit``: prompts of more fake tokens are refused with HTTP 400, and the
    error message quotes the prompt (as some real servers' messages do).
    ``tokenizer``: serve llama-cpp-python's ``/extras/tokenize`` and ``/extras/detokenize``
    (fake tokens numbered in order of first sight, BOS = 0 added in front).
    ``echo_delay``: extra seconds every echo request waits (a server whose echo is slow).
    Scripted faults apply to the OpenAI endpoints (``.../completions``) only.
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        preferences: dict[str, float] | None = None,
        echo: bool = True,
        first_token_top: dict[str, float] | None = None,
        reply: Callable[[str], str] | None = None,
        context_limit: int | None = None,
        tokenizer: bool = False,
        echo_delay: float = 0.0,
    ) -> None:
        self.latency = latency
        self.preferences = dict(preferences or {})
        self.echo = echo
        self.first_token_top = dict(first_token_top or {" ok": -0.1, " yes": -2.5, " no": -3.0})
        self.reply = reply or (lambda prompt: f" answer to {len(prompt)} chars")
        self.context_limit = context_limit
        self.tokenizer = tokenizer
        self.echo_delay = echo_delay
        self._vocab: dict[str, int] = {}
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def script(self, *faults: Fault) -> None:
        """Apply these faults, in order, to the next requests; then answer normally."""
        with self._lock:
            self._faults.extend(faults)

    def reset(self) -> None:
        with self._lock:
            self._faults.clear()
            self.requests = []
            self.max_in_flight = 0

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def start(self) -> FaultServer:
        handler = _make_handler(self)
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fault-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- request handling (called on handler threads) ------------------------------
    def _next_fault(self) -> Fault | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def _enter(self, record: RecordedRequest) -> None:
        # Recorded on arrival, so a client that has its answer always finds its request here.
        with self._lock:
            self.requests.append(record)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _tokenize(self, text: str) -> list[int]:
        with self._lock:
            return [0] + [self._vocab.setdefault(token, len(self._vocab) + 1) for token in fake_tokens(text)]

    def _detokenize(self, ids: list[int]) -> str:
        with self._lock:
            pieces = {i: token for token, i in self._vocab.items()}
        return "".join(pieces.get(i, "") for i in ids)

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.tokenizer and path.endswith("/extras/tokenize"):
            return {"tokens": self._tokenize(body["input"])}
        if self.tokenizer and path.endswith("/extras/detokenize"):
            return {"text": self._detokenize(body["tokens"])}
        if body.get("echo") and self.echo_delay:
            time.sleep(self.echo_delay)
        if self.context_limit is not None:
            prompt = body.get("prompt") or "\n".join(str(m.get("content")) for m in body.get("messages", []))
            if len(fake_tokens(prompt)) > self.context_limit:
                raise PromptTooLong(f"prompt exceeds the context window of {self.context_limit} tokens: {prompt[:200]}")
        if path.endswith("/chat/completions"):
            return self._chat(body)
        if path.endswith("/completions"):
            return self._completion(body)
        raise KeyError(path)

    def _usage(self, prompt: str, completion: str) -> dict[str, int]:
        p, c = len(fake_tokens(prompt)), len(fake_tokens(completion))
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        want_logprobs = body.get("logprobs")
        if want_logprobs is not None:
            generated = next(iter(self.first_token_top))  # one greedy token
        else:
            generated = self.reply(prompt)[: 4 * int(body.get("max_tokens", 16))]
        echo = bool(body.get("echo")) and self.echo
        logprobs = None
        if want_logprobs is not None:
            k = int(want_logprobs)
            tokens, offsets, lps, tops = [], [], [], []
            position = 0 if echo else len(prompt)
            for token in fake_tokens(prompt) if echo else []:
                lp = fake_logprob(token, self.preferences)
                tokens.append(token)
                offsets.append(position)
                lps.append(lp)
                tops.append(dict(sorted({token: lp, " the": -1.0, ",": -1.5}.items(), key=lambda kv: -kv[1])[:k]))
                position += len(token)
            if echo and tokens:  # the OpenAI convention: no log-prob for the first token
                lps[0], tops[0] = None, None
            top_generated = dict(list(self.first_token_top.items())[:k])
            tokens.append(generated)
            offsets.append(position)
            lps.append(self.first_token_top[generated])
            tops.append(top_generated)
            logprobs = {"tokens": tokens, "text_offset": offsets, "token_logprobs": lps, "top_logprobs": tops}
        text = (prompt if echo else "") + generated
        return {
            "id": "cmpl-fake", "object": "text_completion", "created": 0, "model": body.get("model"),
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": "length"}],
            "usage": self._usage(prompt, generated),
        }

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
        logprobs = None
        if body.get("logprobs"):
            k = int(body.get("top_logprobs") or 0)
            generated = next(iter(self.first_token_top))
            top = [{"token": t, "logprob": lp, "bytes": None} for t, lp in list(self.first_token_top.items())[:k]]
            logprobs = {"content": [{"token": generated, "logprob": self.first_token_top[generated],
                                     "bytes": None, "top_logprobs": top}]}
        else:
            generated = self.reply(body["messages"][-1]["content"])
        return {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": generated},
                         "logprobs": logprobs, "finish_reason": "stop"}],
            "usage": self._usage(prompt, generated),
        }


class PromptTooLong(ValueError):
    pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once in the concurrency tests

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out and hang up are part of the tests


def _make_handler(server: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode())
            else:
                self._send(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:
            started = time.perf_counter()
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = {}
            server._enter(RecordedRequest(self.path, body, started))
            try:
                status, payload, headers = self._respond(body)
            finally:
                server._leave()  # before the answer goes out: the client then sees a settled count
            self._send(status, payload, headers)

        def _respond(self, body: dict[str, Any]) -> tuple[int, bytes, dict[str, str] | None]:
            fault = server._next_fault() if self.path.endswith("completions") else None
            delay = server.latency + (fault.delay if fault else 0.0)
            if delay:
                time.sleep(delay)
            if fault is not None and fault.body is not None:
                return fault.status, fault.body, fault.headers
            try:
                payload = json.dumps(server.answer(self.path, body)).encode()
            except PromptTooLong as error:
                message = {"error": {"message": str(error), "type": "invalid_request_error",
                                     "code": "context_length_exceeded"}}
                return 400, json.dumps(message).encode(), None
            except (KeyError, TypeError, ValueError):
                return 400, b'{"error": {"message": "bad request", "code": "invalid_request"}}', None
            return (fault.status if fault else 200), payload, (fault.headers if fault else None)

    return Handler


# -- the real llama.cpp server ---------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it when the test process dies, even if killed
    before its teardown runs (elsewhere a no-op; stop() still kills it normally)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class LlamaCppServer:
    """``python -m llama_cpp.server`` on 127.0.0.1 serving one GGUF model.

    ``start()`` waits until ``/v1/models`` answers; ``stop()`` kills the process
    group it started. The server's log goes to a private temp dir removed at stop.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        model_alias: str = "local-model",
        n_ctx: int = 2048,
        n_threads: int = 1,
        startup_timeout: float = 180.0,
    ) -> None:
        self.model_path = Path(model_path)
        self.model_alias = model_alias
        self.n_ctx = n_ctx
        # One thread by default: llama.cpp's spinning worker threads slow down badly on a
        # busy (CI) machine, and this model is small.
        self.n_threads = n_threads
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_dir: str | None = None

    @property
    def base_url(self) -> str:
        assert self.port is not None, "start() the server first"
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LlamaCppServer:
        self.port = free_port()
        self._log_dir = tempfile.mkdtemp(prefix="dp-textgrad-llama-server-")
        log = open(Path(self._log_dir) / "server.log", "wb")
        command = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model_path), "--model_alias", self.model_alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
        ]
        try:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             preexec_fn=_die_with_parent)
        finally:
            log.close()
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with code {self._process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"llama_cpp.server did not answer within {self.startup_timeout:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        if not self._log_dir:
            return ""
        path = Path(self._log_dir) / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)  # the group this helper started
                process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        if self._log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
