"""Incremental decoding of size-prefixed Kafka frames.

The decoder is fed whatever the socket returned and hands back whole frames, each still
carrying its 4-byte size prefix. Keeping the prefix means a frame can be forwarded as is
and its correlation id patched at a fixed offset, with no re-encode.

A big frame need not pass through a receive buffer at all: the decoder can offer the frame's
own buffer as the place the next receive lands (:meth:`FrameDecoder.receive_target`), so a
shell that receives into it first copies none of the frame's bytes in Python.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from protocol._errors import FrameSizeError

BytesLike = bytes | bytearray | memoryview

SIZE_PREFIX = 4
_SIZE = struct.Struct(">i")
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024
BIG_FRAME = 128 * 1024
"""Frames from this size (prefix included) are received straight into a buffer of their own:
zeroing it costs less than copying the frame out of a receive buffer."""
ADOPT_SHARE = 8
"""A big frame gets its own buffer once 1/ADOPT_SHARE of it has arrived, not on its prefix
alone: a peer cannot make the proxy commit more than this many times what it sent."""


class FrameDecoder:
    """Turns a byte stream into frames; sans-IO, one instance per direction of a connection.

    Memory is bounded by ``max_frame_size`` plus one receive: an announced size above the
    maximum (or below zero) is rejected as soon as its 4 bytes arrive, before any body is
    buffered.

    Big frames (``BIG_FRAME``) are assembled in a buffer of their own, which
    :meth:`receive_target` offers to the shell. After a big frame, the next frame is guessed
    to be as big, and the target is a buffer of that size (a fresh one, or one the shell's
    ``allocate`` reuses): a stream of similar big frames (produce batches, fetch answers) then
    arrives with no copy at all. A wrong guess costs that buffer once, and the guess is dropped.
    """

    __slots__ = ("_buf", "_filled", "_frame", "_guess", "_pos", "big", "max_frame_size", "peer")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, peer: str | None = None) -> None:
        self.max_frame_size = max_frame_size
        self.peer = peer
        self._buf = bytearray()
        self._pos = 0
        self._frame: bytearray | None = None  # a big frame's own buffer, being filled
        self._filled = 0  # its bytes received
        self._guess = 0  # the size of the last big frame, while the next is expected as big
        self.big = False
        """Whether :meth:`receive_target` has a buffer to offer: one attribute for the shell
        to read per receive, as almost every frame is small."""

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buf) - self._pos + (self._filled if self._frame is not None else 0)

    def receive_target(self, allocate: Callable[[int], bytearray] = bytearray) -> memoryview | None:
        """Where the next receive should land first, if anywhere: the unfilled rest of a big
        frame's buffer. Bytes received into it are reported with ``feed(rest, filled=n)``.

        ``allocate`` makes the buffer for a guessed frame; it may return one with old content,
        as only bytes received into it are ever read."""
        frame = self._frame
        if frame is None:
            if not self._guess or len(self._buf) > self._pos:
                return None
            frame = self._frame = allocate(self._guess)  # the next frame, if it is as big
            self._filled = 0
        return memoryview(frame)[self._filled :]

    def release_target(self) -> bytearray | None:
        """Let go of a guessed buffer nothing was received into, and return it (the guess
        stays): a receive that found nothing to read must not leave an idle connection
        holding a frame-sized buffer."""
        frame = self._frame
        if frame is None or self._filled:
            return None
        self._frame = None
        return frame

    def feed(self, data: BytesLike, filled: int = 0) -> list[bytearray]:
        """Add received bytes; return every frame they complete, oldest first. ``filled``
        bytes were received into :meth:`receive_target`'s view, before ``data``.

        Raises :class:`FrameSizeError` for a negative or oversized size prefix, with the
        frames completed before it (its ``frames``); the decoder is then unusable and the
        connection should be closed.
        """
        if filled or self._frame is not None:
            return self._feed_target(filled, data)
        buf = self._buf
        if not buf and len(data) >= SIZE_PREFIX:
            # Nothing buffered and the chunk is exactly one frame (the usual receive at one
            # request in flight): one copy, no slices.
            (size,) = _SIZE.unpack_from(data)
            if size + SIZE_PREFIX == len(data) and size <= self.max_frame_size:
                if len(data) >= BIG_FRAME:
                    self._guess, self.big = len(data), True  # the next may come as big
                return [bytearray(data)]
        buf += data
        frames: list[bytearray] = []
        pos = self._pos
        end = len(buf)
        max_size = self.max_frame_size
        while end - pos >= SIZE_PREFIX:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > max_size:
                raise FrameSizeError(size, max_size, peer=self.peer, frames=frames)
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
        elif end - pos >= SIZE_PREFIX and self._adopt(buf, pos, end):
            return frames
        elif pos > 65536 and pos * 2 > end:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return frames

    def _adopt(self, buf: bytearray, pos: int, end: int) -> bool:
        """Move an incomplete big frame at ``pos`` into a buffer of its own, so that the rest of
        it is received there; whether it was. Its size was checked by the caller."""
        (size,) = _SIZE.unpack_from(buf, pos)
        size += SIZE_PREFIX
        have = end - pos
        if size < BIG_FRAME or size > ADOPT_SHARE * have:
            return False
        frame = bytearray(size)
        frame[:have] = memoryview(buf)[pos:end]
        buf.clear()
        self._pos = 0
        self._frame, self._filled, self.big = frame, have, True
        return True

    def _feed_target(self, filled: int, data: BytesLike) -> list[bytearray]:
        """``filled`` bytes landed in the big frame's buffer, then ``data`` in the shell's."""
        frame = self._frame
        if frame is None:
            raise ValueError("feed(filled=...) without a receive_target() to fill")
        before = self._filled
        if not filled:  # a caller that does not receive into the target: its bytes are copied there
            filled = min(len(data), len(frame) - before)
            frame[before : before + filled] = memoryview(data)[:filled]
            data = memoryview(data)[filled:]
        self._filled = now = before + filled
        if before < SIZE_PREFIX <= now:
            (size,) = _SIZE.unpack_from(frame)
            if size < 0 or size > self.max_frame_size:
                raise FrameSizeError(size, self.max_frame_size, peer=self.peer)
            if size + SIZE_PREFIX != len(frame):
                # A guess, and wrong: the bytes go the ordinary way (in a new buffer if big).
                self._frame, self._guess, self.big = None, 0, False
                frames = self.feed(memoryview(frame)[:now])
                return self._then(frames, data) if data else frames
        if now < len(frame):
            if data:
                raise ValueError("bytes after a big frame's buffer that was not filled")
            return []
        self._frame = None
        self._guess = now
        self.big = True
        frames = [frame]
        return self._then(frames, data) if data else frames

    def _then(self, frames: list[bytearray], data: BytesLike) -> list[bytearray]:
        """``frames``, then the frames ``data`` completes; a size error in ``data`` carries
        ``frames`` too, before its own."""
        try:
            return frames + self.feed(data)
        except FrameSizeError as exc:
            exc.frames = frames + exc.frames
            raise

    def pending_frame_size(self) -> int | None:
        """The announced size of the incomplete frame at the head, if its prefix has arrived."""
        if self._frame is not None and self._filled >= SIZE_PREFIX:
            return len(self._frame) - SIZE_PREFIX
        if len(self._buf) - self._pos < SIZE_PREFIX:
            return None
        return int.from_bytes(self._buf[self._pos : self._pos + SIZE_PREFIX], "big", signed=True)


def frame(payload: BytesLike) -> bytes:
    """Prefix ``payload`` (header + body) with its size."""
    view = memoryview(payload)
    return len(view).to_bytes(SIZE_PREFIX, "big", signed=True) + bytes(view)
