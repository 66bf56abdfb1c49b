"""Broker-address rewriting (protocol.rewrite): every address mapped, nothing else touched."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ApiKey, ProtocolError, api_schemas, response_class, response_header_version
from protocol._rewrite import (
    REWRITTEN_API_KEYS,
    UndecodableVersionError,
    decode_response_body,
    encode_response_body,
    needs_rewrite,
    rewrite_response,
)
from protocol.testing import encode_uvarint
from tests.support.message_strategies import messages, tagged_section

# Written from the JSON schemas and KIP-951, independently of the module under test.
FIRST_VERSION_WITH_ADDRESSES = {
    ApiKey.METADATA: 0,
    ApiKey.FIND_COORDINATOR: 0,
    ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.PRODUCE: 10,
    ApiKey.FETCH: 16,
    ApiKey.SHARE_FETCH: 0,  # KIP-932: NodeEndpoints from v0 (kafka-python 3.0 cannot read either)
    ApiKey.SHARE_ACKNOWLEDGE: 0,
}


def rewritable_versions() -> list[tuple[int, int]]:
    return [
        (api_key, version)
        for api_key, first in sorted(FIRST_VERSION_WITH_ADDRESSES.items())
        if response_class(api_key) is not None
        for version in range(first, response_class(api_key).max_version + 1)
    ]


CASES = rewritable_versions()
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PER_VERSION = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def address_entries(message: Any, api_key: int, version: int) -> list[tuple[Any, str]]:
    """(container, node-id field) of every address a client learns, by the test's own reading."""
    if api_key == ApiKey.METADATA:
        return [(broker, "node_id") for broker in message.brokers or ()]
    if api_key == ApiKey.DESCRIBE_CLUSTER:
        return [(broker, "broker_id") for broker in message.brokers or ()]
    if api_key == ApiKey.FIND_COORDINATOR:
        found = [message] if version <= 3 else list(message.coordinators or ())
        return [(entry, "node_id") for entry in found if entry.error_code == 0]
    return [(endpoint, "node_id") for endpoint in message.node_endpoints or ()]


def shift(node_id: int, host: str, port: int) -> tuple[str, int]:
    """A mapper that changes every address, reversibly."""
    return f"p{node_id}.{host}", (port + 1) if port < 2**31 - 1 else -(2**31)


def unshift(node_id: int, host: str, port: int) -> tuple[str, int]:
    prefix = f"p{node_id}."
    assert host.startswith(prefix)
    return host[len(prefix) :], (port - 1) if port > -(2**31) else 2**31 - 1


def identity(node_id: int, host: str, port: int) -> tuple[str, int]:
    return host, port


def build_frame(message: Any, api_key: int, version: int, correlation_id: int, header_tags: bytes) -> bytes:
    """Size, response header (v1 with the given raw tagged section) and kafka-python's body."""
    header = correlation_id.to_bytes(4, "big", signed=True)
    if response_header_version(api_key, version) == 1:
        header += header_tags
    body = bytes(message.encode())  # not version=: kafka-python 3.0 fails on decoded messages
    return (len(header) + len(body)).to_bytes(4, "big") + header + body


def body_offset(frame: bytes, api_key: int, version: int, header_tags: bytes) -> int:
    return 8 + (len(header_tags) if response_header_version(api_key, version) == 1 else 0)


@st.composite
def response_frames(draw: st.DrawFn, cases: list[tuple[int, int]] = CASES) -> tuple[int, int, bytes, int]:
    api_key, version = draw(st.sampled_from(cases))
    message = draw(messages(response_class(api_key), version))
    header_tags = draw(tagged_section())
    correlation_id = draw(st.integers(-(2**31), 2**31 - 1))
    frame = build_frame(message, api_key, version, correlation_id, header_tags)
    return api_key, version, frame, body_offset(frame, api_key, version, header_tags)


def decode(frame: bytes, api_key: int, version: int, offset: int) -> Any:
    """kafka-python's public decode, independent of the module's exact-length decoder."""
    return response_class(api_key).decode(frame[offset:], version=version)


# -- needs_rewrite ---------------------------------------------------------------------------


def test_needs_rewrite_matches_the_schemas_for_every_api_and_version():
    for api_key in {*api_schemas(), *REWRITTEN_API_KEYS, 9999}:
        for version in range(40):
            first = FIRST_VERSION_WITH_ADDRESSES.get(api_key)
            assert needs_rewrite(api_key, version) == (first is not None and version >= first), (
                api_key,
                version,
            )


def test_every_version_kafka_python_supports_is_covered():
    assert response_class(ApiKey.METADATA).max_version >= 12
    assert response_class(ApiKey.FIND_COORDINATOR).max_version >= 4
    assert response_class(ApiKey.PRODUCE).max_version >= 10
    assert response_class(ApiKey.FETCH).max_version >= 16
    readable = {key for key in FIRST_VERSION_WITH_ADDRESSES if response_class(key) is not None}
    assert {key for key, _ in CASES} == readable >= {ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.FETCH}


