"""Plaintext and TLS streams, read and written with as few system calls and task switches as possible."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Sequence

import trio

RECEIVE_SIZE = 256 * 1024
"""Largest receive through trio's streams (TLS)."""
PLAIN_RECEIVE_SIZE = 1024 * 1024
"""Largest receive on a plaintext socket: one buffer per thread, so a big one costs nothing per
connection and a 1 MiB frame arrives in one system call."""
FAIR_READS = 4
"""Receives a reader (or the engine, per socket and pass) may take back to back before the
other connections get their turn."""
IOV_MAX = 1024


def _plain_socket(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under a plaintext stream, for direct non-blocking I/O (None for TLS)."""
    return stream.socket if isinstance(stream, trio.SocketStream) else None


Chunk = bytearray | memoryview
"""A frame, or the unsent rest of one."""


def send_frames(fd: int, frames: Sequence[Chunk]) -> int:
    """Bytes a non-blocking socket takes now of ``frames``, in one system call (0 when it is
    full). A broken socket raises OSError."""
    count = len(frames)
    try:
        if count == 1:
            return os.write(fd, frames[0])
        return os.writev(fd, frames if count <= IOV_MAX else frames[:IOV_MAX])
    except BlockingIOError:
        return 0


def unsent(frames: Sequence[Chunk], sent: int) -> list[Chunk]:
    """What is left of ``frames`` once ``sent`` bytes went: views of the same bytes, no copy."""
    if not sent:
        return list(frames)
    index = 0
    for frame in frames:
        size = len(frame)
        if sent < size:
            break
        sent -= size
        index += 1
    if index == len(frames):
        return []
    rest: list[Chunk] = [memoryview(frames[index])[sent:]]
    rest.extend(frames[index + 1 :])
    return rest


def write_frames(fd: int, frames: Sequence[Chunk]) -> list[Chunk]:
    """Send what a non-blocking socket takes now; return the rest ([] when everything went)."""
    return unsent(frames, send_frames(fd, frames))


class Outbox:
    """Bytes queued for one stream, sent in as few sends as possible.

    On a plaintext socket, :meth:`write` sends at once when nothing is queued, straight on
    the file descriptor: a relayed batch then costs one ``writev`` and no task switch. Only
    what the socket does not take is queued, for the writer task (:meth:`run`), which
    waits for the socket through trio. Ordering holds because a direct send happens only
    while nothing is queued or being sent.
    """

    __slots__ = ("_buffer", "_changed", "_dropping", "_error", "_fd", "_sending", "eof")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._sending = 0
        self._changed = trio.lowlevel.ParkingLot()
        self._fd = -1
        self._error: OSError | None = None
        self._dropping = False
        self.eof = False

    def attach(self, stream: trio.abc.Stream) -> None:
        """Send directly on ``stream``'s socket when it is plaintext."""
        sock = _plain_socket(stream)
        self._fd = sock.fileno() if sock is not None else -1

    def detach(self) -> None:
        """No more direct sends: the socket is about to close (its number may be reused)."""
        self._fd = -1

    @property
    def pending(self) -> int:
        return len(self._buffer) + self._sending

    def abandon(self) -> None:
        """The peer is gone: drop what is queued and everything written from now on."""
        self._dropping = True
        self._fd = -1
        self._buffer = bytearray()
        self._changed.unpark_all()

    def write(self, frames: list[bytearray]) -> None:
        if self._dropping:
            return
        rest: Sequence[Chunk] = frames
        if self._fd >= 0 and not self._buffer and not self._sending and not self.eof and self._error is None:
            rest = self._send_now(frames)
            if not rest:
                return
        buffer = self._buffer
        for frame in rest:
            buffer += frame
        self._changed.unpark_all()

    def _send_now(self, frames: list[bytearray]) -> Sequence[Chunk]:
        """Send what the socket takes without waiting; returns the rest, for the writer task."""
        try:
            return write_frames(self._fd, frames)
        except OSError as exc:
            self._error = exc  # the writer task reports it, as a failed send_all would
            return frames

    def finish(self) -> None:
        """Send what is queued, then end the stream."""
        self.eof = True
        self._changed.unpark_all()

    async def wait_below(self, limit: int) -> None:
        while self.pending >= limit:
            await self._changed.park()

    async def run(self, stream: trio.abc.HalfCloseableStream | trio.abc.Stream) -> None:
        while True:
            if self._error is not None:
                raise trio.BrokenResourceError(f"socket connection broken: {self._error}") from self._error
            if not self._buffer:
                if self.eof:
                    return
                await self._changed.park()
                continue
            data = self._buffer
            self._buffer = bytearray()
            self._sending = len(data)
            await stream.send_all(data)
            self._sending = 0
            self._changed.unpark_all()


_receive_buffers = threading.local()


def receive_buffer() -> mmap.mmap:
    """One receive buffer per thread, shared by every reader of the trio run in it (and by its
    engine when the engine's loop is a trio task, under a MockClock; the engine's own thread
    has a buffer of its own): each uses what it received before its next await, so idle
    connections cost no buffer.

    An anonymous mapping rather than a ``bytearray`` (which zeroes, so touches, all of its 1 MiB):
    only the pages receives have written become resident, one page while frames are small.
    """
    buffer: mmap.mmap | None = getattr(_receive_buffers, "buffer", None)
    if buffer is None:
        buffer = _receive_buffers.buffer = mmap.mmap(-1, PLAIN_RECEIVE_SIZE)
    return buffer


class Receiver:
    """Receives from one stream; a plaintext socket is read into the thread's receive buffer.

    trio is awaited only when the socket has nothing ready (and every few receives, so
    that one busy connection cannot starve the others). The returned view is valid only
    until the caller's next await.
    """

    __slots__ = ("_buffer", "_fd", "_sock", "_streak", "_stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._sock = _plain_socket(stream)
        self._fd = self._sock.fileno() if self._sock is not None else -1
        self._buffer: mmap.mmap | bytearray = receive_buffer() if self._sock is not None else bytearray()
        self._streak = 0

    async def receive(self) -> bytes | bytearray | memoryview:
        if self._sock is None:
            return await self._stream.receive_some(RECEIVE_SIZE)
        if self._streak >= FAIR_READS:
            self._streak = 0
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                received = os.readv(self._fd, [self._buffer])
            except BlockingIOError:
                self._streak = 0
                await trio.lowlevel.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            # No await from here on: the buffer is shared, and another reader may fill it next.
            self._streak += 1
            return memoryview(self._buffer)[:received]


def peer_name(stream: trio.abc.Stream) -> str:
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return "unknown"
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError):
        return "unknown"
    return f"{host}:{port}"
