"""CaptureWriter without sockets: rows, ids across sides, snap length, files, the bounded queue."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest, SaslHandshakeResponse
from structlog.testing import capture_logs

import corrfix.capture._writer as writer_module
from corrfix.capture import (
    CaptureFiles,
    CaptureWriter,
    add_capture_arguments,
    capture_files,
    capture_info,
    capture_writer_from_args,
    iter_batches,
    read_capture,
    read_summaries,
    render_info,
)
from corrfix.capture._retention import hold, lock_path
from corrfix.capture.format import CAPTURE_ID_KEY, CAPTURE_SCHEMA, SOURCE_KEY, Source, schema_for
from corrfix.core import RepairConfig
from corrfix.proxy import _logs as proxy_logs
from corrfix.proxy._logs import configure_logging
from protocol import ApiKey, parse_request_header
from protocol.testing import encode_request, encode_response, request_frame, response_frame
from tests.support.capture_shell import Shell, run_repair_scenario
from tests.support.consumer_group_frames import heartbeat_answer, heartbeat_request
from tests.support.refusing_output import RefusingOutput


def rows_of(path: Path) -> list[dict]:
    return read_capture(path).to_pylist()


def frames_where(rows: list[dict], side: str, direction: str) -> list[dict]:
    return [r for r in rows if r["kind"] == "frame" and r["side"] == side and r["direction"] == direction]


def ids(rows: list[dict], first: str, second: str) -> list[tuple]:
    return [(r[first], r[second]) for r in rows]


def test_rows_follow_ids_across_both_sides_through_repairs(tmp_path):
    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer, config=RepairConfig(probe_after=1.0))
    run_repair_scenario(shell)
    writer.close()
    rows = rows_of(tmp_path)

    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert {r["capture_id"] for r in rows} == {writer.capture_id}
    assert {r["source"] for r in rows} == {"proxy"}
    assert rows[0]["kind"] == "open" and rows[0]["client_address"] == "127.0.0.1:50001"
    assert rows[0]["upstream_address"] == "127.0.0.1:9092"
    assert rows[-1]["kind"] == "close" and rows[-1]["reason"] == "client closed"

    client_requests = frames_where(rows, "client", "request")
    upstream_requests = frames_where(rows, "upstream", "request")
    upstream_responses = frames_where(rows, "upstream", "response")
    client_responses = frames_where(rows, "client", "response")
    cc, uc = "client_correlation_id", "upstream_correlation_id"
    assert ids(client_requests, cc, uc) == [(100, 0), (101, 1), (102, 2), (103, 4), (104, 5)]
    assert ids(upstream_requests, uc, cc) == [
        (0, 100), (1, 101), (2, 102), (3, 100), (4, 103), (5, 104), (6, None), (7, 104)
    ]  # fmt: skip
    M, P, V = ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.API_VERSIONS
    assert [r["api_key"] for r in upstream_requests] == [M, M, M, M, P, M, V, M]
    assert ids(upstream_responses, uc, cc) == [(1, 101), (2, 102), (3, 100), (4, 103), (6, None), (7, 104)]
    assert [r["api_key"] for r in upstream_responses] == [M, M, M, P, V, M]
    assert ids(client_responses, cc, uc) == [(100, 3), (101, 1), (102, 2), (104, 7)]
    assert all(r["api_version"] is not None for r in client_requests + upstream_requests + client_responses)

    # Frame bytes are copies taken at the time: the repair machine patched the frames later.
    assert [r["frame"] for r in upstream_requests] == shell.sent
    assert [r["frame"] for r in client_responses] == shell.delivered
    assert client_requests[0]["frame"] == bytes(request_frame(ApiKey.METADATA, 100, 0))
    assert all(r["frame_length"] == len(r["frame"]) for r in rows if r["kind"] == "frame")

    repairs = [r for r in rows if r["kind"] == "repair"]
    assert [r["event"] for r in repairs] == [
        "skip_detected", "requeue", "stale_drop", "probe_sent", "skip_detected", "requeue", "probe_found_loss"
    ]  # fmt: skip
    requeues = [r for r in repairs if r["event"] == "requeue"]
    assert [(r[cc], r[uc], r["new_upstream_correlation_id"], r["attempt"]) for r in requeues] == [
        (100, 0, 3, 2),
        (104, 5, 7, 2),
    ]
    assert requeues[0]["api_key"] == ApiKey.METADATA and requeues[0]["api_version"] == 0
    stale = next(r for r in repairs if r["event"] == "stale_drop")
    assert (stale["api_key"], stale[uc], stale["reason"]) == (0, 4, "reply to acks=0 Produce")


def captured_frames(directory: Path, snaplen: int, request: bytes, answer: bytes) -> list[dict]:
    """The frame rows of one request and its answer, captured with ``snaplen``."""
    writer = CaptureWriter(directory, snaplen=snaplen).start()
    shell = Shell(writer)
    shell.open()
    shell.client_sends(request)
    shell.broker_answers(answer)
    writer.close()
    return [r for r in rows_of(directory) if r["kind"] == "frame"]


def test_snaplen_cuts_frames_and_zero_keeps_only_kafka_headers(tmp_path):
    request = encode_request(MetadataRequest[9](topics=None, allow_auto_topic_creation=False), 7, "client-x")
    response = encode_response(
        MetadataResponse[9](throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, topics=[]), 0
    )
    for snaplen in (16, 0):
        frames = captured_frames(tmp_path / str(snaplen), snaplen, request, response)
        assert [r["frame_length"] for r in frames] == [
            len(request),
            len(request),
            len(response),
            len(response),
        ]
        if snaplen:
            assert all(len(r["frame"]) == 16 for r in frames)
            assert frames[0]["frame"] == request[:16]
        else:
            header_end = parse_request_header(request).body_offset
            assert frames[0]["frame"] == request[:header_end]  # header v2: client id and tagged fields
            assert len(frames[2]["frame"]) == 9  # response header v1: correlation id and tagged fields
        assert (
            frames[0]["api_key"] == ApiKey.METADATA
            and frames[0]["api_version"] == 9
            and frames[0]["client_correlation_id"] == 7
        )


def test_a_header_only_capture_keeps_a_kip_848_heartbeat_s_whole_headers(tmp_path):
    """kafka-python cannot decode ConsumerGroupHeartbeat, but Kafka's schemas say its headers
    are flexible from v0: the request's tag byte and the answer's are header, not body."""
    request = heartbeat_request(7, "g", "m", 0, client_id="xyz")
    frames = captured_frames(tmp_path, 0, request, heartbeat_answer(0, 1))
    assert frames[0]["frame"] == request[: 4 + 8 + 2 + 3 + 1]  # size, fixed header, client id, tags
    assert [len(r["frame"]) for r in frames] == [18, 18, 9, 9]  # upstream: the proxy's id


def test_a_file_is_readable_up_to_its_last_flush_while_the_writer_runs(tmp_path):
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()  # only flush() and close() write
    try:
        shell = Shell(writer)
        shell.open()
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        assert writer.flush(timeout=10)
        first = rows_of(tmp_path)
        assert [r["kind"] for r in first] == ["open", "frame", "frame"]
        shell.broker_answers(response_frame(0, 1))
        assert writer.flush(timeout=10)
        assert len(list(iter_batches(tmp_path))) == 2  # one batch per flush, no end-of-stream yet
        assert len(rows_of(tmp_path)) == 5
        summary = read_summaries(tmp_path)[0]
        assert (summary.rows_written, summary.finished) == (5, False)
    finally:
        writer.close()
    summary = read_summaries(tmp_path)[0]
    assert (summary.capture_id, summary.rows_written, summary.rows_lost, summary.finished) == (
        writer.capture_id,
        6,
        0,
        True,
    )
    assert rows_of(tmp_path)[-1]["reason"] == "capture closed"  # c1 was still open


def test_a_flush_waits_for_the_relay_pass_that_gathers_rows(tmp_path):
    """Rows an engine pass gathers are queued at its end: a flush asked for meanwhile (the
    client may already hold the answer) waits for that end, and then writes them."""
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
    try:
        shell = Shell(writer)
        shell.open()
        writer.begin_pass()
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        assert not writer.flush(timeout=0.05)  # the pass is still open
        writer.end_pass()
        assert writer.flush(timeout=10)
        assert [r["kind"] for r in rows_of(tmp_path)] == ["open", "frame", "frame"]
    finally:
        writer.close()


def announce_waits(writer: CaptureWriter, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once another thread waits on the writer's progress (a flush, a close): the lock is
    let go in wait(), so an end of pass notified from then on reaches that waiter."""
    waiting, wait = threading.Event(), writer._progress.wait

    def announced_wait(timeout: float | None = None) -> bool:
        waiting.set()
        return wait(timeout)

    monkeypatch.setattr(writer._progress, "wait", announced_wait)
    return waiting