@given(
    api_key=st.integers(-5, 100).filter(lambda k: k not in REWRITTEN_API_KEYS), junk=st.binary(max_size=40)
)
def test_responses_that_need_no_rewrite_are_not_even_parsed(api_key, junk):
    assert rewrite_response(junk, api_key, 3, shift) is None
    assert rewrite_response(junk, ApiKey.PRODUCE, 9, shift) is None
    assert rewrite_response(junk, ApiKey.FETCH, 15, shift) is None


# -- rewriting -------------------------------------------------------------------------------


@pytest.mark.parametrize(("api_key", "version"), CASES)
@PER_VERSION
@given(data=st.data())
def test_every_address_is_mapped_and_nothing_else_changes(api_key, version, data):
    _, _, frame, offset = data.draw(response_frames([(api_key, version)]))
    original = decode(frame, api_key, version, offset)
    calls: list[tuple[int, str, int]] = []

    def recording(node_id: int, host: str, port: int) -> tuple[str, int]:
        calls.append((node_id, host, port))
        return shift(node_id, host, port)

    out = rewrite_response(frame, api_key, version, recording)

    expected = decode(frame, api_key, version, offset)
    entries = address_entries(expected, api_key, version)
    assert calls == [(getattr(e, node), e.host, e.port) for e, node in entries]
    if not entries:
        assert out is None
        return
    assert out is not None
    for entry, node in entries:
        entry.host, entry.port = shift(getattr(entry, node), entry.host, entry.port)
    assert int.from_bytes(out[:4], "big") == len(out) - 4
    assert out[4:offset] == frame[4:offset]  # header, tagged fields included, byte for byte
    rewritten = decode(out, api_key, version, offset)
    assert rewritten == expected
    assert rewritten != original


@FAST
@given(case=response_frames())
def test_rewriting_there_and_back_restores_the_frame_byte_for_byte(case):
    api_key, version, frame, _ = case
    there = rewrite_response(frame, api_key, version, shift)
    if there is None:
        return
    assert rewrite_response(there, api_key, version, unshift) == frame


@pytest.mark.parametrize(("api_key", "version"), CASES)
@PER_VERSION
@given(data=st.data(), kind=st.sampled_from([bytes, bytearray, memoryview]))
def test_identity_mapper_leaves_the_frame_untouched(api_key, version, data, kind):
    _, _, frame, offset = data.draw(response_frames([(api_key, version)]))
    assert rewrite_response(kind(frame), api_key, version, identity) is None
    body = frame[offset:]
    message = decode_response_body(api_key, version, body)
    assert encode_response_body(message) == body
    assert message == decode(frame, api_key, version, offset)


@settings(max_examples=30, deadline=None)
@given(
    case=response_frames([(ApiKey.FIND_COORDINATOR, v) for v in range(4)]),
    error=st.integers(1, 2**15 - 1),
)
def test_find_coordinator_error_placeholders_are_left_alone(case, error):
    api_key, version, frame, offset = case
    message = decode(frame, api_key, version, offset)
    message.error_code = error
    errored = build_frame(message, api_key, version, 1, b"\x00")
    assert rewrite_response(errored, api_key, version, shift) is None


def test_find_coordinator_batched_maps_only_successful_coordinators():
    cls = response_class(ApiKey.FIND_COORDINATOR)
    coordinator = cls.Coordinator
    message = cls(
        version=4,
        throttle_time_ms=0,
        coordinators=[
            coordinator(
                version=4, key="g1", node_id=1, host="b1", port=9092, error_code=0, error_message=None
            ),
            coordinator(version=4, key="g2", node_id=-1, host="", port=-1, error_code=15, error_message="x"),
        ],
    )
    frame = build_frame(message, ApiKey.FIND_COORDINATOR, 4, 7, b"\x00")
    out = rewrite_response(frame, ApiKey.FIND_COORDINATOR, 4, lambda n, h, p: ("proxy", 19092))
    assert out is not None
    got = decode(out, ApiKey.FIND_COORDINATOR, 4, 9).coordinators
    assert [(c.node_id, c.host, c.port) for c in got] == [(1, "proxy", 19092), (-1, "", -1)]


# -- tagged fields kafka-python cannot keep --------------------------------------------------


def produce_v10_with_endpoint() -> tuple[Any, bytes]:
    cls = response_class(ApiKey.PRODUCE)
    endpoint = cls.NodeEndpoint(version=10, node_id=5, host="broker-5", port=9092, rack="r1")
    message = cls(version=10, responses=[], throttle_time_ms=0, node_endpoints=[endpoint])
    return cls, bytes(message.encode(version=10))


