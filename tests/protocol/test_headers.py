"""Request/response headers and correlation ids (protocol.headers), checked against kafka-python."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.api_header import RequestHeader as KafkaRequestHeader
from kafka.protocol.api_header import ResponseHeader as KafkaResponseHeader

from protocol import ApiKey, ProtocolError, api_schemas, frame, is_flexible, request_class, response_class
from protocol._headers import (
    _MAX_SHAPE_TAIL,
    _MAX_SHARED_SHAPES,
    _SHARED_SHAPES,
    RequestHeaderReader,
    parse_request_header,
    patch_request_correlation_id,
    patch_response_correlation_id,
    request_correlation_id,
    request_header_version,
    response_body_offset,
    response_correlation_id,
    response_header_version,
)
from protocol.testing import encode_request, encode_response, encode_uvarint
from tests.support.consumer_group_frames import heartbeat_answer, heartbeat_request

ALL_CASES = [(k, v) for k in sorted(api_schemas()) for v in range(request_class(k).max_version + 1)]
FLEXIBLE_CASES = [(k, v) for k, v in ALL_CASES if is_flexible(k, v)]
RIGID_CASES = [(k, v) for k, v in ALL_CASES if not is_flexible(k, v)]


def _boundary_versions(api_key: int) -> list[int]:
    """Oldest, newest, and the versions either side of the switch to flexible."""
    top = request_class(api_key).max_version
    low = api_schemas()[api_key].flexible_versions[0]
    return sorted({v for v in (0, low - 1, low, top) if 0 <= v <= top})


# kafka-python compiles a codec per message version; responses are checked at the
# versions where the header can change, to keep the suite fast.
BOUNDARY_CASES = [(k, v) for k in sorted(api_schemas()) for v in _boundary_versions(k)]

INT32 = st.integers(-(2**31), 2**31 - 1)
CLIENT_IDS = st.one_of(st.none(), st.text(max_size=80), st.just(""), st.just("ü∂ƒ😀-клиент"))
TAGGED = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=40)), max_size=4)


def kafka_request_header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """The request header as kafka-python encodes it for this API version."""
    header = KafkaRequestHeader(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    return bytes(header.encode(flexible=request_class(api_key).flexible_version_q(version)))


def build_request(api_key: int, version: int, correlation_id: int, client_id: str | None):
    """(frame, header length, body) built by kafka-python.

    The whole request comes from ``cls[version]()`` with default fields; if kafka-python
    cannot build one with defaults, only the header is built and a dummy body appended.
    """
    header = kafka_request_header(api_key, version, correlation_id, client_id)
    cls = request_class(api_key)
    try:
        message = cls[version]()
        body = bytes(message.encode(version=version))
        framed = encode_request(message, correlation_id, client_id)
    except Exception:
        body = b"\x00\x01\x02\x03"
        framed = frame(header + body)
    assert framed[4 : 4 + len(header)] == header
    return bytearray(framed), len(header), body


def tagged_section(fields: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(encode_uvarint(len(fields)))
    for tag, data in fields:
        out += encode_uvarint(tag) + encode_uvarint(len(data)) + data
    return bytes(out)


# -- request headers against kafka-python --------------------------------------------------


@pytest.mark.parametrize(("api_key", "version"), ALL_CASES)
def test_every_api_version_parses_like_kafka_python(api_key, version):
    framed, header_len, body = build_request(api_key, version, 123456, "corrfix-test")
    header = parse_request_header(framed)
    assert header.api_key == api_key
    assert header.api_version == version
    assert header.correlation_id == 123456
    assert header.client_id == "corrfix-test"
    assert header.body_offset == 4 + header_len
    assert bytes(framed[header.body_offset :]) == body
    expected_version = 2 if request_class(api_key).flexible_version_q(version) else 1
    assert request_header_version(api_key, version) == expected_version
    # kafka-python's own header decoder ends at the same place
    stream = io.BytesIO(bytes(framed[4:]))
    decoded = KafkaRequestHeader.decode(stream, flexible=expected_version == 2)
    assert (decoded.correlation_id, decoded.client_id) == (123456, "corrfix-test")
    assert 4 + stream.tell() == header.body_offset


@settings(max_examples=100)
@given(
    case=st.sampled_from(ALL_CASES),
    correlation_id=INT32,
    client_id=CLIENT_IDS,
    body=st.binary(max_size=64),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_any_header_round_trips(case, correlation_id, client_id, body, kind):
    api_key, version = case
    raw = kafka_request_header(api_key, version, correlation_id, client_id)
    header = parse_request_header(kind(frame(raw + body)))
    assert (header.api_key, header.api_version) == case
    assert header.correlation_id == correlation_id
    assert header.client_id == client_id
    assert header.body_offset == 4 + len(raw)


@pytest.mark.parametrize("client_id", [None, "", "é" * 5000, "😀" * 3000, "a" * 32767])
@pytest.mark.parametrize(("api_key", "version"), [(0, 3), (0, 9), (3, 12), (18, 0), (18, 3), (17, 1)])
def test_long_and_null_client_ids(api_key, version, client_id):
    framed, header_len, _ = build_request(api_key, version, 7, client_id)
    header = parse_request_header(framed)
    assert header.client_id == client_id
    assert header.body_offset == 4 + header_len


@settings(max_examples=80)
@given(
    case=st.sampled_from(FLEXIBLE_CASES),
    correlation_id=INT32,
    client_id=CLIENT_IDS,
    tagged=TAGGED,
    body=st.binary(max_size=32),
)
def test_header_v2_tagged_fields_are_skipped(case, correlation_id, client_id, tagged, body):
    api_key, version = case
    raw = kafka_request_header(api_key, version, correlation_id, client_id)
    assert raw[-1:] == b"\x00"  # kafka-python writes an empty tagged section
    raw = raw[:-1] + tagged_section(tagged)
    header = parse_request_header(frame(raw + body))
    assert header.client_id == client_id
    assert header.correlation_id == correlation_id
    assert header.body_offset == 4 + len(raw)
    # kafka-python ends the header at the same place
    stream = io.BytesIO(raw + body)
    KafkaRequestHeader.decode(stream, flexible=True)
    assert stream.tell() == len(raw)


def test_flexible_header_with_one_tag_by_hand():
    # Metadata v12: header v2 = key, version, id, client id "ab", 1 tagged field (tag 5, 2 bytes)
    raw = b"\x00\x03\x00\x0c\x00\x00\x00\x2a\x00\x02ab" + b"\x01\x05\x02zz"
    header = parse_request_header(frame(raw + b"BODY"))
    assert header.client_id == "ab"
    assert header.correlation_id == 42
    assert header.body_offset == 4 + len(raw)


@pytest.mark.parametrize(("api_key", "version"), [*RIGID_CASES[:1], (0, 8), (17, 1), (3, 8)])
def test_header_v1_has_no_tagged_section(api_key, version):
    # A byte after the client id belongs to the body, not to a tagged section.
    raw = kafka_request_header(api_key, version, 1, "c")
    header = parse_request_header(frame(raw + b"\x05"))
    assert header.body_offset == 4 + len(raw)


# -- the per-connection reader against the general parse ----------------------------------

READER_CASES = [(0, 7), (0, 9), (3, 12), (18, 0), (18, 3), (1, 4), (7, 0), (7, 1), (4, 0), (999, 2)]
"""Rigid and flexible headers, header v0 (ControlledShutdown v0) and unknown APIs."""
FEW_CLIENT_IDS = st.sampled_from([None, "", "bench", "benc", "bench-2", "é"])
"""Few enough that a sequence repeats shapes, and alike enough to tell apart by a byte."""


def _parse_or_error(parse, framed) -> object:
    try:
        return parse(framed)
    except ProtocolError as exc:
        return ("error", str(exc))


def _fields(framed) -> tuple[int, int, int, int | None]:
    """What the reader must return: the general parse's fields, but the client id."""
    header = parse_request_header(framed)
    return header.api_key, header.api_version, header.correlation_id, header.body_offset


