"""Whether bytes can be the start of a request a Kafka client sent.

A capture that starts in the middle of a connection, or loses the bytes of a size prefix,
has to find the next frame start by looking. This module says whether a request header
could be one: every check is a rule of the protocol, and every api key and version Kafka
ever defined passes (:func:`every_request_schema`), from the 0.8-era inter-broker keys and
Produce v0 on. It proves nothing by itself; the importer proves a frame by decoding its
body and checking where the next one starts.
"""

from __future__ import annotations

import re
import struct

from protocol._api_key import ApiKey
from protocol._errors import ProtocolError
from protocol._framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, BytesLike
from protocol._schemas import every_request_schema
from protocol._varint import read_tagged_fields

HEADER_NEEDS_MORE = 0
"""Returned when the bytes end before the header is decided."""
HEADER_IMPLAUSIBLE = -1
"""Returned when no Kafka client could have sent these bytes as a request header."""
MIN_REQUEST_SIZE = 8  # api key, version, correlation id
MAX_CLIENT_ID = 1024  # longer client ids are taken for noise

_HEAD = struct.Struct(">ihhi")  # size, api key, api version, correlation id
_CLIENT_ID_AT = SIZE_PREFIX + 8
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_CONTROLLED_SHUTDOWN = ApiKey.CONTROLLED_SHUTDOWN


def request_header_end(buf: BytesLike, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> int:
    """Where the body starts (counted from the size prefix) if ``buf`` starts a plausible request.

    Plausible means: a size from a bare header up to ``max_frame_size``; an api key Kafka
    defines, at a version it ever defined; a correlation id of at least 0; for header v1
    and v2 a client id that is null or printable text of at most ``MAX_CLIENT_ID`` bytes
    inside the frame; for header v2 tagged fields inside the frame. :data:`HEADER_IMPLAUSIBLE` if
    any check fails, :data:`HEADER_NEEDS_MORE` if ``buf`` ends before every check could run.
    """
    n = len(buf)
    if n < SIZE_PREFIX + MIN_REQUEST_SIZE:
        return _prefix_plausibility(buf, max_frame_size)
    size, api_key, api_version, correlation_id = _HEAD.unpack_from(buf)
    schema = every_request_schema().get(api_key)
    if not MIN_REQUEST_SIZE <= size <= max_frame_size or schema is None or correlation_id < 0:
        return HEADER_IMPLAUSIBLE
    low, high = schema.valid_versions
    if not low <= api_version <= high:
        return HEADER_IMPLAUSIBLE
    if api_key == _CONTROLLED_SHUTDOWN and api_version == 0:
        return _CLIENT_ID_AT  # header v0: no client id
    end = SIZE_PREFIX + size
    if end < _CLIENT_ID_AT + 2:
        return HEADER_IMPLAUSIBLE
    if n < _CLIENT_ID_AT + 2:
        return HEADER_NEEDS_MORE
    length = int.from_bytes(buf[_CLIENT_ID_AT : _CLIENT_ID_AT + 2], "big", signed=True)
    pos = _CLIENT_ID_AT + 2
    if length < -1 or length > MAX_CLIENT_ID or pos + max(length, 0) > end:
        return HEADER_IMPLAUSIBLE
    if length > 0:
        text = bytes(buf[pos : pos + length])
        if _CONTROL.search(text):
            return HEADER_IMPLAUSIBLE
        if len(text) < length:
            return HEADER_NEEDS_MORE
        try:
            if not text.decode("utf-8").isprintable():
                return HEADER_IMPLAUSIBLE
        except UnicodeDecodeError:
            return HEADER_IMPLAUSIBLE
        pos += length
    if not schema.is_flexible(api_version):
        return pos
    with memoryview(buf) as view:
        try:
            return read_tagged_fields(view[: min(n, end)], pos)
        except ProtocolError:
            return HEADER_NEEDS_MORE if n < end else HEADER_IMPLAUSIBLE


def _prefix_plausibility(buf: BytesLike, max_frame_size: int) -> int:
    """The checks the first few bytes of a header allow: size, then api key, then version."""
    n = len(buf)
    if n >= SIZE_PREFIX:
        size = int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True)
        if not MIN_REQUEST_SIZE <= size <= max_frame_size:
            return HEADER_IMPLAUSIBLE
    if n >= SIZE_PREFIX + 2:
        schema = every_request_schema().get(int.from_bytes(buf[4:6], "big", signed=True))
        if schema is None:
            return HEADER_IMPLAUSIBLE
        if n >= SIZE_PREFIX + 4:
            low, high = schema.valid_versions
            if not low <= int.from_bytes(buf[6:8], "big", signed=True) <= high:
                return HEADER_IMPLAUSIBLE
    return HEADER_NEEDS_MORE
