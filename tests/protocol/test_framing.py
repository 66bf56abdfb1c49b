"""Size-prefixed framing (protocol.framing)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from protocol import (
    ADOPT_SHARE,
    BIG_FRAME,
    DEFAULT_MAX_FRAME_SIZE,
    SIZE_PREFIX,
    FrameDecoder,
    FrameSizeError,
    ProtocolError,
    frame,
)

PAYLOADS = st.lists(st.binary(max_size=300), max_size=12)
CHUNK_TYPES = st.sampled_from([bytes, bytearray, memoryview])
# Compaction slack the decoder may keep of already returned bytes before it moves data.
COMPACTION_SLACK = 65536


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(stream)) for c in cuts})
    bounds = [0, *points, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def size_prefix(size: int) -> bytes:
    return size.to_bytes(SIZE_PREFIX, "big", signed=True)


# -- frame() -------------------------------------------------------------------------------


@settings(max_examples=50)
@given(payload=st.binary(max_size=2000), kind=CHUNK_TYPES)
def test_frame_prefixes_the_big_endian_size(payload, kind):
    framed = frame(kind(payload))
    assert isinstance(framed, bytes)
    assert int.from_bytes(framed[:4], "big") == len(payload)
    assert framed[4:] == payload


# -- round trips ---------------------------------------------------------------------------


@settings(max_examples=100)
@given(payloads=PAYLOADS, cuts=st.lists(st.integers(0, 5000), max_size=40), kind=CHUNK_TYPES)
def test_frames_split_anywhere_come_back_identical_and_in_order(payloads, cuts, kind):
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder(max_frame_size=300)
    out: list[bytearray] = []
    fed = 0
    for chunk in split(stream, cuts):
        got = decoder.feed(kind(chunk))
        assert all(isinstance(f, bytearray) for f in got)
        out.extend(got)
        fed += len(chunk)
        # nothing is lost or duplicated: what is not returned yet is buffered
        assert decoder.buffered == fed - sum(len(f) for f in out)
    assert [bytes(f) for f in out] == [frame(p) for p in payloads]
    assert decoder.buffered == 0
    assert decoder.pending_frame_size() is None


@settings(max_examples=50)
@given(payloads=PAYLOADS)
def test_byte_at_a_time_feeding(payloads):
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out.extend(decoder.feed(stream[i : i + 1]))
    assert [bytes(f) for f in out] == [frame(p) for p in payloads]


@settings(max_examples=50)
@given(payloads=PAYLOADS)
def test_all_frames_in_one_feed(payloads):
    decoder = FrameDecoder()
    assert [bytes(f) for f in decoder.feed(b"".join(frame(p) for p in payloads))] == [
        frame(p) for p in payloads
    ]


def test_returned_frames_are_independent_copies():
    decoder = FrameDecoder()
    first, second = decoder.feed(frame(b"abcd") + frame(b"efgh"))
    first[4:8] = b"XXXX"
    assert bytes(second) == frame(b"efgh")
    (third,) = decoder.feed(frame(b"ijkl"))
    assert bytes(third) == frame(b"ijkl")
    assert bytes(first) == frame(b"XXXX")


def test_empty_feed_returns_nothing():
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0
    assert decoder.pending_frame_size() is None


# -- partial frames ------------------------------------------------------------------------


@settings(max_examples=50)
@given(payloads=PAYLOADS, last=st.binary(max_size=300), data=st.data())
def test_partial_frame_is_buffered_until_complete(payloads, last, data):
    tail = frame(last)
    keep = data.draw(st.integers(0, len(tail) - 1))
    decoder = FrameDecoder(max_frame_size=300)
    got = decoder.feed(b"".join(frame(p) for p in payloads) + tail[:keep])
    assert [bytes(f) for f in got] == [frame(p) for p in payloads]
    assert decoder.buffered == keep
    expected_pending = len(last) if keep >= SIZE_PREFIX else None
    assert decoder.pending_frame_size() == expected_pending
    assert [bytes(f) for f in decoder.feed(tail[keep:])] == [tail]
    assert decoder.buffered == 0
    assert decoder.pending_frame_size() is None


def test_pending_frame_size_needs_all_four_prefix_bytes():
    decoder = FrameDecoder()
    prefix = size_prefix(0x010203)
    for i in range(3):
        decoder.feed(prefix[i : i + 1])
        assert decoder.pending_frame_size() is None
        assert decoder.buffered == i + 1
    decoder.feed(prefix[3:])
    assert decoder.pending_frame_size() == 0x010203
    assert decoder.buffered == 4


# -- size limits ---------------------------------------------------------------------------


def test_zero_size_frames_are_fine():
    decoder = FrameDecoder(max_frame_size=0)
    assert decoder.feed(b"\x00\x00\x00\x00" * 3) == [bytearray(b"\x00\x00\x00\x00")] * 3
    assert decoder.buffered == 0


@pytest.mark.parametrize("max_size", [0, 1, 17, 1024])
def test_frame_of_exactly_the_maximum_is_accepted(max_size):
    decoder = FrameDecoder(max_frame_size=max_size)
    payload = bytes(range(256)) * (max_size // 256 + 1)
    assert decoder.feed(frame(payload[:max_size])) == [bytearray(frame(payload[:max_size]))]
    with pytest.raises(FrameSizeError):
        decoder.feed(size_prefix(max_size + 1))


def test_default_maximum():
    assert FrameDecoder().max_frame_size == DEFAULT_MAX_FRAME_SIZE == 100 * 1024 * 1024


BAD_SIZES = st.one_of(st.integers(-(2**31), -1), st.integers(1001, 2**31 - 1))
SIZES_FOR_ERRORS = st.sampled_from([0, 1, 300, BIG_FRAME - SIZE_PREFIX, BIG_FRAME + 5000])
"""Frames before a bad size prefix: small ones, and big ones that get a buffer of their own."""


@settings(max_examples=50)
@given(size=BAD_SIZES, before=PAYLOADS, peer=st.text(min_size=1, max_size=30))
def test_bad_size_is_rejected_as_soon_as_the_prefix_arrives(size, before, peer):
    decoder = FrameDecoder(max_frame_size=1000, peer=peer)
    # complete frames before the bad one are returned normally
    good = decoder.feed(b"".join(frame(p) for p in before))
    assert [bytes(f) for f in good] == [frame(p) for p in before]
    prefix = size_prefix(size)
    for i in range(SIZE_PREFIX - 1):
        assert decoder.feed(prefix[i : i + 1]) == []
    # the fourth byte is enough: no body is needed (or buffered) to refuse it
    with pytest.raises(FrameSizeError) as info:
        decoder.feed(prefix[3:])
    err = info.value
    assert isinstance(err, ProtocolError)
    assert err.size == size
    assert err.max_size == 1000
    assert err.peer == peer
    assert str(size) in str(err)
    assert peer in str(err)
    assert ("negative" in str(err)) == (size < 0)


@settings(max_examples=50)
@given(size=BAD_SIZES, body=st.binary(max_size=64))
def test_bad_size_with_body_in_the_same_chunk_is_rejected(size, body):
    decoder = FrameDecoder(max_frame_size=1000)
    with pytest.raises(FrameSizeError) as info:
        decoder.feed(frame(b"ok") + size_prefix(size) + body)
    assert info.value.size == size
    assert info.value.peer is None
    assert "(peer" not in str(info.value)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(SIZES_FOR_ERRORS, max_size=6),
    bad=st.one_of(st.integers(-(2**31), -1), st.integers(4 * BIG_FRAME + 1, 2**31 - 1)),
    reads=st.lists(st.integers(1, 4 * BIG_FRAME), min_size=1, max_size=50),
    shared=st.sampled_from([3, 4096, BIG_FRAME, 1 << 20]),
    use_target=st.booleans(),
)
def test_a_bad_size_carries_the_frames_completed_before_it_in_the_same_call(
    sizes, bad, reads, shared, use_target
):
    """Whatever the reads, each good frame is returned or carried by the error, once and in
    order: a caller can act on every frame that arrived whole before the bad prefix."""
    frames = [big_frame(size + SIZE_PREFIX, i) for i, size in enumerate(sizes)]
    stream = b"".join(frames) + size_prefix(bad) + b"body"
    decoder = FrameDecoder(max_frame_size=4 * BIG_FRAME)
    out: list[bytearray] = []
    pos = 0
    with pytest.raises(FrameSizeError) as info:
        for i in itertools.count():
            taken, got = read_next(decoder, stream, pos, reads[i % len(reads)], shared, use_target)
            out += got
            pos += taken
    assert [bytes(f) for f in out + info.value.frames] == frames


def test_huge_announced_size_is_refused_before_any_body():
    decoder = FrameDecoder(peer="10.0.0.1:5555")
    with pytest.raises(FrameSizeError, match=r"frame size 2147483647 .*\(peer 10\.0\.0\.1:5555\)"):
        decoder.feed(b"\x7f\xff\xff\xff")


# -- bounded memory ------------------------------------------------------------------------


# seeded generation: shrinking a 120 KB stream would only take minutes and say nothing more
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), max_chunk=st.integers(64, 9000), max_size=st.integers(0, 2000))
def test_memory_stays_bounded_over_a_long_stream(seed, max_chunk, max_size):
    rnd = random.Random(seed)
    # ~120 KB of frames, well above max_size + one chunk + the compaction slack
    parts = []
    boundaries = set()
    total = 0
    while total < 120_000:
        size = rnd.choice([0, min(1, max_size), max_size, rnd.randint(0, max_size)])
        parts.append(frame(rnd.randbytes(size)))
        total += len(parts[-1])
        boundaries.add(total)
    stream = b"".join(parts)
    decoder = FrameDecoder(max_frame_size=max_size)
    count = 0
    pos = 0
    while pos < len(stream):
        stop = min(pos + rnd.randint(1, max_chunk), len(stream))
        if stop in boundaries and stop < len(stream):
            stop += 1  # never leave the buffer empty, so only compaction can free it
        count += len(decoder.feed(stream[pos:stop]))
        pos = stop
        # what is still buffered is at most one incomplete frame
        assert decoder.buffered < max_size + SIZE_PREFIX
        # and the storage behind it stays within max frame + one chunk (+ compaction slack)
        assert len(decoder._buf) <= max_size + SIZE_PREFIX + max(max_chunk + 1, COMPACTION_SLACK)
    assert count == len(parts)
    assert decoder.buffered == 0


# -- big frames, received into their own buffer --------------------------------------------

BIG = BIG_FRAME  # the smallest frame (prefix included) that gets a buffer of its own


def big_frame(total: int, fill: int) -> bytes:
    """A frame of ``total`` bytes, prefix included, whose body is ``fill`` repeated."""
    return size_prefix(total - SIZE_PREFIX) + bytes([fill % 256]) * (total - SIZE_PREFIX)


def receive(decoder: FrameDecoder, stream: bytes, pos: int, count: int, shared: int) -> tuple[int, list]:
    """What a shell reading with readv([target, shared buffer]) does: up to ``count`` bytes,
    the decoder's target filled first. Returns the bytes taken and the frames they completed."""
    target = decoder.receive_target() if decoder.big else None
    if target is None:
        count = min(count, shared, len(stream) - pos)
        return count, decoder.feed(memoryview(stream)[pos : pos + count])
    count = min(count, len(target) + shared, len(stream) - pos)
    filled = min(count, len(target))
    target[:filled] = stream[pos : pos + filled]
    return count, decoder.feed(memoryview(stream)[pos + filled : pos + count], filled)


