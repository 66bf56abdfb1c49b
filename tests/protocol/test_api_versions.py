"""ApiVersions capping (protocol.api_versions): clients never pick a version the proxy cannot read."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.schemas import BaseField, load_json

from protocol import (
    ApiKey,
    ProtocolError,
    join_group_rebalance_timeout_ms,
    parse_request_header,
    request_class,
    response_class,
)
from protocol._api_versions import (
    LIBRDKAFKA_TAG_SKIP_FIXED,
    UNSUPPORTED_VERSION,
    ClientSoftware,
    cap_api_versions,
    client_software,
    decodable_max_versions,
    librdkafka_version,
    mis_skips_tagged_fields,
    strip_tagged_fields,
    unsupported_api_versions_response,
)
from protocol._rewrite import UndecodableVersionError
from protocol.testing import encode_request
from tests.support.api_versions_samples import (
    CONFLUENT_REQUEST,
    KCAT_REQUEST,
    TANSU_TAGS,
    TANSU_V3_ANSWER,
    ReadUnderflow,
    librdkafka_reads,
    ranges,
)
from tests.support.kafka_frames import join_group_request
from tests.support.message_strategies import messages

CAPPED = {
    0: "Produce",
    1: "Fetch",
    3: "Metadata",
    10: "FindCoordinator",
    11: "JoinGroup",  # its request is read for the rebalance timeout the deadline waits out
    18: "ApiVersions",
    60: "DescribeCluster",
    76: "ShareGroupHeartbeat",  # no use without ShareFetch: no version while that has none
    78: "ShareFetch",  # answers with addresses that kafka-python 3.0 cannot read: no version
    79: "ShareAcknowledge",
}
CLS = response_class(ApiKey.API_VERSIONS)
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
        if response_class(key) is None:
            assert caps[key] == -1, name
            continue
        assert caps[key] == min(schema_max(name, "Request"), schema_max(name, "Response")), name
    caps[0] = -5  # a fresh dict each time
    assert decodable_max_versions()[0] != -5


def test_a_share_consumer_is_not_let_into_a_share_group_it_could_not_fetch_from():
    """The Java share consumer that is offered ShareGroupHeartbeat but not ShareFetch joins
    its share group and is assigned partitions; each ShareFetch then fails in the client, which
    logs that at debug level and tries again, so the partitions assigned to it are never
    consumed, and nothing says why. Without the heartbeat it stops at once: "The cluster does
    not support the share group protocol"."""
    frame = frame_of(
        CLS(
            version=3,
            error_code=0,
            throttle_time_ms=0,
            api_keys=[
                CLS.ApiVersion(version=3, api_key=key, min_version=1, max_version=1)
                for key in (ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_DESCRIBE, ApiKey.SHARE_FETCH)
            ],
        )
    )
    kept = decode(cap_api_versions(frame, 3, decodable_max_versions()), 3)
    assert [entry.api_key for entry in kept.api_keys] == [ApiKey.SHARE_GROUP_DESCRIBE]


def test_join_group_is_offered_only_in_versions_whose_rebalance_timeout_can_be_read():
    """The deadline of a JoinGroup counts from the end of its rebalance timeout, read from the
    request. A version kafka-python could not read would give 0, and the plain deadline would
    cut every member off a rebalance that waits for a slow one (max.poll.interval.ms)."""
    newest = request_class(ApiKey.JOIN_GROUP).max_version
    offered = CLS.ApiVersion(version=3, api_key=ApiKey.JOIN_GROUP, min_version=0, max_version=newest + 1)
    frame = frame_of(CLS(version=3, error_code=0, throttle_time_ms=0, api_keys=[offered]))
    (entry,) = decode(cap_api_versions(frame, 3, decodable_max_versions()), 3).api_keys
    assert (entry.min_version, entry.max_version) == (0, newest)
    request = join_group_request(newest, rebalance_timeout_ms=600_000)
    assert join_group_rebalance_timeout_ms(request, parse_request_header(request)) == 600_000


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
        (ApiKey.API_VERSIONS, 0, CLS.max_version)
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
    (entry,) = [e for e in answer.api_keys if e.api_key == ApiKey.API_VERSIONS]
    assert (entry.min_version, entry.max_version) == (0, decodable_max_versions()[ApiKey.API_VERSIONS])
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


# -- client compatibility: librdkafka before 2.2.0 and tagged fields ---------------------------

# Tansu's answer to an ApiVersions v3 request (correlation id 7), captured from the broker the
# tests run: 36 APIs, then all four optional tagged fields, at their default values.
# What Debian 12's kcat 1.7.1 sends first (size prefix added): ApiVersions v3, client id
# "rdkafka", client software "librdkafka" "2.0.2" (KIP-511: librdkafka's version string).
# confluent-kafka-python 2.16.1 on its bundled librdkafka 2.16.0.
REQUEST_CLS = request_class(ApiKey.API_VERSIONS)
FLEXIBLE_VERSIONS = range(3, CLS.max_version + 1)