def test_a_relay_pass_whose_end_fails_still_lets_a_flush_waiting_for_it_go_on(tmp_path, monkeypatch):
    """The pass is over even if queueing its rows fails: a flush waiting for its end is told,
    and does not wait for a pass that never ends."""
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
    try:
        shell = Shell(writer)
        shell.open()
        writer.begin_pass()
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        waiting = announce_waits(writer, monkeypatch)
        flushed: list[bool] = []
        flusher = threading.Thread(target=lambda: flushed.append(writer.flush(timeout=10)))
        flusher.start()
        assert waiting.wait(10)
        queue_runs, failures = writer._recorder._queue_runs, [RuntimeError("a bug in queueing")]

        def fails_once() -> None:
            if failures:
                raise failures.pop()
            queue_runs()

        monkeypatch.setattr(writer._recorder, "_queue_runs", fails_once)
        with pytest.raises(RuntimeError, match="a bug in queueing"):  # the engine logs it and goes on
            writer.end_pass()
        flusher.join(30)
        assert flushed == [True]
        assert not writer._recorder.in_pass
    finally:
        writer.close()


def test_closing_waits_for_a_relay_pass_in_progress_and_writes_the_rows_it_gathered(tmp_path, monkeypatch):
    """The engine's thread outlives the proxy until the trio run ends: a connection that closed
    in its last pass has its close row queued when that pass ends, after trio's thread has
    seen the close. A capture closed in between still writes the row."""
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
    shell = Shell(writer)
    shell.open()
    writer.begin_pass()
    shell.close()  # gathered by the pass, not queued yet
    waiting = announce_waits(writer, monkeypatch)
    closer = threading.Thread(target=writer.close)
    closer.start()
    assert waiting.wait(10)
    writer.end_pass()
    closer.join(30)
    assert not closer.is_alive()
    rows = read_capture(tmp_path).to_pylist()
    assert [(row["kind"], row["reason"]) for row in rows] == [("open", None), ("close", "client closed")]
    assert writer.stats.rows_lost == 0


