"""A frame corrfix forwards unchanged is stored once: the client-side row keeps its head
and names the upstream row, and readers join them back (capture schema version 2)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import corrfix.capture._writer as writer_module
from corrfix.capture import CaptureWriter, iter_batches, read_capture
from corrfix.capture._writer import keep_together
from corrfix.capture.format import (
    CAPTURE_SCHEMA,
    FILE_SUFFIX,
    SHARED_HEAD,
    SHARED_MIN,
    VERSION_KEY,
    Source,
    schema_for,
    whole_frames,
    with_shared_frames,
)
from protocol import ApiKey
from protocol.testing import request_frame, response_frame
from tests.support.capture_shell import Shell


def padded(frame: bytearray, size: int) -> bytes:
    """``frame`` grown to ``size`` bytes of random body, its size prefix set to match."""
    out = bytearray(frame) + os.urandom(size - len(frame))
    out[:4] = (size - 4).to_bytes(4, "big")
    return bytes(out)


def frame_rows(rows: list[dict], side: str, direction: str) -> list[dict]:
    return [r for r in rows if r["kind"] == "frame" and r["side"] == side and r["direction"] == direction]


def stored_rows(path) -> list[dict]:
    """The rows as written, frames not joined."""
    return pa.Table.from_batches(list(iter_batches(path))).to_pylist()


def test_big_frames_forwarded_unchanged_are_stored_once_and_read_back_whole(tmp_path):
    requests = [padded(request_frame(ApiKey.METADATA, cid, cid), 5000) for cid in (10, 11)]
    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer)
    shell.open()
    shell.client_sends(*requests)
    answers = [padded(response_frame(upstream_id, upstream_id), 3000) for upstream_id in (0, 1)]
    shell.broker_answers(*answers)
    shell.close()
    writer.close()

    stored = stored_rows(tmp_path)
    by_seq = {r["seq"]: r for r in stored}
    for client_row in frame_rows(stored, "client", "request") + frame_rows(stored, "client", "response"):
        assert len(client_row["frame"]) == SHARED_HEAD
        holder = by_seq[client_row["frame_seq"]]
        assert holder["side"] == "upstream" and holder["direction"] == client_row["direction"]
        assert holder["upstream_correlation_id"] == client_row["upstream_correlation_id"]
        assert holder["frame_seq"] is None and len(holder["frame"]) == holder["frame_length"]

    rows = read_capture(tmp_path).to_pylist()
    assert [r["frame"] for r in frame_rows(rows, "client", "request")] == requests
    assert [r["frame"] for r in frame_rows(rows, "upstream", "request")] == shell.sent
    assert [r["frame"] for r in frame_rows(rows, "upstream", "response")] == answers
    assert [r["frame"] for r in frame_rows(rows, "client", "response")] == shell.delivered
    assert all(len(r["frame"]) == r["frame_length"] for r in rows if r["kind"] == "frame")


def test_small_rewritten_and_cut_frames_keep_their_own_bytes(tmp_path):
    def transform(api_key, api_version, frame):
        return frame[:-8] + b"rewritten"[:8]  # same length, other bytes: not the broker's

    writer = CaptureWriter(tmp_path, snaplen=2000).start()
    shell = Shell(writer, machine_options={"transform": transform})
    shell.open()
    small = padded(request_frame(ApiKey.METADATA, 1, 1), SHARED_MIN - 1)
    big = padded(request_frame(ApiKey.METADATA, 2, 2), 6000)
    shell.client_sends(small, big)
    shell.broker_answers(padded(response_frame(0, 0), 1500), padded(response_frame(1, 1), 1500))
    shell.close()
    writer.close()

    stored = stored_rows(tmp_path)
    client_requests = frame_rows(stored, "client", "request")
    assert client_requests[0]["frame_seq"] is None and client_requests[0]["frame"] == small
    # Cut by the snap length on both sides, the same bytes after the head: shared.
    assert client_requests[1]["frame_seq"] is not None and len(client_requests[1]["frame"]) == SHARED_HEAD
    assert all(r["frame_seq"] is None for r in frame_rows(stored, "client", "response"))  # rewritten
    rows = read_capture(tmp_path).to_pylist()
    assert frame_rows(rows, "client", "request")[1]["frame"] == big[:2000]
    assert [r["frame"] for r in frame_rows(rows, "client", "response")] == [d[:2000] for d in shell.delivered]


def test_big_frames_not_sent_on_in_the_call_that_received_them_keep_the_bytes_that_arrived(tmp_path):
    """A received row is the core's head copy and the frame's bytes after it. An answer held
    for an older one is sent in a later call, a rewritten one is another frame: neither is
    stored once, and the broker's row holds what the broker sent, its own id included."""

    def transform(api_key, api_version, frame):
        if int.from_bytes(frame[4:8], "big") == 2:
            return frame[:-9] + b"rewritten"  # same length, other bytes: not the broker's
        return frame

    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer, machine_options={"transform": transform})
    shell.open()
    requests = [padded(request_frame(ApiKey.METADATA, cid, cid), 3000) for cid in (10, 11, 12)]
    shell.client_sends(*requests)  # upstream 0, 1, 2
    answers = [padded(response_frame(upstream_id, upstream_id), 4000) for upstream_id in (1, 2, 3)]
    shell.broker_answers(answers[0])  # 1's answer, held: 0's is lost, and 0 is re-sent as 3
    shell.broker_answers(answers[1], answers[2])  # 2's answer is rewritten; 3's delivers all
    shell.close()
    writer.close()

    stored = stored_rows(tmp_path)
    assert [r["frame_seq"] is None for r in frame_rows(stored, "client", "response")] == [False, True, True]
    assert [len(r["frame"]) for r in frame_rows(stored, "upstream", "response")] == [4000] * 3
    rows = read_capture(tmp_path).to_pylist()
    assert [r["frame"] for r in frame_rows(rows, "client", "request")] == requests
    assert [r["frame"] for r in frame_rows(rows, "upstream", "response")] == answers
    assert [r["frame"] for r in frame_rows(rows, "client", "response")] == shell.delivered
    assert [int.from_bytes(answer[4:8], "big") for answer in shell.delivered] == [10, 11, 12]
    assert shell.delivered[2].endswith(b"rewritten")


