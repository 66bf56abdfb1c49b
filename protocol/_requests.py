"""Facts about a request that decide how the proxy treats it.

``produce_acks`` is on the hot path (every Produce), so it reads the two bytes by hand.
The rest decodes the body with kafka-python and is called only when a request has to be
re-sent or its response is overdue, which is rare.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import TYPE_CHECKING

from protocol._api_key import ApiKey
from protocol._errors import ProtocolError
from protocol._framing import BytesLike
from protocol._headers import RequestHeader
from protocol._produce_layout import (
    NO_PRODUCER_ID,
    PRODUCE_FIRST_FLEXIBLE,
    PRODUCE_FIRST_TRANSACTIONAL_ID,
    RECORD_BATCH_HEADER_SIZE,
    RECORD_BATCH_MAGIC_OFFSET,
)
from protocol._schemas import request_class
from protocol._varint import read_uvarint

if TYPE_CHECKING:  # kafka-python loads only when a body is decoded or a schema read
    from kafka.protocol.api_message import ApiMessage

# Bound once: reading a member off an Enum class costs about 0.25 µs, and these are read per frame.
_PRODUCE, _FETCH = ApiKey.PRODUCE, ApiKey.FETCH
_INT16 = struct.Struct(">h")
_LENGTH_AND_ACKS = struct.Struct(">hh")
"""A Produce v3-v8 body's transactional_id length, then acks if that id is null."""
_NULL_LENGTH = -1


def produce_acks(frame: BytesLike, header: RequestHeader) -> int:
    """The acks field of a Produce request, read without decoding the body."""
    return produce_acks_at(frame, header.api_version, header.body_offset)


def produce_acks_at(frame: BytesLike, version: int, pos: int | None) -> int:
    """:func:`produce_acks` from the header's version and body offset (the relay's fields).

    From v3 the body starts with transactional_id: a nullable int16-length string up to
    v8, a compact nullable string (varint length + 1) from v9. A producer outside a
    transaction sends it null (length -1), so v3 to v8 first try one unpack of that length
    and acks together.
    """
    if pos is None:
        raise ProtocolError("Produce request body cannot be located")
    if PRODUCE_FIRST_TRANSACTIONAL_ID <= version < PRODUCE_FIRST_FLEXIBLE:
        try:
            length, acks = _LENGTH_AND_ACKS.unpack_from(frame, pos)
        except struct.error:
            pass  # truncated: the walk below says where
        else:
            if length == _NULL_LENGTH:
                return acks
    return _walk_to_acks(frame, pos, version)


def _walk_to_acks(frame: BytesLike, pos: int, version: int) -> int:
    """Skip transactional_id, whatever its version and length, and read acks."""
    end = len(frame)
    if version >= PRODUCE_FIRST_FLEXIBLE:
        length_plus_one, pos = read_uvarint(frame, pos)
        if length_plus_one:
            pos += length_plus_one - 1
    elif version >= PRODUCE_FIRST_TRANSACTIONAL_ID:
        if pos + 2 > end:
            raise ProtocolError("Produce request truncated in transactional_id")
        (length,) = _INT16.unpack_from(frame, pos)
        pos += 2 + max(length, 0)
    if pos + 2 > end:
        raise ProtocolError("Produce request truncated before acks")
    acks: int = _INT16.unpack_from(frame, pos)[0]  # no slice: one unpack off the frame
    return acks


def expects_response(frame: BytesLike, header: RequestHeader) -> bool:
    """False only for Produce with acks=0: the one request a broker must not answer."""
    return header.api_key != _PRODUCE or produce_acks(frame, header) != 0


def _decode_body(frame: BytesLike, header: RequestHeader) -> ApiMessage | None:
    cls = request_class(header.api_key)
    if cls is None or header.body_offset is None or header.api_version > cls.max_version:
        return None
    try:
        return cls.decode(bytes(frame[header.body_offset :]), version=header.api_version)
    except Exception:  # kafka-python raises assorted errors on malformed bodies
        return None


def produce_is_idempotent(frame: BytesLike, header: RequestHeader) -> bool:
    """True when re-sending this Produce cannot append records twice.

    That holds when it is transactional, or when every record batch carries a producer
    id (the broker then de-duplicates by producer id, epoch and sequence). Anything that
    cannot be decoded counts as not idempotent.
    """
    request = _decode_body(frame, header)
    if request is None:
        return False
    if getattr(request, "transactional_id", None):
        return True
    from kafka.record.default_records import DefaultRecordBatch  # loaded with the decode above

    saw_batch = False
    for topic in request.topic_data or ():  # a null array decodes as None
        for partition in topic.partition_data or ():
            records = partition.records
            if not records:
                continue
            data = bytes(records)
            if len(data) < RECORD_BATCH_HEADER_SIZE or data[RECORD_BATCH_MAGIC_OFFSET] != 2:
                return False
            if DefaultRecordBatch(data).producer_id == NO_PRODUCER_ID:
                return False
            saw_batch = True
    return saw_batch


def join_group_rebalance_timeout_ms(frame: BytesLike, header: RequestHeader) -> int:
    """How long the group coordinator may hold this JoinGroup before it answers (0 if
    unreadable): until every member has rejoined, at most the rebalance timeout it carries
    (from v1; v0's session timeout served as both). The Java consumer waits that long plus
    5 s for the answer, and its rebalance timeout is ``max.poll.interval.ms``, which
    applications raise to minutes or more. Asked once per JoinGroup, so kafka-python decodes it.
    """
    request = _decode_body(frame, header)
    if request is None:
        return 0
    timeout = request.rebalance_timeout_ms if header.api_version >= 1 else request.session_timeout_ms
    return max(int(timeout), 0)


def fetch_max_wait_ms(frame: BytesLike, header: RequestHeader) -> int:
    """How long the broker may hold this Fetch before answering (0 if unreadable).

    Every Fetch asks this, so it reads four bytes at the offset the schema gives for the
    version rather than decoding the body.
    """
    offset = fixed_field_offset(_FETCH, header.api_version, "MaxWaitMs")
    if offset is None or header.body_offset is None:
        return 0
    pos = header.body_offset + offset
    if pos + 4 > len(frame):
        return 0
    return max(int.from_bytes(frame[pos : pos + 4], "big", signed=True), 0)


_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "int64": 8,
    "float64": 8,
    "uuid": 16,
}


@cache
def fixed_field_offset(api_key: int, api_version: int, name: str) -> int | None:
    """Where a top-level request field starts in the body, from the JSON schema, if only
    fixed-size fields come before it in this version (tagged fields are not in line)."""
    from kafka.protocol.schemas import BaseField  # once per key, version and name (cached)

    cls = request_class(api_key)
    if cls is None or api_version > cls.max_version:
        return None
    offset = 0
    for field in cls.json["fields"]:
        low, high = BaseField.parse_versions(field["versions"])
        if not low <= api_version <= high:
            continue
        if "taggedVersions" in field:
            tag_low, tag_high = BaseField.parse_versions(field["taggedVersions"])
            if tag_low <= api_version <= tag_high:
                continue
        if field["name"] == name:
            return offset
        size = _FIXED_SIZES.get(field["type"])
        if size is None:
            return None
        offset += size
    return None


def sasl_mechanism(frame: BytesLike, header: RequestHeader) -> str | None:
    """The mechanism a SaslHandshake request names (None if unreadable)."""
    request = _decode_body(frame, header)
    mechanism = getattr(request, "mechanism", None)
    return mechanism if isinstance(mechanism, str) else None
