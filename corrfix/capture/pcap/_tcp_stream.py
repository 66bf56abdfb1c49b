"""One direction of a TCP connection, put back in sequence order (sans-IO).

Segments go in as captured: retransmitted, duplicated, overlapping or out of order. What
comes out is the byte stream in order, as :class:`Data` pieces, and :class:`Gap` pieces
where bytes were never captured. A gap always has a known length, because sequence
numbers say how much is missing; that is what lets the Kafka framing continue after it.

A hole is held open while a retransmission may still fill it. It is declared a gap when:

* the other side acknowledges bytes past it (the receiver has them, so they will not be
  sent again: the capture simply missed them), and the segment carrying them did not
  turn up soon after in the capture (see :meth:`StreamReassembler.acknowledges_unseen`
  and the connection's deferral of such acknowledgements in :mod:`._import`);
* the snap length cut a segment short (those bytes are in no packet of this capture);
* more than ``max_held_bytes`` wait behind it, or more than a :class:`HeldBudget`'s limit
  behind the holes of every stream sharing it (this one's then go first); or
* the stream ends (:meth:`finish`).

Offsets count from the first byte after the SYN. When the capture started mid-stream,
they count from the first byte the peer was still waiting for when the capture began (its
first acknowledgement seen), so the bytes sent between that and the first captured one
are a hole too: acknowledgements seen before the first captured byte declare their part
of it a gap at once. Without such an acknowledgement, offsets count from the first byte
seen. 32-bit sequence numbers are unwrapped against the position.

Each :class:`Data` piece carries the capture time of the packet that carried it, not of the
packet that closed a hole before it: a frame is timed by its own first byte.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

_SEQ_MOD = 1 << 32
_HALF = 1 << 31
DEFAULT_MAX_HELD_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_HELD_TOTAL = 256 * 1024 * 1024


class HeldBudget:
    """Bytes held behind holes by every stream of one import, bounded as a whole: a capture of
    one direction only (``tcpdump dst port 9092``) that drops packets holds bytes behind a
    hole on every connection at once, each within its own bound.

    The stream that goes over it gives up its own holes first, so the total never stays over
    the limit after a segment is read, and no stream is made to skip for another's sake."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int = DEFAULT_MAX_HELD_TOTAL) -> None:
        self.held = 0
        self.limit = limit


def sequence_after(seq: int, other: int) -> bool:
    """Whether sequence number ``seq`` comes after ``other`` (32-bit wrap-around)."""
    return 0 < (seq - other) % _SEQ_MOD < _HALF


class Data(NamedTuple):
    """Stream bytes at ``offset``; ``ts_ns`` is when the packet that carried them was captured."""

    offset: int
    data: bytes
    ts_ns: int


class Gap(NamedTuple):
    """``length`` stream bytes at ``offset`` that the capture does not have."""

    offset: int
    length: int
    ts_ns: int


Piece = Data | Gap