def test_tansus_answer_is_what_librdkafka_2_0_2_cannot_read():
    """The cause of issue #13, byte for byte: "Read underflow" exactly as kcat logs it."""
    answer = decode(TANSU_V3_ANSWER, 3)
    assert answer.tags == {
        "supported_features",
        "finalized_features_epoch",
        "finalized_features",
        "zk_migration_ready",
    }
    # 4 tagged fields: tag 0 size 1 (empty array), tag 1 size 8 (epoch -1), tag 2 size 1
    # (empty array), tag 3 size 1 (false).
    assert TANSU_V3_ANSWER.endswith(bytes.fromhex("04 000101 0108ffffffffffffffff 020101 030100"))
    # Tag 0 has size 1 and nothing is skipped; its value 0x01 is read as a tag and tag 1's id
    # as a size; then 0x08 is a tag and ff..ff 02 a size of 0x02FFFFFFFFFFFFFF.
    with pytest.raises(ReadUnderflow, match="expected 216172782113783806 bytes > 5 remaining"):
        librdkafka_reads(TANSU_V3_ANSWER, fixed=False)
    assert librdkafka_reads(TANSU_V3_ANSWER, fixed=True) == ranges(TANSU_V3_ANSWER, 3)


def test_stripped_answer_is_read_alike_by_old_and_new_librdkafka():
    out, dropped = strip_tagged_fields(TANSU_V3_ANSWER, 3)
    assert dropped == TANSU_TAGS
    assert out[4:8] == TANSU_V3_ANSWER[4:8]
    assert out.endswith(b"\x00\x00\x00\x00\x00")  # throttle time 0, no tagged fields
    assert len(out) == len(TANSU_V3_ANSWER) - 19
    assert (
        librdkafka_reads(out, fixed=False) == librdkafka_reads(out, fixed=True) == ranges(TANSU_V3_ANSWER, 3)
    )
    assert strip_tagged_fields(out, 3) is None


@settings(max_examples=150, deadline=None)
@given(case=api_versions_responses(), caps=CAPS)
def test_stripping_keeps_every_api_range_and_drops_every_tag(case, caps):
    """Capped (as the router does) then stripped: kafka-python reads the same ranges, every
    tagged field at its default, and librdkafka before 2.2.0 reads it too."""
    version, message = case
    capped = cap_api_versions(frame_of(message, 42), version, caps)
    stripped = strip_tagged_fields(capped, version)
    if version < 3:
        assert stripped is None
        return
    expected = decode(capped, version)
    if stripped is None:
        assert not expected.tags and not expected.unknown_tags
        return
    out, dropped = stripped
    assert dropped
    answer = decode(out, version)
    assert answer.header.correlation_id == 42
    assert (answer.error_code, answer.throttle_time_ms) == (0, expected.throttle_time_ms)
    assert ranges(out, version) == ranges(capped, version)
    for name, field in CLS.fields.items():
        if field._tag is not None:
            assert getattr(answer, name) == field.default
    assert not answer.tags and not answer.unknown_tags
    assert librdkafka_reads(out, fixed=False) == ranges(capped, version)


@pytest.mark.parametrize("version", FLEXIBLE_VERSIONS)
def test_unknown_tags_are_dropped_too(version):
    """Tags kafka-python does not know (a newer broker's), at the top level and in an entry."""
    entry = CLS.ApiVersion(version=version, api_key=3, min_version=0, max_version=12)
    body = bytearray(CLS(version=version, error_code=0, throttle_time_ms=0, api_keys=[entry]).encode())
    assert body[-1] == 0 and body[-6] == 0  # the message's and the entry's empty tag sections
    body[-6:-5] = bytes([1, 8, 1, 0xEE])  # tag 8 on the entry, one byte
    body[-1:] = bytes([1, 9, 2, 0xAB, 0xCD])  # tag 9, two bytes
    frame = (4 + len(body)).to_bytes(4, "big") + (5).to_bytes(4, "big") + bytes(body)
    assert librdkafka_reads(frame, fixed=True) == [(3, 0, 12)]
    out, dropped = strip_tagged_fields(frame, version)
    assert dropped == ["tag 9", "ApiKeys entry tags"]
    assert librdkafka_reads(out, fixed=False) == [(3, 0, 12)]


@pytest.mark.parametrize("version", range(3))
def test_answers_before_v3_have_no_tags_to_strip(version):
    frame = frame_of(CLS(version=version, error_code=0, api_keys=[]))
    assert strip_tagged_fields(frame, version) is None


