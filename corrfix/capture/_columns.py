"""Capture rows held column by column between the relay and the writer thread, bounded.

The recorder packs each row as one fixed-width record (the numbers: sequence, times, ids,
lengths, the size of its frame copy) with one ``struct`` call, into one ``bytearray`` per
call; the queue appends those records whole and the frames' bytes, up to the snap length,
into one buffer (a call's small frames joined first: one copy call per call), with no
object per row and the connection once per call. The few values only some rows have
(addresses, repair event, reason, attempt, a re-send's id, the row whose frame bytes a row
shares) go to a short side list. The writer thread swaps the buffers out under a lock held
for that swap alone, and :func:`record_batch` turns them into an Arrow record batch with
numpy and ``pa.Array.from_buffers``, without Python code per row, so it holds the GIL only
briefly.

Bounded: a row that would take the queue past ``max_rows`` rows, or ``max_bytes`` bytes
(frame copies plus a fixed charge per row), is dropped and counted by kind, never waited
for. A warning is logged at most every 10 seconds.
"""

from __future__ import annotations

import mmap
import struct
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc  # here, not on the first batch: its import takes a third of a second
import structlog

from corrfix.capture.format import BINARY_MAX_BYTES, Direction, RowKind, Side

log = structlog.get_logger("corrfix.capture")

ROW_OVERHEAD = 256
"""Bytes a queued row is charged besides its frame copy, for the queue's byte budget."""
WARNING_INTERVAL = 10.0
"""At most one "rows lost" warning per this many seconds."""
NULL = -(1 << 62)
"""An integer field that is null (every nullable column is narrower than 63 bits)."""
MAX_FRAME_BYTES = BINARY_MAX_BYTES
"""Frame bytes one swap may hold: they become one Arrow ``binary`` array."""
_JOIN_BELOW = 64 * 1024
"""A call's pieces holding more bytes than this in all are copied one by one."""
_JOIN_PIECE = 2048
"""A call's pieces, when they hold up to ``_JOIN_BELOW`` bytes in all and fewer than
``_JOIN_PIECE`` on average, are joined and copied in one call: joining copies them once
more, which costs less than a Python step per small piece, but more than that step for a
piece of a few KiB (a call with a 16 KiB frame, into a buffer larger than the caches:
4.9 µs per call joined against 3.2 µs piece by piece, measured)."""

# What a row is: its kind, side and direction in one code, the index into these tables.
SHAPES: tuple[tuple[RowKind, Side | None, Direction | None], ...] = (
    (RowKind.FRAME, Side.CLIENT, Direction.REQUEST),
    (RowKind.FRAME, Side.UPSTREAM, Direction.REQUEST),
    (RowKind.FRAME, Side.UPSTREAM, Direction.RESPONSE),
    (RowKind.FRAME, Side.CLIENT, Direction.RESPONSE),
    (RowKind.OPEN, None, None),
    (RowKind.CLOSE, None, None),
    (RowKind.REPAIR, None, None),
)
CLIENT_REQUEST, UPSTREAM_REQUEST, UPSTREAM_RESPONSE, CLIENT_RESPONSE, OPEN, CLOSE, REPAIR = range(len(SHAPES))
_KIND_NAMES = [kind.value for kind, _, _ in SHAPES]

_RECORD = struct.Struct("<qqqqqqqqBq")
"""One row as the recorder packs it: seq, wall_ns, mono_ns, api_key, api_version, client id,
upstream id, frame_length, shape, then the bytes of its frame copy (-1: no frame). Integers
that are null are :data:`NULL`."""
RECORD_SIZE = _RECORD.size
pack_row = _RECORD.pack
"""Pack one row's record (the recorder appends records to a ``bytearray``)."""
STORED_AT = RECORD_SIZE - 8
"""Where a record's frame-copy size is, for :data:`STORED` (a row that comes to share its bytes)."""
STORED = struct.Struct("<q")
_DTYPE = np.dtype(
    [
        ("seq", "<i8"),
        ("wall_ns", "<i8"),
        ("mono_ns", "<i8"),
        ("api_key", "<i8"),
        ("api_version", "<i8"),
        ("client_correlation_id", "<i8"),
        ("upstream_correlation_id", "<i8"),
        ("frame_length", "<i8"),
        ("shape", "u1"),
        ("stored", "<i8"),
    ]
)
if _DTYPE.itemsize != RECORD_SIZE:
    raise ImportError("capture record layout and dtype disagree")