def test_pairs_sharing_bytes_stay_in_one_batch_when_the_writer_splits_a_flush(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "BATCH_ROWS", 3)
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
    shell = Shell(writer)
    shell.open()
    requests = [padded(request_frame(ApiKey.METADATA, cid, cid), 2000) for cid in range(7)]
    for upstream_id, request in enumerate(requests):  # 4 rows each: every third row ends a batch
        shell.client_sends(request)
        shell.broker_answers(padded(response_frame(upstream_id, upstream_id), 2000))
    shell.close()
    writer.close()

    batches = list(iter_batches(tmp_path))
    assert len(batches) >= 8
    shared = 0
    for batch in batches:
        seqs = set(batch.column("seq").to_pylist())
        for holder in batch.column("frame_seq").drop_null().to_pylist():
            assert holder in seqs
            shared += 1
    assert shared == 14
    rows = read_capture(tmp_path).to_pylist()
    assert [r["frame"] for r in frame_rows(rows, "client", "request")] == requests


@given(
    rows=st.integers(2, 60),
    pairs=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)), max_size=12),
    start=st.integers(0, 59),
    size=st.integers(1, 20),
)
def test_a_batch_end_never_falls_inside_a_sharing_pair(rows, pairs, start, size):
    pairs = [(a, b) for a, b in pairs if a < rows and b < rows and a != b]
    start = min(start, rows - 1)
    first = np.array([min(p) for p in pairs], np.int64)
    last = np.array([max(p) for p in pairs], np.int64)
    end = keep_together(start, min(rows, start + size), first, last)
    assert start < end <= rows
    assert not any(a < end <= b for a, b in zip(first.tolist(), last.tolist(), strict=True))


