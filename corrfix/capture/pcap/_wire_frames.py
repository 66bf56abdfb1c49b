"""Kafka frames out of one reassembled TCP direction, resynchronising where framing is lost (sans-IO).

In sync, a frame's size prefix says where the next frame starts, and a :class:`Gap` inside
a frame only truncates that frame: its bytes up to the first missing one are kept, and
``length`` still says how long it was. Framing is lost when the capture starts mid-stream,
when a gap swallows a size prefix, or when a size prefix is impossible. Then every offset
of what follows is tried as a frame start, and the first plausible one is taken:

* a request: a sane size, a known api key with a valid version, a non-negative
  correlation id and a printable client id that fits the frame (random bytes pass that
  about once in 10^12 offsets);
* a response: a sane size and the correlation id of a request seen on this connection
  that is still unanswered (responses to requests before the capture are skipped).

Where enough bytes follow, the frame after the candidate must start with a sane size too.
A candidate is only confirmed once its header is whole, so the bytes held while searching
are bounded by a header, not by a frame.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from corrfix.capture.pcap._tcp_stream import Data, Gap, Piece
from protocol import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, ProtocolError, api_schemas, parse_request_header

MIN_REQUEST_SIZE = 8  # api key, version, correlation id
MIN_RESPONSE_SIZE = 4  # correlation id
MAX_CLIENT_ID = 1024
MAX_HEADER = 4096  # a request header longer than this is taken for noise
_LOOKBEHIND = 8  # bytes a candidate needs before the fast pre-filter can see it


class Verdict(enum.Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    NEED_MORE = "need_more"


@dataclass(frozen=True, slots=True)
class WireFrame:
    """A frame as captured.

    ``data`` is the frame from its size prefix up to its first missing byte; ``length`` is
    the whole frame's length (size prefix included), so ``len(data) < length`` when part of
    it was not captured (``missing`` bytes) or the stream ended inside it (``complete`` is
    False). ``gap_before`` bytes of this direction were never captured and ``skipped_before``
    captured bytes could not be framed, between the previous frame and this one.
    """

    offset: int
    ts_ns: int
    data: bytes
    length: int
    missing: int = 0
    gap_before: int = 0
    skipped_before: int = 0
    complete: bool = True


class Boundary:
    """Decides whether a frame can start at an offset; one per direction."""

    min_size: int = MIN_REQUEST_SIZE

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size

    def sane_size(self, size: int) -> bool:
        return self.min_size <= size <= self.max_frame_size

    def candidates(self, buf: bytearray, start: int) -> Iterator[int]:
        """Offsets from ``start`` that may begin a frame, in order (a superset of the real ones)."""
        raise NotImplementedError

    def check(self, buf: memoryview, final: bool) -> Verdict:
        """Whether a frame starts at ``buf[0]``; ``final``: no more bytes will follow."""
        raise NotImplementedError

    def _check_next(self, buf: memoryview, size: int) -> bool:
        """The frame after this one, where its prefix was captured, has a sane size too."""
        end = SIZE_PREFIX + size
        if len(buf) < end + SIZE_PREFIX:
            return True
        return self.sane_size(int.from_bytes(buf[end : end + SIZE_PREFIX], "big", signed=True))


class RequestBoundary(Boundary):
    """Request frames: validated by their header alone."""

    min_size = MIN_REQUEST_SIZE
    # size < 128 MiB, api key < 128, version < 256: what every known request header satisfies.
    _PREFILTER = re.compile(rb"(?=[\x00-\x07][\x00-\xff]{3}\x00[\x00-\x7f]\x00)")

    def candidates(self, buf: bytearray, start: int) -> Iterator[int]:
        for match in self._PREFILTER.finditer(buf, start):
            yield match.start()

    def check(self, buf: memoryview, final: bool) -> Verdict:
        need = Verdict.REJECT if final else Verdict.NEED_MORE
        if len(buf) < SIZE_PREFIX + MIN_REQUEST_SIZE:
            return need
        size = int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True)
        if not self.sane_size(size):
            return Verdict.REJECT
        schema = api_schemas().get(int.from_bytes(buf[4:6], "big", signed=True))
        version = int.from_bytes(buf[6:8], "big", signed=True)
        correlation_id = int.from_bytes(buf[8:12], "big", signed=True)
        if schema is None or correlation_id < 0:
            return Verdict.REJECT
        low, high = schema.valid_versions
        if not low <= version <= high:
            return Verdict.REJECT
        if len(buf) >= 14:
            # The client id must fit the frame, and what has arrived of it must be text.
            client_id_length = int.from_bytes(buf[12:14], "big", signed=True)
            if not -1 <= client_id_length <= min(MAX_CLIENT_ID, size - 10):
                return Verdict.REJECT
            if any(b < 0x20 or b == 0x7F for b in buf[14 : 14 + max(client_id_length, 0)]):
                return Verdict.REJECT
        try:
            header = parse_request_header(buf[: SIZE_PREFIX + size])
        except ProtocolError:
            enough = len(buf) >= min(SIZE_PREFIX + size, MAX_HEADER)
            return Verdict.REJECT if enough else need
        if header.client_id is not None and not header.client_id.isprintable():
            return Verdict.REJECT
        return Verdict.ACCEPT if self._check_next(buf, size) else Verdict.REJECT


class ResponseBoundary(Boundary):
    """Response frames: validated by a correlation id the connection is waiting for."""

    min_size = MIN_RESPONSE_SIZE

    def __init__(
        self, is_pending: Callable[[int], bool], pending_ids: Callable[[], Iterator[int]], **kwargs: int
    ) -> None:
        super().__init__(**kwargs)
        self._is_pending = is_pending
        self._pending_ids = pending_ids

    def candidates(self, buf: bytearray, start: int) -> Iterator[int]:
        offsets = set()
        for correlation_id in self._pending_ids():
            needle = correlation_id.to_bytes(4, "big", signed=True)
            found = buf.find(needle, start + SIZE_PREFIX)
            while found != -1:
                offsets.add(found - SIZE_PREFIX)
                found = buf.find(needle, found + 1)
        yield from sorted(offsets)

    def check(self, buf: memoryview, final: bool) -> Verdict:
        if len(buf) < SIZE_PREFIX + MIN_RESPONSE_SIZE:
            return Verdict.REJECT if final else Verdict.NEED_MORE
        size = int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True)
        if not self.sane_size(size) or not self._is_pending(int.from_bytes(buf[4:8], "big", signed=True)):
            return Verdict.REJECT
        return Verdict.ACCEPT if self._check_next(buf, size) else Verdict.REJECT


class FrameSplitter:
    """Turns one direction's pieces into :class:`WireFrame` s.

    ``synced=True`` when the stream is known to start at a frame boundary (a SYN was seen).
    """

    def __init__(self, boundary: Boundary, synced: bool) -> None:
        self.boundary = boundary
        self.synced = synced
        self.gap_bytes = 0  # totals, for the import summary
        self.skipped_bytes = 0
        # In sync: the frame being read.
        self._frame = bytearray()
        self._frame_offset = 0
        self._frame_length: int | None = None
        self._consumed = 0
        self._missing = 0
        self._truncated = False
        # Out of sync: captured bytes since framing was lost, from stream offset _search_offset.
        self._search = bytearray()
        self._search_offset = 0
        # Since the last frame.
        self._gap_before = 0
        self._skipped_before = 0

    def feed(self, piece: Piece) -> list[WireFrame]:
        """Frames completed by this piece, in order."""
        out: list[WireFrame] = []
        if isinstance(piece, Data):
            self._data(piece.offset, piece.data, piece.ts_ns, out)
        else:
            self._gap(piece, out)
        return out

    def finish(self, ts_ns: int) -> tuple[list[WireFrame], int, int]:
        """The stream ended: (frames still decidable, trailing gap bytes, trailing skipped bytes).

        A frame cut off by the end is returned with ``complete=False`` once its size is known.
        """
        out: list[WireFrame] = []
        if not self.synced:
            self._resync(ts_ns, out, final=True)
        if self.synced and self._consumed:
            if self._frame_length is None:
                self._skip(self._consumed)
            else:
                out.append(self._emit(ts_ns, complete=False))
        elif not self.synced:
            self._skip(len(self._search))
            self._search.clear()
        gap, skipped = self._gap_before, self._skipped_before
        self._gap_before = self._skipped_before = 0
        return out, gap, skipped

    # -- in sync ---------------------------------------------------------------------------

    def _data(self, offset: int, data: bytes, ts_ns: int, out: list[WireFrame]) -> None:
        if not self.synced:
            if not self._search:
                self._search_offset = offset
            self._search += data
            self._resync(ts_ns, out, final=False)
            return
        pos = 0
        while pos < len(data):
            if self._consumed == 0:
                self._frame_offset = offset + pos
            if self._frame_length is None:
                take = min(SIZE_PREFIX - self._consumed, len(data) - pos)
                self._frame += data[pos : pos + take]
                self._consumed += take
                pos += take
                if self._consumed < SIZE_PREFIX:
                    return
                size = int.from_bytes(self._frame[:SIZE_PREFIX], "big", signed=True)
                if not self.boundary.sane_size(size):
                    self._lose_sync(self._frame_offset + 1, bytes(self._frame[1:]) + data[pos:])
                    self._skipped_before += 1
                    self.skipped_bytes += 1
                    self._resync(ts_ns, out, final=False)
                    return
                self._frame_length = SIZE_PREFIX + size
            take = min(self._frame_length - self._consumed, len(data) - pos)
            if not self._truncated:
                self._frame += data[pos : pos + take]
            self._consumed += take
            pos += take
            if self._consumed == self._frame_length:
                out.append(self._emit(ts_ns))

    def _gap(self, gap: Gap, out: list[WireFrame]) -> None:
        self.gap_bytes += gap.length
        if not self.synced:
            self._resync(gap.ts_ns, out, final=True)
            if not self.synced:
                self._skip(len(self._search))
                self._search.clear()
                self._gap_before += gap.length
                return
            if self._consumed == 0:  # the search confirmed whole frames only; the gap follows them
                self._lose_sync(gap.offset + gap.length, b"")
                self._gap_before += gap.length
                return
        length = gap.length
        if self._frame_length is not None and self._consumed:
            take = min(self._frame_length - self._consumed, length)
            self._consumed += take
            self._missing += take
            self._truncated = True
            length -= take
            if self._consumed == self._frame_length:
                out.append(self._emit(gap.ts_ns))
        if length:  # the gap swallowed a size prefix: framing is lost
            if self._consumed:
                self._skip(self._consumed)
            self._reset_frame()
            self._lose_sync(gap.offset + gap.length, b"")
            self._gap_before += length

    def _emit(self, ts_ns: int, complete: bool = True) -> WireFrame:
        assert self._frame_length is not None
        frame = WireFrame(
            offset=self._frame_offset,
            ts_ns=ts_ns,
            data=bytes(self._frame),
            length=self._frame_length,
            missing=self._missing,
            gap_before=self._gap_before,
            skipped_before=self._skipped_before,
            complete=complete,
        )
        self._gap_before = self._skipped_before = 0
        self._reset_frame()
        return frame

    def _reset_frame(self) -> None:
        self._frame = bytearray()
        self._frame_length = None
        self._consumed = 0
        self._missing = 0
        self._truncated = False

    def _skip(self, n: int) -> None:
        self._skipped_before += n
        self.skipped_bytes += n

    # -- out of sync -----------------------------------------------------------------------

    def _lose_sync(self, offset: int, pending: bytes) -> None:
        self.synced = False
        self._reset_frame()
        self._search = bytearray(pending)
        self._search_offset = offset

    def _resync(self, ts_ns: int, out: list[WireFrame], final: bool) -> None:
        """Look for a frame start in the search buffer; on success, frame from there on."""
        buf = self._search
        keep_from = len(buf) if final else max(len(buf) - _LOOKBEHIND, 0)
        found = None
        with memoryview(buf) as view:
            for offset in list(self.boundary.candidates(buf, 0)):
                verdict = self.boundary.check(view[offset:], final)
                if verdict is Verdict.ACCEPT:
                    found = offset
                    break
                if verdict is Verdict.NEED_MORE:
                    keep_from = min(keep_from, offset)
                    break
        if found is not None:
            start, rest = self._search_offset + found, bytes(buf[found:])
            self._skip(found)
            self._search = bytearray()
            self.synced = True
            self._data(start, rest, ts_ns, out)
        elif keep_from:
            self._skip(keep_from)
            del buf[:keep_from]
            self._search_offset += keep_from
