"""The hand-written ConsumerGroupHeartbeat reader against frames encoded from Apache Kafka's
schemas' field lists (:mod:`tests.support.heartbeat_schema`), not from the reader's code:
every valid version, optional fields null and set, several topic partitions, a regex
subscription, and tagged fields in the headers and at each struct level."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from protocol import ApiKey
from spark_audit.decode import _consumer_group
from spark_audit.decode._frame_decode import decode
from tests.support import heartbeat_schema
from tests.support.heartbeat_schema import VALID_VERSIONS

TOPICS = [uuid.UUID(int=1), uuid.UUID("5f1e0e5c-8a53-4a55-9b1e-3e0f0c6a7d21"), uuid.UUID(int=2**128 - 1)]
TAGS = {0: b"\x01\x02", 7: b"", 300: b"x" * 130}  # a tag and a size of two varint bytes
OWNED = [
    {"TopicId": TOPICS[0], "Partitions": [0, 1, 2], "_tags": TAGS},
    {"TopicId": TOPICS[1], "Partitions": []},
    {"TopicId": TOPICS[2], "Partitions": [2**31 - 1]},
]


def _facts(frame: bytes, version: int, direction: str) -> list[dict[str, Any]]:
    return decode(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, direction, frame, len(frame))


def _request_body(version: int, group: str, member: str, epoch: int, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"GroupId": group, "MemberId": member, "MemberEpoch": epoch}
    body["RebalanceTimeoutMs"] = -1  # it did not change
    if version >= 1:
        body["SubscribedTopicRegex"] = None  # null: it did not change
    return {**body, **fields}


@pytest.mark.parametrize("version", VALID_VERSIONS)
@pytest.mark.parametrize("client_id", ["consumer-payments-1", None, ""])
def test_a_request_with_every_field_set_gives_its_group_member_and_epoch(version: int, client_id: str | None):
    body = _request_body(
        version,
        "payments",
        "Mn0x-9fGQ2yZ3Lr7cW5aVg",
        17,
        InstanceId="instance-é",
        RackId="eu-west-1a",
        RebalanceTimeoutMs=300_000,
        SubscribedTopicNames=["orders", "refunds"],
        ServerAssignor="uniform",
        TopicPartitions=OWNED,
        _tags=TAGS,
    )
    if version >= 1:
        body["SubscribedTopicRegex"] = "payments-.*"
    frame = heartbeat_schema.request(version, 41, body, client_id=client_id, header_tags=TAGS)
    assert _facts(frame, version, "request") == [
        {"fact": "group", "group_id": "payments", "member_id": "Mn0x-9fGQ2yZ3Lr7cW5aVg", "generation_id": 17}
    ]


@pytest.mark.parametrize("version", VALID_VERSIONS)
@pytest.mark.parametrize(("member", "epoch"), [("", 0), ("m", -1), ("m", -2), ("m", 2**31 - 1)])
def test_a_request_with_every_optional_field_null_gives_the_epoch_sent(version: int, member: str, epoch: int):
    # A heartbeat at rest sends null for what did not change; joins send epoch 0 (with an
    # empty member id before KIP-1082), leaves -1, and static members leaving -2.
    frame = heartbeat_schema.request(version, 2**31 - 1, _request_body(version, "g", member, epoch))
    assert _consumer_group.heartbeat_request(frame) == [
        {"fact": "group", "group_id": "g", "member_id": member, "generation_id": epoch}
    ]


def _answer_body(error: int, member: str | None, epoch: int, **fields: Any) -> dict[str, Any]:
    body = {"ThrottleTimeMs": 0, "ErrorCode": error, "MemberId": member, "MemberEpoch": epoch}
    return {**body, "HeartbeatIntervalMs": 5000, **fields}


@pytest.mark.parametrize("version", VALID_VERSIONS)
def test_an_answer_handing_out_an_assignment_gives_the_epoch_and_member(version: int):
    assignment = {"TopicPartitions": OWNED, "_tags": TAGS}
    body = _answer_body(0, "Mn0x-9fGQ2yZ3Lr7cW5aVg", 4, ThrottleTimeMs=250, Assignment=assignment, _tags=TAGS)
    frame = heartbeat_schema.response(version, 41, body, header_tags=TAGS)
    assert _facts(frame, version, "response") == [
        {"fact": "generation", "generation_id": 4, "member_id": "Mn0x-9fGQ2yZ3Lr7cW5aVg", "error_code": 0}
    ]


@pytest.mark.parametrize("version", VALID_VERSIONS)
def test_an_answer_at_rest_names_no_member(version: int):
    body = _answer_body(0, None, 9, ErrorMessage=None, Assignment=None)
    frame = heartbeat_schema.response(version, 41, body)
    assert _facts(frame, version, "response") == [
        {"fact": "generation", "generation_id": 9, "member_id": None, "error_code": 0}
    ]


@pytest.mark.parametrize("version", VALID_VERSIONS)
@pytest.mark.parametrize("error", [110, 111, 82, 16, 25])  # and NOT_COORDINATOR, UNKNOWN_MEMBER_ID
def test_an_answer_with_an_error_and_its_message_gives_an_error_fact(version: int, error: int):
    message = "The member epoch is fenced by the group coordinator. " * 3  # over 127 bytes
    frame = heartbeat_schema.response(
        version, 41, _answer_body(error, None, 0, ErrorMessage=message), header_tags={1: b"\x00"}
    )
    assert _facts(frame, version, "response") == [
        {"fact": "generation", "generation_id": 0, "member_id": None, "error_code": error},
        {"fact": "error", "error_code": error},
    ]


def test_a_version_beyond_the_schemas_is_undecodable_not_misread():
    unknown = max(VALID_VERSIONS) + 1
    request = heartbeat_schema.request(1, 41, _request_body(1, "g", "m", 3))
    answer = heartbeat_schema.response(1, 41, _answer_body(0, None, 3))
    assert [f["fact"] for f in _facts(request, unknown, "request")] == ["undecodable"]
    assert [f["fact"] for f in _facts(answer, unknown, "response")] == ["undecodable"]
    assert max(VALID_VERSIONS) == _consumer_group.HIGHEST_VERSION
