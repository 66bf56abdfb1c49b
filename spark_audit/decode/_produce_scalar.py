"""Produce request bodies walked by hand, one frame at a time (the scalar path): the one
body the audit does not decode with kafka-python.

Why: Produce requests are most of a busy capture, and the duplicate and sequence checks
need only where each record batch sits and its fixed-offset v2 header (producer id and
epoch, base sequence, record count, CRC, first timestamp, length). kafka-python builds every object and copies
every record set, at a few thousand frames a second per core; this walk only reads
lengths. It covers Produce v0 to v13 (transactional id from v3, flexible from v9, topic ids
from v13). Anything it does not expect (a pre-v2 message set, a cut batch, trailing bytes,
a length out of range) returns None, and the caller decodes the frame with kafka-python
as before, so odd frames get exactly the old facts.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from protocol import (
    PRODUCE_FIRST_FLEXIBLE,
    PRODUCE_FIRST_TOPIC_ID,
    PRODUCE_FIRST_TRANSACTIONAL_ID,
    RECORD_BATCH_HEADER,
    RECORD_BATCH_HEADER_SIZE,
    RECORD_BATCH_LOG_OVERHEAD,
    RECORD_BATCH_MAGIC_OFFSET,
    ProtocolError,
)
from protocol import read_tagged_fields as _tags
from protocol import read_uvarint as _uvarint

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _Odd(Exception):
    """Not a body this walk reads: fall back to kafka-python."""


def _size(buf: bytes, pos: int, flexible: bool, wide: bool) -> tuple[int, int]:
    """A length (or count): compact (+1) when flexible, else int16 or int32 (``wide``)."""
    if flexible:
        value, pos = _uvarint(buf, pos)
        return value - 1, pos
    if wide:
        return _INT32.unpack_from(buf, pos)[0], pos + 4
    return _INT16.unpack_from(buf, pos)[0], pos + 2


def _string(buf: bytes, pos: int, flexible: bool) -> tuple[str | None, int]:
    size, pos = _size(buf, pos, flexible, False)
    if size < 0:
        if size == -1:
            return None, pos
        raise _Odd
    if pos + size > len(buf):
        raise _Odd
    return buf[pos : pos + size].decode("utf-8"), pos + size


def _batches(buf: bytes, pos: int, end: int, common: dict[str, Any], facts: list[dict[str, Any]]) -> None:
    while pos < end:
        if end - pos < RECORD_BATCH_HEADER_SIZE or buf[pos + RECORD_BATCH_MAGIC_OFFSET] != 2:
            raise _Odd  # a cut batch, or a pre-v2 message set: kafka-python reads those
        _, length, _, _, crc, _, _, first_timestamp, _, producer_id, epoch, base_sequence, count = (
            RECORD_BATCH_HEADER.unpack_from(buf, pos)
        )
        size = RECORD_BATCH_LOG_OVERHEAD + length
        if size < RECORD_BATCH_HEADER_SIZE or pos + size > end:
            raise _Odd
        facts.append(
            {
                **common,
                "crc": crc,
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "base_sequence": base_sequence,
                "record_count": count,
                "first_timestamp": first_timestamp,
                "batch_length": length,
            }
        )
        pos += size


def produce_batch_facts(frame: bytes, body_offset: int, api_version: int) -> list[dict[str, Any]] | None:
    """``produce_batch`` facts of a Produce request whose body starts at ``body_offset``, as
    :func:`spark_audit.decode.decode` gives them; None when kafka-python must decode it."""
    flexible = api_version >= PRODUCE_FIRST_FLEXIBLE
    buf, end = frame, len(frame)
    facts: list[dict[str, Any]] = []
    try:
        pos = body_offset
        transactional_id = None
        if api_version >= PRODUCE_FIRST_TRANSACTIONAL_ID:
            transactional_id, pos = _string(buf, pos, flexible)
        acks = _INT16.unpack_from(buf, pos)[0]
        pos += 6  # acks, timeout
        topics, pos = _size(buf, pos, flexible, True)
        if topics < -1:
            raise _Odd
        for _ in range(max(topics, 0)):
            if api_version >= PRODUCE_FIRST_TOPIC_ID:
                if pos + 16 > end:
                    raise _Odd
                topic: str | None = str(uuid.UUID(bytes=bytes(buf[pos : pos + 16])))
                pos += 16
            else:
                topic, pos = _string(buf, pos, flexible)
                topic = topic or None
            partitions, pos = _size(buf, pos, flexible, True)
            if partitions < -1:
                raise _Odd
            for _ in range(max(partitions, 0)):
                index = _INT32.unpack_from(buf, pos)[0]
                size, pos = _size(buf, pos + 4, flexible, True)
                if size < -1 or pos + size > end:
                    raise _Odd
                if size > 0:
                    common = {
                        "fact": "produce_batch",
                        "topic": topic,
                        "partition": index,
                        "acks": acks,
                        "transactional_id": transactional_id,
                    }
                    _batches(buf, pos, pos + size, common, facts)
                    pos += size
                if flexible:
                    pos = _tags(buf, pos)
            if flexible:
                pos = _tags(buf, pos)
        if flexible:
            pos = _tags(buf, pos)
        if pos != end:
            raise _Odd
    except (_Odd, ProtocolError, IndexError, struct.error, UnicodeDecodeError, ValueError):
        return None
    return facts
