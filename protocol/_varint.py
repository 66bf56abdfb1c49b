"""Bounded readers for the unsigned varints and tagged fields of flexible versions.

Each read checks the buffer end and the varint length, so a hostile frame can neither
read past its end nor make the parser loop or allocate on a huge announced length.
"""

from __future__ import annotations

from protocol._errors import ProtocolError

BytesLike = bytes | bytearray | memoryview

MAX_VARINT_BYTES = 5


def read_uvarint(buf: BytesLike, pos: int) -> tuple[int, int]:
    """Read an unsigned 32-bit varint at ``pos``; return (value, next position)."""
    value = 0
    shift = 0
    end = len(buf)
    for i in range(MAX_VARINT_BYTES):
        if pos + i >= end:
            raise ProtocolError("truncated varint")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > 0xFFFFFFFF:
                raise ProtocolError("varint overflows 32 bits")
            return value, pos + i + 1
        shift += 7
    raise ProtocolError("varint longer than 5 bytes")


def read_tagged_fields(buf: BytesLike, pos: int) -> int:
    """Skip a tagged-field section at ``pos``; return the position after it."""
    count, pos = read_uvarint(buf, pos)
    end = len(buf)
    if count > end - pos:
        raise ProtocolError(f"{count} tagged fields cannot fit in the frame")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > end:
            raise ProtocolError("tagged field runs past the end of the frame")
    return pos


def read_compact_string(buf: BytesLike, pos: int) -> tuple[str | None, int]:
    """Read a compact nullable string at ``pos`` (its length plus one as a varint, 0 for
    null); return (text, next position). Bytes that are not UTF-8 are replaced, not raised."""
    length_plus_one, pos = read_uvarint(buf, pos)
    if length_plus_one == 0:
        return None, pos
    end = pos + length_plus_one - 1
    if end > len(buf):
        raise ProtocolError("compact string runs past the end of the frame")
    return bytes(buf[pos:end]).decode("utf-8", "replace"), end
