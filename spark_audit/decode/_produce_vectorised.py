"""Produce frames of the common shape decoded a whole Arrow batch at a time, with numpy
(the vectorised path).

Why: Produce requests and their answers are most of a busy capture, and even the hand
walk of :mod:`._produce_scalar` (plus kafka-python for the answers) costs Python per frame.
Nearly every Produce a client sends carries one topic, one partition and one v2 record
batch, and its answer one topic and one partition; at that shape every field the checks
need sits at an offset that depends on a few lengths only, so it is read for every frame
of the batch at once from the Arrow array's own buffers.

A frame is taken here only if it has exactly that shape and its lengths add up to the
frame's end: versions 3 to 12, no transactional id, no record errors or error message,
no tagged fields, the frame not cut, and in flexible versions (9 and up) one-byte
compact lengths (topic names under 127 bytes) and records under 2 MiB. Anything else is left to
:func:`spark_audit.decode.decode`, which gives the same facts, one frame at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import (
    PRODUCE_FIRST_FLEXIBLE,
    PRODUCE_FIRST_TRANSACTIONAL_ID,
    RECORD_BATCH_HEADER_SIZE,
    RECORD_BATCH_LOG_OVERHEAD,
    ApiKey,
    request_class,
    response_class,
)

FIRST_VERSION = PRODUCE_FIRST_TRANSACTIONAL_ID
"""Older Produce has no transactional id (and v0-v1 answers no throttle time): rare, scalar."""
LAST_VERSION = 12
"""v13 names topics by id: scalar."""
MAX_SHORT_VARINT = 0x7F


@dataclass(frozen=True, slots=True)
class Decoded:
    """Facts columns of the frames taken (``rows``: their positions in the input batch)."""

    rows: np.ndarray
    columns: dict[str, pa.Array]


class _Frames:
    """Big-endian reads at per-frame offsets over chosen rows of one binary array, read in
    place (no frame is copied). ``ok`` marks the frames still of the common shape: a read
    that would leave its frame drops the frame, and a dropped frame is never read again
    (its values are 0)."""

    def __init__(self, frames: pa.Array, lengths: pa.Array, at: np.ndarray | None = None) -> None:
        if frames.type != pa.binary():
            frames = frames.cast(pa.binary())
        _, offsets, data = frames.buffers()
        n = len(frames)
        bounds = np.frombuffer(offsets, dtype=np.int32, count=n + 1, offset=4 * frames.offset)
        rows = np.arange(n) if at is None else at
        self.start = bounds[rows].astype(np.int64)
        self.end = bounds[rows + 1].astype(np.int64)
        self.data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        length = pc.fill_null(lengths, -1).to_numpy(zero_copy_only=False)[rows]
        self.ok = (self.end - self.start == length) & (self.end > self.start)
        if frames.null_count:
            self.ok &= frames.is_valid().to_numpy(zero_copy_only=False)[rows]

    def require(self, condition: np.ndarray) -> None:
        self.ok &= condition

    def unsigned(self, pos: np.ndarray, size: int, where: np.ndarray | bool = True) -> np.ndarray:
        """The ``size``-byte value at ``pos`` in the frames ``where`` applies (elsewhere 0)."""
        use = self.ok & where
        self.ok &= ~use | (pos + size <= self.end)
        use &= self.ok
        everywhere = use.all()
        if not everywhere and not use.any():
            return np.zeros(len(use), np.uint64)
        at = pos if everywhere else np.where(use, pos, 0)
        kind: type[np.unsignedinteger] = np.uint32 if size <= 4 else np.uint64  # fewer bytes moved
        value: np.ndarray = self.data[at].astype(kind)
        for k in range(1, size):
            value = np.bitwise_or(np.left_shift(value, kind(8), out=value), self.data[at + k], out=value)
        out = value.astype(np.uint64)
        if not everywhere:
            out[~use] = 0
        return out

    def signed(self, pos: np.ndarray, size: int, where: np.ndarray | bool = True) -> np.ndarray:
        value = self.unsigned(pos, size, where)
        if size == 8:
            return value.view(np.int64)
        bits = 8 * size
        value = value.astype(np.int64)
        return value - ((value >> (bits - 1)) << bits)

    def short_varint(self, pos: np.ndarray, where: np.ndarray | bool = True) -> np.ndarray:
        """A one-byte unsigned varint (a longer one is not the common shape)."""
        value = self.signed(pos, 1, where) & 0xFF
        self.require(value <= MAX_SHORT_VARINT)
        return value

    def varint(self, pos: np.ndarray, where: np.ndarray | bool = True) -> tuple[np.ndarray, np.ndarray]:
        """An unsigned varint of up to 3 bytes (flexible records under 2 MiB), and its width."""
        value = np.zeros(len(pos), np.int64)
        width = np.zeros(len(pos), np.int64)
        going = self.ok & where
        for k in range(3):
            byte = self.signed(pos + k, 1, going) & 0xFF
            value |= np.where(going, (byte & 0x7F) << (7 * k), 0)
            width = np.where(going, k + 1, width)
            going &= byte > MAX_SHORT_VARINT
        self.require(~going)
        return value, width

    def strings(self, pos: np.ndarray, size: np.ndarray) -> pa.Array:
        """UTF-8 strings of ``size`` bytes at ``pos`` for the frames still ``ok`` (in order);
        a frame whose bytes are not UTF-8 is dropped."""
        rows = np.flatnonzero(self.ok)
        starts, sizes = pos[rows], size[rows]
        offsets = np.zeros(len(rows) + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        index = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(self.data[index].tobytes())]
        raw = pa.Array.from_buffers(pa.binary(), len(rows), buffers)
        try:
            return raw.cast(pa.string())
        except pa.ArrowInvalid:
            valid = np.array([_is_utf8(v) for v in raw.to_pylist()], dtype=bool)
            self.ok[rows[~valid]] = False
            return raw.filter(pa.array(valid)).cast(pa.string())


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _count(f: _Frames, pos: np.ndarray, flexible: np.ndarray) -> np.ndarray:
    """Past the count of an array that must hold exactly one element (int32 1, compact 2)."""
    legacy = f.signed(pos, 4, ~flexible)
    compact = f.short_varint(pos, flexible)
    f.require(np.where(flexible, compact == 2, legacy == 1))
    return pos + np.where(flexible, 1, 4)


def _name(f: _Frames, pos: np.ndarray, flexible: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A non-null string: where its bytes start, their number, and the position after it."""
    size = np.where(flexible, f.short_varint(pos, flexible) - 1, f.signed(pos, 2, ~flexible))
    f.require(size >= 0)
    size = np.maximum(size, 0)
    start = pos + np.where(flexible, 1, 2)
    f.require(start + size <= f.end)
    return start, size, start + size


