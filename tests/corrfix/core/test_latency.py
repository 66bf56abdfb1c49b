"""The adaptive probe timeout (corrfix.core._latency) against RFC 6298's estimator, written out."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from corrfix.core._latency import RetransmitTimer

MINIMUM, MAXIMUM = 0.02, 1.0
SAMPLES = st.lists(st.floats(0.0, 5.0, allow_nan=False), max_size=30)


def rfc6298_timeout(samples: list[float]) -> float:
    """RFC 6298 section 2: SRTT and RTTVAR from the samples (alpha 1/8, beta 1/4, K 4), bounded."""
    if not samples:
        return MAXIMUM
    srtt, rttvar = samples[0], samples[0] / 2
    for sample in samples[1:]:
        rttvar = (1 - 1 / 4) * rttvar + 1 / 4 * abs(srtt - sample)
        srtt = (1 - 1 / 8) * srtt + 1 / 8 * sample
    return min(max(srtt + 4 * rttvar, MINIMUM), MAXIMUM)


@given(produce=SAMPLES, fetch=SAMPLES)
def test_timeout_follows_the_estimator_per_api_key(produce, fetch):
    timer = RetransmitTimer(MINIMUM, MAXIMUM)
    for i in range(max(len(produce), len(fetch))):  # interleaved: the keys must not mix
        if i < len(produce):
            timer.observe(0, produce[i])
        if i < len(fetch):
            timer.observe(1, fetch[i])
    assert timer.timeout(0) == rfc6298_timeout(produce)
    assert timer.timeout(1) == rfc6298_timeout(fetch)
    assert timer.timeout(99) == MAXIMUM


def test_minimum_above_maximum_is_clamped():
    timer = RetransmitTimer(2.0, 1.0)
    timer.observe(0, 0.0)
    assert timer.timeout(0) == 1.0


def test_samples_of_zero_never_leave_the_estimates_subnormal():
    """A busy consumer's Fetch is answered before its max wait, so each sample, less the
    hold, is 0. The estimates then decay geometrically: RFC 6298's arithmetic would keep them
    at the smallest subnormal floats for good, whose every operation takes a microcode assist
    (observe() took half as long again), once per batch of answers for the connection's life."""
    timer = RetransmitTimer(MINIMUM, MAXIMUM)
    timer.observe(1, 0.01)
    for _ in range(10_000):
        timer.observe(1, 0.0)
    _, srtt, rttvar = timer._estimates[1]
    assert srtt == 0.0 or srtt >= sys.float_info.min
    assert rttvar == 0.0 or rttvar >= sys.float_info.min
    assert timer.timeout(1) == MINIMUM