def test_a_row_whose_holder_is_missing_keeps_its_head(tmp_path):
    head = b"h" * SHARED_HEAD
    base = dict.fromkeys(CAPTURE_SCHEMA.names)
    base.update(capture_id="x", source="proxy", connection_id="c1", kind="frame", wall_ns=1, mono_ns=1)
    rows = [
        {**base, "seq": 1, "frame": head, "frame_seq": 2, "frame_length": 4000},
        {**base, "seq": 3, "frame": b"H" * SHARED_HEAD, "frame_seq": 4, "frame_length": 4000},
        {**base, "seq": 4, "frame": b"u" * 4000, "frame_length": 4000},
        {**base, "connection_id": "c2", "seq": 2, "frame": b"v" * 4000, "frame_length": 4000},
    ]
    table = with_shared_frames(pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA))
    frames = table.column("frame").to_pylist()
    assert frames[0] == head  # its holder (c1, seq 2) was lost: the head alone, like a cut frame
    assert frames[1] == b"H" * SHARED_HEAD + b"u" * (4000 - SHARED_HEAD)
    assert frames[2:] == [b"u" * 4000, b"v" * 4000]


def test_version_1_files_are_read_as_they_are(tmp_path):
    v1_names = [name for name in CAPTURE_SCHEMA.names if name != "frame_seq"]
    schema = schema_for("old", Source.PROXY)
    v1 = pa.schema([schema.field(name) for name in v1_names], metadata={**schema.metadata, VERSION_KEY: b"1"})
    row = dict.fromkeys(v1_names)
    row.update(
        capture_id="old", source="proxy", connection_id="c1", seq=0, kind="frame", wall_ns=1, mono_ns=1
    )
    row.update(frame=b"x" * 3000, frame_length=3000, side="client", direction="request")
    batch = pa.RecordBatch.from_pylist([row], schema=v1)
    with pa.OSFile(str(tmp_path / f"old{FILE_SUFFIX}"), "wb") as sink, pa.ipc.new_stream(sink, v1) as w:
        w.write_batch(batch)
    table = read_capture(tmp_path)
    assert table.schema.names == CAPTURE_SCHEMA.names
    assert table.column("frame").to_pylist() == [b"x" * 3000]
    assert table.column("frame_seq").to_pylist() == [None]


def test_a_newer_schema_version_is_refused(tmp_path):
    schema = schema_for("new", Source.PROXY)
    newer = schema.with_metadata({**schema.metadata, VERSION_KEY: b"99"})
    with pa.OSFile(str(tmp_path / f"new{FILE_SUFFIX}"), "wb") as sink, pa.ipc.new_stream(sink, newer):
        pass
    with pytest.raises(ValueError, match="schema version 99"):
        read_capture(tmp_path)


def test_a_capture_file_read_twice_still_gives_each_row_its_own_frame(tmp_path):
    requests = [padded(request_frame(ApiKey.METADATA, cid, cid), 3000) for cid in (1, 2, 3)]
    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer)
    shell.open()
    shell.client_sends(*requests)
    shell.broker_answers(*(padded(response_frame(i, i), 2000) for i in range(3)))
    shell.close()
    writer.close()
    (tmp_path / "backup").mkdir()
    for file in tmp_path.glob(f"*{FILE_SUFFIX}"):
        (tmp_path / "backup" / file.name).write_bytes(file.read_bytes())

    rows = read_capture(tmp_path).to_pylist()
    assert [r["frame"] for r in frame_rows(rows, "client", "request")] == requests * 2
    assert [r["frame"] for r in frame_rows(rows, "client", "response")] == shell.delivered * 2
    # Concatenated, with one key twice in a batch and the rows out of their written order.
    table = pa.Table.from_batches(list(iter_batches(tmp_path))).combine_chunks().sort_by("seq")
    whole = with_shared_frames(table).to_pylist()
    assert sorted(r["frame"] for r in frame_rows(whole, "client", "request")) == sorted(requests * 2)


