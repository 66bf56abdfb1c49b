"""Kafka frames out of one reassembled TCP direction, resynchronising where framing is lost (sans-IO).

In sync, a frame's size prefix says where the next frame starts, and a :class:`Gap` inside
a frame only truncates that frame: its bytes up to the first missing one are kept, and
``length`` still says how long it was. Framing is lost when the capture starts mid-stream,
when a gap swallows a size prefix, or when a size prefix is impossible. Then frame starts
are searched for, and a candidate is taken only once it is **proven**:

* its header is plausible (a request: :func:`protocol.request_header_end`, every api key
  and version Kafka ever defined; a response: the correlation id of a request on this
  connection that is still unanswered);
* its body decodes with kafka-python to exactly its declared length;
* the next frame start it implies lands on a plausible header, or exactly at the end of
  the bytes captured so far (the end of a segment, a hole, or the capture's end); after a
  response, that header must answer a request sent after the candidate's own, since
  answers come in request order;
* it is no longer than the bytes captured from its start (so a size prefix read out of a
  body cannot swallow the real frames after it).

A body kafka-python cannot decode (an api it has no schema for, a version newer than its
own) is proven only by a plausible header after it. Candidates are tried in stream order;
one still waiting for its bytes does not hold back a later one that is proven first. When
nothing is proven, the bytes stay unframed and are counted (``skipped_before``). The bytes
held while searching are bounded by ``search_limit``.

Each frame carries the capture time of the packet that carried its first byte.
"""

from __future__ import annotations

import bisect
import enum
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from corrfix.capture.pcap._tcp_stream import Data, Gap, Piece
from protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_IMPLAUSIBLE,
    HEADER_NEEDS_MORE,
    MIN_REQUEST_SIZE,
    SIZE_PREFIX,
    ProtocolError,
    body_decodes_exactly,
    request_header_end,
    response_body_offset,
)

MIN_RESPONSE_SIZE = 4  # correlation id
DEFAULT_SEARCH_LIMIT = 16 * 1024 * 1024
"""Captured bytes held while looking for a frame start; a longer candidate is not proven."""
_TRIM_AT = 64 * 1024  # drop bytes no candidate can start in once this many have piled up
_MAX_NEEDLES = 512  # pending correlation ids searched for as response starts
RESPONSE_LOOKBACK = 64 * 1024
"""Unframed response bytes kept for a request proven after its answer arrived."""


class Verdict(enum.Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    NEED_MORE = "need_more"


class WireFrame(NamedTuple):
    """A frame as captured.

    ``data`` is the frame from its size prefix up to its first missing byte; ``length`` is
    the whole frame's length (size prefix included), so ``len(data) < length`` when part of
    it was not captured (``missing`` bytes) or the stream ended inside it (``complete`` is
    False). ``gap_before`` bytes of this direction were never captured and ``skipped_before``
    captured bytes could not be framed, between the previous frame and this one. ``ts_ns``
    is the capture time of the packet that carried the frame's first byte.
    ``hole_end`` is the stream offset where the latest such stretch before this frame ended.
    """

    offset: int
    ts_ns: int
    data: bytes
    length: int
    missing: int = 0
    gap_before: int = 0
    skipped_before: int = 0
    complete: bool = True
    hole_end: int = -1  # where the last hole before this frame ended (-1: none so far)


@dataclass(frozen=True, slots=True)
class Header:
    """What a plausible header says: the frame's size, where its body starts, and whose it is."""

    size: int
    body_offset: int
    api_key: int
    api_version: int
    correlation_id: int


class Boundary:
    """Decides whether a frame can start at an offset; one per direction."""

    min_size: int = MIN_REQUEST_SIZE
    request: bool = True
    strong_header: bool = True  # a plausible header is rare by chance (see FrameSplitter._prove)

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size

    def sane_size(self, size: int) -> bool:
        return self.min_size <= size <= self.max_frame_size

    def candidates(self, buf: bytearray, start: int, stop: int) -> Iterator[int]:
        """Offsets in ``[start, stop)`` that may begin a frame, in order (a superset of the real ones)."""
        raise NotImplementedError

    def header(self, buf: memoryview) -> Header | Verdict:
        """The header at ``buf[0]``, or REJECT, or NEED_MORE when ``buf`` ends too early to tell."""
        raise NotImplementedError

    def follows(self, buf: memoryview, previous: Header) -> Verdict:
        """Whether a frame after ``previous`` can start at ``buf[0]`` (header only, no body)."""
        raise NotImplementedError

    def body_decodes(self, frame: memoryview, header: Header) -> bool | None:
        """Whether the body decodes to exactly the frame's end; None if it cannot be decoded."""
        return body_decodes_exactly(
            header.api_key, header.api_version, frame[header.body_offset :], request=self.request
        )


class RequestBoundary(Boundary):
    """Request frames: a header Kafka could have sent, at any version ever defined."""

    min_size = MIN_REQUEST_SIZE
    request = True
    # size < 128 MiB, api key < 128, version < 256: what every known request header satisfies.
    _PREFILTER = re.compile(rb"(?=[\x00-\x07][\x00-\xff]{3}\x00[\x00-\x7f]\x00)")

    def candidates(self, buf: bytearray, start: int, stop: int) -> Iterator[int]:
        for match in self._PREFILTER.finditer(buf, start, stop + 7):
            if match.start() >= stop:
                return
            yield match.start()

    def header(self, buf: memoryview) -> Header | Verdict:
        end = request_header_end(buf, self.max_frame_size)
        if end == HEADER_IMPLAUSIBLE:
            return Verdict.REJECT
        if end == HEADER_NEEDS_MORE:
            return Verdict.NEED_MORE
        size = int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True)
        api_key = int.from_bytes(buf[4:6], "big", signed=True)
        api_version = int.from_bytes(buf[6:8], "big", signed=True)
        return Header(size, end, api_key, api_version, int.from_bytes(buf[8:12], "big", signed=True))

    def follows(self, buf: memoryview, previous: Header) -> Verdict:
        found = self.header(buf)
        return found if isinstance(found, Verdict) else Verdict.ACCEPT


class ResponseBoundary(Boundary):
    """Response frames: the correlation id of a request this connection still waits on.

    ``lookup(id)`` gives the api key and version of the oldest unanswered request with that
    id (None if there is none); ``pending_ids()`` every unanswered id, newest last;
    ``highest_id()`` the highest request id seen. After a response, the next one may also
    answer a request the capture lost: any id above its own, up to the highest seen, or a
    waiting request sent after its own (never an older one: answers come in request order).
    """

    min_size = MIN_RESPONSE_SIZE
    request = False
    strong_header = False

    def __init__(
        self,
        lookup: Callable[[int], tuple[int, int] | None],
        pending_ids: Callable[[], Iterable[int]],
        highest_id: Callable[[], int | None],
        **kwargs: int,
    ) -> None:
        super().__init__(**kwargs)
        self._lookup = lookup
        self._pending_ids = pending_ids
        self._highest_id = highest_id

    def candidates(self, buf: bytearray, start: int, stop: int) -> Iterator[int]:
        ids = list(self._pending_ids())
        if len(ids) > _MAX_NEEDLES:  # answers come for the oldest; acks=0 requests never get one
            ids = ids[: _MAX_NEEDLES // 2] + ids[-_MAX_NEEDLES // 2 :]
        yield from self.offsets_of(ids, buf, start, stop)

    @staticmethod
    def offsets_of(ids: Iterable[int], buf: bytearray, start: int, stop: int) -> list[int]:
        """Offsets in ``[start, stop)`` where a response with one of these correlation ids may start."""
        offsets = set()
        for correlation_id in ids:
            needle = correlation_id.to_bytes(4, "big", signed=True)
            found = buf.find(needle, start + SIZE_PREFIX, stop + SIZE_PREFIX + 3)
            while found != -1:
                offsets.add(found - SIZE_PREFIX)
                found = buf.find(needle, found + 1, stop + SIZE_PREFIX + 3)
        return sorted(offsets)

    def header(self, buf: memoryview) -> Header | Verdict:
        if len(buf) < SIZE_PREFIX + MIN_RESPONSE_SIZE:
            return Verdict.NEED_MORE if self._prefix_sane(buf) else Verdict.REJECT
        size = int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True)
        correlation_id = int.from_bytes(buf[4:8], "big", signed=True)
        request = self._lookup(correlation_id)
        if not self.sane_size(size) or request is None:
            return Verdict.REJECT
        api_key, api_version = request
        try:
            body_offset = response_body_offset(buf[: SIZE_PREFIX + size], api_key, api_version)
        except ProtocolError:
            return Verdict.NEED_MORE if len(buf) < SIZE_PREFIX + size else Verdict.REJECT
        return Header(size, body_offset, api_key, api_version, correlation_id)

    def follows(self, buf: memoryview, previous: Header) -> Verdict:
        if len(buf) < SIZE_PREFIX + MIN_RESPONSE_SIZE:
            return Verdict.NEED_MORE if self._prefix_sane(buf) else Verdict.REJECT
        size = int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True)
        correlation_id = int.from_bytes(buf[4:8], "big", signed=True)
        if not self.sane_size(size):
            return Verdict.REJECT
        highest = self._highest_id()
        if highest is not None and previous.correlation_id < correlation_id <= highest:
            return Verdict.ACCEPT
        later = self._sent_after(correlation_id, previous.correlation_id)
        return Verdict.ACCEPT if correlation_id != previous.correlation_id and later else Verdict.REJECT

    def _sent_after(self, correlation_id: int, previous: int) -> bool:
        """Whether a request still waiting under ``correlation_id`` was sent after ``previous``'s:
        answers come in request order, so a frame that would answer an older request cannot
        follow (inside an opaque body, chains of small waiting ids line up all too often)."""
        if self._lookup(correlation_id) is None:
            return False
        order = {cid: i for i, cid in enumerate(self._pending_ids())}  # newest last
        return order.get(correlation_id, -1) > order.get(previous, len(order))

    def _prefix_sane(self, buf: memoryview) -> bool:
        return len(buf) < SIZE_PREFIX or self.sane_size(int.from_bytes(buf[:SIZE_PREFIX], "big", signed=True))


@dataclass(frozen=True, slots=True)
class _Wait:
    """A candidate that needs the buffer to reach ``need`` bytes before it can be decided."""

    need: int


_PROVEN = Verdict.ACCEPT


class FrameSplitter:
    """Turns one direction's pieces into :class:`WireFrame` s.

    ``synced=True`` when the stream is known to start at a frame boundary (a SYN was seen).
    """

    def __init__(
        self,
        boundary: Boundary,
        synced: bool,
        search_limit: int = DEFAULT_SEARCH_LIMIT,
        lookback: int = 0,
    ) -> None:
        self.boundary = boundary
        self.synced = synced
        self.search_limit = search_limit
        self.lookback = lookback  # unframed bytes kept for :meth:`reconsider`
        self.gap_bytes = 0  # totals, for the import summary
        self.skipped_bytes = 0
        self._hole_end = -1  # stream offset where the latest unframed stretch ended
        # In sync: the frame being read.
        self._frame = bytearray()
        self._frame_offset = 0
        self._frame_ts = 0
        self._frame_length: int | None = None
        self._consumed = 0
        self._missing = 0
        self._truncated = False
        # Out of sync: contiguous captured bytes since framing was lost, from stream offset
        # _search_offset; _starts/_times: where each piece begins in it, and its capture time.
        self._search = bytearray()
        self._search_offset = 0
        self._starts: list[int] = []
        self._times: list[int] = []
        self._scanned = 0  # candidates before this buffer offset have been found
        self._waiting: dict[int, int] = {}  # candidate offset -> buffer length it waits for
        # Since the last frame.
        self._gap_before = 0
        self._skipped_before = 0

    def feed(self, piece: Piece) -> list[WireFrame]:
        """Frames completed by this piece, in order."""
        out: list[WireFrame] = []
        if isinstance(piece, Data):
            if self.synced:
                self._data(piece.offset, piece.data, piece.ts_ns, out)
            else:
                self._search_more(piece, out)
        else:
            self._gap(piece, out)
        return out

    @property
    def searching(self) -> bool:
        """Out of sync, with captured bytes not yet framed or given up on."""
        return not self.synced and bool(self._search)

    @property
    def hole_end(self) -> int:
        """Where the latest unframed stretch ended (-1: none so far): frames made from here,
        at rest, carry it."""
        return self._hole_end

    @property
    def at_rest(self) -> bool:
        """In sync between two frames, no hole or skipped bytes since the last one: whole
        frames fed from here are made as a clean stream's are, and leave this state as it was."""
        return self.synced and not self._consumed and not self._gap_before and not self._skipped_before

    def reconsider(self, offsets: Callable[[bytearray, int], Iterable[int]]) -> list[WireFrame]:
        """Try again candidates ``offsets(buffer, stop)`` finds among bytes already searched.

        For responses whose request was proven after they arrived: a new correlation id
        makes new candidates of bytes searched before (up to ``lookback`` bytes back).
        """
        out: list[WireFrame] = []
        if self.synced or not self._search:
            return out
        for offset in offsets(self._search, self._scanned):
            self._waiting.setdefault(offset, 0)
        self._resync(out, final=False)
        return out

    def finish(self, ts_ns: int) -> tuple[list[WireFrame], int, int]:
        """The stream ended: (frames still decidable, trailing gap bytes, trailing skipped bytes).

        A frame cut off by the end is returned with ``complete=False`` once its size is known.
        """
        out: list[WireFrame] = []
        self._resync_final(out, stream_end=True)
        if self.synced and self._consumed:
            if self._frame_length is None:
                self._skip(self._consumed)
                self._reset_frame()
            else:
                out.append(self._emit(complete=False))
        elif not self.synced:
            self._drop_search()
        gap, skipped = self._gap_before, self._skipped_before
        self._gap_before = self._skipped_before = 0
        return out, gap, skipped

    # -- in sync ---------------------------------------------------------------------------

    def _data(self, offset: int, data: bytes | memoryview, ts_ns: int, out: list[WireFrame]) -> None:
        pos = 0
        end = len(data)
        sane = self.boundary.sane_size
        while pos < end:
            if self._consumed == 0 and pos + SIZE_PREFIX <= end:
                size = int.from_bytes(data[pos : pos + SIZE_PREFIX], "big", signed=True)
                stop = pos + SIZE_PREFIX + size
                if stop <= end and sane(size):  # a whole frame in this piece: no copying into _frame
                    hole_end = self._hole_end
                    if self._gap_before or self._skipped_before:
                        hole_end = self._hole_end = offset + pos
                    out.append(
                        WireFrame(
                            offset + pos,
                            ts_ns,
                            bytes(data[pos:stop]),
                            stop - pos,
                            0,
                            self._gap_before,
                            self._skipped_before,
                            True,
                            hole_end,
                        )
                    )
                    self._gap_before = self._skipped_before = 0
                    pos = stop
                    continue
            if self._consumed == 0:
                self._frame_offset = offset + pos
                self._frame_ts = ts_ns
            if self._frame_length is None:
                take = min(SIZE_PREFIX - self._consumed, len(data) - pos)
                self._frame += data[pos : pos + take]
                self._consumed += take
                pos += take
                if self._consumed < SIZE_PREFIX:
                    return
                size = int.from_bytes(self._frame[:SIZE_PREFIX], "big", signed=True)
                if not self.boundary.sane_size(size):
                    start, ts = self._frame_offset + 1, self._frame_ts
                    pending = bytes(self._frame[1:])
                    self._reset_frame()
                    self._skip(1)
                    self._lose_sync(start)
                    self._search_more(Data(start, pending, ts), out)
                    if pos < len(data):
                        self._search_more(Data(offset + pos, bytes(data[pos:]), ts_ns), out)
                    return
                self._frame_length = SIZE_PREFIX + size
            take = min(self._frame_length - self._consumed, len(data) - pos)
            if not self._truncated:
                self._frame += data[pos : pos + take]
            self._consumed += take
            pos += take
            if self._consumed == self._frame_length:
                out.append(self._emit())
        return

    def _gap(self, gap: Gap, out: list[WireFrame]) -> None:
        self.gap_bytes += gap.length
        if not self.synced:
            self._resync_final(out)
            if not self.synced:
                self._drop_search()
                self._missed(gap.length)
                self._lose_sync(gap.offset + gap.length)
                return
        length = gap.length
        if self._frame_length is not None and self._consumed:
            take = min(self._frame_length - self._consumed, length)
            self._consumed += take
            self._missing += take
            self._truncated = True
            length -= take
            if self._consumed == self._frame_length:
                out.append(self._emit())
        if length:  # the gap swallowed a size prefix: framing is lost
            if self._consumed:
                self._skip(self._consumed)
            self._reset_frame()
            self._lose_sync(gap.offset + gap.length)
            self._missed(length)

    def _emit(self, complete: bool = True) -> WireFrame:
        assert self._frame_length is not None
        if self._gap_before or self._skipped_before:
            self._hole_end = self._frame_offset
        frame = WireFrame(
            offset=self._frame_offset,
            ts_ns=self._frame_ts,
            data=bytes(self._frame),
            length=self._frame_length,
            missing=self._missing,
            gap_before=self._gap_before,
            skipped_before=self._skipped_before,
            complete=complete,
            hole_end=self._hole_end,
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

    def _missed(self, n: int) -> None:
        """``n`` bytes between frames were never captured."""
        self._gap_before += n

    # -- out of sync -----------------------------------------------------------------------

    def _lose_sync(self, offset: int) -> None:
        self.synced = False
        self._search = bytearray()
        self._search_offset = offset
        self._starts, self._times = [], []
        self._scanned = 0
        self._waiting = {}

    def _drop_search(self) -> None:
        """Nothing in the search buffer can be proven: count it as unframed."""
        self._skip(len(self._search))
        self._lose_sync(self._search_offset + len(self._search))

    def _search_more(self, piece: Data, out: list[WireFrame]) -> None:
        if not self._search:
            self._search_offset = piece.offset
        self._starts.append(len(self._search))
        self._times.append(piece.ts_ns)
        self._search += piece.data
        self._resync(out, final=False)

    def _resync_final(self, out: list[WireFrame], stream_end: bool = False) -> None:
        """Resync on what is buffered, knowing that nothing follows it (a hole, or with
        ``stream_end`` the end of the stream); again if framing is lost again within those bytes."""
        while not self.synced and self._search:
            before = (self._search_offset, len(self._search))
            self._resync(out, final=True, stream_end=stream_end)
            if not self.synced and (self._search_offset, len(self._search)) == before:
                return

    def _resync(self, out: list[WireFrame], final: bool, stream_end: bool = False) -> None:
        """Look for a proven frame start in the search buffer; on success, frame from there on.

        ``final``: no more bytes will follow these (a hole, or with ``stream_end`` the end of
        the stream).
        """
        length = len(self._search)
        found = None
        with memoryview(self._search) as view:
            waiting = [o for o in sorted(self._waiting) if final or self._waiting[o] <= length]
            found = self._first_proven(view, waiting, final, stream_end)
            if found is None:
                stop = length if final else max(length - SIZE_PREFIX - 3, self._scanned)
                candidates = self.boundary.candidates(self._search, self._scanned, stop)
                found = self._first_proven(view, candidates, final, stream_end)
                self._scanned = stop if found is None else found + 1
        if found is not None:
            self._synchronise(found, out)
        elif final:
            return
        else:
            self._trim()

    def _first_proven(
        self, view: memoryview, offsets: Iterable[int], final: bool, stream_end: bool
    ) -> int | None:
        """The first of ``offsets`` proven a frame start; the undecided ones are left waiting."""
        for offset in offsets:
            verdict = self._prove(view, offset, final, stream_end)
            if verdict is _PROVEN:
                return offset
            if isinstance(verdict, _Wait):
                self._waiting[offset] = verdict.need
            else:
                self._waiting.pop(offset, None)
        return None

    def _prove(self, view: memoryview, offset: int, final: bool, stream_end: bool) -> Verdict | _Wait:
        """Whether a frame provably starts at ``offset`` of the search buffer.

        A body that cannot be decoded is proven by ending exactly where the stream ends, or
        by the frame after it: a request by a plausible request header there (api key,
        version, correlation id, printable client id and tagged fields line up rarely by
        chance); a response only by the next frame's own exact decode, as the answer to a
        later request, as a plausible
        response header (an id that is waiting, a size below the maximum) turns up inside
        an opaque body all too often.
        """
        length = len(view)
        boundary = self.boundary
        found = self._frame_at(view, offset, final)
        if not isinstance(found, tuple):
            return found
        header, end = found
        decoded = boundary.body_decodes(view[offset:end], header)
        if decoded is False:
            return Verdict.REJECT
        if end == length:
            if decoded or stream_end:
                return _PROVEN  # it ends where the captured bytes end
            return Verdict.REJECT if final else _Wait(end + 1)
        if not decoded and not boundary.strong_header:
            return self._prove_by_next(view, end, final, header)
        following = boundary.follows(view[end:], header)
        if following is Verdict.ACCEPT:
            return _PROVEN
        if following is Verdict.NEED_MORE:
            return _PROVEN if final else _Wait(length + 1)
        return Verdict.REJECT

    def _frame_at(self, view: memoryview, offset: int, final: bool) -> tuple[Header, int] | Verdict | _Wait:
        """The header at ``offset`` and where its frame ends, once the captured bytes hold it
        all; else the verdict (a rejected header or size) or how many bytes to wait for."""
        length = len(view)
        header = self.boundary.header(view[offset:])
        if header is Verdict.REJECT:
            return Verdict.REJECT
        if header is Verdict.NEED_MORE:
            return Verdict.REJECT if final else _Wait(length + 1)
        assert isinstance(header, Header)
        end = offset + SIZE_PREFIX + header.size
        if SIZE_PREFIX + header.size > self.search_limit:
            return Verdict.REJECT
        if end > length:
            return Verdict.REJECT if final else _Wait(end)
        return header, end

    def _prove_by_next(self, view: memoryview, start: int, final: bool, previous: Header) -> Verdict | _Wait:
        """Whether a frame that may follow ``previous`` (an answer to a later request), and whose
        body kafka-python decodes exactly, starts at ``start``."""
        found = self._frame_at(view, start, final)
        if not isinstance(found, tuple):
            return found
        header, end = found
        if self.boundary.follows(view[start:], previous) is not Verdict.ACCEPT:
            return Verdict.REJECT
        return _PROVEN if self.boundary.body_decodes(view[start:end], header) else Verdict.REJECT

    def _synchronise(self, found: int, out: list[WireFrame]) -> None:
        """Frame from buffer offset ``found`` on: replay the buffered pieces in sync."""
        buf, starts, times, base = self._search, self._starts, self._times, self._search_offset
        self._skip(found)
        self._search = bytearray()
        self._starts, self._times = [], []
        self._waiting = {}
        self._scanned = 0
        self.synced = True
        first = bisect.bisect_right(starts, found) - 1
        with memoryview(buf) as view:
            for i in range(first, len(starts)):
                start = max(starts[i], found)
                stop = starts[i + 1] if i + 1 < len(starts) else len(buf)
                if stop > start:
                    if self.synced:
                        self._data(base + start, bytes(view[start:stop]), times[i], out)
                    else:  # framing was lost again within the buffered bytes
                        self._search_more(Data(base + start, bytes(view[start:stop]), times[i]), out)

    def _trim(self) -> None:
        """Forget bytes no candidate can start in any more, and candidates grown too long."""
        length = len(self._search)
        for offset in [o for o in self._waiting if length - o > self.search_limit]:
            del self._waiting[offset]
        keep_from = min(self._waiting, default=self._scanned)
        keep_from = min(keep_from, self._scanned, length - self.lookback)
        if keep_from <= 0 or (keep_from < _TRIM_AT and keep_from * 2 < length):
            return
        del self._search[:keep_from]
        self._skip(keep_from)
        self._search_offset += keep_from
        self._scanned -= keep_from
        self._waiting = {o - keep_from: need - keep_from for o, need in self._waiting.items()}
        first = max(bisect.bisect_right(self._starts, keep_from) - 1, 0)
        self._starts = [max(s - keep_from, 0) for s in self._starts[first:]]
        self._times = self._times[first:]
