"""Adaptive probe timeouts, one per api key, in the manner of TCP's retransmission timer.

A probe is cheap and harmless against a conforming broker (it is answered after every
older request), so the proxy can probe as soon as an answer is later than usual rather
than after a fixed second. "Usual" is learned per api key from the smoothed latency and
its variation (RFC 6298's estimator), bounded by the configured minimum and maximum.
"""

from __future__ import annotations

_ALPHA = 0.125
_BETA = 0.25
_K = 4.0


class RetransmitTimer:
    """Smoothed latency and variation per api key; an unknown key gets the maximum."""

    __slots__ = ("_estimates", "maximum", "minimum")

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = min(minimum, maximum)
        self.maximum = maximum
        self._estimates: dict[int, tuple[float, float]] = {}

    def observe(self, api_key: int, sample: float) -> None:
        """Fold in one latency sample of a request that was sent only once (Karn's rule)."""
        estimate = self._estimates.get(api_key)
        if estimate is None:
            self._estimates[api_key] = (sample, sample / 2)
            return
        srtt, rttvar = estimate
        rttvar = (1 - _BETA) * rttvar + _BETA * abs(srtt - sample)
        srtt = (1 - _ALPHA) * srtt + _ALPHA * sample
        self._estimates[api_key] = (srtt, rttvar)

    def timeout(self, api_key: int) -> float:
        """How long an answer of this api key may be late before it is worth a probe."""
        estimate = self._estimates.get(api_key)
        if estimate is None:
            return self.maximum
        srtt, rttvar = estimate
        return min(max(srtt + _K * rttvar, self.minimum), self.maximum)