def test_files_rotate_by_size_and_keep_one_schema(tmp_path):
    writer = CaptureWriter(tmp_path, rotate_bytes=1, flush_seconds=60.0).start()
    shell = Shell(writer)
    shell.open()
    for i in range(3):
        shell.client_sends(request_frame(ApiKey.METADATA, i, i))
        writer.flush(timeout=10)
    writer.close()
    files = capture_files(tmp_path)
    assert files == writer.stats.files and len(files) == 4  # one per flush, then the close row
    for file in files:
        with pa.OSFile(str(file), "rb") as source:
            reader = pa.ipc.open_stream(source)
            assert reader.schema.equals(CAPTURE_SCHEMA)
            assert reader.schema.metadata[CAPTURE_ID_KEY] == writer.capture_id.encode()
            assert reader.schema.metadata[SOURCE_KEY] == b"proxy"
            assert reader.read_all().num_rows >= 1  # and the end-of-stream marker was written
    assert [r["seq"] for r in rows_of(tmp_path)] == list(range(8))
    summary = json.loads(writer.summary_path.read_text())
    assert summary["files"] == [f.name for f in files]
    # Each file's part of the connection index, finished ones encoded when the next began.
    for file in files:
        assert summary["connections"][file.name] == {"c1": read_capture(file).num_rows}