def _header_bytes(
    api_key: int, version: int, correlation_id: int, client_id: str | None, tags: bytes
) -> bytes:
    """A request header by hand, so that unknown APIs and header v0 can be written too."""
    raw = (
        api_key.to_bytes(2, "big")
        + version.to_bytes(2, "big")
        + correlation_id.to_bytes(4, "big", signed=True)
    )
    if request_header_version(api_key, version) == 0:
        return raw
    encoded = None if client_id is None else client_id.encode()
    raw += (
        (-1).to_bytes(2, "big", signed=True) if encoded is None else len(encoded).to_bytes(2, "big") + encoded
    )
    return raw + tags if request_header_version(api_key, version) == 2 else raw


@settings(max_examples=150)
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(READER_CASES),
            INT32,
            FEW_CLIENT_IDS,
            st.sampled_from([b"\x00", b"\x01\x05\x02zz", b"\x01\x05"]),  # the last is truncated
            st.binary(max_size=6),
            st.integers(0, 8),  # bytes cut off the end
            st.sampled_from([bytes, bytearray]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_reader_reads_every_frame_as_the_general_parse(requests):
    reader = RequestHeaderReader()
    for (api_key, version), correlation_id, client_id, tags, body, cut, kind in requests:
        framed = frame(_header_bytes(api_key, version, correlation_id, client_id, tags) + body)
        framed = kind(framed[: max(len(framed) - cut, 4)])
        assert _parse_or_error(reader.fields, framed) == _parse_or_error(_fields, framed)


def test_readers_share_shapes_and_keep_a_bounded_number():
    _SHARED_SHAPES.clear()  # a cache: other tests may have filled it
    first, second = RequestHeaderReader(), RequestHeaderReader()
    framed = frame(_header_bytes(0, 9, 1, "shared", b"\x00"))
    assert first.fields(framed) == second.fields(framed) == _fields(framed)
    assert first._shape is second._shape  # one copy of the client id for every connection
    for i in range(_MAX_SHARED_SHAPES + 10):  # the peers choose the client ids
        framed = frame(_header_bytes(3, 12, i, f"c{i}", b"\x00"))
        assert first.fields(framed) == _fields(framed)
    assert 0 < len(_SHARED_SHAPES) <= _MAX_SHARED_SHAPES
    assert first.fields(framed) is not None and first._shape in _SHARED_SHAPES


def test_a_long_client_id_is_parsed_every_time_and_never_kept():
    """A peer choosing 32 KiB client ids must not make connections or the shared table hold them."""
    _SHARED_SHAPES.clear()
    reader = RequestHeaderReader()
    short = frame(_header_bytes(0, 9, 1, "short", b"\x00"))
    reader.fields(short)
    kept = reader._shape
    long_id = "x" * 30_000
    for correlation_id in (2, 3):
        framed = frame(_header_bytes(0, 9, correlation_id, long_id, b"\x00"))
        assert reader.fields(framed) == _fields(framed)
        assert reader._shape is kept
    assert all(len(shape[1]) <= _MAX_SHAPE_TAIL for shape in _SHARED_SHAPES)


@pytest.mark.parametrize("head", [b"\xff\xff\xff\xff", b"\x00\x00\xff\xff", b"\xff\xff\x00\x00"])
def test_reader_rejects_negative_api_keys_and_versions_from_the_start(head):
    framed = frame(head + b"\x00\x00\x00\x01\xff\xff\x00")
    with pytest.raises(ProtocolError, match="request header has api key"):
        RequestHeaderReader().fields(framed)


# -- header versions -----------------------------------------------------------------------


def test_controlled_shutdown_v0_has_header_v0():
    assert request_header_version(ApiKey.CONTROLLED_SHUTDOWN, 0) == 0
    raw = b"\x00\x07\x00\x00\x00\x00\x00\x09" + b"\x00\x05abcde"
    header = parse_request_header(frame(raw))
    assert header.client_id is None
    assert header.correlation_id == 9
    assert header.body_offset == 12


@pytest.mark.parametrize(("api_key", "version"), [(999, 2), (1000, 0), (32767, 5)])
def test_unknown_api_reads_client_id_but_cannot_locate_body(api_key, version):
    assert request_header_version(api_key, version) is None
    raw = api_key.to_bytes(2, "big") + version.to_bytes(2, "big") + b"\x00\x00\x00\x01" + b"\x00\x03xyz"
    header = parse_request_header(frame(raw + b"\x01\x02\x03"))
    assert header.api_key == api_key
    assert header.client_id == "xyz"
    assert header.body_offset is None


@pytest.mark.parametrize(("api_key", "version"), ALL_CASES)
def test_response_header_version(api_key, version):
    expected = 0 if api_key == ApiKey.API_VERSIONS else int(bool(is_flexible(api_key, version)))
    assert response_header_version(api_key, version) == expected


@pytest.mark.parametrize("version", range(0, 10))
def test_api_versions_response_header_is_always_v0(version):
    assert response_header_version(ApiKey.API_VERSIONS, version) == 0
    # even though the request itself is flexible from v3
    assert request_header_version(ApiKey.API_VERSIONS, version) == (2 if version >= 3 else 1)


def test_response_header_version_of_unknown_api_is_v0():
    assert response_header_version(999, 5) == 0


@pytest.mark.parametrize(
    ("api_key", "version", "header_version"),
    [(ApiKey.CONTROLLED_SHUTDOWN, 1, 1), (ApiKey.CONTROLLED_SHUTDOWN, 3, 2), (ApiKey.LEADER_AND_ISR, 0, 1)],
)
def test_headers_of_apis_kafka_python_cannot_decode_are_located(api_key, version, header_version):
    """Kafka defined these (inter-broker, KRaft, KIP-848, share groups), so their header
    versions are known from its schemas even where kafka-python has no class for the body."""
    assert request_header_version(api_key, version) == header_version
    tags = b"\x00" if header_version == 2 else b""
    raw = (
        api_key.to_bytes(2, "big") + version.to_bytes(2, "big") + b"\x00\x00\x00\x01" + b"\x00\x03xyz" + tags
    )
    header = parse_request_header(frame(raw + b"\x01\x02\x03"))
    assert (header.client_id, header.body_offset) == ("xyz", 4 + len(raw))


@pytest.mark.parametrize("version", [0, 1])
def test_a_kip_848_heartbeat_has_flexible_headers_both_ways(version):
    """A KIP-848 consumer heartbeats with ConsumerGroupHeartbeat, flexible from v0: request
    header v2 and response header v1, each with a tag byte a rigid header lacks."""
    request = heartbeat_request(3, "g", "m", 0, version=version, client_id="xyz")
    assert parse_request_header(request).body_offset == 4 + 8 + 2 + 3 + 1
    answer = heartbeat_answer(3, 1)
    assert response_body_offset(answer, ApiKey.CONSUMER_GROUP_HEARTBEAT, version) == 4 + 4 + 1


@pytest.mark.parametrize(("api_key", "version"), BOUNDARY_CASES)
def test_response_body_offset_matches_kafka_python(api_key, version):
    cls = response_class(api_key)
    framed = encode_response(cls[version](), correlation_id=-77)
    offset = response_body_offset(framed, api_key, version)
    flexible = cls.flexible_version_q(version) and api_key != ApiKey.API_VERSIONS
    assert offset == 4 + len(bytes(KafkaResponseHeader(correlation_id=-77).encode(flexible=flexible)))
    assert response_correlation_id(framed) == -77
    cls.decode(framed[offset:], version=version)  # the body really starts there


@settings(max_examples=50)
@given(case=st.sampled_from(FLEXIBLE_CASES), tagged=TAGGED, body=st.binary(max_size=16))
def test_response_header_v1_tagged_fields_are_skipped(case, tagged, body):
    api_key, version = case
    raw = b"\x00\x00\x00\x05" + tagged_section(tagged)
    offset = response_body_offset(frame(raw + body), api_key, version)
    if api_key == ApiKey.API_VERSIONS:
        assert offset == 8
    else:
        assert offset == 4 + len(raw)


# -- malformed input -----------------------------------------------------------------------


@settings(max_examples=100)
@given(case=st.sampled_from(ALL_CASES), client_id=CLIENT_IDS, tagged=TAGGED, data=st.data())
def test_every_truncated_header_is_rejected(case, client_id, tagged, data):
    api_key, version = case
    raw = kafka_request_header(api_key, version, 5, client_id)
    if is_flexible(api_key, version):
        raw = raw[:-1] + tagged_section(tagged)
    framed = frame(raw)
    cut = data.draw(st.integers(0, len(framed) - 1))
    with pytest.raises(ProtocolError):
        parse_request_header(framed[:cut])
    assert parse_request_header(framed).body_offset == len(framed)


@pytest.mark.parametrize("length", [-2, -100, -32768])
def test_bad_client_id_length_is_rejected(length):
    raw = b"\x00\x03\x00\x01\x00\x00\x00\x01" + length.to_bytes(2, "big", signed=True)
    with pytest.raises(ProtocolError, match="client id length"):
        parse_request_header(frame(raw + b"x" * 10))


def test_client_id_longer_than_the_frame_is_rejected():
    raw = b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x10short"
    with pytest.raises(ProtocolError, match="inside its client id"):
        parse_request_header(frame(raw))


def test_invalid_utf8_client_id_is_replaced_not_fatal():
    raw = b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x03\xff\xfeA"
    header = parse_request_header(frame(raw))
    assert header.client_id == "\ufffd\ufffdA"
    assert header.body_offset == len(frame(raw))


@pytest.mark.parametrize(("api_key", "version"), [(-1, 0), (0, -1), (-32768, -32768)])
def test_negative_api_key_or_version_is_rejected(api_key, version):
    raw = api_key.to_bytes(2, "big", signed=True) + version.to_bytes(2, "big", signed=True)
    with pytest.raises(ProtocolError):
        parse_request_header(frame(raw + b"\x00\x00\x00\x01\xff\xff\x00"))


@settings(max_examples=100)
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    try:
        header = parse_request_header(data)
    except ProtocolError:
        return
    assert header.body_offset is None or 12 <= header.body_offset <= len(data)


@settings(max_examples=100)
@given(case=st.sampled_from(ALL_CASES), correlation_id=INT32, tail=st.binary(max_size=48))
def test_known_api_with_garbage_after_the_id_raises_only_protocol_error(case, correlation_id, tail):
    api_key, version = case
    prefix = (
        api_key.to_bytes(2, "big")
        + version.to_bytes(2, "big")
        + correlation_id.to_bytes(4, "big", signed=True)
    )
    try:
        header = parse_request_header(frame(prefix + tail))
    except ProtocolError:
        return
    assert header.correlation_id == correlation_id
    assert 12 <= header.body_offset <= 4 + len(prefix) + len(tail)


@settings(max_examples=100)
@given(case=st.sampled_from([*ALL_CASES, (999, 0)]), data=st.binary(max_size=32))
def test_arbitrary_response_bytes_raise_only_protocol_error(case, data):
    try:
        offset = response_body_offset(data, *case)
    except ProtocolError:
        return
    assert 8 <= offset <= len(data)


def test_short_response_frames_are_rejected():
    for size in range(8):
        with pytest.raises(ProtocolError):
            response_correlation_id(b"\x00" * size)
        with pytest.raises(ProtocolError):
            response_body_offset(b"\x00" * size, 3, 0)
        with pytest.raises(ProtocolError):
            response_body_offset(b"\x00" * size, 3, 12)


def test_truncated_response_tagged_fields_are_rejected():
    with pytest.raises(ProtocolError):
        response_body_offset(b"\x00\x00\x00\x05\x00\x00\x00\x01", 3, 12)  # no tag count
    with pytest.raises(ProtocolError):
        response_body_offset(b"\x00\x00\x00\x05\x00\x00\x00\x01\x01\x00\x09ab", 3, 12)
    # the same bytes are fine for a header v0 response
    assert response_body_offset(b"\x00\x00\x00\x05\x00\x00\x00\x01", 3, 8) == 8


# -- correlation ids -----------------------------------------------------------------------


@settings(max_examples=100)
@given(
    case=st.sampled_from(ALL_CASES),
    old=INT32,
    new=INT32,
    client_id=CLIENT_IDS,
    body=st.binary(max_size=40),
)
def test_request_correlation_patch_round_trips(case, old, new, client_id, body):
    raw = kafka_request_header(*case, old, client_id)
    framed = bytearray(frame(raw + body))
    before = bytes(framed)
    assert request_correlation_id(framed) == old
    patch_request_correlation_id(framed, new)
    assert request_correlation_id(framed) == new
    assert parse_request_header(framed).correlation_id == new
    assert len(framed) == len(before)
    assert framed[:8] == before[:8]
    assert framed[12:] == before[12:]
    assert framed[8:12] == new.to_bytes(4, "big", signed=True)
    patch_request_correlation_id(framed, old)
    assert bytes(framed) == before


@settings(max_examples=50)
@given(payload=st.binary(min_size=4, max_size=80), new=INT32)
def test_response_correlation_patch_round_trips(payload, new):
    framed = bytearray(frame(payload))
    before = bytes(framed)
    old = response_correlation_id(framed)
    assert old == int.from_bytes(payload[:4], "big", signed=True)
    patch_response_correlation_id(framed, new)
    assert response_correlation_id(framed) == new
    assert framed[:4] == before[:4]
    assert framed[8:] == before[8:]
    patch_response_correlation_id(framed, old)
    assert bytes(framed) == before


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 2**40])
def test_patching_out_of_range_ids_fails_and_leaves_the_frame_alone(bad):
    request = bytearray(frame(kafka_request_header(3, 1, 1, "c")))
    response = bytearray(frame(b"\x00\x00\x00\x01body"))
    request_before, response_before = bytes(request), bytes(response)
    with pytest.raises(OverflowError):
        patch_request_correlation_id(request, bad)
    with pytest.raises(OverflowError):
        patch_response_correlation_id(response, bad)
    assert bytes(request) == request_before
    assert bytes(response) == response_before


@pytest.mark.parametrize(("api_key", "version"), [(0, 9), (18, 3), (18, 0), (3, 12), (1, 4)])
def test_kafka_python_responses_carry_the_patched_id(api_key, version):
    framed = bytearray(encode_response(response_class(api_key)[version](), correlation_id=1))
    patch_response_correlation_id(framed, -123)
    decoded = response_class(api_key).decode(bytes(framed), version=version, header=True, framed=True)
    assert decoded.header.correlation_id == -123
