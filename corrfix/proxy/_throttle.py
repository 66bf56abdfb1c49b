"""Repair warnings held to a rate per kind, for the whole process.

A broker that loses answers by the thousand per second would otherwise cost a warning line
per repair: the relay engine's CPU, which formats them, and the log pipeline's, which ships
them, both when corrfix is busiest. Every repair is still counted (``corrfix_repairs``, each
connection's closing line, capture), and the next line written says how many were not. A
storm that ends has no next line, so the proxy says what is still left out every
:data:`HELD_REPORT_INTERVAL` (:meth:`LogThrottle.take_held`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

LOG_RATE = 10.0
"""Lines a second, for each kind, once a burst is spent."""
LOG_BURST = 20.0
"""Lines that may come at once, for each kind."""
HELD_REPORT_INTERVAL = 10.0
"""How often the proxy logs the lines left out that no later line has counted yet."""


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

    def take_held(self) -> dict[str, int]:
        """Lines left out per key that no line written since has counted, reset to none: a
        storm that ended has no next line to say them."""
        with self._lock:
            held = {key: bucket.held for key, bucket in self._buckets.items() if bucket.held}
            for key in held:
                self._buckets[key].held = 0
        return held