def test_the_index_of_the_file_being_written_follows_every_write(tmp_path):
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
    shell = Shell(writer)
    shell.open()
    for i in range(3):
        shell.client_sends(request_frame(ApiKey.METADATA, i, i))
        writer.flush(timeout=10)
        [file] = capture_files(tmp_path)
        counts = json.loads(writer.summary_path.read_text())["connections"][file.name]
        assert counts == {"c1": read_capture(file).num_rows}
    writer.close()


def test_files_rotate_by_age_even_when_idle(tmp_path):
    now = [0.0]
    schema = schema_for("cafe", Source.PROXY)
    files = CaptureFiles(
        tmp_path, "capture-x", schema, rotate_bytes=1 << 30, rotate_seconds=5.0, clock=lambda: now[0]
    )
    batch = pa.RecordBatch.from_pylist([], schema=schema)
    files.write(batch)
    now[0] = 4.9
    files.rotate_if_old()
    files.write(batch)
    assert len(files.files) == 1
    now[0] = 5.0
    files.rotate_if_old()  # idle, but old: finished now
    with pa.OSFile(str(files.files[0]), "rb") as source:
        assert pa.ipc.open_stream(source).read_all().num_rows == 0  # complete stream
    files.write(batch)
    files.finish_file()
    assert [p.name for p in files.files] == ["capture-x-000001.arrows", "capture-x-000002.arrows"]


def test_a_full_queue_drops_rows_and_counts_them_without_blocking(tmp_path):
    writer = CaptureWriter(tmp_path, queue_rows=5)  # not started: nothing drains the queue
    shell = Shell(writer)
    shell.open()  # 1 row
    shell.client_sends(*(request_frame(ApiKey.METADATA, i, i) for i in range(4)))  # 8 rows
    shell.broker_answers(*(response_frame(i, i) for i in range(4)))  # 8 rows
    assert writer.stats.rows_lost == 12
    writer.close()
    assert len(rows_of(tmp_path)) == 5
    summary = read_summaries(tmp_path)[0]
    assert (summary.rows_written, summary.rows_lost, summary.finished) == (5, 13, True)
    assert summary.rows_lost_by_kind == {"frame": 12, "close": 1}


def test_observer_calls_never_wait_for_a_stuck_writer_thread(tmp_path, monkeypatch):
    writer = CaptureWriter(tmp_path, queue_rows=10, flush_seconds=60.0)
    in_write, release = threading.Event(), threading.Event()
    original = writer._files.write

    def stuck_write(batch):
        in_write.set()
        assert release.wait(30), "test did not release the writer"
        original(batch)

    monkeypatch.setattr(writer._files, "write", stuck_write)
    writer.start()
    shell = Shell(writer)
    shell.open()
    writer._queue.wake.set()
    assert in_write.wait(10)
    for i in range(50):  # 100 rows while the writer thread is stuck in a write
        shell.client_sends(request_frame(ApiKey.METADATA, i, i))
    assert not release.is_set() and writer.stats.rows_lost == 90
    release.set()
    writer.close()
    stats = writer.stats
    assert stats.rows_written == 11 and stats.rows_lost == 91  # and the close row at close()
    assert len(rows_of(tmp_path)) == 11


def ring_writer(directory: Path, max_bytes: int) -> tuple[CaptureWriter, Shell]:
    """A writer that starts a new file at every flush, within ``max_bytes``."""
    writer = CaptureWriter(directory, rotate_bytes=1, flush_seconds=60.0, max_bytes=max_bytes).start()
    shell = Shell(writer)
    shell.open()
    return writer, shell


