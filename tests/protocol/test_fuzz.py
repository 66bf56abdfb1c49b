"""Fuzzing the wire layer across modules: damaged real frames, noise, truncations, huge sizes.

The per-module tests feed each parser arbitrary bytes. Here kafka-python's own frames for
every api and version are damaged (bit flips, edge values, inserted and deleted bytes,
truncation, overflowing varints, splices) and run through the whole chain the proxy runs
them through. The contract: :class:`protocol.errors.ProtocolError` is the only error
(the relay catches exactly that one and closes the connection); ``fetch_max_wait_ms``,
``produce_is_idempotent`` and ``sasl_mechanism`` never raise; and memory stays within one
frame whatever the peer announces. ``bench/fuzz.py`` runs the same targets 10⁶ times.
"""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    SIZE_PREFIX,
    ApiKey,
    FrameDecoder,
    FrameSizeError,
    ProtocolError,
    is_flexible,
    parse_request_header,
    produce_acks,
)
from protocol.testing import (
    BAD_VARINTS,
    MUTATIONS,
    STREAM_MAX_FRAME,
    mutate,
    one_case,
    random_stream,
    request_seeds,
    request_target,
    response_seeds,
    response_target,
    stream_target,
    varint_target,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RANDOMS = st.randoms(use_true_random=False)
REQUEST_SEEDS = st.sampled_from(request_seeds())
RESPONSE_SEEDS = st.sampled_from(response_seeds())
OVERFLOWING_VARINTS = st.sampled_from(BAD_VARINTS[:2])  # above 32 bits; longer than 5 bytes


@FUZZ
@given(seed=REQUEST_SEEDS, other=REQUEST_SEEDS, rnd=RANDOMS)
def test_damaged_requests_raise_only_protocol_error(seed, other, rnd):
    request_target(mutate(seed.frame, rnd, other.frame))


@FUZZ
@given(seed=RESPONSE_SEEDS, other=RESPONSE_SEEDS, rnd=RANDOMS)
def test_damaged_responses_raise_only_protocol_error(seed, other, rnd):
    response_target(mutate(seed.frame, rnd, other.frame), seed.api_key, seed.api_version)


@FUZZ
@given(seed=RESPONSE_SEEDS, api_key=st.sampled_from([0, 1, 3, 10, 18, 60]), version=st.integers(0, 30))
def test_responses_matched_to_the_wrong_request_raise_only_protocol_error(seed, api_key, version):
    """A stray answer is decoded as whatever request the proxy thinks it answers."""
    response_target(seed.frame, api_key, version)


@FUZZ
@given(seed=st.one_of(REQUEST_SEEDS, RESPONSE_SEEDS), cut=st.integers(0, 10_000), fix_size=st.booleans())
def test_every_truncation_raises_only_protocol_error(seed, cut, fix_size):
    frame = bytearray(seed.frame[: cut % (len(seed.frame) + 1)])
    if fix_size and len(frame) >= SIZE_PREFIX:
        frame[:SIZE_PREFIX] = (len(frame) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big")
    request_target(frame)
    response_target(frame, seed.api_key, seed.api_version)


@FUZZ
@given(data=st.binary(max_size=64), api_key=st.integers(0, 80), version=st.integers(0, 20))
def test_noise_raises_only_protocol_error(data, api_key, version):
    request_target(data)
    response_target(data, api_key, version)


@FUZZ
@given(rnd=RANDOMS)
def test_decoder_memory_stays_within_one_frame_over_damaged_streams(rnd):
    stream_target(random_stream(rnd), rnd)


@FUZZ
@given(
    data=st.binary(max_size=16),
    pos=st.integers(0, 16),
    bad=st.sampled_from(BAD_VARINTS),
    at=st.integers(0, 16),
)
def test_overflowing_varints_anywhere_raise_only_protocol_error(data, pos, bad, at):
    buf = data[:at] + bad + data[at:]
    varint_target(buf, min(pos, len(buf)))


flexible_requests = [
    seed
    for seed in request_seeds()
    if is_flexible(seed.api_key, seed.api_version) and not (seed.api_key == 7 and seed.api_version == 0)
]


@settings(max_examples=60, deadline=None)
@given(seed=st.sampled_from(flexible_requests), bad=OVERFLOWING_VARINTS)
def test_overflowing_varint_in_a_flexible_header_is_a_protocol_error(seed, bad):
    """Header v2 ends in a tagged-field section; a varint there that overflows must be refused."""
    header = parse_request_header(seed.frame)
    assert header.body_offset is not None
    tags_at = header.body_offset - 1  # kafka-python writes an empty section: one zero byte
    assert seed.frame[tags_at] == 0
    damaged = bytearray(seed.frame[:tags_at] + bad + seed.frame[header.body_offset :])
    damaged[:SIZE_PREFIX] = (len(damaged) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big")
    with pytest.raises(ProtocolError, match="varint"):
        parse_request_header(damaged)


@settings(max_examples=60, deadline=None)
@given(version=st.integers(9, 13), bad=OVERFLOWING_VARINTS)
def test_overflowing_transactional_id_length_is_a_protocol_error(version, bad):
    """From Produce v9 the transactional id's length is a varint, read on every Produce."""
    seed = next(s for s in request_seeds() if s.api_key == ApiKey.PRODUCE and s.api_version == version)
    header = parse_request_header(seed.frame)
    assert header.body_offset is not None
    damaged = seed.frame[: header.body_offset] + bad + b"\x00" * 8
    with pytest.raises(ProtocolError, match="varint"):
        produce_acks(damaged, parse_request_header(damaged))


@pytest.mark.parametrize(
    "size", [-1, -(2**31), 2**31 - 1, DEFAULT_MAX_FRAME_SIZE + 1, 0x16030100, 0x47455420]
)
def test_huge_or_negative_sizes_are_refused_without_buffering_the_body(size):
    """A peer announcing 2 GiB gets refused at its 4 prefix bytes; the body it sends is never kept."""
    body = b"x" * (64 * 1024)
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with pytest.raises(FrameSizeError) as info:
            decoder.feed(size.to_bytes(SIZE_PREFIX, "big", signed=True) + body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.size == size
    assert peak < 3 * len(body)  # the one receive, copied at most once: not the announced size


@settings(max_examples=40, deadline=None)
@given(rnd=RANDOMS, max_frame_size=st.sampled_from([0, 16, STREAM_MAX_FRAME, 70_000]))
def test_decoder_never_holds_more_than_one_frame_for_any_maximum(rnd, max_frame_size):
    stream_target(random_stream(rnd), rnd, max_frame_size)


def test_fuzz_cases_allocate_a_bounded_amount():
    """Whatever a damaged frame announces (2^31-1 array entries, a 4 GiB varint), the targets
    allocate kilobytes, never the announced size."""
    rnd = random.Random(2024)
    for _ in range(300):  # compile kafka-python's codecs outside the measurement
        one_case(rnd)
    tracemalloc.start()
    try:
        worst = 0
        for _ in range(400):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            one_case(rnd)
            worst = max(worst, tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert worst < 4 * 1024 * 1024


def test_the_mutator_reaches_every_stage():
    """A fuzzer whose inputs all die in the first check proves nothing: with a fixed seed,
    damaged frames must still get through to acks, rewriting and capping."""
    rnd = random.Random(99)
    reached = Counter(one_case(rnd) for _ in range(3000))
    for outcome in [
        ("request", "rejected"),
        ("request", "parsed"),
        ("request", "acks read"),
        ("response", "rejected"),
        ("response", "rewritten"),
        ("response", "capped"),
        ("stream", "frames"),
        ("stream", "no frame"),
    ]:
        assert reached[outcome] >= 5, (outcome, reached)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__.strip("_"))
def test_each_mutation_changes_frames(mutation):
    """Every mutation operator does something, so none of them silently fuzzes nothing."""
    rnd = random.Random(1)
    seeds = request_seeds()
    changed = 0
    for i in range(50):
        frame = seeds[i * 5 % len(seeds)].frame
        out = bytearray(frame)
        mutation(rnd, out, seeds[(i + 1) % len(seeds)].frame)
        changed += out != frame
    assert changed >= 25
