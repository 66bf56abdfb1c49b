"""Incremental decoding of size-prefixed Kafka frames.

The decoder is fed whatever the socket returned and hands back whole frames, each still
carrying its 4-byte size prefix. Keeping the prefix means a frame can be forwarded as is
and its correlation id patched at a fixed offset, with no re-encode.
"""

from __future__ import annotations

import struct

from protocol._errors import FrameSizeError

BytesLike = bytes | bytearray | memoryview

SIZE_PREFIX = 4
_SIZE = struct.Struct(">i")
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024


class FrameDecoder:
    """Turns a byte stream into frames; sans-IO, one instance per direction of a connection.

    Memory is bounded by ``max_frame_size`` plus one receive: an announced size above the
    maximum (or below zero) is rejected as soon as its 4 bytes arrive, before any body is
    buffered.
    """

    __slots__ = ("_buf", "_pos", "max_frame_size", "peer")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, peer: str | None = None) -> None:
        self.max_frame_size = max_frame_size
        self.peer = peer
        self._buf = bytearray()
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buf) - self._pos

    def feed(self, data: BytesLike) -> list[bytearray]:
        """Add received bytes; return every frame they complete, oldest first.

        Raises :class:`FrameSizeError` for a negative or oversized size prefix; the
        decoder is then unusable and the connection should be closed.
        """
        buf = self._buf
        if not buf and len(data) >= SIZE_PREFIX:
            # Nothing buffered and the chunk is exactly one frame (the usual receive at one
            # request in flight): one copy, no slices.
            (size,) = _SIZE.unpack_from(data)
            if size + SIZE_PREFIX == len(data) and size <= self.max_frame_size:
                return [bytearray(data)]
        buf += data
        frames: list[bytearray] = []
        pos = self._pos
        end = len(buf)
        max_size = self.max_frame_size
        while end - pos >= SIZE_PREFIX:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > max_size:
                raise FrameSizeError(size, max_size, peer=self.peer)
            stop = pos + SIZE_PREFIX + size
            if stop > end:
                break
            if pos == 0 and stop == end:  # the buffer is exactly one frame: hand it over uncopied
                self._buf = bytearray()
                self._pos = 0
                frames.append(buf)
                return frames
            frames.append(buf[pos:stop])
            pos = stop
        if pos == end:
            buf.clear()
            pos = 0
        elif pos > 65536 and pos * 2 > end:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return frames

    def pending_frame_size(self) -> int | None:
        """The announced size of the incomplete frame at the head, if its prefix has arrived."""
        if self.buffered < SIZE_PREFIX:
            return None
        return int.from_bytes(self._buf[self._pos : self._pos + SIZE_PREFIX], "big", signed=True)


def frame(payload: BytesLike) -> bytes:
    """Prefix ``payload`` (header + body) with its size."""
    view = memoryview(payload)
    return len(view).to_bytes(SIZE_PREFIX, "big", signed=True) + bytes(view)