def test_a_capture_keeps_its_directory_within_max_bytes_oldest_files_first(tmp_path):
    """Without a limit, a capture grows until the disk is full (or, in an ``emptyDir`` past its
    ``sizeLimit``, the pod is evicted). With one, the oldest files are removed as new ones come,
    and the summary says what went."""
    writer, shell = ring_writer(tmp_path, max_bytes=12_000)
    seen: dict[str, int] = {}  # every file's size, as it was written
    with capture_logs() as logs:
        for i in range(12):
            shell.client_sends(request_frame(ApiKey.METADATA, i, i))
            writer.flush(timeout=10)
            files = capture_files(tmp_path)
            sizes = [f.stat().st_size for f in files]
            seen.update({f.name: size for f, size in zip(files, sizes, strict=True)})  # each file is whole
            assert sum(sizes) <= 12_000 and len(files) >= min(i + 1, 3), sizes
    writer.close()
    stats = writer.stats
    kept = capture_files(tmp_path)
    assert stats.files_removed == len(stats.files) - len(kept) > 0
    assert [f.name for f in kept] == [f.name for f in stats.files[-len(kept) :]]  # the newest stay
    assert stats.bytes_removed == sum(size for name, size in seen.items() if not (tmp_path / name).exists())
    summary = json.loads(writer.summary_path.read_text())
    assert summary["files"] == [f.name for f in kept]
    assert set(summary["connections"]) == {f.name for f in kept}
    assert (summary["files_removed"], summary["bytes_removed"]) == (stats.files_removed, stats.bytes_removed)
    seqs = [r["seq"] for r in rows_of(tmp_path)]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] > 0  # the newest rows, in order
    assert any(e["event"] == "capture files removed" and e["max_bytes"] == 12_000 for e in logs)
    shown = render_info(capture_info(tmp_path))
    assert f"removed {stats.files_removed} older files (--capture-max-bytes)" in shown


def test_a_running_capture_holds_its_lock_and_lets_go_when_it_closes(tmp_path):
    """Other writers pruning the directory (--workers siblings, a restarted proxy) keep the
    newest file of a capture whose lock is held, and take it once the lock is free."""
    writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
    lock = lock_path(tmp_path, writer.summary_path.name.removesuffix(".capture.json"))
    assert lock.exists()
    with pytest.raises(BlockingIOError):
        hold(tmp_path, lock.name[1:].removesuffix(".lock"))
    writer.close()
    assert not lock.exists()


def test_a_new_capture_removes_what_earlier_runs_left_first(tmp_path):
    old, shell = ring_writer(tmp_path, max_bytes=1 << 30)
    for i in range(3):
        shell.client_sends(request_frame(ApiKey.METADATA, i, i))
        old.flush(timeout=10)
    old.close()
    left_over = capture_files(tmp_path)
    assert len(left_over) == 4 and old.summary_path.exists()
    new, shell = ring_writer(tmp_path, max_bytes=sum(f.stat().st_size for f in left_over[1:]))
    assert [f.name for f in capture_files(tmp_path)] == [f.name for f in left_over[1:]]  # at start
    shell.client_sends(request_frame(ApiKey.METADATA, 9, 9))
    new.flush(timeout=10)
    new.close()
    assert not old.summary_path.exists()  # the old capture had finished: its summary went with its files
    assert {read_summaries(tmp_path)[0].capture_id} == {new.capture_id}
    assert new.stats.files_removed == 4


def test_a_capture_s_summary_leaves_out_its_files_another_writer_removed(tmp_path):
    """``--workers``: each worker's writer prunes the one directory, so one removes another's
    older files. The other's summary went on naming them in ``files`` and in the connection
    index the audit plans from, though they were gone."""
    first, first_shell = ring_writer(tmp_path, max_bytes=1 << 30)
    for i in range(3):
        first_shell.client_sends(request_frame(ApiKey.METADATA, i, i))
        first.flush(timeout=10)
    mine = capture_files(tmp_path)
    second, second_shell = ring_writer(tmp_path, max_bytes=sum(f.stat().st_size for f in mine[-2:]))
    second_shell.client_sends(request_frame(ApiKey.METADATA, 9, 9))
    second.flush(timeout=10)
    second.close()
    assert second.stats.files_removed > 0
    first_shell.client_sends(request_frame(ApiKey.METADATA, 3, 3))
    first.flush(timeout=10)
    kept = [path.name for path in first.stats.files if path.exists()]
    summary = json.loads(first.summary_path.read_text())
    first.close()
    assert len(kept) < len(first.stats.files)
    assert summary["files"] == kept
    assert set(summary["connections"]) == set(kept)
    assert summary["files_removed"] == 0  # the other writer removed them, and counts them