def test_error_answers_are_left_alone():
    assert strip_tagged_fields(unsupported_api_versions_response(3), 3) is None
    assert strip_tagged_fields(frame_of(CLS(version=3, error_code=42, api_keys=[])), 3) is None


@settings(max_examples=100, deadline=None)
@given(version=st.sampled_from(FLEXIBLE_VERSIONS), junk=st.binary(max_size=40))
def test_malformed_answers_raise_only_protocol_error(version, junk):
    body = b"\x00\x00" + junk
    frame = (4 + len(body)).to_bytes(4, "big") + b"\x00\x00\x00\x01" + body
    with contextlib.suppress(ProtocolError):
        strip_tagged_fields(frame, version)


def test_client_software_of_real_clients():
    kcat = client_software(KCAT_REQUEST, parse_request_header(KCAT_REQUEST))
    assert kcat == ClientSoftware("librdkafka", "2.0.2")
    assert str(kcat) == "librdkafka 2.0.2"
    confluent = client_software(CONFLUENT_REQUEST, parse_request_header(CONFLUENT_REQUEST))
    assert confluent == ClientSoftware("confluent-kafka-python", "2.16.1-rdkafka-2.16.0")


SOFTWARE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@settings(max_examples=100, deadline=None)
@given(version=st.sampled_from(FLEXIBLE_VERSIONS), name=SOFTWARE_TEXT, software_version=SOFTWARE_TEXT)
def test_client_software_reads_what_kafka_python_encodes(version, name, software_version):
    request = REQUEST_CLS(
        version=version, client_software_name=name, client_software_version=software_version
    )
    frame = encode_request(request, correlation_id=9, client_id="c")
    assert client_software(frame, parse_request_header(frame)) == ClientSoftware(name, software_version)


@pytest.mark.parametrize("version", range(3))
def test_requests_before_v3_name_no_software(version):
    frame = encode_request(REQUEST_CLS(version=version), correlation_id=1)
    assert client_software(frame, parse_request_header(frame)) is None


def test_truncated_client_software_is_a_protocol_error():
    short = KCAT_REQUEST[:-4]
    short = (len(short) - 4).to_bytes(4, "big") + short[4:]
    with pytest.raises(ProtocolError):
        client_software(short, parse_request_header(short))


@pytest.mark.parametrize(
    ("name", "version", "librdkafka", "misreads"),
    [
        # librdkafka's default client software: rd_kafka_version_str()
        ("librdkafka", "1.4.0", (1, 4, 0), True),  # first with ApiVersions v3 (KIP-511)
        ("librdkafka", "2.0.2", (2, 0, 2), True),  # Debian 12's kcat
        ("librdkafka", "2.1.1", (2, 1, 1), True),  # the last release with the bug
        ("librdkafka", "2.2.0-RC1", (2, 2, 0), False),  # PR #4278 is in v2.2.0-RC1
        ("librdkafka", "2.2.0", (2, 2, 0), False),
        ("librdkafka", "2.16.0", (2, 16, 0), False),
        ("librdkafka", "v2.1", (2, 1, 0), True),
        ("librdkafka", "unknown", None, False),
        # bindings that report librdkafka's version as theirs
        ("confluent-kafka-go", "2.1.1", (2, 1, 1), True),
        ("confluent-kafka-dotnet", "2.0.2", (2, 0, 2), True),
        ("confluent-kafka-dotnet", "2.3.0", (2, 3, 0), False),
        # bindings that append it to their own version
        ("confluent-kafka-python", "2.0.2-rdkafka-2.0.2", (2, 0, 2), True),
        ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", (2, 16, 0), False),
        ("confluent-kafka-javascript", "1.0.0-librdkafka-2.1.0", (2, 1, 0), True),
        ("karafka", "v2.0.0-rdkafka-ruby-v0.13.0-librdkafka-v2.0.2", (2, 0, 2), True),
        ("karafka", "v2.5.0-rdkafka-ruby-v0.19.5-librdkafka-v2.8.0", (2, 8, 0), False),
        # not librdkafka, whatever the version number
        ("kafka-python", "2.0.2", None, False),
        ("apache-kafka-java", "3.7.0", None, False),
        ("sarama", "1.38.1", None, False),
        ("my-app", "1.0-myrdkafka-1.0.0", None, False),
    ],
)
def test_which_clients_misread_tagged_fields(name, version, librdkafka, misreads):
    software = ClientSoftware(name, version)
    assert librdkafka_version(software) == librdkafka
    assert mis_skips_tagged_fields(software) is misreads
    if librdkafka is not None:
        assert misreads == (librdkafka < LIBRDKAFKA_TAG_SKIP_FIXED)
