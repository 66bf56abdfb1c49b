"""Row filters and frame trims, applied in Arrow before rows reach Spark (no Spark here)."""

from __future__ import annotations

import pyarrow as pa

from corrfix.capture.format import CAPTURE_SCHEMA
from spark_audit.source import FrameTrim, RowFilter
from spark_audit.source._batches import shape
from tests.support.audit_builders import row


def batch(rows):
    return pa.RecordBatch.from_pylist(rows, schema=CAPTURE_SCHEMA)


ROWS = [
    row("c", 0, "open"),
    row("c", 1, side="client", direction="request", api_key=0, frame=b"client-request"),
    row("c", 2, side="upstream", direction="request", api_key=0, frame=b"upstream-request"),
    row("c", 3, side="upstream", direction="response", api_key=3, frame=b"upstream-response"),
    row("w", 1, source="wire", side="client", direction="request", api_key=0, frame=b"wire-request"),
    row("c", 4, "repair", event="requeue"),
]


def test_broker_side_keeps_upstream_frames_of_proxy_captures_and_all_frames_of_wire_ones():
    kept = RowFilter(kinds=frozenset({"frame"}), broker_side=True).apply(batch(ROWS))
    assert [(r["connection_id"], r["seq"]) for r in kept.to_pylist()] == [("c", 2), ("c", 3), ("w", 1)]


def test_filters_combine_and_round_trip_through_data_source_options():
    rows = RowFilter(api_keys=frozenset({0}), directions=frozenset({"request"}), broker_side=True)
    assert RowFilter.from_options(rows.options()) == rows
    assert [r["seq"] for r in rows.apply(batch(ROWS)).to_pylist()] == [2, 1]
    assert RowFilter().apply(batch(ROWS)).num_rows == len(ROWS)


def test_frame_trim_keeps_the_head_of_chosen_frames_only():
    trim = FrameTrim(api_keys=frozenset({0}), directions=frozenset({"request"}), max_bytes=6)
    assert FrameTrim.from_options(trim.options()) == trim
    frames = trim.apply(batch(ROWS)).column("frame").to_pylist()
    assert frames == [None, b"client", b"upstre", None, b"wire-r", None]


def test_a_client_frame_stored_once_comes_back_whole_even_when_its_upstream_row_is_filtered_out():
    upstream = b"\x00\x00\x0b\xb4" + bytes(range(256)) * 12  # 3,076 bytes
    head = b"\x00\x00\x0b\xb4" + b"h" * 508
    rows = [
        row("c", 1, side="client", direction="request", api_key=0, frame=head, frame_seq=2),
        row("c", 2, side="upstream", direction="request", api_key=0, frame=upstream),
    ]
    kept = shape(batch(rows), CAPTURE_SCHEMA, RowFilter(sides=frozenset({"client"})))
    assert kept is not None
    assert kept.column("frame").to_pylist() == [head + upstream[512:]]
