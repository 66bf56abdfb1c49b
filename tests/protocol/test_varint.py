"""Unsigned varints and tagged-field sections of flexible versions (protocol.varint)."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.schemas.fields.codecs.types import UnsignedVarInt32

from protocol import ProtocolError
from protocol._varint import MAX_VARINT_BYTES, read_compact_string, read_tagged_fields, read_uvarint
from protocol.testing import encode_uvarint

UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
JUNK = st.binary(max_size=16)


def tagged_section(fields: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(encode_uvarint(len(fields)))
    for tag, data in fields:
        out += encode_uvarint(tag) + encode_uvarint(len(data)) + data
    return bytes(out)


# -- read_uvarint / encode_uvarint ---------------------------------------------------------


@settings(max_examples=50)
@given(value=UINT32, before=JUNK, after=JUNK)
def test_uvarint_round_trips_at_any_offset(value, before, after):
    encoded = encode_uvarint(value)
    buf = before + encoded + after
    assert read_uvarint(buf, len(before)) == (value, len(before) + len(encoded))


@settings(max_examples=50)
@given(value=UINT32)
def test_uvarint_encoding_matches_kafka_python(value):
    assert encode_uvarint(value) == bytes(UnsignedVarInt32.encode(value))
    assert read_uvarint(bytes(UnsignedVarInt32.encode(value)), 0) == (value, len(encode_uvarint(value)))


@pytest.mark.parametrize(
    ("value", "length"),
    [
        (0, 1),
        (127, 1),
        (128, 2),
        (2**14 - 1, 2),
        (2**14, 3),
        (2**21, 4),
        (2**28 - 1, 4),
        (2**28, 5),
        (2**32 - 1, 5),
    ],
)
def test_uvarint_length_boundaries(value, length):
    encoded = encode_uvarint(value)
    assert len(encoded) == length
    assert read_uvarint(encoded, 0) == (value, length)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_uvarint_accepts_any_bytes_like(kind):
    assert read_uvarint(kind(b"\xac\x02rest"), 0) == (300, 2)


def test_uvarint_max_value_is_exact():
    assert read_uvarint(b"\xff\xff\xff\xff\x0f", 0) == (2**32 - 1, 5)


def test_non_canonical_padding_is_accepted_within_five_bytes():
    # Kafka's reader accepts redundant continuation bytes as long as the total fits.
    assert read_uvarint(b"\x80\x80\x80\x80\x00", 0) == (0, 5)
    assert read_uvarint(b"\x81\x00", 0) == (1, 2)


@settings(max_examples=50)
@given(first_five=st.lists(st.integers(0x80, 0xFF), min_size=5, max_size=5), tail=JUNK)
def test_more_than_five_bytes_is_rejected(first_five, tail):
    with pytest.raises(ProtocolError, match="longer than 5 bytes"):
        read_uvarint(bytes(first_five) + tail, 0)


@settings(max_examples=50)
@given(first_four=st.lists(st.integers(0x80, 0xFF), min_size=4, max_size=4), last=st.integers(0x10, 0x7F))
def test_fifth_byte_overflowing_32_bits_is_rejected(first_four, last):
    with pytest.raises(ProtocolError, match="overflows 32 bits"):
        read_uvarint(bytes([*first_four, last]), 0)


@settings(max_examples=50)
@given(value=UINT32, before=JUNK, data=st.data())
def test_every_truncation_is_rejected(value, before, data):
    encoded = encode_uvarint(value)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ProtocolError, match="truncated"):
        read_uvarint(before + encoded[:cut], len(before))


def test_reading_at_or_past_the_end_is_rejected():
    with pytest.raises(ProtocolError):
        read_uvarint(b"", 0)
    with pytest.raises(ProtocolError):
        read_uvarint(b"\x01", 1)
    with pytest.raises(ProtocolError):
        read_uvarint(b"\x01", 7)


@settings(max_examples=100)
@given(buf=st.binary(max_size=12), pos=st.integers(0, 12))
def test_arbitrary_bytes_give_a_value_or_protocol_error(buf, pos):
    try:
        value, end = read_uvarint(buf, pos)
    except ProtocolError:
        return
    assert 0 <= value <= 2**32 - 1
    assert pos < end <= min(len(buf), pos + MAX_VARINT_BYTES)
    if end - pos == 1 or buf[end - 1] != 0:  # no redundant trailing group: canonical form
        assert encode_uvarint(value) == bytes(buf[pos:end])


# -- read_tagged_fields --------------------------------------------------------------------


@settings(max_examples=50)
@given(
    fields=st.lists(st.tuples(UINT32, st.binary(max_size=300)), max_size=8),
    before=JUNK,
    after=JUNK,
)
def test_tagged_fields_are_skipped(fields, before, after):
    section = tagged_section(fields)
    buf = before + section + after
    assert read_tagged_fields(buf, len(before)) == len(before) + len(section)


def test_empty_tagged_section_is_one_byte():
    assert read_tagged_fields(b"\x00body", 0) == 1


@settings(max_examples=50)
@given(fields=st.lists(st.tuples(UINT32, st.binary(max_size=40)), min_size=1, max_size=5), data=st.data())
def test_truncated_tagged_section_is_rejected(fields, data):
    section = tagged_section(fields)
    cut = data.draw(st.integers(0, len(section) - 1))
    with pytest.raises(ProtocolError):
        read_tagged_fields(section[:cut], 0)


def test_tagged_field_running_past_the_end_is_rejected():
    with pytest.raises(ProtocolError, match="past the end"):
        read_tagged_fields(b"\x01\x00\x05abcd", 0)
    # exactly fitting is fine
    assert read_tagged_fields(b"\x01\x00\x05abcde", 0) == 8


def _assert_rejected_cheaply(buf: bytes) -> None:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ProtocolError):
            read_tagged_fields(buf, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 0.5
    assert peak < 64 * 1024


@pytest.mark.parametrize("count", [2**32 - 1, 2**31, 10**9, 3])
def test_huge_tagged_field_count_is_rejected_without_work(count):
    # Two bytes of payload cannot hold 3 (or four billion) tagged fields.
    _assert_rejected_cheaply(encode_uvarint(count) + b"\x00\x00")


@pytest.mark.parametrize("size", [2**32 - 1, 2**31, 10**9, 5])
def test_huge_tagged_field_size_is_rejected_without_allocating(size):
    _assert_rejected_cheaply(b"\x01\x07" + encode_uvarint(size) + b"abcd")


@settings(max_examples=50)
@given(excess=st.integers(1, 2**32 - 1 - 64), tail=st.binary(max_size=64))
def test_count_larger_than_the_remaining_bytes_is_rejected_up_front(excess, tail):
    buf = encode_uvarint(len(tail) + excess) + tail
    with pytest.raises(ProtocolError, match="cannot fit"):
        read_tagged_fields(buf, 0)


@settings(max_examples=100)
@given(buf=st.binary(max_size=64), pos=st.integers(0, 8))
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(buf, pos):
    try:
        end = read_tagged_fields(buf, pos)
    except ProtocolError:
        return
    assert pos < end <= len(buf)


@given(text=st.none() | st.text(max_size=300), before=st.binary(max_size=5), after=st.binary(max_size=5))
def test_compact_strings_read_back_at_any_offset(text, before, after):
    """A compact nullable string as Kafka's flexible versions write it: its UTF-8 length plus
    one as a varint, 0 for null."""
    data = b"" if text is None else text.encode("utf-8")
    encoded = encode_uvarint(0 if text is None else len(data) + 1) + data
    assert read_compact_string(before + encoded + after, len(before)) == (text, len(before) + len(encoded))


@given(text=st.text(min_size=1, max_size=40), cut=st.integers(1, 40))
def test_a_compact_string_cut_short_is_rejected(text, cut):
    data = text.encode("utf-8")
    encoded = encode_uvarint(len(data) + 1) + data
    cut = min(cut, len(data))
    with pytest.raises(ProtocolError):
        read_compact_string(encoded[: len(encoded) - cut], 0)


def test_a_compact_string_that_is_not_utf8_is_read_with_replacements():
    assert read_compact_string(b"\x03\xff\xfe", 0) == ("\ufffd\ufffd", 3)
