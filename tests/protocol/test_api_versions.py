"""ApiVersions capping (protocol.api_versions): clients never pick a version the proxy cannot read."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.schemas import BaseField, load_json

from protocol.api_versions import (
    UNSUPPORTED_VERSION,
    cap_api_versions,
    decodable_max_versions,
    unsupported_api_versions_response,
)
from protocol.errors import ProtocolError
from protocol.rewrite import UndecodableVersionError
from protocol.schemas import response_class

from .message_strategies import messages

API_VERSIONS = 18
CAPPED = {
    0: "Produce",
    1: "Fetch",
    3: "Metadata",
    10: "FindCoordinator",
    18: "ApiVersions",
    60: "DescribeCluster",
}
CLS = response_class(API_VERSIONS)
VERSIONS = range(CLS.max_version + 1)


def schema_max(name: str, kind: str) -> int:
    return BaseField.parse_versions(load_json(f"{name}{kind}")["validVersions"])[1]


def frame_of(message: Any, correlation_id: int = 77) -> bytes:
    """Header v0 (correlation id only) and the body, as a broker sends ApiVersions."""
    body = bytes(message.encode())
    return (4 + len(body)).to_bytes(4, "big") + correlation_id.to_bytes(4, "big", signed=True) + body


def decode(frame: bytes, version: int) -> Any:
    """The way kafka-python's client reads it (v0 whenever error_code != 0)."""
    return CLS.decode(frame, version=version, header=True, framed=True)


@st.composite
def api_versions_responses(draw: st.DrawFn) -> tuple[int, Any]:
    """A successful response with unique api keys, some of them capped ones."""
    version = draw(st.sampled_from(VERSIONS))
    message = draw(messages(CLS, version))
    keys = draw(
        st.lists(
            st.one_of(st.sampled_from(sorted(CAPPED)), st.integers(-(2**15), 2**15 - 1)),
            unique=True,
            max_size=12,
        )
    )
    versions = st.integers(-1, 40)
    message.error_code = 0
    message.api_keys = [
        CLS.ApiVersion(version=version, api_key=key, min_version=draw(versions), max_version=draw(versions))
        for key in keys
    ]
    return version, message


CAPS = st.dictionaries(st.sampled_from(sorted(CAPPED)), st.integers(-1, 30), max_size=6)


def test_decodable_max_versions_come_from_the_schemas():
    caps = decodable_max_versions()
    assert set(caps) == set(CAPPED)
    for key, name in CAPPED.items():
        assert caps[key] == min(schema_max(name, "Request"), schema_max(name, "Response")), name
    caps[0] = -5  # a fresh dict each time
    assert decodable_max_versions()[0] != -5


@settings(max_examples=120, deadline=None)
@given(case=api_versions_responses(), caps=CAPS, correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_capped_versions_are_lowered_dropped_or_kept(case, caps, correlation_id):
    version, message = case
    frame = frame_of(message, correlation_id)
    out = cap_api_versions(frame, version, caps)
    expected = decode(frame, version)
    kept = []
    for entry in expected.api_keys:
        cap = caps.get(entry.api_key)
        if cap is not None and entry.min_version > cap:
            continue
        if cap is not None and entry.max_version > cap:
            entry.max_version = cap
        kept.append(entry)
    changed = kept != decode(frame, version).api_keys
    expected.api_keys = kept
    assert out[4:8] == frame[4:8]
    assert int.from_bytes(out[:4], "big") == len(out) - 4
    assert decode(out, version) == expected
    assert (out is not frame) == changed


@settings(max_examples=80, deadline=None)
@given(case=api_versions_responses())
def test_capping_to_the_decodable_versions_never_leaves_a_version_above_them(case):
    version, message = case
    caps = decodable_max_versions()
    out = decode(cap_api_versions(frame_of(message), version, caps), version)
    for entry in out.api_keys:
        if entry.api_key in caps:
            assert entry.min_version <= caps[entry.api_key]
            assert entry.max_version <= caps[entry.api_key]


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_nothing_to_cap_returns_the_frame_itself(kind):
    message = CLS(
        version=3,
        error_code=0,
        throttle_time_ms=0,
        api_keys=[CLS.ApiVersion(version=3, api_key=3, min_version=0, max_version=12)],
    )
    frame = frame_of(message)
    out = cap_api_versions(kind(frame), 3, {3: 13, 0: 1})
    assert out == frame
    assert isinstance(out, bytes)
    if kind is bytes:
        assert cap_api_versions(frame, 3, {3: 13}) is frame


@pytest.mark.parametrize("request_version", VERSIONS)
def test_unsupported_version_answers_are_capped_as_v0(request_version):
    frame = unsupported_api_versions_response(5, max_version=9)
    out = cap_api_versions(frame, request_version, decodable_max_versions())
    answer = decode(out, request_version)
    assert answer.version == 0
    assert answer.error_code == UNSUPPORTED_VERSION
    assert [(e.api_key, e.min_version, e.max_version) for e in answer.api_keys] == [
        (API_VERSIONS, 0, CLS.max_version)
    ]


def test_other_errors_are_relayed_untouched():
    message = CLS(version=3, error_code=42, throttle_time_ms=0, api_keys=[])
    frame = frame_of(message)
    assert cap_api_versions(frame, 3, {18: 0}) is frame


@pytest.mark.parametrize("request_version", [*VERSIONS, 9])
def test_unsupported_version_response_is_what_kafka_python_retries_on(request_version):
    frame = unsupported_api_versions_response(-123)
    assert frame[4:8] == (-123).to_bytes(4, "big", signed=True)
    answer = CLS.decode(frame, version=min(request_version, CLS.max_version), header=True, framed=True)
    assert answer.header.correlation_id == -123
    assert answer.error_code == UNSUPPORTED_VERSION
    # kafka-python's connection: next version = min(current, the listed ApiVersions max).
    (entry,) = [e for e in answer.api_keys if e.api_key == API_VERSIONS]
    assert (entry.min_version, entry.max_version) == (0, decodable_max_versions()[API_VERSIONS])
    assert min(request_version, entry.max_version) <= CLS.max_version


def test_a_successful_answer_newer_than_kafka_python_is_undecodable():
    frame = frame_of(CLS(version=0, error_code=0, api_keys=[]))
    with pytest.raises(UndecodableVersionError):
        cap_api_versions(frame, CLS.max_version + 1, {})


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from(VERSIONS), error=st.sampled_from([0, 35]), junk=st.binary(max_size=60))
def test_garbage_raises_only_protocol_error(version, error, junk):
    body = error.to_bytes(2, "big") + junk
    frame = (4 + len(body)).to_bytes(4, "big") + b"\x00\x00\x00\x01" + body
    with contextlib.suppress(ProtocolError):
        assert isinstance(cap_api_versions(frame, version, decodable_max_versions()), bytes)


@settings(max_examples=80, deadline=None)
@given(case=api_versions_responses(), cut=st.integers(1, 50))
def test_truncated_answers_raise_protocol_error(case, cut):
    version, message = case
    frame = frame_of(message)
    short = frame[: max(8, len(frame) - cut)]
    short = (len(short) - 4).to_bytes(4, "big") + short[4:]
    with pytest.raises(ProtocolError):
        cap_api_versions(short, version, {})
