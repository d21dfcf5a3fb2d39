"""One private record under every candidate prompt at once: batched generation on the DSPy path.

DP-ES scores each private record under the K candidates of a generation. The CLI's generation
path hands the engine one record and the K prompts (``engine.generate_for_prefixes``), which
llama.cpp decodes together. A DSPy program cannot be handed K prompts: it is Python that calls
its LM one request at a time. So :func:`run_under_prompts` runs the program once per candidate,
each run in a thread of its own, all on the SAME record, and the runs meet at a
:class:`CandidateRendezvous`: an :class:`~.lm.EngineLM` request of a run waits until every other
run has made its next request or finished, and the round's requests go to the engine together.
Requests with the same inputs text (the suffix) and settings on an engine that decodes prefixes
together become one ``generate_for_prefixes`` call over their distinct prefixes (a predictor two
candidates share is generated once); any other request is its own ``generate_after_prefix``.

Why it keeps the guarantee: a rendezvous only ever holds requests made for one record (under
public candidate prompts), so each output depends on the public prompts and that record alone,
exactly as on the CLI's path, and one record still moves each candidate's sum by at most the
clip bound. Rounds are set by the runs' own requests, never by a clock: which requests share a
decode is a function of this record's runs, not of other records or timing.

A request made in a thread that is not one of the runs (a thread the program starts itself) is
sent alone; a failing batched call is retried request by request, so each run sees the outcome
(output or error) it would have had alone.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_RENDEZVOUS: contextvars.ContextVar[CandidateRendezvous | None] = contextvars.ContextVar(
    "dp_textgrad_candidate_rendezvous", default=None
)


@dataclass(eq=False)
class PrefixRequest:
    """One greedy generation of ``prefix + suffix`` on ``engine`` (a run's LM request)."""

    engine: Any
    prefix: str
    suffix: str
    max_tokens: int
    stop: tuple[str, ...] | None
    position: int = 0  # the run's place among the candidates: a round is sent in this order
    output: str | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def group_key(self) -> tuple[int, str, int, tuple[str, ...] | None]:
        return (id(self.engine), self.suffix, self.max_tokens, self.stop)


def _send_alone(request: PrefixRequest) -> None:
    try:
        (output,) = request.engine.generate_after_prefix(
            request.prefix, [request.suffix], max_tokens=request.max_tokens, stop=request.stop and list(request.stop)
        )
        request.output = str(output)
    except BaseException as exc:  # noqa: BLE001 - handed to the run that made the request
        request.error = exc
    request.done.set()


def send_together(requests: Sequence[PrefixRequest]) -> None:
    """Generate ``requests`` (one record's, under several prompts): those sharing engine, suffix and
    settings in one ``generate_for_prefixes`` over their distinct prefixes where the engine decodes
    prefixes together, the others one by one. Every request ends done, with an output or an error."""
    groups: dict[tuple[int, str, int, tuple[str, ...] | None], list[PrefixRequest]] = {}
    for request in requests:
        groups.setdefault(request.group_key(), []).append(request)
    for group in groups.values():
        first = group[0]
        prefixes = list(dict.fromkeys(request.prefix for request in group))
        if len(prefixes) > 1 and getattr(first.engine, "batches_prefixes", False):
            try:
                outputs = first.engine.generate_for_prefixes(
                    prefixes, first.suffix, max_tokens=first.max_tokens, stop=first.stop and list(first.stop)
                )
                if len(outputs) != len(prefixes):
                    raise RuntimeError("engine.generate_for_prefixes: returned the wrong number of outputs")
            except Exception:  # noqa: BLE001 - each request gets the outcome it has alone
                outputs = None
            if outputs is not None:
                by_prefix = dict(zip(prefixes, (str(o) for o in outputs), strict=True))
                for request in group:
                    request.output = by_prefix[request.prefix]
                    request.done.set()
                continue
        shared: dict[str, PrefixRequest] = {}
        for request in group:
            same = shared.get(request.prefix)
            if same is None:
                shared[request.prefix] = request
                _send_alone(request)
            else:  # the same text under two candidates (a part a child did not edit): generated once
                request.output, request.error = same.output, same.error
                request.done.set()


class CandidateRendezvous:
    """Where the runs of one record under K candidate prompts meet (module docstring).

    A round closes when every live run (registered with :meth:`member`, not yet finished) waits
    with a request; the run that closes it sends the round (:func:`send_together`) while the
    others wait for their outputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: dict[int, int] = {}  # thread ident -> the run's position
        self._pending: list[PrefixRequest] = []

    @contextmanager
    def member(self, position: int = 0) -> Iterator[None]:
        """Run the block as one of the runs (this thread, the ``position``-th candidate), leaving
        when it ends."""
        ident = threading.get_ident()
        with self._lock:
            self._members[ident] = position
        token = _RENDEZVOUS.set(self)
        try:
            yield
        finally:
            _RENDEZVOUS.reset(token)
            with self._lock:
                self._members.pop(ident, None)
                round_ = self._close_round()
            if round_:
                send_together(round_)

    def _close_round(self) -> list[PrefixRequest]:
        """The pending requests if every live run has one (caller holds the lock), else []."""
        if self._pending and len(self._pending) >= len(self._members):
            round_, self._pending = self._pending, []
            return sorted(round_, key=lambda request: request.position)  # the same order whatever the timing
        return []

    def generate(self, request: PrefixRequest) -> str:
        """``request``'s output, generated with the round it closes or joins."""
        with self._lock:
            position = self._members.get(threading.get_ident())
            if position is None:
                round_ = None
            else:
                request.position = position
                self._pending.append(request)
                round_ = self._close_round()
        if round_ is None:
            _send_alone(request)
        elif round_:
            send_together(round_)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.output or ""


def current_rendezvous() -> CandidateRendezvous | None:
    """The rendezvous of the run this thread belongs to, if any."""
    return _RENDEZVOUS.get()


def run_under_prompts(prompts: Sequence[str], run: Callable[[str], T]) -> list[T | BaseException]:
    """``run(prompt)`` for each prompt, each in a thread of its own meeting the others at one
    :class:`CandidateRendezvous`; in prompt order, each the result or the exception it raised.
    Call it for ONE private record (module docstring)."""
    rendezvous = CandidateRendezvous()
    results: list[Any] = [None] * len(prompts)
    ready = threading.Barrier(len(prompts)) if prompts else None

    def one(position: int) -> None:
        with rendezvous.member(position):
            assert ready is not None
            ready.wait()  # every run registered before any request: a round waits for all of them
            try:
                results[position] = run(prompts[position])
            except BaseException as exc:  # noqa: BLE001 - the caller scores it as that run's failure
                results[position] = exc

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(one, position), daemon=True)
        for position in range(len(prompts))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


__all__ = ["CandidateRendezvous", "PrefixRequest", "current_rendezvous", "run_under_prompts", "send_together"]
