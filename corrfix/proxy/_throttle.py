"""Repair warnings held to a rate per kind, for the whole process.

A broker that loses answers by the thousand per second would otherwise cost a warning line
per repair: the relay engine's CPU, which formats them, and the log pipeline's, which ships
them, both when corrfix is busiest. Every repair is still counted (``corrfix_repairs``, each
connection's closing line, capture), and the next line written says how many were not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

LOG_RATE = 10.0
"""Lines a second, for each kind, once a burst is spent."""
LOG_BURST = 20.0
"""Lines that may come at once, for each kind."""


class _Bucket:
    __slots__ = ("at", "held", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at
        self.held = 0


class LogThrottle:
    """A token bucket per key; the relay engine's thread and trio's both ask."""

    def __init__(
        self, rate: float = LOG_RATE, burst: float = LOG_BURST, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, key: str) -> int | None:
        """None: leave this line out. Otherwise how many lines of ``key`` were left out since
        the last one written, which this one should say."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(self._burst, now)
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
            bucket.at = now
            if bucket.tokens < 1.0:
                bucket.held += 1
                return None
            bucket.tokens -= 1.0
            held, bucket.held = bucket.held, 0
            return held