class StreamReassembler:
    """In-order delivery of one TCP direction; memory bounded by ``max_held_bytes``."""

    def __init__(
        self, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES, budget: HeldBudget | None = None
    ) -> None:
        self.max_held_bytes = max_held_bytes
        self.budget = HeldBudget() if budget is None else budget
        self.saw_syn = False
        self._isn: int | None = None  # sequence number of stream offset 0
        self._next = 0  # offset of the next byte to deliver
        self._end: int | None = None  # offset of the FIN, once seen
        self._seen_end = 0  # end of the furthest segment seen
        self._held: list[tuple[int, int, bytes, int, int]] = []  # (offset, order, data, length, ts)
        self._held_bytes = 0
        self._order = itertools.count()
        # Acknowledgements of this direction seen before its first byte (mid-stream start).
        self._first_ack: int | None = None
        self._last_ack: int | None = None

    @property
    def started(self) -> bool:
        """Whether the stream's origin is known (a SYN or a data segment was seen)."""
        return self._isn is not None

    @property
    def position(self) -> int:
        """Offset of the next byte to deliver."""
        return self._next

    @property
    def at_rest(self) -> bool:
        """Started, every byte seen delivered, no FIN: segments that follow back to back
        would each be delivered at once, whole."""
        return self._isn is not None and not self._held and self._end is None and self._seen_end <= self._next

    @property
    def next_seq(self) -> int:
        """The sequence number of the next byte to deliver (once started)."""
        assert self._isn is not None
        return (self._isn + self._next) % _SEQ_MOD

    def advance(self, length: int) -> None:
        """``length`` more bytes were delivered, in order, elsewhere (the clean path)."""
        self._next += length
        self._seen_end = self._next

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
        out: list[Piece] = []
        if self._isn is None:
            if not length:
                return []
            self._isn = seq  # mid-stream: this segment's first byte is offset 0 ...
            first, last = self._first_ack, self._last_ack
            if first is not None and last is not None and sequence_after(seq, first):
                self._isn = first  # ... unless the peer was waiting for earlier bytes
                out += self.acknowledged(last, ts_ns)
        offset = self._unwrap(seq)
        self._seen_end = max(self._seen_end, offset + length)
        if fin:
            self._end = offset + length
        if not length or offset + length <= self._next:
            return out  # pure ACK, keep-alive, or a retransmission of delivered bytes
        if self._end is not None and offset >= self._end:
            return out  # nothing follows a FIN
        if offset == self._next and not self._held and len(payload) == length:
            out.append(Data(offset, payload, ts_ns))  # in order and whole: the common case
            self._next = offset + length
            return out
        heapq.heappush(self._held, (offset, next(self._order), payload, length, ts_ns))
        self._held_bytes += len(payload)
        budget = self.budget
        budget.held += len(payload)
        out += self._drain(ts_ns)
        while self._held_bytes > self.max_held_bytes or (self._held and budget.held > budget.limit):
            out += self._skip_to(self._held[0][0], ts_ns)
        return out

    def acknowledges_unseen(self, ack: int) -> bool:
        """Whether the peer's ``ack`` covers bytes no segment seen so far carried (acknowledging
        it would declare them a gap). A capture can hold a segment after its acknowledgement:
        packets taken on different CPUs or interfaces are written in the order they reached
        the capture, not the order they were sent."""
        if self._isn is None:
            return False
        upto = self._acknowledged_end(ack)
        if upto <= self._next:
            return False
        covered = self._next
        for offset, _, _, length, _ in sorted(self._held):
            if offset > covered:
                break
            covered = max(covered, offset + length)
        return covered < upto

    def acknowledged_if_seen(self, ack: int, ts_ns: int) -> list[Piece] | None:
        """:meth:`acknowledged`, unless ``ack`` covers bytes no segment seen carried: then None,
        and nothing done (see :meth:`acknowledges_unseen`)."""
        isn = self._isn
        if isn is not None:
            ahead = ((ack - isn) % _SEQ_MOD - self._next) % _SEQ_MOD
            if not ahead or ahead >= _HALF:
                return []  # the usual case: nothing past the bytes delivered (checked for every segment)
            if self.acknowledges_unseen(ack):
                return None
        return self.acknowledged(ack, ts_ns)

    def acknowledged(self, ack: int, ts_ns: int) -> list[Piece]:
        """The peer acknowledged everything before ``ack``: bytes not captured by then never will be."""
        if self._isn is None:
            if self._first_ack is None:
                self._first_ack = ack
            if self._last_ack is None or sequence_after(ack, self._last_ack):
                self._last_ack = ack
            return []
        upto = self._acknowledged_end(ack)
        out: list[Piece] = []
        while upto > self._next:
            if self._held and self._held[0][0] <= self._next:
                out += self._drain(ts_ns)
                continue
            out += self._skip_to(min(upto, self._held[0][0]) if self._held else upto, ts_ns)
        return out

    def finish(self, ts_ns: int) -> list[Piece]:
        """The stream is over (FIN, RST, or end of capture): deliver everything still held.

        A direction of which no byte was captured still reports what its acknowledgements
        prove was sent.
        """
        out: list[Piece] = []
        first, last = self._first_ack, self._last_ack
        if self._isn is None and first is not None and last is not None:
            sent = (last - first) % _SEQ_MOD
            if 0 < sent < _HALF:
                out.append(Gap(0, sent, ts_ns))
            return out
        while self._held:
            out += self._skip_to(self._held[0][0], ts_ns)
        if self._end is not None and self._end > self._next:
            out.append(Gap(self._next, self._end - self._next, ts_ns))
            self._next = self._end
        return out

    def _acknowledged_end(self, ack: int) -> int:
        """The offset up to which ``ack`` says data was received."""
        upto = self._unwrap(ack)
        if self._end is not None:
            return min(upto, self._end)  # the FIN takes a sequence number but is no data
        if upto == self._seen_end + 1 and not self._held:
            return upto - 1  # most likely the FIN, its ACK captured before it
        return upto

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
        """Deliver what is in order now; ``now_ns``: the capture time of the packet that made it so
        (the time a snap-length gap is declared; data keeps its own packet's time)."""
        out: list[Piece] = []
        held = self._held
        while held and held[0][0] <= self._next:
            offset, _, payload, length, ts_ns = heapq.heappop(held)
            self._held_bytes -= len(payload)
            self.budget.held -= len(payload)
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
                out.append(Gap(self._next, end - self._next, now_ns))
                self._next = end
        return out