Extra = tuple[str | None, str | None, str | None, str | None, int | None, int | None, int | None]
"""What only some rows have: (client_address, upstream_address, event, reason, attempt,
new_upstream_correlation_id, frame_seq)."""
_EXTRA_COLUMNS = (
    "client_address",
    "upstream_address",
    "event",
    "reason",
    "attempt",
    "new_upstream_correlation_id",
    "frame_seq",
)
_FRAME_SEQ: Final = 6
"""Where ``frame_seq`` is in an :data:`Extra` (one further on in a queued extra, after its row);
a literal, so that a type checker knows the item is an ``int | None``."""


@dataclass
class RowChunk:
    """The rows one swap took from the queue."""

    records: bytearray
    frames: memoryview
    connections: list[str]
    run_slots: list[int]  # each run's connection (an index into connections) ...
    run_rows: list[int]  # ... and how many consecutive rows it holds
    extras: list[tuple[int, *Extra]]  # the row's index first
    rows: int
    buffer: mmap.mmap

    def kinds(self, start: int = 0, stop: int | None = None) -> Counter[str]:
        """Rows per kind, for counting lost rows."""
        return _kinds(np.frombuffer(self.records, _DTYPE)["shape"][start:stop])

    def frame_sizes_agree(self) -> bool:
        """Whether the records' frame sizes add up to the frame bytes held (Arrow trusts them)."""
        return int(self.frame_bytes().sum()) == len(self.frames)

    def connection_slots(self) -> np.ndarray:
        """Each row's connection, as an index into ``connections``."""
        return np.repeat(np.asarray(self.run_slots, np.int32), np.asarray(self.run_rows, np.int64))

    def shared_spans(self) -> tuple[np.ndarray, np.ndarray] | None:
        """First and last row of each pair of rows sharing frame bytes (None: no such pair).
        The rows of one run are consecutive, with consecutive ``seq``, and a pair is always
        within one, so the other row is as far away in the chunk as in ``seq``."""
        at = _FRAME_SEQ + 1
        shared = [(extra[0], extra[at]) for extra in self.extras if extra[at] is not None]
        if not shared:
            return None
        rows, holders = np.array(shared, np.int64).T
        seq = np.frombuffer(self.records, _DTYPE)["seq"]
        others = rows + holders - seq[rows]
        inside = (others >= 0) & (others < self.rows)
        inside[inside] = seq[others[inside]] == holders[inside]
        rows, others = rows[inside], others[inside]
        if not len(rows):
            return None
        return np.minimum(rows, others), np.maximum(rows, others)

    def frame_bytes(self) -> np.ndarray:
        """Bytes of frame copy per row."""
        return np.maximum(np.frombuffer(self.records, _DTYPE)["stored"], 0)


def _next_bytes(
    pieces: list[bytes | bytearray | memoryview], start: int, size: int
) -> tuple[list[bytes | bytearray | memoryview], int]:
    """The pieces from ``start`` on that hold the next ``size`` bytes, and where the rest begin."""
    total, end = 0, start
    while total < size:
        total += len(pieces[end])
        end += 1
    return pieces[start:end], end


def kinds_of(records: bytearray) -> Counter[str]:
    """Rows per kind of packed records, for counting them lost."""
    return _kinds(np.frombuffer(records, _DTYPE)["shape"])


def _kinds(shapes: np.ndarray) -> Counter[str]:
    counts = np.bincount(shapes, minlength=len(SHAPES))
    found: Counter[str] = Counter()
    for shape, count in enumerate(counts.tolist()):
        if count:
            found[_KIND_NAMES[shape]] += count
    return found