def test_unknown_top_level_tags_are_dropped_and_known_ones_rewritten():
    cls, body = produce_v10_with_endpoint()
    # body: responses (1 byte) + throttle (4) + tagged section; add an unknown tag 7.
    tagged = body[5:]
    assert tagged[0] == 1
    patched = body[:5] + b"\x02" + tagged[1:] + encode_uvarint(7) + encode_uvarint(2) + b"zz"
    assert cls.decode(patched, version=10).unknown_tags == {"_7": b"zz"}
    frame = (len(patched) + 5).to_bytes(4, "big") + b"\x00\x00\x00\x01\x00" + patched
    out = rewrite_response(frame, ApiKey.PRODUCE, 10, shift)
    assert out is not None
    rewritten = cls.decode(out[9:], version=10)
    assert rewritten.unknown_tags is None
    assert [(e.host, e.port) for e in rewritten.node_endpoints] == [("p5.broker-5", 9093)]


def test_nested_tags_inside_a_tagged_struct_are_a_protocol_error():
    """Valid Kafka, but kafka-python decodes tagged structs assuming empty nested tags."""
    _, body = produce_v10_with_endpoint()
    assert body[-1] == 0  # the endpoint's own (empty) tagged section, last in the body
    nested = body[:-1] + b"\x01\x03\x01Z"
    patched = nested[:7] + bytes([nested[7] + 3]) + nested[8:]  # grow the tag-0 size
    frame = (len(patched) + 5).to_bytes(4, "big") + b"\x00\x00\x00\x01\x00" + patched
    with pytest.raises(ProtocolError):
        rewrite_response(frame, ApiKey.PRODUCE, 10, shift)


# -- malformed input -------------------------------------------------------------------------


@FAST
@given(case=response_frames(), cut=st.integers(1, 200))
def test_truncated_bodies_raise_protocol_error(case, cut):
    api_key, version, frame, offset = case
    body = frame[offset:]
    cut = min(cut, len(body))
    short = frame[:offset] + body[: len(body) - cut]
    short = (len(short) - 4).to_bytes(4, "big") + short[4:]
    with pytest.raises(ProtocolError):
        rewrite_response(short, api_key, version, shift)


@FAST
@given(case=response_frames(), extra=st.binary(min_size=1, max_size=8))
def test_trailing_bytes_raise_protocol_error(case, extra):
    api_key, version, frame, _ = case
    longer = (len(frame) - 4 + len(extra)).to_bytes(4, "big") + frame[4:] + extra
    with pytest.raises(ProtocolError):
        rewrite_response(longer, api_key, version, shift)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), header=tagged_section(), junk=st.binary(max_size=120))
def test_garbage_bodies_raise_only_protocol_error(case, header, junk):
    api_key, version = case
    head = b"\x00\x00\x00\x09" + (header if response_header_version(api_key, version) == 1 else b"")
    frame = (len(head) + len(junk)).to_bytes(4, "big") + head + junk
    try:
        out = rewrite_response(frame, api_key, version, shift)
    except ProtocolError:
        return
    assert out is None or isinstance(out, bytes)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), frame=st.binary(max_size=60))
def test_garbage_frames_raise_only_protocol_error(case, frame):
    api_key, version = case
    with contextlib.suppress(ProtocolError):
        rewrite_response(frame, api_key, version, shift)


@FAST
@given(case=response_frames(), delta=st.integers(-3, 3).filter(bool))
def test_a_wrong_size_prefix_is_a_protocol_error(case, delta):
    api_key, version, frame, _ = case
    bad = (len(frame) - 4 + delta).to_bytes(4, "big", signed=True) + frame[4:]
    with pytest.raises(ProtocolError):
        rewrite_response(bad, api_key, version, shift)


def test_a_version_newer_than_kafka_python_is_undecodable():
    newest = response_class(ApiKey.METADATA).max_version
    frame = b"\x00\x00\x00\x06\x00\x00\x00\x01\x00\x00"
    with pytest.raises(UndecodableVersionError) as info:
        rewrite_response(frame, ApiKey.METADATA, newest + 1, shift)
    assert isinstance(info.value, ProtocolError)
    assert (info.value.api_version, info.value.max_version) == (newest + 1, newest)


# -- the mapper is the proxy's own code ------------------------------------------------------


def metadata_frame() -> bytes:
    cls = response_class(ApiKey.METADATA)
    broker = cls.MetadataResponseBroker(version=1, node_id=1, host="b", port=9092, rack=None)
    message = cls(version=1, brokers=[broker], controller_id=1, topics=[])
    return build_frame(message, ApiKey.METADATA, 1, 1, b"")


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (("h", "9092"), TypeError),
        ((None, 9092), TypeError),
        (("h", True), TypeError),
        (("h", 2**31), ValueError),
        (("h" * 40000, 9092), ValueError),
    ],
)
def test_a_bad_mapper_result_is_a_programming_error(result, error):
    with pytest.raises(error):
        rewrite_response(metadata_frame(), ApiKey.METADATA, 1, lambda n, h, p: result)
