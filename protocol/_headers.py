"""Request and response headers: parse the few fields the proxy needs, patch ids in place.

Every request header starts with api key (int16), api version (int16) and correlation id
(int32), whatever its version, and every response header starts with the correlation id.
So the correlation id sits at a fixed offset in each frame and can be rewritten in four
bytes. Only the client id and the tagged fields of header v2 need the schema's flexible
versions, which come from :mod:`protocol.schemas`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol._api_key import ApiKey
from protocol._errors import ProtocolError
from protocol._framing import SIZE_PREFIX, BytesLike
from protocol._schemas import is_flexible
from protocol._varint import read_tagged_fields

# Bound once: reading a member off an Enum class costs about 0.25 µs, and these are read per frame.
_CONTROLLED_SHUTDOWN, _API_VERSIONS = ApiKey.CONTROLLED_SHUTDOWN, ApiKey.API_VERSIONS

REQUEST_CORRELATION_OFFSET = SIZE_PREFIX + 4
RESPONSE_CORRELATION_OFFSET = SIZE_PREFIX
MIN_REQUEST_FRAME = SIZE_PREFIX + 8
_REQUEST_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_REQUEST_HEAD_V1 = struct.Struct(">hhih")  # and the client id's length (header v1 and v2)
_SHAPE_KEY_AND_CORRELATION_ID = struct.Struct(">ii")
"""Api key and api version read as one int (a dict key that needs no tuple), and the
correlation id, in one unpack."""
CORRELATION_ID = struct.Struct(">i")
"""A header's correlation id: an int32 at :data:`REQUEST_CORRELATION_OFFSET` of a request
frame and :data:`RESPONSE_CORRELATION_OFFSET` of a response frame. Read and written in
place: a slice and ``int.from_bytes`` cost four times as much. The proxy's hot path packs
ids it knows to be int32s with it directly (a call of the functions below costs 0.1 µs)."""
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_HEADER_VERSIONS: dict[tuple[int, int], int | None] = {}
"""Request header version by (api key, api version), filled as versions are seen: a dict hit
costs a third of asking the schemas again (a tuple's hash and one lookup)."""
_MAX_HEADER_VERSIONS = 4096
MIN_RESPONSE_FRAME = SIZE_PREFIX + 4


class RequestHeader(NamedTuple):
    """The parsed request header; ``body_offset`` is where the body starts in the frame.

    ``body_offset`` is None for an API whose schema is unknown and whose header may carry
    tagged fields: its body cannot be located, but it can still be relayed. A named tuple,
    not a frozen dataclass: one is made per request, and a tuple costs a third as much.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int | None


_new_header = tuple.__new__
"""Builds a RequestHeader from its fields at half the cost of calling the class."""

RequestFields = tuple[int, int, int, int | None]
"""What the relay reads of every request's header: api key, api version, correlation id and
body offset (None where :class:`RequestHeader` has None). A plain tuple, unpacked at once."""


def request_header_version(api_key: int, api_version: int) -> int | None:
    """Request header version 0, 1 or 2 from the API's flexible versions; None if unknown."""
    if api_key == _CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    flexible = is_flexible(api_key, api_version)
    if flexible is None:
        return None
    return 2 if flexible else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header version 0 or 1. ApiVersions always answers with v0 so that a client
    can read the answer before it knows which versions the broker speaks."""
    if api_key == _API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def parse_request_header(frame: BytesLike) -> RequestHeader:
    """Parse the header of a request frame (size prefix included)."""
    end = len(frame)
    if end < 14:  # shorter than a header with a client id: the slow path says what is missing
        return _parse_short_request_header(frame)
    api_key, api_version, correlation_id, length = _REQUEST_HEAD_V1.unpack_from(frame, SIZE_PREFIX)
    if api_key < 0 or api_version < 0:
        raise ProtocolError(f"request header has api key {api_key} and version {api_version}")
    try:
        version = _HEADER_VERSIONS[api_key, api_version]
    except KeyError:
        version = request_header_version(api_key, api_version)
        if len(_HEADER_VERSIONS) < _MAX_HEADER_VERSIONS:  # peers choose the keys: bounded
            _HEADER_VERSIONS[api_key, api_version] = version
    if version == 0:
        return _new_header(RequestHeader, (api_key, api_version, correlation_id, None, 12))
    pos = 14
    client_id = None
    if length >= 0:
        if pos + length > end:
            raise ProtocolError("request header is truncated inside its client id")
        client_id = str(frame[pos : pos + length], "utf-8", "replace")
        pos += length
    elif length != -1:
        raise ProtocolError(f"request header has client id length {length}")
    if version == 2:
        pos = read_tagged_fields(frame, pos)
    elif version is None:
        return _new_header(RequestHeader, (api_key, api_version, correlation_id, client_id, None))
    return _new_header(RequestHeader, (api_key, api_version, correlation_id, client_id, pos))


_HeaderShape = tuple[int, bytes, int, int, int]
"""What repeats between a connection's requests: api key and version as one int, the header
bytes after the correlation id (client id and tagged fields), then api key, api version and
body offset."""
_NO_SHAPE: _HeaderShape = (2**32, b"", 0, 0, 0)
"""Matches no frame: api key and version read as one int32 are never 2**32."""


class RequestHeaderReader:
    """Reads one connection's request headers, remembering the last one's shape.

    A client names itself the same way in every request, so a header repeats byte for byte
    after its correlation id from one request of an API to the next; decoding the client id
    was a quarter of a parse. A frame that repeats the remembered shape gets its fields and
    only its correlation id read; any other frame takes :func:`parse_request_header`.
    It returns :data:`RequestFields`, not a :class:`RequestHeader`: the relay reads these
    four of every request, and building a named tuple and reading its fields cost as much
    as the rest of the read.
    """

    __slots__ = ("_shape",)

    def __init__(self) -> None:
        self._shape = _NO_SHAPE
        """One shape, not one per API: it is kept per connection, and a connection that
        idles for hours keeps it too."""

    def fields(self, frame: bytes | bytearray) -> RequestFields:
        """What :func:`parse_request_header` says of ``frame``, but its client id."""
        try:
            key, correlation_id = _SHAPE_KEY_AND_CORRELATION_ID.unpack_from(frame, SIZE_PREFIX)
        except struct.error:
            header = parse_request_header(frame)  # too short: it says what is missing
            return header.api_key, header.api_version, header.correlation_id, header.body_offset
        shape_key, tail, api_key, api_version, offset = self._shape
        if key == shape_key and frame.startswith(tail, _AFTER_CORRELATION_ID):
            return api_key, api_version, correlation_id, offset
        header = self._learn(frame, key)
        return header.api_key, header.api_version, header.correlation_id, header.body_offset

    def _learn(self, frame: bytes | bytearray, key: int) -> RequestHeader:
        """Parse a frame of another shape, and remember its shape if it is short enough."""
        header = parse_request_header(frame)
        end = header.body_offset
        if end is not None and end - _AFTER_CORRELATION_ID <= _MAX_SHAPE_TAIL:
            tail = bytes(frame[_AFTER_CORRELATION_ID:end])
            shape = (key, tail, header.api_key, header.api_version, end)
            if len(_SHARED_SHAPES) >= _MAX_SHARED_SHAPES:  # peers choose the shapes: bounded
                _SHARED_SHAPES.clear()  # connections keep theirs; sharing starts over
            self._shape = _SHARED_SHAPES.setdefault(shape, shape)
        return header


_AFTER_CORRELATION_ID = REQUEST_CORRELATION_OFFSET + 4
_SHARED_SHAPES: dict[_HeaderShape, _HeaderShape] = {}
"""Every connection's shapes, each kept once: connections of one client software share
their header tail, and an idle connection then holds a reference, not its own copy."""
_MAX_SHARED_SHAPES = 1024
_MAX_SHAPE_TAIL = 256
"""Longest header tail (client id and tagged fields) remembered: a client id can be 32 KiB,
and a peer that sends such ids must not make every connection, or the shared table, hold
copies of them. Such headers are parsed every time; the table then holds at most 1,024
shapes of a few hundred bytes each."""


def _parse_short_request_header(frame: BytesLike) -> RequestHeader:
    end = len(frame)
    if end < MIN_REQUEST_FRAME:
        raise ProtocolError(f"request frame of {end - SIZE_PREFIX} bytes is shorter than a header")
    api_key, api_version, correlation_id = _REQUEST_HEAD.unpack_from(frame, SIZE_PREFIX)
    if api_key < 0 or api_version < 0:
        raise ProtocolError(f"request header has api key {api_key} and version {api_version}")
    if request_header_version(api_key, api_version) == 0:
        return RequestHeader(api_key, api_version, correlation_id, None, 12)
    raise ProtocolError("request header is truncated before its client id")


def response_body_offset(frame: BytesLike, api_key: int, api_version: int) -> int:
    """Where a response's body starts, given the request it answers."""
    if len(frame) < MIN_RESPONSE_FRAME:
        raise ProtocolError("response frame is shorter than a header")
    if response_header_version(api_key, api_version) == 0:
        return MIN_RESPONSE_FRAME
    return read_tagged_fields(frame, MIN_RESPONSE_FRAME)


def request_correlation_id(frame: BytesLike) -> int:
    correlation_id: int = CORRELATION_ID.unpack_from(frame, REQUEST_CORRELATION_OFFSET)[0]
    return correlation_id


def response_correlation_id(frame: BytesLike) -> int:
    try:  # no length test first: every answer is read here
        correlation_id: int = CORRELATION_ID.unpack_from(frame, RESPONSE_CORRELATION_OFFSET)[0]
    except struct.error:
        raise ProtocolError(f"response frame of {len(frame) - SIZE_PREFIX} bytes has no header") from None
    return correlation_id


def patch_request_correlation_id(frame: bytearray, correlation_id: int) -> None:
    """Rewrite a request frame's correlation id in place (OverflowError outside int32)."""
    # Checked first: pack_into can write part of an out-of-range value before it fails.
    if not _INT32_MIN <= correlation_id <= _INT32_MAX:
        raise OverflowError(f"correlation id {correlation_id} is not an int32")
    CORRELATION_ID.pack_into(frame, REQUEST_CORRELATION_OFFSET, correlation_id)


def patch_response_correlation_id(frame: bytearray, correlation_id: int) -> None:
    """Rewrite a response frame's correlation id in place (OverflowError outside int32)."""
    if not _INT32_MIN <= correlation_id <= _INT32_MAX:
        raise OverflowError(f"correlation id {correlation_id} is not an int32")
    CORRELATION_ID.pack_into(frame, RESPONSE_CORRELATION_OFFSET, correlation_id)
