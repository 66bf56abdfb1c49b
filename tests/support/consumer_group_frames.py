"""ConsumerGroupHeartbeat (api key 68, KIP-848's consumer group protocol) frames, encoded
by hand: kafka-python has no class for it. Laid out as Apache Kafka's
ConsumerGroupHeartbeatRequest and ConsumerGroupHeartbeatResponse schemas say (versions 0
and 1, flexible from 0: compact strings and arrays, tagged fields, request header v2 and
response header v1)."""

from __future__ import annotations

import struct
import uuid

from protocol import ApiKey
from protocol.testing import encode_uvarint

NO_TAGS = b"\x00"


def _string(value: str | None) -> bytes:
    """A compact (nullable) string: length + 1 as an unsigned varint, 0 for null."""
    if value is None:
        return encode_uvarint(0)
    data = value.encode()
    return encode_uvarint(len(data) + 1) + data


def _topic_partitions(assigned: dict[uuid.UUID, list[int]] | None) -> bytes:
    """A compact nullable array of (topic id, compact array of int32 partitions)."""
    if assigned is None:
        return encode_uvarint(0)
    out = encode_uvarint(len(assigned) + 1)
    for topic_id, partitions in assigned.items():
        out += topic_id.bytes + encode_uvarint(len(partitions) + 1)
        out += b"".join(struct.pack(">i", p) for p in partitions) + NO_TAGS
    return out


def _framed(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def heartbeat_request(
    cid: int,
    group: str,
    member: str,
    epoch: int,
    *,
    version: int = 1,
    owned: dict[uuid.UUID, list[int]] | None = None,
    topics: list[str] | None = None,
    client_id: str = "consumer-1",
) -> bytes:
    """A ConsumerGroupHeartbeat request: member ``epoch`` 0 joins, -1 leaves, -2 leaves
    as a static member; ``topics`` the subscription, ``owned`` the partitions it owns."""
    client = client_id.encode()
    header = struct.pack(">hhih", ApiKey.CONSUMER_GROUP_HEARTBEAT, version, cid, len(client)) + client
    body = _string(group) + _string(member) + struct.pack(">i", epoch)
    body += _string(None) + _string(None) + struct.pack(">i", 45_000)  # instance id, rack, timeout
    if topics is None:
        body += encode_uvarint(0)
    else:
        body += encode_uvarint(len(topics) + 1) + b"".join(_string(t) for t in topics)
    if version >= 1:
        body += _string(None)  # the subscribed topic regex
    body += _string(None) + _topic_partitions(owned) + NO_TAGS  # server assignor
    return _framed(header + NO_TAGS + body)


def heartbeat_answer(
    cid: int,
    epoch: int,
    *,
    error_code: int = 0,
    member: str | None = None,
    assignment: dict[uuid.UUID, list[int]] | None = None,
) -> bytes:
    """A ConsumerGroupHeartbeat answer handing out member ``epoch``, with ``assignment``
    (null: no new one)."""
    body = struct.pack(">ih", 0, error_code) + _string(None) + _string(member)
    body += struct.pack(">ii", epoch, 5000)
    if assignment is None:
        body += b"\xff"
    else:
        body += b"\x01" + _topic_partitions(assignment) + NO_TAGS
    return _framed(struct.pack(">i", cid) + NO_TAGS + body + NO_TAGS)
