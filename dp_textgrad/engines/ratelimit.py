"""A blocking, thread-safe token bucket for client-side request rate limits.

API providers enforce requests-per-minute limits; hitting them costs a 429 and a
back-off, so the engine spaces its own requests instead. Each ``acquire`` reserves
a token immediately (the bucket may go into debt) and then sleeps off the debt
outside the lock, so waiting threads are served in arrival order without polling.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up for a burst."""

    def __init__(
        self,
        rate: float,
        capacity: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate: must be a finite number > 0 (tokens per second), got {rate!r}")
        if not (isinstance(capacity, (int, float)) and math.isfinite(capacity) and capacity >= 1):
            raise ValueError(f"capacity: must be a finite number >= 1, got {capacity!r}")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self.capacity  # a fresh bucket allows an initial burst of `capacity`
        self._last = clock()

    @classmethod
    def per_minute(cls, requests_per_minute: float, burst: float = 1.0, **kwargs: Any) -> TokenBucket:
        if not (
            isinstance(requests_per_minute, (int, float))
            and math.isfinite(requests_per_minute)
            and requests_per_minute > 0
        ):
            raise ValueError(
                f"requests_per_minute: must be a finite number > 0 or None (no limit), got {requests_per_minute!r}"
            )
        return cls(requests_per_minute / 60.0, burst, **kwargs)

    def acquire(self, tokens: float = 1.0) -> float:
        """Take ``tokens``, sleeping until they are available; return the seconds waited."""
        if not (math.isfinite(tokens) and 0 < tokens <= self.capacity):
            raise ValueError(f"tokens: must be in (0, capacity={self.capacity}], got {tokens!r}")
        with self._lock:
            now = self._clock()
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= tokens
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait
