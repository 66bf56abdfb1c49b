"""One direction of a TCP connection, put back in sequence order (sans-IO).

Segments go in as captured: retransmitted, duplicated, overlapping or out of order. What
comes out is the byte stream in order, as :class:`Data` pieces, and :class:`Gap` pieces
where bytes were never captured. A gap always has a known length, because sequence
numbers say how much is missing; that is what lets the Kafka framing continue after it.

A hole is held open while a retransmission may still fill it. It is declared a gap when:

* the other side acknowledges bytes past it (the receiver has them, so they will not be
  sent again: the capture simply missed them);
* the snap length cut a segment short (those bytes are in no packet of this capture);
* more than ``max_held_bytes`` wait behind it; or
* the stream ends (:meth:`finish`).

Offsets count from the first byte after the SYN, or from the first byte seen when the
capture started mid-stream; 32-bit sequence numbers are unwrapped against the position.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

_SEQ_MOD = 1 << 32
_HALF = 1 << 31
DEFAULT_MAX_HELD_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Data:
    """Stream bytes at ``offset``; ``ts_ns`` is when the packet that made them in-order was captured."""

    offset: int
    data: bytes
    ts_ns: int


@dataclass(frozen=True, slots=True)
class Gap:
    """``length`` stream bytes at ``offset`` that the capture does not have."""

    offset: int
    length: int
    ts_ns: int


Piece = Data | Gap


class StreamReassembler:
    """In-order delivery of one TCP direction; memory bounded by ``max_held_bytes``."""

    def __init__(self, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES) -> None:
        self.max_held_bytes = max_held_bytes
        self.saw_syn = False
        self._isn: int | None = None  # sequence number of stream offset 0
        self._next = 0  # offset of the next byte to deliver
        self._end: int | None = None  # offset of the FIN, once seen
        self._held: list[tuple[int, int, bytes, int, int]] = []  # (offset, order, data, length, ts)
        self._held_bytes = 0
        self._order = itertools.count()

    @property
    def started(self) -> bool:
        """Whether the stream's origin is known (a SYN or a data segment was seen)."""
        return self._isn is not None

    @property
    def position(self) -> int:
        """Offset of the next byte to deliver."""
        return self._next

    @property
    def held_bytes(self) -> int:
        """Captured bytes waiting behind a hole."""
        return self._held_bytes

    def is_new_syn(self, seq: int) -> bool:
        """Whether a SYN with this sequence number opens a different connection than this one's."""
        return self._isn is not None and (seq + 1) % _SEQ_MOD != self._isn

    def syn(self, seq: int) -> None:
        """The SYN (or SYN-ACK) of this direction: data starts right after it."""
        if self._isn is None:
            self._isn = (seq + 1) % _SEQ_MOD
            self.saw_syn = True

    def segment(self, seq: int, payload: bytes, length: int, ts_ns: int, fin: bool = False) -> list[Piece]:
        """A captured segment: ``payload`` is its captured data, ``length`` its real data length."""
        if self._isn is None:
            if not length:
                return []
            self._isn = seq  # mid-stream: this segment's first byte is offset 0
        offset = self._unwrap(seq)
        if fin:
            self._end = offset + length
        if not length or offset + length <= self._next:
            return []  # pure ACK, keep-alive, or a retransmission of delivered bytes
        if self._end is not None and offset >= self._end:
            return []  # nothing follows a FIN
        heapq.heappush(self._held, (offset, next(self._order), payload, length, ts_ns))
        self._held_bytes += len(payload)
        out = self._drain(ts_ns)
        while self._held_bytes > self.max_held_bytes:
            out += self._skip_to(self._held[0][0], ts_ns)
        return out

    def acknowledged(self, ack: int, ts_ns: int) -> list[Piece]:
        """The peer acknowledged everything before ``ack``: bytes not captured by then never will be."""
        if self._isn is None:
            return []
        upto = self._unwrap(ack)
        if self._end is not None:
            upto = min(upto, self._end)  # the FIN takes a sequence number but is no data
        out: list[Piece] = []
        while upto > self._next:
            if self._held and self._held[0][0] <= self._next:
                out += self._drain(ts_ns)
                continue
            out += self._skip_to(min(upto, self._held[0][0]) if self._held else upto, ts_ns)
        return out

    def finish(self, ts_ns: int) -> list[Piece]:
        """The stream is over (FIN, RST, or end of capture): deliver everything still held."""
        out: list[Piece] = []
        while self._held:
            out += self._skip_to(self._held[0][0], ts_ns)
        if self._end is not None and self._end > self._next:
            out.append(Gap(self._next, self._end - self._next, ts_ns))
            self._next = self._end
        return out

    def _unwrap(self, seq: int) -> int:
        assert self._isn is not None
        relative = (seq - self._isn) % _SEQ_MOD
        diff = (relative - self._next) % _SEQ_MOD
        if diff >= _HALF:
            diff -= _SEQ_MOD
        return self._next + diff

    def _skip_to(self, offset: int, ts_ns: int) -> list[Piece]:
        out: list[Piece] = []
        if offset > self._next:
            out.append(Gap(self._next, offset - self._next, ts_ns))
            self._next = offset
        return out + self._drain(ts_ns)

    def _drain(self, now_ns: int) -> list[Piece]:
        """Deliver what is in order now; ``now_ns``: the capture time of the packet that made it so."""
        out: list[Piece] = []
        held = self._held
        while held and held[0][0] <= self._next:
            offset, _, payload, length, captured_ns = heapq.heappop(held)
            ts_ns = max(captured_ns, now_ns)
            self._held_bytes -= len(payload)
            captured_end = offset + len(payload)
            if captured_end > self._next:
                out.append(Data(self._next, payload[self._next - offset :], ts_ns))
                self._next = captured_end
            # The snap length cut this segment: its tail is in no packet, unless another
            # (held) segment carries those bytes in full.
            end = offset + length
            if held and held[0][0] < end:
                end = max(self._next, held[0][0])
            if end > self._next:
                out.append(Gap(self._next, end - self._next, ts_ns))
                self._next = end
        return out
