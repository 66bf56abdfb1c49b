"""The recorder: a failure while recording costs that call's rows, never the relay's connection."""

from __future__ import annotations

import pytest

from corrfix.capture._columns import RowColumns, record_batch
from corrfix.capture._recorder import Recorder
from corrfix.capture.format import Source, schema_for
from protocol import ApiKey
from protocol.testing import request_frame, response_frame
from tests.support.capture_shell import Shell


def rows_of(columns: RowColumns) -> list[dict]:
    return record_batch(columns.take(), schema_for("t", Source.PROXY), "t", "proxy").to_pylist()


def test_a_failing_call_loses_its_rows_counted_and_the_next_call_records_cleanly(monkeypatch):
    columns = RowColumns(max_rows=1000, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    shell = Shell(recorder)
    shell.open()
    real = Recorder._upstream_request

    def broken(self, *args):
        real(self, *args)  # its row is packed, then the call fails
        raise RuntimeError("a bug in recording")

    monkeypatch.setattr(Recorder, "_upstream_request", broken)
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0))  # does not raise
    assert shell.sent, "the request still went upstream"
    assert columns.lost == 2 and columns.lost_by_kind == {"frame": 2}
    monkeypatch.setattr(Recorder, "_upstream_request", real)

    shell.broker_answers(response_frame(0, 7))
    rows = rows_of(columns)
    assert [(row["kind"], row["side"], row["direction"]) for row in rows] == [
        ("open", None, None),
        ("frame", "upstream", "response"),
        ("frame", "client", "response"),
    ]
    assert all(row["connection_id"] == "c1" for row in rows)
    assert [row["seq"] for row in rows] == [0, 3, 4]  # the lost rows keep their numbers


def test_a_call_that_fails_before_packing_a_row_still_counts_every_row_it_loses(monkeypatch):
    columns = RowColumns(max_rows=1000, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    shell = Shell(recorder)
    shell.open()

    def broken(self, *args):
        raise RuntimeError("a bug in recording")

    monkeypatch.setattr(Recorder, "_client_request", broken)
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0), request_frame(ApiKey.METADATA, 8, 1))
    assert columns.lost == 4 and columns.lost_by_kind == {"frame": 4}  # two received, two sent


def test_record_batch_refuses_frame_sizes_that_disagree_with_the_bytes_held():
    columns = RowColumns(max_rows=1000, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    Shell(recorder).open()
    chunk = columns.take()
    chunk.frames = memoryview(b"stray")  # bytes no record names
    with pytest.raises(ValueError, match="frame bytes"):
        record_batch(chunk, schema_for("t", Source.PROXY), "t", "proxy")
