"""The client-compatibility repair in the machine and its switch: librdkafka before 2.2.0 gets
ApiVersions answers without tagged fields, counted as ``client_compat``; nobody else is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from corrfix._cli import _with_config_file, build_parser, proxy_config_from_args
from corrfix.core import RepairConfig, RepairKind, RepairMachine
from protocol import ApiKey, cap_api_versions, decodable_max_versions, request_class, response_class
from protocol.testing import encode_request
from tests.support.api_versions_samples import (
    CONFLUENT_REQUEST,
    KCAT_REQUEST,
    TANSU_TAGS,
    TANSU_V3_ANSWER,
    librdkafka_reads,
    ranges,
)

CLIENT_ID = 1
"""The correlation id of both captured requests."""


def upstream_answer(frame: bytes, upstream_id: int) -> bytearray:
    """The captured answer as the broker sends it to the id the machine chose."""
    answer = bytearray(frame)
    answer[4:8] = upstream_id.to_bytes(4, "big", signed=True)
    return answer


def round_trip(machine: RepairMachine, request: bytes = KCAT_REQUEST, answer: bytes = TANSU_V3_ANSWER):
    """One ApiVersions request and its answer; returns (what the client got, the events)."""
    sent = machine.client_frames([bytearray(request)], now=0.0)
    (upstream,) = sent.to_upstream
    upstream_id = int.from_bytes(upstream[8:12], "big", signed=True)
    got = machine.upstream_frames([upstream_answer(answer, upstream_id)], now=0.001)
    (delivered,) = got.to_client
    return bytes(delivered), sent.repairs + got.repairs


def test_kcat_gets_the_answer_without_tagged_fields_and_the_repair_is_counted():
    delivered, events = round_trip(RepairMachine())
    assert int.from_bytes(delivered[4:8], "big") == CLIENT_ID
    assert librdkafka_reads(delivered, fixed=False) == ranges(TANSU_V3_ANSWER, 3)
    (event,) = events
    assert event.kind is RepairKind.CLIENT_COMPAT
    assert event.api == "ApiVersions"
    assert event.client_correlation_id == CLIENT_ID
    assert all(tag in event.reason for tag in TANSU_TAGS)
    assert "librdkafka 2.0.2" in event.reason


def test_turned_off_kcat_gets_the_brokers_answer():
    delivered, events = round_trip(RepairMachine(RepairConfig(client_compat=False)))
    assert delivered == upstream_answer(TANSU_V3_ANSWER, CLIENT_ID)
    assert events == []


def test_a_fixed_librdkafka_gets_the_brokers_answer():
    delivered, events = round_trip(RepairMachine(), CONFLUENT_REQUEST)
    assert delivered == upstream_answer(TANSU_V3_ANSWER, CLIENT_ID)
    assert events == []


@pytest.mark.parametrize("version", range(3))
def test_requests_that_name_no_software_are_relayed_as_they_are(version):
    request = encode_request(request_class(ApiKey.API_VERSIONS)(version=version), CLIENT_ID)
    answer = response_class(ApiKey.API_VERSIONS)(version=version, error_code=0, api_keys=[])
    answer.with_header(correlation_id=CLIENT_ID)
    frame = bytes(answer.encode(header=True, framed=True))
    delivered, events = round_trip(RepairMachine(), request, frame)
    assert delivered == frame and events == []


def kafka_like_answer() -> bytes:
    """An ApiVersions v3 answer as Apache Kafka 3.x sends it: tagged fields with values."""
    cls = response_class(ApiKey.API_VERSIONS)
    answer = cls(
        version=3,
        error_code=0,
        throttle_time_ms=0,
        api_keys=[
            cls.ApiVersion(version=3, api_key=ApiKey.METADATA, min_version=0, max_version=12),
            cls.ApiVersion(version=3, api_key=ApiKey.API_VERSIONS, min_version=0, max_version=3),
        ],
        supported_features=[
            cls.SupportedFeatureKey(version=3, name="metadata.version", min_version=1, max_version=20)
        ],
        finalized_features_epoch=7,
        finalized_features=[
            cls.FinalizedFeatureKey(
                version=3, name="metadata.version", min_version_level=20, max_version_level=20
            )
        ],
    )
    answer.with_header(correlation_id=CLIENT_ID)
    return bytes(answer.encode(header=True, framed=True))


def capping(caps: dict[int, int]):
    def cap(api_key: int, api_version: int, frame: bytearray) -> bytes:
        return cap_api_versions(frame, api_version, caps)

    return cap


def test_the_cap_and_the_compat_repair_both_apply():
    caps = {**decodable_max_versions(), ApiKey.METADATA: 4}
    delivered, events = round_trip(RepairMachine(transform=capping(caps)), answer=kafka_like_answer())
    assert [e.kind for e in events] == [RepairKind.CLIENT_COMPAT]
    assert "SupportedFeatures, FinalizedFeaturesEpoch, FinalizedFeatures for" in events[0].reason
    assert librdkafka_reads(delivered, fixed=False) == [(ApiKey.METADATA, 0, 4), (ApiKey.API_VERSIONS, 0, 3)]
    assert not response_class(ApiKey.API_VERSIONS).decode(delivered, version=3, header=True, framed=True).tags


def test_a_cap_that_re_encodes_tansus_answer_leaves_nothing_to_repair():
    """kafka-python writes only tagged fields that differ from their default, and Tansu's are
    all defaults: an answer the cap changed already reads fine, so nothing is counted."""
    caps = {**decodable_max_versions(), ApiKey.METADATA: 4}
    delivered, events = round_trip(RepairMachine(transform=capping(caps)))
    assert events == []
    assert dict((k, (lo, hi)) for k, lo, hi in librdkafka_reads(delivered, fixed=False))[ApiKey.METADATA] == (
        0,
        4,
    )


def test_other_requests_on_a_compat_connection_are_untouched():
    machine = RepairMachine()
    round_trip(machine)
    metadata = encode_request(request_class(ApiKey.METADATA)(version=4, topics=None), 2)
    sent = machine.client_frames([bytearray(metadata)], now=1.0)
    (upstream,) = sent.to_upstream
    answer = response_class(ApiKey.METADATA)(version=4, brokers=[], topics=[])
    answer.with_header(correlation_id=int.from_bytes(upstream[8:12], "big"))
    got = machine.upstream_frames([bytearray(answer.encode(header=True, framed=True))], now=1.001)
    assert got.repairs == [] and len(got.to_client) == 1


def test_a_malformed_software_name_is_ignored_and_relayed():
    bad = bytearray(KCAT_REQUEST)
    bad[25] = 0x7F  # the software name's length now runs past the frame
    machine = RepairMachine()
    delivered, events = round_trip(machine, bytes(bad))
    assert delivered == upstream_answer(TANSU_V3_ANSWER, CLIENT_ID) and events == []


# -- the switch: flag, TOML, default ------------------------------------------------------------


def parse(*argv: str):
    parser = build_parser()
    return proxy_config_from_args(_with_config_file(parser, parser.parse_args(list(argv)), list(argv)))


def test_on_by_default_and_off_by_flag():
    assert parse("proxy", "--listen", ":1", "--upstream", "h:2").repair.client_compat is True
    off = parse("proxy", "--listen", ":1", "--upstream", "h:2", "--no-client-compat")
    assert off.repair.client_compat is False


def test_off_in_the_config_file(tmp_path: Path):
    file = tmp_path / "c.toml"
    file.write_text('listen = "127.0.0.1:1"\nupstream = "h:2"\nclient-compat = false\n')
    assert parse("proxy", "--config", str(file)).repair.client_compat is False
