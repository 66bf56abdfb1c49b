"""Adaptive probe timeouts, one per api key, in the manner of TCP's retransmission timer.

A probe is cheap and harmless against a conforming broker (it is answered after every
older request), so the proxy can probe as soon as an answer is later than usual rather
than after a fixed second. "Usual" is learned per api key from the smoothed latency and
its variation (RFC 6298's estimator), bounded by the configured minimum and maximum.
"""

from __future__ import annotations

import sys

_ALPHA = 0.125
_BETA = 0.25
_K = 4.0
_KEEP_SRTT, _KEEP_RTTVAR = 1 - _ALPHA, 1 - _BETA
"""Weights of the old estimates, computed once rather than per sample."""
_SMALLEST_NORMAL = sys.float_info.min
"""Below this, floats are subnormal. Samples of 0 (a busy consumer's Fetch, answered before its
max wait, less that hold) decay both estimates geometrically, and RFC 6298's arithmetic then
keeps them at the smallest subnormals for good (7/8 of one rounds back to it), each operation
on which takes a microcode assist: half as much again per sample, for the connection's life.
They are flushed to 0 there, which costs a comparison only when the timeout is below the
minimum."""


class RetransmitTimer:
    """Smoothed latency and variation per api key; an unknown key gets the maximum."""

    __slots__ = ("_estimates", "maximum", "minimum")

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = min(minimum, maximum)
        self.maximum = maximum
        self._estimates: dict[int, tuple[float, float, float]] = {}
        """Per api key: the bounded timeout, then the smoothed latency and its variation. The
        timeout is computed once per sample: it is asked after every receive, and a sample
        comes once per batch of answers."""

    def observe(self, api_key: int, sample: float) -> None:
        """Fold in one latency sample of a request that was sent only once (Karn's rule)."""
        estimate = self._estimates.get(api_key)
        if estimate is None:
            srtt, rttvar = sample, sample / 2
        else:
            _, srtt, rttvar = estimate
            rttvar = _KEEP_RTTVAR * rttvar + _BETA * abs(srtt - sample)
            srtt = _KEEP_SRTT * srtt + _ALPHA * sample
        timeout = srtt + _K * rttvar  # bounded by hand: min() and max() cost twice as much
        if timeout < self.minimum:
            if timeout < _SMALLEST_NORMAL:
                srtt = rttvar = 0.0  # flushed (see _SMALLEST_NORMAL); 0 is exact and quick
            timeout = self.minimum
        elif timeout > self.maximum:
            timeout = self.maximum
        self._estimates[api_key] = (timeout, srtt, rttvar)

    def timeout(self, api_key: int) -> float:
        """How long an answer of this api key may be late before it is worth a probe."""
        estimate = self._estimates.get(api_key)
        return self.maximum if estimate is None else estimate[0]