def read_next(
    decoder: FrameDecoder, stream: bytes, pos: int, count: int, shared: int, use_target: bool
) -> tuple[int, list]:
    """One read of up to ``count`` bytes: as a shell does (:func:`receive`), or fed plainly
    by a caller that ignores the decoder's target."""
    if use_target:
        return receive(decoder, stream, pos, count, shared)
    taken = min(count, len(stream) - pos)
    return taken, decoder.feed(stream[pos : pos + taken])


SIZES = st.sampled_from([0, 1, 300, BIG - SIZE_PREFIX - 1, BIG - SIZE_PREFIX, BIG + 5000, 3 * BIG])


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(SIZES, min_size=1, max_size=8),
    reads=st.lists(st.integers(1, 4 * BIG), min_size=1, max_size=50),
    shared=st.sampled_from([3, 4096, BIG, 1 << 20]),
    use_target=st.booleans(),
)
def test_big_frames_come_back_identical_whether_or_not_received_into_their_buffer(
    sizes, reads, shared, use_target
):
    """Small and big frames, wrong guesses included (a big frame after a small one, a small
    one after a big one, big ones of other sizes), read in any pieces, with the target used
    as a shell does or ignored as a plain feeder does."""
    frames = [big_frame(size + SIZE_PREFIX, i) for i, size in enumerate(sizes)]
    stream = b"".join(frames)
    decoder = FrameDecoder()
    out: list[bytearray] = []
    pos = 0
    for i in itertools.count():
        if pos == len(stream):
            break
        taken, got = read_next(decoder, stream, pos, reads[i % len(reads)], shared, use_target)
        out += got
        pos += taken
        assert decoder.buffered == pos - sum(map(len, out))
    assert [bytes(f) for f in out] == frames
    assert all(isinstance(f, bytearray) for f in out)
    assert decoder.buffered == 0


