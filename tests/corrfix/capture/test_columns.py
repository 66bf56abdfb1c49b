"""The capture queue: packed records and frame bytes in, Arrow rows out, bounded by rows and bytes."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from corrfix.capture._columns import (
    CLIENT_REQUEST,
    NULL,
    REPAIR,
    ROW_OVERHEAD,
    SHAPES,
    UPSTREAM_RESPONSE,
    RowColumns,
    pack_row,
    record_batch,
)
from corrfix.capture.format import Source, schema_for

SCHEMA = schema_for("t", Source.PROXY)

# A drawn row: (shape, frame bytes or None for a row without a frame, where its bytes are
# split in two pieces: 0 for one piece; the second piece may be empty, as a recorder's is).
# Small frames are joined before their copy, frames of a few KiB copied piece by piece.
rows_drawn = st.tuples(
    st.sampled_from([CLIENT_REQUEST, UPSTREAM_RESPONSE, REPAIR]),
    st.one_of(st.none(), st.binary(min_size=0, max_size=300), st.binary(min_size=2048, max_size=6000)),
    st.integers(0, 320),
)
calls_drawn = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(rows_drawn, min_size=1, max_size=6)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(calls=calls_drawn, max_rows=st.integers(1, 40), max_bytes=st.integers(1, 40_000))
def test_each_call_keeps_the_rows_that_fit_in_order_and_counts_the_others(calls, max_rows, max_bytes):
    """Against a model that admits row by row: a call's first rows that fit are queued with
    their own bytes (in one piece or two) and connection, the rest are lost and counted by kind."""
    queue = RowColumns(max_rows=max_rows, max_bytes=max_bytes)
    expected: list[tuple[str, int, int, bytes | None]] = []
    lost: Counter[str] = Counter()
    rows_used = bytes_used = frames_used = 0
    seq = 0
    for connection, rows in calls:
        records, frames = bytearray(), []
        admitting = True
        for shape, frame, split in rows:
            stored = -1 if frame is None else len(frame)
            records += pack_row(seq, seq * 10, seq * 7, NULL, NULL, seq, NULL, stored, shape, stored)
            if frame is not None:
                frames += [frame[:split], frame[split:]] if split else [frame]
            cost = ROW_OVERHEAD + max(stored, 0)
            admitting = (
                admitting
                and rows_used + 1 <= max_rows
                and bytes_used + cost <= max_bytes
                and frames_used + max(stored, 0) <= max_bytes
            )
            if admitting:
                rows_used, bytes_used, frames_used = (
                    rows_used + 1,
                    bytes_used + cost,
                    frames_used + max(stored, 0),
                )
                expected.append((connection, seq, shape, frame))
            else:
                lost[SHAPES[shape][0].value] += 1
            seq += 1
        queue.extend(connection, records, frames, [])

    chunk = queue.take()
    assert chunk.rows == len(expected)
    assert queue.lost == sum(lost.values()) and queue.lost_by_kind == lost
    if not expected:
        return
    written = record_batch(chunk, SCHEMA, "t", "proxy").to_pylist()
    got = [(row["connection_id"], row["seq"], row["kind"], row["frame"]) for row in written]
    assert got == [(c, s, SHAPES[shape][0].value, frame) for c, s, shape, frame in expected]
    assert [row["client_correlation_id"] for row in written] == [s for _, s, _, _ in expected]
    assert all(row["api_key"] is None for row in written)


def test_a_closed_queue_takes_nothing_and_counts_everything():
    queue = RowColumns(max_rows=100, max_bytes=1 << 20)
    queue.close()
    records = pack_row(0, 1, 2, 3, 4, 5, 6, 3, CLIENT_REQUEST, 3) + pack_row(
        1, 1, 2, 3, 4, 5, 6, NULL, REPAIR, -1
    )
    queue.extend("a", bytearray(records), [b"abc"], [])
    assert queue.take().rows == 0
    assert queue.lost_by_kind == Counter({"frame": 1, "repair": 1})
