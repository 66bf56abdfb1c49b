"""Facts about a request that decide how the proxy treats it.

``produce_acks`` is on the hot path (every Produce), so it reads the two bytes by hand.
The rest decodes the body with kafka-python and is called only when a request has to be
re-sent or its response is overdue, which is rare.
"""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatch

from .errors import ProtocolError
from .framing import BytesLike
from .headers import RequestHeader
from .schemas import request_class
from .varint import read_uvarint

PRODUCE_KEY = 0
FETCH_KEY = 1
NO_PRODUCER_ID = -1
_RECORD_BATCH_MAGIC_OFFSET = 16
_RECORD_BATCH_HEADER_SIZE = DefaultRecordBatch.HEADER_STRUCT.size


def produce_acks(frame: BytesLike, header: RequestHeader) -> int:
    """The acks field of a Produce request, read without decoding the body.

    From v3 the body starts with transactional_id: a nullable int16-length string up to
    v8, a compact nullable string (varint length + 1) from v9.
    """
    pos = header.body_offset
    if pos is None:
        raise ProtocolError("Produce request body cannot be located")
    end = len(frame)
    version = header.api_version
    if version >= 9:
        length_plus_one, pos = read_uvarint(frame, pos)
        if length_plus_one:
            pos += length_plus_one - 1
    elif version >= 3:
        if pos + 2 > end:
            raise ProtocolError("Produce request truncated in transactional_id")
        length = int.from_bytes(frame[pos : pos + 2], "big", signed=True)
        pos += 2 + max(length, 0)
    if pos + 2 > end:
        raise ProtocolError("Produce request truncated before acks")
    return int.from_bytes(frame[pos : pos + 2], "big", signed=True)


def expects_response(frame: BytesLike, header: RequestHeader) -> bool:
    """False only for Produce with acks=0: the one request a broker must not answer."""
    return header.api_key != PRODUCE_KEY or produce_acks(frame, header) != 0


def _decode_body(frame: BytesLike, header: RequestHeader) -> object | None:
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
    saw_batch = False
    for topic in request.topic_data or ():  # a null array decodes as None
        for partition in topic.partition_data or ():
            records = partition.records
            if not records:
                continue
            data = bytes(records)
            if len(data) < _RECORD_BATCH_HEADER_SIZE or data[_RECORD_BATCH_MAGIC_OFFSET] != 2:
                return False
            if DefaultRecordBatch(data).producer_id == NO_PRODUCER_ID:
                return False
            saw_batch = True
    return saw_batch


def fetch_max_wait_ms(frame: BytesLike, header: RequestHeader) -> int:
    """How long the broker may hold this Fetch before answering (0 if unreadable)."""
    request = _decode_body(frame, header)
    return max(int(getattr(request, "max_wait_ms", 0) or 0), 0)


def sasl_mechanism(frame: BytesLike, header: RequestHeader) -> str | None:
    """The mechanism a SaslHandshake request names (None if unreadable)."""
    request = _decode_body(frame, header)
    mechanism = getattr(request, "mechanism", None)
    return mechanism if isinstance(mechanism, str) else None
