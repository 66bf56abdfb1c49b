"""The capture queue: packed records and frame bytes in, Arrow rows out, bounded by rows and bytes."""

from __future__ import annotations

from array import array
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corrfix.capture._columns import (
    _EXTRA_COLUMNS,
    _FRAME_SEQ,
    CLIENT_REQUEST,
    NULL,
    RECORD_SIZE,
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
# Calls of small pieces are joined before their copy, calls whose pieces average 2 KiB or more
# are copied piece by piece (the parametrized test below has each case for certain); the big
# frames are cut from a repeating pattern at a drawn start (random bytes that long make
# drawing too slow for hypothesis's health check on a busy machine).
_PATTERN = bytes(range(251)) * 25
big_frames = st.tuples(st.integers(2048, 6000), st.integers(0, 250)).map(
    lambda drawn: _PATTERN[drawn[1] : drawn[1] + drawn[0]]
)
rows_drawn = st.tuples(
    st.sampled_from([CLIENT_REQUEST, UPSTREAM_RESPONSE, REPAIR]),
    st.one_of(st.none(), st.binary(min_size=0, max_size=300), big_frames),
    st.integers(0, 320),
)
calls_drawn = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(rows_drawn, min_size=1, max_size=6)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    calls=calls_drawn,
    max_rows=st.integers(1, 40),
    max_bytes=st.integers(1, 40_000),
    queued_after=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_each_call_keeps_the_rows_that_fit_in_order_and_counts_the_others(
    calls, max_rows, max_bytes, queued_after
):
    """Against a model that admits row by row: a call's first rows that fit are queued with
    their own bytes (in one piece or two) and connection, the rest are lost and counted by kind,
    whether each call is queued on its own or several (a relay pass's) in one step."""
    queue = RowColumns(max_rows=max_rows, max_bytes=max_bytes)
    pending: tuple[list, bytearray, list] = ([], bytearray(), [])
    expected: list[tuple[str, int, int, bytes | None]] = []
    lost: Counter[str] = Counter()
    rows_used = bytes_used = frames_used = 0
    seq = 0
    for call, (connection, rows) in enumerate(calls):
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
        pending[0].append((connection, len(records) // RECORD_SIZE))
        pending[1].extend(records)
        pending[2].extend(frames)
        if queued_after[call] or call == len(calls) - 1:
            queue.extend(*pending, [])
            pending = ([], bytearray(), [])

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


_LONG = _PATTERN * 12  # 75 KiB


@pytest.mark.parametrize(
    "pieces_per_row",
    [
        pytest.param([[_LONG[:1024], _LONG[1024:16384]]], id="16-KiB-head-and-rest"),
        pytest.param([[_LONG[:3072]], [_LONG[5:3077]]], id="two-frames-of-3-KiB"),
        pytest.param([[_LONG[:100], _LONG[100:5120]], [_LONG[9:2100], b""]], id="split-5-KiB"),
        pytest.param([[_LONG[:40_000]], [_LONG[:100]], [_LONG[1:30_000]]], id="over-64-KiB"),
        pytest.param([[_LONG[i : i + 40]] for i in range(0, 400, 40)], id="many-small"),
    ],
)
def test_a_calls_pieces_are_queued_in_order_joined_or_one_by_one(pieces_per_row):
    """Each way of copying a call's pieces (joined when small, one by one when they average a
    few KiB) gives every row its own bytes."""
    queue = RowColumns(max_rows=100, max_bytes=1 << 24)
    records, pieces = bytearray(), []
    for seq, row_pieces in enumerate(pieces_per_row):
        stored = sum(map(len, row_pieces))
        records += pack_row(seq, 0, 0, NULL, NULL, seq, NULL, stored, CLIENT_REQUEST, stored)
        pieces += row_pieces
    queue.extend([("a", len(records) // RECORD_SIZE)], records, pieces, [])
    written = record_batch(queue.take(), SCHEMA, "t", "proxy").to_pylist()
    assert [row["frame"] for row in written] == [b"".join(row_pieces) for row_pieces in pieces_per_row]


def test_a_closed_queue_takes_nothing_and_counts_everything():
    queue = RowColumns(max_rows=100, max_bytes=1 << 20)
    queue.close()
    records = pack_row(0, 1, 2, 3, 4, 5, 6, 3, CLIENT_REQUEST, 3) + pack_row(
        1, 1, 2, 3, 4, 5, 6, NULL, REPAIR, -1
    )
    queue.extend([("a", len(records) // RECORD_SIZE)], bytearray(records), [b"abc"], [])
    assert queue.take().rows == 0
    assert queue.lost_by_kind == Counter({"frame": 1, "repair": 1})


def test_a_call_that_fails_half_queued_leaves_the_queue_as_it_was_and_counts_its_rows():
    """A call whose frame bytes cannot be copied (a bug: a piece whose ``len`` counts items,
    not bytes) after its records went in: none of its rows stay queued, all are counted lost,
    and the calls before and after it convert as if it had never come."""
    queue = RowColumns(max_rows=100, max_bytes=1 << 20)

    def call(seq: int, stored: int) -> bytearray:
        return bytearray(pack_row(seq, 0, 0, NULL, NULL, seq, NULL, stored, CLIENT_REQUEST, stored))

    queue.extend([("a", 1)], call(0, 3), [b"abc"], [])
    items = memoryview(array("i", [1, 2, 3]))  # len 3, 12 bytes
    with pytest.raises(IndexError):
        queue.extend([("b", 2)], call(1, 3) + call(2, 3), [b"def", items], [])
    assert (queue.accepted, queue.lost, queue.lost_by_kind) == (1, 2, {"frame": 2})
    queue.extend([("c", 1)], call(3, 3), [b"ghi"], [])
    rows = record_batch(queue.take(), SCHEMA, "t", "proxy").to_pylist()
    assert [(row["connection_id"], row["seq"], row["frame"]) for row in rows] == [
        ("a", 0, b"abc"),
        ("c", 3, b"ghi"),
    ]


def test_frame_seq_names_the_frame_seq_item_of_an_extra() -> None:
    assert _EXTRA_COLUMNS[_FRAME_SEQ] == "frame_seq"