class RowColumns:
    """Rows waiting for the writer thread, bounded by count and bytes; full means dropped."""

    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._wake_rows = max(1, max_rows // 4)
        self._wake_bytes = max(1, max_bytes // 4)
        self._capacity = min(max_bytes, MAX_FRAME_BYTES)
        self._spare: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.closed = False
        self.accepted = 0
        self.lost = 0
        self.lost_by_kind: Counter[str] = Counter()
        self.wake = threading.Event()
        self._lost_since_warning = 0
        self._next_warning = 0.0
        self._reset()

    def _reset(self) -> None:
        self._records = bytearray()
        # Anonymous memory that never moves (a growing bytearray is copied on every reallocation:
        # 10 µs per 16 KiB frame), reused once written (a page's first touch costs a fault).
        self._frames = self._spare.pop() if self._spare else mmap.mmap(-1, self._capacity)
        self._end = 0
        self._connections: list[str] = []
        self._slots: dict[str, int] = {}
        self._run_slots: list[int] = []
        self._run_rows: list[int] = []
        self._extras: list[tuple[int, *Extra]] = []
        self._rows = 0
        self._bytes = 0

    def extend(
        self,
        runs: list[tuple[str, int]],
        records: bytearray,
        frames: list[bytes | bytearray | memoryview],
        extras: list[tuple[int, Extra]],
    ) -> None:
        """Rows of one or more connections: which connection each run of consecutive rows is
        of (a connection may have several runs), their records packed by :data:`pack_row`,
        the bytes of their frames in order (in pieces, already cut to the snap length; a
        row's pieces add up to its record's size, and a row may span several), and what only
        some rows have, by the row's index.
        One lock and one bound check for them all; when they do not all fit, each run (one
        call's rows) keeps its first rows that fit, in order, and loses the others, as if
        each had been queued on its own.
        Every row given is queued or counted lost, once, even when this raises (a bug): the
        rows not queued by then are counted, so the caller has none left to count."""
        dropped = False
        with self._lock:
            pending = records  # rows neither queued nor counted lost yet
            try:
                rows = len(records) // RECORD_SIZE
                stored = sum(map(len, frames))
                size = ROW_OVERHEAD * rows + stored
                if (
                    self.closed
                    or self._rows + rows > self.max_rows
                    or self._bytes + size > self.max_bytes
                    or self._end + stored > self._capacity
                ):
                    dropped = True
                    runs, records, frames, extras, lost = self._fitting(runs, records, rows, frames, extras)
                    pending = records
                    self._lose(lost)
                    rows = len(records) // RECORD_SIZE
                    stored = sum(map(len, frames))
                    size = ROW_OVERHEAD * rows + stored
                wake = self._queue(runs, records, rows, frames, stored, extras, size) if rows else False
            except BaseException:
                self._lose(kinds_of(pending))  # _queue left none of them queued
                raise
        if dropped:
            self._maybe_warn()
        if wake and not self.wake.is_set():
            self.wake.set()

    def _fitting(
        self,
        runs: list[tuple[str, int]],
        records: bytearray,
        rows: int,
        frames: list[bytes | bytearray | memoryview],
        extras: list[tuple[int, Extra]],
    ) -> tuple[
        list[tuple[str, int]],
        bytearray,
        list[bytes | bytearray | memoryview],
        list[tuple[int, Extra]],
        Counter[str],
    ]:
        """Each run's first rows that fit, after the runs before it (the lock held), and the
        others by kind, for the caller to count lost once this has not failed. A run is one
        call's rows: a big row that does not fit costs the rest of its own call, never
        another connection's rows."""
        table = np.frombuffer(records, _DTYPE, rows)
        copies = np.maximum(table["stored"], 0)
        seq, shapes = table["seq"], table["shape"]
        kept_runs: list[tuple[str, int]] = []
        kept_records = bytearray()
        kept_frames: list[bytes | bytearray | memoryview] = []
        kept_extras: list[tuple[int, Extra]] = []
        lost: Counter[str] = Counter()
        used_rows, used_bytes, used_end = self._rows, self._bytes, self._end
        start = piece = kept = 0
        for connection, run in runs:
            stop = start + run
            run_copies = copies[start:stop]
            fit = 0
            if not self.closed:
                fits = (used_bytes + np.cumsum(ROW_OVERHEAD + run_copies) <= self.max_bytes) & (
                    used_end + np.cumsum(run_copies) <= self._capacity
                )
                fit = min(run if fits.all() else int(fits.argmin()), max(0, self.max_rows - used_rows))
            run_pieces, piece = _next_bytes(frames, piece, int(run_copies.sum()))
            if fit:
                fit_bytes = int(run_copies[:fit].sum())
                kept_runs.append((connection, fit))
                kept_records += records[start * RECORD_SIZE : (start + fit) * RECORD_SIZE]
                kept_frames += _next_bytes(run_pieces, 0, fit_bytes)[0]
                # A row naming a row not queued (frame_seq) keeps its head alone.
                kept_extras += [
                    (kept + i - start, extra)
                    for i, extra in extras
                    if start <= i < start + fit
                    and (extra[_FRAME_SEQ] is None or i + extra[_FRAME_SEQ] - int(seq[i]) < start + fit)
                ]
                used_rows += fit
                used_bytes += ROW_OVERHEAD * fit + fit_bytes
                used_end += fit_bytes
                kept += fit
            if fit < run:
                lost.update(_kinds(shapes[start + fit : stop]))
            start = stop
        return kept_runs, kept_records, kept_frames, kept_extras, lost

    def _queue(
        self,
        runs: list[tuple[str, int]],
        records: bytearray,
        rows: int,
        frames: list[bytes | bytearray | memoryview],
        stored: int,
        extras: list[tuple[int, Extra]],
        size: int,
    ) -> bool:
        """Append the rows (the lock held), all of them or, when this raises, none: a half
        appended call would leave records, frame bytes and counts that disagree, and the
        writer could not convert the swap that holds it. Returns whether the writer should wake."""
        count = self._rows
        had_connections, had_runs, had_extras = (
            len(self._connections),
            len(self._run_slots),
            len(self._extras),
        )
        try:
            slots = self._slots
            for connection, run in runs:
                slot = slots.get(connection)
                if slot is None:
                    slot = slots[connection] = len(self._connections)
                    self._connections.append(connection)
                self._run_slots.append(slot)
                self._run_rows.append(run)
            self._records += records
            if frames:  # bytes past _end are not queued until _end moves
                buffer, end = self._frames, self._end
                if len(frames) > 1 and stored <= _JOIN_BELOW and stored < _JOIN_PIECE * len(frames):
                    buffer[end : end + stored] = b"".join(frames)
                else:
                    for frame in frames:
                        start, end = end, end + len(frame)
                        buffer[start:end] = frame
            if extras:
                self._extras += [(count + i, *extra) for i, extra in extras]
        except BaseException:
            for connection in self._connections[had_connections:]:
                del self._slots[connection]
            del self._connections[had_connections:], self._run_slots[had_runs:], self._run_rows[had_runs:]
            del self._records[count * RECORD_SIZE :], self._extras[had_extras:]
            raise
        self._end += stored
        self._rows = count = count + rows
        self._bytes += size
        self.accepted += rows
        return count >= self._wake_rows or self._bytes >= self._wake_bytes

    def _lose(self, kinds: Counter[str]) -> None:
        rows = sum(kinds.values())
        self.lost += rows
        self._lost_since_warning += rows
        self.lost_by_kind.update(kinds)

    def close(self) -> None:
        """From now on every row is dropped (and counted)."""
        with self._lock:
            self.closed = True

    def take(self) -> RowChunk:
        """Everything queued; the relay appends to fresh buffers from now on."""
        with self._lock:
            frames = memoryview(self._frames)[: self._end]
            chunk = RowChunk(
                self._records,
                frames,
                self._connections,
                self._run_slots,
                self._run_rows,
                self._extras,
                self._rows,
                self._frames,
            )
            self._reset()
        return chunk

    def recycle(self, chunk: RowChunk) -> None:
        """The chunk is written: its frame buffer may take new rows, unless Arrow still holds it."""
        try:
            chunk.frames.release()
        except BufferError:
            return
        with self._lock:
            if not self._spare:
                self._spare.append(chunk.buffer)

    def count_lost(self, kinds: Counter[str]) -> None:
        """Rows that were queued but could not be written."""
        with self._lock:
            self._lose(kinds)
        self._maybe_warn()

    def _maybe_warn(self) -> None:
        now = time.monotonic()
        if now < self._next_warning:
            return
        with self._lock:
            lost, self._lost_since_warning = self._lost_since_warning, 0
            self._next_warning = now + WARNING_INTERVAL
            total = self.lost
        if lost:
            log.warning("capture rows lost", lost=lost, lost_total=total, queue_rows=self.max_rows)


# -- the writer thread's side ----------------------------------------------------------


def _validity(valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    nulls = int(valid.size - np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _numbers(values: np.ndarray, arrow_type: pa.DataType, dtype: str) -> pa.Array:
    valid = values != NULL
    bitmap, nulls = _validity(valid)
    data = np.where(valid, values, 0).astype(dtype) if nulls else values.astype(dtype)
    return pa.Array.from_buffers(arrow_type, len(values), [bitmap, pa.py_buffer(data)], null_count=nulls)


def _scattered(rows: int, at: Sequence[int], values: Sequence[object], arrow_type: pa.DataType) -> pa.Array:
    """A column null but at the rows ``at``, which hold ``values``."""
    if not any(value is not None for value in values):
        return pa.nulls(rows, arrow_type)
    indices = np.zeros(rows, np.int32)
    indices[np.asarray(at, np.int64)] = np.arange(1, len(values) + 1, dtype=np.int32)
    return pc.take(pa.array([None, *values], arrow_type), indices)


_KINDS = pa.array(_KIND_NAMES, pa.string())
_SIDES = pa.array([side and side.value for _, side, _ in SHAPES], pa.string())
_DIRECTIONS = pa.array([direction and direction.value for _, _, direction in SHAPES], pa.string())


def record_batch(chunk: RowChunk, schema: pa.Schema, capture_id: str, source: str) -> pa.RecordBatch:
    """The chunk's rows as one record batch of the capture schema (no Python per row)."""
    n = chunk.rows
    if not chunk.frame_sizes_agree():
        raise ValueError("capture rows name more or fewer frame bytes than were queued")
    records = np.frombuffer(chunk.records, _DTYPE)
    shapes = pa.array(records["shape"])
    columns: dict[str, pa.Array] = {
        "capture_id": pa.repeat(capture_id, n),
        "source": pa.repeat(source, n),
        "connection_id": pc.take(pa.array(chunk.connections, pa.string()), chunk.connection_slots()),
        "seq": pa.array(records["seq"]),
        "kind": pc.take(_KINDS, shapes),
        "side": pc.take(_SIDES, shapes),
        "direction": pc.take(_DIRECTIONS, shapes),
        "wall_ns": pa.array(records["wall_ns"]),
        "mono_ns": pa.array(records["mono_ns"]),
        "api_key": _numbers(records["api_key"], pa.int16(), "<i2"),
        "api_version": _numbers(records["api_version"], pa.int16(), "<i2"),
        "client_correlation_id": _numbers(records["client_correlation_id"], pa.int32(), "<i4"),
        "upstream_correlation_id": _numbers(records["upstream_correlation_id"], pa.int32(), "<i4"),
        "frame_length": _numbers(records["frame_length"], pa.int32(), "<i4"),
    }
    copies = records["stored"]
    has_frame = copies >= 0
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    np.cumsum(np.maximum(copies, 0), out=offsets[1:])
    bitmap, nulls = _validity(has_frame)
    columns["frame"] = pa.Array.from_buffers(
        pa.binary(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(chunk.frames)], null_count=nulls
    )
    at = [extra[0] for extra in chunk.extras]
    for position, name in enumerate(_EXTRA_COLUMNS, start=1):
        values = [extra[position] for extra in chunk.extras]
        columns[name] = _scattered(n, at, values, schema.field(name).type)
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)