def test_a_produce_request_whose_acks_lie_past_the_head_keeps_its_own_bytes(tmp_path):
    def produce(correlation_id: int, client_id: bytes) -> bytes:
        header = (0).to_bytes(2, "big") + (3).to_bytes(2, "big") + correlation_id.to_bytes(4, "big")
        header += len(client_id).to_bytes(2, "big") + client_id
        body = (
            b"\xff\xff" + (0).to_bytes(2, "big", signed=True) + bytes(3000)
        )  # null transactional id, acks=0
        return len(header + body).to_bytes(4, "big") + header + body

    short, long = produce(1, b"c" * 10), produce(2, b"c" * 600)
    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer)
    shell.open()
    shell.client_sends(short, long)
    shell.close()
    writer.close()
    stored = frame_rows(stored_rows(tmp_path), "client", "request")
    assert stored[0]["frame_seq"] is not None and len(stored[0]["frame"]) == SHARED_HEAD
    assert stored[1]["frame_seq"] is None and stored[1]["frame"] == long
    assert [r["frame"] for r in frame_rows(read_capture(tmp_path).to_pylist(), "client", "request")] == [
        short,
        long,
    ]


def test_a_client_row_whose_upstream_row_did_not_fit_the_queue_names_nothing(tmp_path):
    writer = CaptureWriter(tmp_path, queue_bytes=1100, flush_seconds=60.0).start()
    shell = Shell(writer)
    shell.client_sends(padded(request_frame(ApiKey.METADATA, 7, 7), 2000))
    writer.close()
    stored = stored_rows(tmp_path)
    frames = [r for r in stored if r["kind"] == "frame"]
    assert [(r["side"], r["direction"]) for r in frames] == [("client", "request")]
    assert frames[0]["frame_seq"] is None and len(frames[0]["frame"]) == SHARED_HEAD
    assert writer.stats.rows_written == len(stored) and writer.stats.rows_lost == 1


@given(
    pairs=st.lists(st.tuples(st.sampled_from(["c1", "c2", "c3"]), st.booleans(), st.booleans()), max_size=8),
    order=st.randoms(use_true_random=False),
    twice=st.booleans(),
    shuffle=st.booleans(),
)
def test_whole_frames_joins_every_head_to_its_holder_in_any_row_order(pairs, order, twice, shuffle):
    """Against a dictionary lookup: rows as written, read twice, reordered, holders lost."""
    base = dict.fromkeys(CAPTURE_SCHEMA.names)
    base.update(capture_id="x", source="proxy", kind="frame", wall_ns=1, mono_ns=1)
    rows, expected, seqs = [], [], {"c1": 0, "c2": 0, "c3": 0}
    for number, (connection, forward, lost) in enumerate(pairs):
        head = bytes([number]) * SHARED_HEAD
        holder = bytes([100 + number]) * (SHARED_HEAD + 50 + number)
        first = seqs[connection]
        seqs[connection] += 2
        head_seq, holder_seq = (first, first + 1) if forward else (first + 1, first)
        client = {
            **base,
            "connection_id": connection,
            "seq": head_seq,
            "frame": head,
            "frame_seq": holder_seq,
        }
        upstream = {**base, "connection_id": connection, "seq": holder_seq, "frame": holder}
        written = [client] if lost else ([client, upstream] if forward else [upstream, client])
        rows += written
        whole = head if lost else head + holder[SHARED_HEAD:]
        expected += [(connection, head_seq, whole)] + ([] if lost else [(connection, holder_seq, holder)])
    if twice:
        rows, expected = rows + rows, expected + expected
    if shuffle:
        order.shuffle(rows)
    batch = pa.RecordBatch.from_pylist(rows, schema=CAPTURE_SCHEMA)
    got = [(r["connection_id"], r["seq"], r["frame"]) for r in whole_frames(batch).to_pylist()]
    assert sorted(got) == sorted(expected)