def test_a_big_frame_received_into_its_target_is_that_buffer_uncopied():
    decoder = FrameDecoder()
    first, second = big_frame(BIG + 100, 1), big_frame(BIG + 100, 2)
    assert decoder.receive_target() is None  # nothing big seen yet: the shell's buffer is used
    (frame1,) = decoder.feed(first)
    target = decoder.receive_target()  # after a big frame, the next is guessed as big
    assert target is not None and len(target) == len(second)
    target[:] = second
    (frame2,) = decoder.feed(b"", len(second))
    assert frame2 == second and target.obj is frame2
    assert bytes(frame1) == first


def test_the_rest_of_a_big_frame_goes_to_its_own_buffer_once_a_share_of_it_is_in():
    decoder = FrameDecoder()
    whole = big_frame(BIG * 2, 7)
    share = len(whole) // ADOPT_SHARE
    assert decoder.feed(whole[: share - 1]) == []
    assert decoder.receive_target() is None  # not yet: an announced size alone commits nothing
    assert decoder.feed(whole[share - 1 : share]) == []
    target = decoder.receive_target()
    assert target is not None and len(target) == len(whole) - share
    assert decoder.buffered == share and decoder.pending_frame_size() == len(whole) - SIZE_PREFIX
    target[:5000] = whole[share : share + 5000]
    assert decoder.feed(b"", 5000) == []
    assert decoder.buffered == share + 5000
    rest = decoder.receive_target()
    assert rest is not None and len(rest) == len(whole) - share - 5000
    rest[:] = whole[share + 5000 :]
    small = frame(b"after")
    (got, after) = decoder.feed(small, len(rest))  # what followed it landed in the shell's buffer
    assert bytes(got) == whole and bytes(after) == small


