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
_KEEP_SRTT, _KEEP_RTTVAR = 1 - _ALPHA, 1 - _BETA
"""Weights of the old estimates, computed once: ``observe`` runs for nearly every answer."""


class RetransmitTimer:
    """Smoothed latency and variation per api key; an unknown key gets the maximum."""

    __slots__ = ("_estimates", "maximum", "minimum")

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = min(minimum, maximum)
        self.maximum = maximum
        self._estimates: dict[int, list[float]] = {}
        """Per api key: [smoothed latency, its variation], updated in place."""

    def observe(self, api_key: int, sample: float) -> None:
        """Fold in one latency sample of a request that was sent only once (Karn's rule)."""
        estimate = self._estimates.get(api_key)
        if estimate is None:
            self._estimates[api_key] = [sample, sample / 2]
            return
        srtt, rttvar = estimate
        estimate[1] = _KEEP_RTTVAR * rttvar + _BETA * abs(srtt - sample)
        estimate[0] = _KEEP_SRTT * srtt + _ALPHA * sample

    def timeout(self, api_key: int) -> float:
        """How long an answer of this api key may be late before it is worth a probe."""
        estimate = self._estimates.get(api_key)
        if estimate is None:
            return self.maximum
        srtt, rttvar = estimate
        return min(max(srtt + _K * rttvar, self.minimum), self.maximum)
