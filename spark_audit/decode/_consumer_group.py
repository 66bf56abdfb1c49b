"""ConsumerGroupHeartbeat (api key 68), KIP-848's consumer group protocol, read by hand:
kafka-python has no class for it, and the rebalance check needs only the fields each body
opens with.

Every member of a group on the new protocol (``group.protocol=consumer``, GA in Kafka 4.0)
sends these instead of JoinGroup, SyncGroup and Heartbeat. The request names the group,
the member and the member epoch it is at (0 to join, -1 to leave, -2 to leave as a static
member); the answer the member epoch the coordinator hands out (a new one at each step of
a rebalance, the same one at rest) and an error code. Versions 0 and 1, flexible from 0
(compact strings, request header v2, response header v1); both versions start with the
same fields.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol import ProtocolError, read_compact_string, read_tagged_fields

Fact = dict[str, Any]

HIGHEST_VERSION = 1
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ERROR_AT = 4  # after ThrottleTimeMs
_CLIENT_ID_AT = 12  # size, api key, version, correlation id
_BODY_AT = 8  # size, correlation id


def _int32(frame: bytes, pos: int) -> int:
    if pos + 4 > len(frame):
        raise ProtocolError("an int32 runs past the end of the frame")
    value: int = _INT32.unpack_from(frame, pos)[0]
    return value


def heartbeat_request(frame: bytes) -> list[Fact]:
    """The ``group`` fact of a request: group, member and the member epoch it sent
    (``generation_id``)."""
    if len(frame) < _CLIENT_ID_AT + 2:
        raise ProtocolError("request frame is shorter than its header")
    client_id_length: int = _INT16.unpack_from(frame, _CLIENT_ID_AT)[0]
    pos = read_tagged_fields(frame, _CLIENT_ID_AT + 2 + max(client_id_length, 0))
    group, pos = read_compact_string(frame, pos)
    member, pos = read_compact_string(frame, pos)
    epoch = _int32(frame, pos)
    return [{"fact": "group", "group_id": group, "member_id": member, "generation_id": epoch}]


def heartbeat_answer(frame: bytes) -> list[Fact]:
    """The ``generation`` fact of an answer: the member epoch it handed out
    (``generation_id``), the member id when it names one, and the error code; with an
    ``error`` fact when the code is not 0."""
    body = read_tagged_fields(frame, _BODY_AT)
    if body + _ERROR_AT + 2 > len(frame):
        raise ProtocolError("answer is shorter than its error code")
    error_code: int = _INT16.unpack_from(frame, body + _ERROR_AT)[0]
    _message, pos = read_compact_string(frame, body + _ERROR_AT + 2)
    member, pos = read_compact_string(frame, pos)
    epoch = _int32(frame, pos)
    facts: list[Fact] = [
        {"fact": "generation", "generation_id": epoch, "member_id": member, "error_code": error_code}
    ]
    if error_code:
        facts.append({"fact": "error", "error_code": error_code})
    return facts