def test_a_wrong_guess_is_dropped_and_costs_no_bytes():
    decoder = FrameDecoder()
    decoder.feed(big_frame(BIG, 1))
    target = decoder.receive_target()
    assert target is not None
    smalls = frame(b"a") + frame(b"bc")
    target[: len(smalls)] = smalls
    assert [bytes(f) for f in decoder.feed(b"", len(smalls))] == [frame(b"a"), frame(b"bc")]
    assert not decoder.big and decoder.receive_target() is None  # no more guessing
    assert decoder.buffered == 0


def test_a_huge_announced_size_commits_no_buffer_until_a_share_of_it_arrived():
    decoder = FrameDecoder()
    size = 16 * 1024 * 1024
    whole = big_frame(size, 3)
    assert decoder.feed(whole[: size // ADOPT_SHARE - 1]) == []
    assert decoder.receive_target() is None
    assert len(decoder._buf) < size // ADOPT_SHARE + 65536  # what arrived, not what was announced
    assert decoder.feed(whole[size // ADOPT_SHARE - 1 : size // ADOPT_SHARE]) == []
    target = decoder.receive_target()
    assert target is not None and len(target) == size - size // ADOPT_SHARE
    target[:] = whole[size // ADOPT_SHARE :]
    (got,) = decoder.feed(b"", len(target))
    assert got == whole


def guessing_decoder() -> tuple[FrameDecoder, memoryview]:
    """A decoder that saw a big frame, and the buffer it guesses the next one lands in."""
    decoder = FrameDecoder(max_frame_size=DEFAULT_MAX_FRAME_SIZE)
    decoder.feed(big_frame(BIG, 1))
    target = decoder.receive_target()
    assert target is not None
    return decoder, target


@pytest.mark.parametrize("size", [-1, DEFAULT_MAX_FRAME_SIZE + 1])
def test_a_bad_size_in_a_guessed_buffer_is_rejected(size):
    decoder, target = guessing_decoder()
    target[:4] = size_prefix(size)
    with pytest.raises(FrameSizeError):
        decoder.feed(b"", 4)


def test_a_plausible_other_size_in_a_guessed_buffer_is_a_wrong_guess_not_an_error():
    decoder, target = guessing_decoder()
    target[:4] = size_prefix(200)
    assert decoder.feed(b"", 4) == []
    assert decoder.buffered == 4 and decoder.pending_frame_size() == 200


def test_filled_without_a_target_is_refused():
    with pytest.raises(ValueError, match="receive_target"):
        FrameDecoder().feed(b"", 10)


def test_a_guessed_buffer_that_received_nothing_is_let_go_and_the_guess_kept():
    decoder = FrameDecoder()
    decoder.feed(big_frame(BIG, 1))
    target = decoder.receive_target()
    assert target is not None
    released = decoder.release_target()
    assert released is target.obj and decoder.buffered == 0
    again = decoder.receive_target()  # still guessing: a new buffer for the next receive
    assert again is not None and again.obj is not released
    again[:10] = big_frame(BIG, 2)[:10]
    assert decoder.feed(b"", 10) == []
    assert decoder.release_target() is None  # bytes arrived: the frame's buffer stays
    assert decoder.buffered == 10