def test_command_line_options():
    parser = argparse.ArgumentParser()
    add_capture_arguments(parser)
    assert capture_writer_from_args(parser.parse_args([])) is None
    args = parser.parse_args(
        [
            *("--capture-dir", "/tmp/x", "--capture-snaplen", "0", "--capture-rotate-bytes", "64M"),
            *("--capture-rotate-seconds", "60", "--capture-queue-rows", "10k"),
            *("--capture-flush-seconds", "0.5"),
        ]
    )
    writer = capture_writer_from_args(args)
    assert writer is not None
    assert writer.directory == Path("/tmp/x") and writer._recorder.snaplen == 0
    assert writer._files.rotate_bytes == 64 * 1024 * 1024 and writer._files.rotate_seconds == 60
    assert writer._queue.max_rows == 10 * 1024 and writer.flush_seconds == 0.5
    with pytest.raises(SystemExit):
        parser.parse_args(["--capture-snaplen", "lots"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--capture-queue-rows", "0"])
    assert writer.max_bytes is None
    limited = capture_writer_from_args(
        parser.parse_args(["--capture-dir", "/tmp/x", "--capture-max-bytes", "2G"])
    )
    assert limited is not None and limited.max_bytes == 2 << 30
    with pytest.raises(ValueError, match="at least rotate_bytes"):
        CaptureWriter(Path("/tmp/x"), rotate_bytes=1024, max_bytes=1023)


def test_requests_the_proxy_answers_itself_and_rewritten_answers(tmp_path):
    def local_answer(header):
        if header.api_key == ApiKey.API_VERSIONS and header.api_version > 3:
            return bytes(response_frame(header.correlation_id, 99))
        return None

    def transform(api_key, api_version, frame):
        return frame + b"rewritten"

    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer, machine_options={"local_answer": local_answer, "transform": transform})
    shell.open()
    too_new = bytearray(request_frame(ApiKey.METADATA, 1, 1))
    too_new[4:8] = (18).to_bytes(2, "big") + (9).to_bytes(2, "big")  # ApiVersions v9
    shell.client_sends(too_new, request_frame(ApiKey.METADATA, 2, 2))
    shell.broker_answers(response_frame(0, 2))
    shell.close()
    writer.close()
    rows = rows_of(tmp_path)
    cc, uc = "client_correlation_id", "upstream_correlation_id"
    assert ids(frames_where(rows, "client", "request"), cc, uc) == [(1, None), (2, 0)]
    assert ids(frames_where(rows, "upstream", "request"), uc, cc) == [(0, 2)]
    client_responses = frames_where(rows, "client", "response")
    seen = [(r[cc], r[uc], r["api_key"]) for r in client_responses]
    assert seen == [(1, None, ApiKey.API_VERSIONS), (2, 0, ApiKey.METADATA)]
    upstream_response = frames_where(rows, "upstream", "response")[0]
    assert client_responses[1]["frame"].endswith(b"rewritten")
    assert not upstream_response["frame"].endswith(b"rewritten")  # what the broker sent, before rewriting


FULL_DISK = OSError(28, "No space left on device")
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC's marker: continuation, length 0


def first_write_fails(
    writer: CaptureWriter, monkeypatch: pytest.MonkeyPatch, error: Exception = FULL_DISK
) -> None:
    """The writer's first batch meets ``error`` (a full disk); the next ones are written."""
    original = writer._files.write
    failures = [error]

    def write(batch: pa.RecordBatch) -> None:
        if failures:
            raise failures.pop()
        original(batch)

    monkeypatch.setattr(writer._files, "write", write)


@pytest.mark.parametrize("error", [FULL_DISK, RuntimeError("a bug in writing")], ids=["io", "bug"])
def test_a_failed_write_costs_its_rows_and_the_capture_goes_on(tmp_path, monkeypatch, error):
    """Not only an I/O error: a bug in writing a batch costs that batch's rows, counted,
    and the writer thread goes on with the next ones."""
    writer = CaptureWriter(tmp_path, flush_seconds=60.0)
    first_write_fails(writer, monkeypatch, error)
    writer.start()
    shell = Shell(writer)
    shell.open()
    assert writer.flush(timeout=10)  # the open row is lost
    shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
    shell.close()
    writer.close()
    assert [r["kind"] for r in rows_of(tmp_path)] == ["frame", "frame", "close"]
    summary = read_summaries(tmp_path)[0]
    assert (summary.rows_written, summary.rows_lost, summary.rows_lost_by_kind) == (3, 1, {"open": 1})
    assert summary.finished


def test_a_bug_counting_a_files_connections_leaves_it_out_of_the_index_and_loses_no_row(
    tmp_path, monkeypatch
):
    """The rows are in the file: they stay counted as written, and the writer thread goes on.
    The file is left out of the index, not indexed in part (readers then count it themselves;
    a partial count would hide connections from them)."""
    value_counts = writer_module.pc.value_counts
    failures = [RuntimeError("a bug in the index")]

    def fails_once(column: pa.Array) -> pa.Array:
        if failures:
            raise failures.pop()
        return value_counts(column)

    monkeypatch.setattr(writer_module.pc, "value_counts", fails_once)
    with capture_logs() as logs:
        writer = CaptureWriter(tmp_path, flush_seconds=60.0).start()
        shell = Shell(writer)
        shell.open()
        assert writer.flush(timeout=10)  # the open row is written, its count fails
        assert not failures
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        assert writer.flush(timeout=10)  # later rows go to the same file: still left out
        writer.close()
    assert [r["kind"] for r in rows_of(tmp_path)] == ["open", "frame", "frame", "close"]
    summary = read_summaries(tmp_path)[0]
    assert (summary.rows_written, summary.rows_lost, summary.finished) == (4, 0, True)
    assert len(summary.files) == 1 and summary.connections == {}
    errors = [(e["event"], e.get("exc_info")) for e in logs if e["log_level"] == "error"]
    assert errors == [("capture file left out of the connection index", True)]  # with its traceback


def test_a_writer_thread_stopped_by_a_bug_says_it_did_not_finish_and_counts_every_later_row_lost(
    tmp_path, monkeypatch
):
    """A bug outside any batch's rows, which the thread cannot write past: the summary says
    ``finished: false``, and rows that come after are counted lost rather than left unwritten."""
    writer = CaptureWriter(tmp_path, flush_seconds=60.0)

    def broken(chunk: object) -> None:
        raise RuntimeError("a bug in the writer's loop")

    monkeypatch.setattr(writer._queue, "recycle", broken)
    with capture_logs() as logs:
        writer.start()
        shell = Shell(writer)
        shell.open()
        assert writer.flush(timeout=10)  # the open row is written, then the thread stops
        assert not read_summaries(tmp_path)[0].finished
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        writer.close()
    stats = writer.stats
    assert (stats.rows_written, stats.rows_lost) == (1, 3)  # two frames and the close row
    assert writer._queue.lost_by_kind == {"frame": 2, "close": 1}
    assert [r["kind"] for r in rows_of(tmp_path)] == ["open"]
    summary = read_summaries(tmp_path)[0]
    assert (summary.rows_written, summary.finished) == (1, False)
    errors = [e["event"] for e in logs if e["log_level"] == "error"]
    assert errors == ["capture writer failed and stopped, rows from now on are lost"]


def first_finish_fails(writer: CaptureWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end-of-stream marker of the first file the writer finishes meets a full disk: the
    file is closed without it, as after a real failure, and the next ones are finished."""
    files = writer._files
    original = files.finish_file
    failures = [FULL_DISK]

    def finish_file() -> None:
        if failures and files._writer is not None:
            files._writer = None  # its marker is never written
            original()
            raise failures.pop()
        original()

    monkeypatch.setattr(files, "finish_file", finish_file)


def test_a_file_whose_end_marker_fails_keeps_the_rows_written_to_it(tmp_path, monkeypatch):
    """A rotation by size finishes the file right after the batch that filled it: a marker
    that cannot be written costs that file its marker (logged), never the batch, which is
    readable and counted as written, in the index too."""
    writer = CaptureWriter(tmp_path, rotate_bytes=1, flush_seconds=60.0)
    first_finish_fails(writer, monkeypatch)
    with capture_logs() as logs:
        writer.start()
        shell = Shell(writer)
        shell.open()
        assert writer.flush(timeout=10)  # written, then its file cannot be finished
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        writer.close()
    assert [r["kind"] for r in rows_of(tmp_path)] == ["open", "frame", "frame", "close"]
    summary = read_summaries(tmp_path)[0]
    assert (summary.rows_written, summary.rows_lost, summary.finished) == (4, 0, True)
    first, *others = writer.stats.files
    assert summary.connections[first.name] == {"c1": 1}
    assert not first.read_bytes().endswith(END_OF_STREAM)
    assert others and all(path.read_bytes().endswith(END_OF_STREAM) for path in others)
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["capture file could not be finished"]


def test_a_failed_write_whose_error_cannot_be_logged_either_still_costs_only_its_rows(tmp_path, monkeypatch):
    """A full disk under both the capture and the ``--log-file``: the writer's error line is
    refused too. The writer thread goes on, counts the lost rows, and writes the rest."""
    configure_logging(json=True, file=tmp_path / "proxy.log")
    log_file = proxy_logs._log_file
    assert log_file is not None
    monkeypatch.setattr(log_file, "_file", RefusingOutput(OSError(28, "No space left on device")))
    capture = tmp_path / "capture"
    writer = CaptureWriter(capture, flush_seconds=60.0)
    first_write_fails(writer, monkeypatch)
    writer.start()
    try:
        shell = Shell(writer)
        shell.open()
        assert writer.flush(timeout=10)  # the open row is lost, and its error line with it
        assert log_file.refused
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
        shell.close()
    finally:
        writer.close()
        proxy_logs._log_file = None
    assert [r["kind"] for r in rows_of(capture)] == ["frame", "frame", "close"]
    summary = read_summaries(capture)[0]
    assert (summary.rows_written, summary.rows_lost) == (3, 1)


def raw_token(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def test_sasl_credentials_are_never_captured(tmp_path):
    """SASL v0 tokens (no Kafka header) keep only their size; SaslAuthenticate only its header."""
    handshake = encode_request(SaslHandshakeRequest[0](mechanism="PLAIN"), 7, "c")
    handshake_answer = encode_response(SaslHandshakeResponse[0](error_code=0, mechanisms=["PLAIN"]), 0)
    authenticate = encode_request(SaslAuthenticateRequest[1](auth_bytes=b"\x00bob\x00secret"), 9, "c")
    writer = CaptureWriter(tmp_path).start()
    shell = Shell(writer)
    shell.open()
    shell.client_sends(handshake)
    shell.broker_answers(handshake_answer)
    token = raw_token(b"\x00bob\x00secret")  # would read as api key 0, a plausible Produce
    shell.client_sends(token)
    shell.broker_answers(raw_token(b""))
    shell.client_sends(request_frame(ApiKey.METADATA, 8, 8), authenticate)  # tracked again afterwards
    shell.broker_answers(response_frame(1, 8), response_frame(2, 9))
    shell.close()
    writer.close()
    rows = [r for r in rows_of(tmp_path) if r["kind"] == "frame"]
    tokens = [r for r in rows if r["reason"] == "sasl_v0_token"]
    assert [(r["side"], r["direction"], r["frame"], r["frame_length"]) for r in tokens] == [
        ("client", "request", token[:4], len(token)),
        ("upstream", "request", token[:4], len(token)),
        ("upstream", "response", bytes(4), 4),
        ("client", "response", bytes(4), 4),
    ]
    assert all(r["api_key"] is None and r["client_correlation_id"] is None for r in tokens)
    after = [r for r in rows if r["reason"] is None][4:]  # past the handshake, both sides
    ids_after = [
        (r["side"], r["api_key"], r["client_correlation_id"], r["upstream_correlation_id"]) for r in after
    ]
    assert ids_after == [
        ("client", 3, 8, 1), ("client", 36, 9, 2), ("upstream", 3, 8, 1), ("upstream", 36, 9, 2),
        ("upstream", 3, 8, 1), ("upstream", 36, 9, 2), ("client", 3, 8, 1), ("client", 36, 9, 2),
    ]  # fmt: skip
    secret = b"secret"
    assert not any(secret in r["frame"] for r in rows)
    # SaslAuthenticate v1: size, api key, version, correlation id, client id "c"; no body
    assert [len(r["frame"]) for r in after if r["api_key"] == 36 and r["direction"] == "request"] == [15, 15]
