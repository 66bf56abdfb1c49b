"""Produce ``acks`` read from the frames' own Arrow buffers with numpy: no copy, no Python
per frame.

acks=0 is the only request that gets no answer, so the pairing needs it. It sits at an
offset that depends only on the client id's length, the header's tagged fields and the
transactional id. Anything unusual (tagged fields in the header, a transactional id of
127 bytes or more, a cut frame) gives -1, which counts as "expects an answer".
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from protocol import PRODUCE_FIRST_FLEXIBLE, PRODUCE_FIRST_TRANSACTIONAL_ID

CLIENT_ID_LENGTH_AT = 12
"""size (4), api key (2), version (2), correlation id (4): then the client id's length."""
UNKNOWN = -1


class _Bytes:
    """Big-endian reads at per-frame offsets into chosen rows of one binary array."""

    def __init__(self, frames: pa.Array, rows: np.ndarray) -> None:
        _, offsets, data = frames.buffers()
        bounds = np.frombuffer(offsets, dtype=np.int32, count=len(frames) + 1, offset=4 * frames.offset)
        self.start = bounds[rows].astype(np.int64)
        self.end = bounds[rows + 1].astype(np.int64)
        if frames.null_count:
            valid = np.asarray(frames.is_valid().to_numpy(zero_copy_only=False))[rows]
            self.end = np.where(valid, self.end, self.start)
        self.data = (
            np.frombuffer(data, dtype=np.uint8) if data is not None and data.size else np.zeros(1, np.uint8)
        )

    def unsigned(self, pos: np.ndarray, size: int, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The value at ``pos`` (relative to each frame) and whether it could be read."""
        at = self.start + pos
        ok = where & (pos >= 0) & (at + size <= self.end)
        everywhere = bool(ok.all())
        if not everywhere:  # the others read byte 0 (or the last): in bounds, then zeroed
            at = np.minimum(np.where(ok, at, 0), len(self.data) - size)
        value = self.data[at].astype(np.int32)  # two bytes at most: int32 moves half of int64
        for k in range(1, size):
            value = (value << 8) | self.data[at + k]
        value = value.astype(np.int64)
        return (value if everywhere else np.where(ok, value, 0)), ok

    def int16(self, pos: np.ndarray, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        value, ok = self.unsigned(pos, 2, where)
        return value - ((value >> 15) << 16), ok


def produce_acks(frames: pa.Array, rows: np.ndarray, versions: np.ndarray) -> np.ndarray:
    """acks of the Produce request frames at ``rows`` of ``frames`` (``versions``: their api
    versions), or -1 where it cannot be read."""
    if len(rows) == 0:
        return np.zeros(0, np.int64)
    if frames.type != pa.binary():
        frames = frames.cast(pa.binary())
    b = _Bytes(frames, rows)
    everywhere = np.ones(len(rows), bool)
    client_id, ok = b.int16(np.full(len(rows), CLIENT_ID_LENGTH_AT, np.int64), everywhere)
    after = 14 + np.maximum(client_id, 0)
    flexible = versions >= PRODUCE_FIRST_FLEXIBLE
    tags, tags_ok = b.unsigned(after, 1, ok & flexible)
    ok &= ~flexible | (tags_ok & (tags == 0))
    body = np.where(flexible, after + 1, after)
    compact, compact_ok = b.unsigned(body, 1, ok & flexible)
    legacy, legacy_ok = b.int16(body, ok & ~flexible & (versions >= PRODUCE_FIRST_TRANSACTIONAL_ID))
    old = versions < PRODUCE_FIRST_TRANSACTIONAL_ID
    acks_at = np.select(
        [old, ~flexible, compact == 0],
        [body, body + 2 + np.maximum(legacy, 0), body + 1],
        body + compact,
    )
    ok &= old | np.where(flexible, compact_ok & (compact < 128), legacy_ok)
    acks, acks_ok = b.int16(acks_at, ok)
    return np.where(acks_ok, acks, UNKNOWN)