def _no_tags(f: _Frames, pos: np.ndarray, flexible: np.ndarray) -> np.ndarray:
    """Past an empty tagged-field section (flexible versions only)."""
    f.require(~flexible | (f.short_varint(pos, flexible) == 0))
    return pos + flexible


def _null_string(
    f: _Frames, pos: np.ndarray, flexible: np.ndarray, where: np.ndarray | None = None
) -> np.ndarray:
    """Past a string that must be null (int16 -1, compact 0), in the frames ``where`` has it."""
    where = np.ones(len(pos), dtype=bool) if where is None else where
    legacy = f.signed(pos, 2, where & ~flexible)
    compact = f.short_varint(pos, where & flexible)
    f.require(~where | np.where(flexible, compact == 0, legacy == -1))
    return pos + np.where(where, np.where(flexible, 1, 2), 0)


def _versions(
    api_version: pa.Array, at: np.ndarray | None, is_request: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each frame's version, whether it is one read here, and whether it is flexible."""
    cls = request_class(ApiKey.PRODUCE) if is_request else response_class(ApiKey.PRODUCE)
    last = min(LAST_VERSION, cls.max_version) if cls is not None else -1
    version = pc.fill_null(api_version, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    version = version if at is None else version[at]
    return version, (version >= FIRST_VERSION) & (version <= last), version >= PRODUCE_FIRST_FLEXIBLE


def _topics(f: _Frames, start: np.ndarray, size: np.ndarray) -> pa.Array:
    """Topic names (an empty one is null, as in the scalar decode); call it last."""
    names = f.strings(start, size)
    return pc.if_else(pc.equal(names, ""), pa.nulls(len(names), pa.string()), names)


def _taken(
    f: _Frames, name_at: np.ndarray, name_size: np.ndarray, **values: tuple[np.ndarray, pa.DataType]
) -> Decoded:
    """The frames still of the common shape: their topic, and each of ``values`` (per frame,
    with its Arrow type) at those frames."""
    topic = _topics(f, name_at, name_size)
    rows = np.flatnonzero(f.ok)
    return Decoded(rows, {"topic": topic, **{name: pa.array(v[rows], t) for name, (v, t) in values.items()}})


def decode_requests(frames: pa.RecordBatch, at: np.ndarray | None = None) -> Decoded:
    """``produce_batch`` facts of the Produce requests in ``frames`` (columns ``frame``,
    ``frame_length``, ``api_version``; only the rows ``at``, if given) that have the common
    shape (``rows``: positions in ``at``)."""
    f = _Frames(frames.column("frame"), frames.column("frame_length"), at)
    version, known, flexible = _versions(frames.column("api_version"), at, True)
    f.require(known)
    f.require(f.signed(f.start + 4, 2) == ApiKey.PRODUCE)  # the frame's own header agrees with its row
    f.require(f.signed(f.start + 6, 2) == version)
    client_id = f.signed(f.start + 12, 2)
    f.require(client_id >= -1)  # -1 is a null client id; below that the header is malformed
    pos = _no_tags(f, f.start + 14 + np.maximum(client_id, 0), flexible)
    pos = _null_string(f, pos, flexible)  # transactional id
    acks = f.signed(pos, 2)
    pos = _count(f, pos + 6, flexible)  # acks, timeout
    name_at, name_size, pos = _name(f, pos, flexible)
    pos = _count(f, pos, flexible)
    partition = f.signed(pos, 4)
    legacy_size = f.signed(pos + 4, 4, ~flexible)
    compact_size, width = f.varint(pos + 4, flexible)
    size = np.where(flexible, compact_size - 1, legacy_size)
    batch = pos + 4 + np.where(flexible, width, 4)
    f.require(size >= RECORD_BATCH_HEADER_SIZE)
    f.require(f.signed(batch + 16, 1) == 2)  # magic: a v2 record batch
    f.require(RECORD_BATCH_LOG_OVERHEAD + f.signed(batch + 8, 4) == size)  # exactly one batch
    pos = _no_tags(f, _no_tags(f, _no_tags(f, batch + size, flexible), flexible), flexible)
    f.require(pos == f.end)
    crc = f.unsigned(batch + 17, 4).astype(np.int64)
    producer_id = f.signed(batch + 43, 8)
    epoch = f.signed(batch + 51, 2)
    base_sequence = f.signed(batch + 53, 4)
    record_count = f.signed(batch + 57, 4)
    first_timestamp = f.signed(batch + 27, 8)
    return _taken(
        f,
        name_at,
        name_size,
        partition=(partition, pa.int32()),
        acks=(acks, pa.int16()),
        crc=(crc, pa.int64()),
        producer_id=(producer_id, pa.int64()),
        producer_epoch=(epoch, pa.int16()),
        base_sequence=(base_sequence, pa.int32()),
        record_count=(record_count, pa.int32()),
        first_timestamp=(first_timestamp, pa.int64()),
        batch_length=(size - RECORD_BATCH_LOG_OVERHEAD, pa.int32()),
    )


def decode_responses(frames: pa.RecordBatch, at: np.ndarray | None = None) -> Decoded:
    """``produce_ack`` facts (topic, partition, error code, base offset) of the Produce
    answers in ``frames`` (only the rows ``at``, if given) that have the common shape."""
    f = _Frames(frames.column("frame"), frames.column("frame_length"), at)
    version, known, flexible = _versions(frames.column("api_version"), at, False)
    f.require(known)
    pos = _no_tags(f, f.start + 8, flexible)  # size, correlation id
    pos = _count(f, pos, flexible)
    name_at, name_size, pos = _name(f, pos, flexible)
    pos = _count(f, pos, flexible)
    partition = f.signed(pos, 4)
    error_code = f.signed(pos + 4, 2)
    base_offset = f.signed(pos + 6, 8)
    pos = pos + 22 + np.where(version >= 5, 8, 0)  # index, error, offset, append time; log start
    errors_v8 = version >= 8
    legacy_errors = f.signed(pos, 4, errors_v8 & ~flexible)
    compact_errors = f.short_varint(pos, flexible)
    f.require(~errors_v8 | np.where(flexible, compact_errors == 1, legacy_errors == 0))  # no record errors
    pos = pos + np.where(errors_v8, np.where(flexible, 1, 4), 0)
    pos = _null_string(f, pos, flexible, errors_v8)  # error message
    pos = _no_tags(f, _no_tags(f, pos, flexible), flexible) + 4  # partition, topic tags; throttle time
    pos = _no_tags(f, pos, flexible)
    f.require(pos == f.end)
    return _taken(
        f,
        name_at,
        name_size,
        partition=(partition, pa.int32()),
        error_code=(error_code, pa.int16()),
        offset=(base_offset, pa.int64()),
    )
