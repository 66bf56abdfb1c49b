"""ConsumerGroupHeartbeat (api key 68) frames encoded from Apache Kafka's JSON schemas'
field lists, by a small generic encoder of flexible versions: a second reading of the
schemas, independent of the audit's hand-written reader and of
:mod:`tests.support.consumer_group_frames`, so that both cannot share one mistake.

The field tables below are ConsumerGroupHeartbeatRequest.json and
ConsumerGroupHeartbeatResponse.json (validVersions 0-1, flexibleVersions 0+) field by
field: name, type, first version, first nullable version (None: never nullable) and the
fields of a struct. Values are dicts keyed by field name; a struct's ``"_tags"`` entry
holds the tagged fields at its level ({tag: raw bytes}).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from protocol import ApiKey
from protocol.testing import encode_uvarint

FIRST_FLEXIBLE = 0
VALID_VERSIONS = range(2)


@dataclass(frozen=True)
class Field:
    """One field of a schema's ``fields`` list."""

    name: str
    type: str
    versions: int
    nullable: int | None = None
    fields: tuple[Field, ...] = ()


_TOPIC_PARTITIONS = (Field("TopicId", "uuid", 0), Field("Partitions", "[]int32", 0))

REQUEST = (
    Field("GroupId", "string", 0),
    Field("MemberId", "string", 0),
    Field("MemberEpoch", "int32", 0),
    Field("InstanceId", "string", 0, 0),
    Field("RackId", "string", 0, 0),
    Field("RebalanceTimeoutMs", "int32", 0),
    Field("SubscribedTopicNames", "[]string", 0, 0),
    Field("SubscribedTopicRegex", "string", 1, 1),
    Field("ServerAssignor", "string", 0, 0),
    Field("TopicPartitions", "[]TopicPartitions", 0, 0, _TOPIC_PARTITIONS),
)
RESPONSE = (
    Field("ThrottleTimeMs", "int32", 0),
    Field("ErrorCode", "int16", 0),
    Field("ErrorMessage", "string", 0, 0),
    Field("MemberId", "string", 0, 0),
    Field("MemberEpoch", "int32", 0),
    Field("HeartbeatIntervalMs", "int32", 0),
    Field(
        "Assignment",
        "Assignment",
        0,
        0,
        (Field("TopicPartitions", "[]TopicPartitions", 0, fields=_TOPIC_PARTITIONS),),
    ),
)
_SCALARS = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q"}


def _tagged(tags: dict[int, bytes]) -> bytes:
    """A tagged-field section: count, then tag, size and data, tags ascending."""
    out = encode_uvarint(len(tags))
    for tag in sorted(tags):
        out += encode_uvarint(tag) + encode_uvarint(len(tags[tag])) + tags[tag]
    return out


def _value(kind: str, value: Any, children: tuple[Field, ...], version: int) -> bytes:
    """A non-null value of ``kind`` in a flexible version (compact strings and arrays)."""
    if kind in _SCALARS:
        return struct.pack(_SCALARS[kind], value)
    if kind == "uuid":
        return uuid.UUID(str(value)).bytes
    if kind == "string":
        data = value.encode()
        return encode_uvarint(len(data) + 1) + data
    if kind.startswith("[]"):
        items = b"".join(_value(kind[2:], item, children, version) for item in value)
        return encode_uvarint(len(value) + 1) + items
    return encode_struct(children, value, version)  # a struct type


def encode_struct(fields: tuple[Field, ...], values: dict[str, Any], version: int) -> bytes:
    """The fields of ``version`` in order, then the struct's tagged fields."""
    out = b""
    for field in fields:
        if version < field.versions:
            assert field.name not in values, f"{field.name} is not in version {version}"
            continue
        value = values.get(field.name)
        is_struct = bool(field.fields) and not field.type.startswith("[]")
        if value is None:
            assert field.nullable is not None and version >= field.nullable, f"{field.name} is not nullable"
            out += b"\xff" if is_struct else encode_uvarint(0)  # a struct: int8 -1; else length 0
            continue
        if is_struct and field.nullable is not None and version >= field.nullable:
            out += b"\x01"  # a nullable struct that is present
        out += _value(field.type, value, field.fields, version)
    return out + _tagged(values.get("_tags", {}))


def _framed(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def request(
    version: int,
    correlation_id: int,
    body: dict[str, Any],
    *,
    client_id: str | None = "consumer-1",
    header_tags: dict[int, bytes] | None = None,
) -> bytes:
    """A framed request: header v2 (client id with an int16 length, -1 for null, then
    tagged fields) and the body of ``version``."""
    client = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    header = struct.pack(">hhi", ApiKey.CONSUMER_GROUP_HEARTBEAT, version, correlation_id) + client
    return _framed(header + _tagged(header_tags or {}) + encode_struct(REQUEST, body, version))


def response(
    version: int, correlation_id: int, body: dict[str, Any], *, header_tags: dict[int, bytes] | None = None
) -> bytes:
    """A framed answer: header v1 (correlation id, tagged fields) and the body of ``version``."""
    header = struct.pack(">i", correlation_id) + _tagged(header_tags or {})
    return _framed(header + encode_struct(RESPONSE, body, version))
