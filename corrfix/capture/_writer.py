"""``corrfix proxy --capture-dir``: record both sides of every connection without slowing it.

The relay calls the observer synchronously, so an observer call only copies what a row
needs and appends it, column by column, to bounded in-memory buffers (:mod:`._columns`).
When they are full, rows are dropped and counted, never waited for. A background thread
swaps the buffers out, makes them Arrow record batches without Python code per row, and
appends those to the capture's files at least every ``flush_seconds``;
the totals, lost rows included, go to the JSON sidecar (see docs/capture-format.md).
With ``max_bytes``, the same thread keeps the directory's capture files within it, oldest
removed first (:mod:`._retention`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import structlog

from corrfix.capture._columns import RowChunk, RowColumns, record_batch
from corrfix.capture._files import CaptureFiles, UnfinishedFileError, capture_stem
from corrfix.capture._options import (
    DEFAULT_FLUSH_SECONDS,
    DEFAULT_QUEUE_BYTES,
    DEFAULT_QUEUE_ROWS,
    DEFAULT_ROTATE_BYTES,
    DEFAULT_ROTATE_SECONDS,
    DEFAULT_SNAPLEN,
)
from corrfix.capture._recorder import Recorder
from corrfix.capture._retention import hold, prune, release
from corrfix.capture._summary import SUMMARY_SUFFIX, CaptureSummary, write_summary
from corrfix.capture.format import Source, schema_for
from corrfix.core import Event

log = structlog.get_logger("corrfix.capture")

BATCH_ROWS = 16_384
BATCH_BYTES = 16 * 1024 * 1024
CAPTURE_CLOSED = "capture closed"
"""The close reason of connections still open when the capture ends."""
CLOSE_WAITS_FOR_PASS = 5.0
"""How long closing waits for a relay pass in progress to queue its rows (a pass takes
milliseconds; one that takes longer is stuck, and its rows are counted lost)."""
WARNING_INTERVAL = 10.0
"""At most one error log line of each kind per this many seconds."""


@dataclass(frozen=True)
class CaptureStats:
    rows_written: int
    rows_lost: int
    files: list[Path]
    bytes_written: int
    files_removed: int = 0
    bytes_removed: int = 0
    """Capture files (of any capture in the directory) removed under ``max_bytes``."""


class CaptureWriter:
    """A :class:`~corrfix.proxy.ConnectionObserver` that writes an Arrow capture directory.

    ``start()`` the writer thread before traffic flows and ``close()`` it after the proxy
    stops (or use it as a context manager); ``close()`` writes everything still queued.
    """

    def __init__(
        self,
        directory: Path,
        *,
        snaplen: int = DEFAULT_SNAPLEN,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
        queue_rows: int = DEFAULT_QUEUE_ROWS,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        capture_id: str | None = None,
        keep_page_cache: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        for name, value in (("rotate_bytes", rotate_bytes), ("queue_rows", queue_rows)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_bytes is not None and max_bytes < rotate_bytes:
            raise ValueError(f"max_bytes ({max_bytes}) must be at least rotate_bytes ({rotate_bytes})")
        self.max_bytes = max_bytes
        if rotate_seconds <= 0 or flush_seconds <= 0:
            raise ValueError("rotate_seconds and flush_seconds must be > 0")
        self.directory = directory
        self.capture_id = capture_id or uuid.uuid4().hex
        self.schema = schema_for(self.capture_id, Source.PROXY)
        self._source = Source.PROXY.value
        self.flush_seconds = flush_seconds
        started = time.time_ns()
        stem = self._stem = capture_stem(self.capture_id, started)
        self.summary_path = directory / f"{stem}{SUMMARY_SUFFIX}"
        self._summary = CaptureSummary(self.capture_id, Source.PROXY.value, started, snaplen=snaplen)
        self._queue = RowColumns(queue_rows, queue_bytes)
        self._files = CaptureFiles(
            directory,
            stem,
            self.schema,
            rotate_bytes=rotate_bytes,
            rotate_seconds=rotate_seconds,
            keep_page_cache=keep_page_cache,
        )
        self._recorder = Recorder(self._queue, snaplen)
        self._thread = threading.Thread(target=self._run, name="corrfix-capture", daemon=True)
        self._progress = threading.Condition()
        self._processed = 0
        self._pass_waiters = 0  # flush calls waiting for an engine pass to queue its rows
        self._stopping = False
        self._reopen = False
        self._ended = False
        self._error_logged: dict[str, float] = {}  # by message: when it may be logged again
        self._unindexed: set[str] = set()  # files left out of the summary's connection index
        self._removed: set[str] = set()  # this capture's own files removed under max_bytes
        self._pruned_at = -1  # bytes written when the directory was last pruned
        self._lock: int | None = None  # held while the writer runs: pruners keep its newest file

    # -- ConnectionObserver: called by the relay, in its thread --------------------------

    @property
    def snaplen(self) -> int:
        return self._recorder.snaplen

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        self._recorder.connection_opened(connection, client, upstream)

    def events(self, connection: str, events: Sequence[Event]) -> None:
        self._recorder.events(connection, events)

    def connection_closed(self, connection: str, reason: str) -> None:
        self._recorder.connection_closed(connection, reason)

    def begin_pass(self) -> None:
        """The relay engine starts a pass over its ready sockets: rows are queued at its end."""
        self._recorder.begin_pass()

    def end_pass(self) -> None:
        try:
            self._recorder.end_pass()
        finally:  # the pass is over even if queueing its rows failed: a flush may wait for that
            if self._pass_waiters:
                with self._progress:
                    self._progress.notify_all()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> CaptureWriter:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = hold(self.directory, self._stem)
        except OSError as exc:  # without it, pruners keep this capture's newest file all the same
            log.warning("capture lock not taken", directory=str(self.directory), error=str(exc))
        self._prune()  # what earlier runs left may already be over the limit
        self._write_summary()
        self._thread.start()
        log.info("capture started", directory=str(self.directory), capture_id=self.capture_id)
        return self

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every row queued before this call is written (or lost); False on timeout."""
        if not self._thread.is_alive():
            raise RuntimeError("the capture writer is not running")
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._wait_for_pass(timeout):
            return False
        target = self._queue.accepted
        self._queue.wake.set()
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        with self._progress:
            return self._progress.wait_for(lambda: self._processed >= target or self._ended, left)

    def _wait_for_pass(self, timeout: float | None) -> bool:
        """Wait until an engine pass in progress has queued the rows it gathers; False on timeout."""
        with self._progress:
            self._pass_waiters += 1
            try:
                recorder, ended = self._recorder, self._recorder.passes_ended
                return self._progress.wait_for(
                    lambda: not recorder.in_pass or recorder.passes_ended != ended, timeout
                )
            finally:
                self._pass_waiters -= 1

    def reopen(self) -> None:
        """Finish the current file now: the next rows go to a new file, in a directory made
        anew if it was moved away (SIGHUP, after a log rotation moved the capture)."""
        self._reopen = True
        self._queue.wake.set()

    def close(self) -> None:
        """Stop accepting rows, write what is queued, finish the files and the summary.

        Call it once the proxy has stopped: connections still open get a close row with
        the reason ``capture closed`` (a proxy cancelled at shutdown reports no close)."""
        if self._stopping:  # not the queue's state: a writer thread that failed closed it
            return
        # The relay engine's thread outlives the proxy's serve() until the trio run ends: a
        # pass of its may still gather the rows of a connection that closed in it (trio's
        # thread reports the close), and they are queued when that pass ends.
        if not self._wait_for_pass(CLOSE_WAITS_FOR_PASS):
            log.warning("capture closed during a relay pass that did not end, its rows are lost")
        self._recorder.close_all(CAPTURE_CLOSED)
        self._queue.close()
        self._stopping = True
        self._queue.wake.set()
        if self._thread.is_alive():
            self._thread.join()
        elif self._thread.ident is None:
            self._run()  # never started: write what was queued here
        stats = self.stats
        log.info(
            "capture closed",
            directory=str(self.directory),
            rows=stats.rows_written,
            lost=stats.rows_lost,
            files=len(stats.files),
        )

    def __enter__(self) -> CaptureWriter:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def stats(self) -> CaptureStats:
        summary = self._summary
        return CaptureStats(
            summary.rows_written,
            self._queue.lost,
            list(self._files.files),
            self._files.bytes_written,
            summary.files_removed,
            summary.bytes_removed,
        )

    # -- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        """Write until stopped. ``finished`` in the summary says the thread got there: when
        a bug it cannot write past stops it, every row from then on is counted lost instead."""
        stopped = False
        try:
            self._write_until_stopped()
            stopped = True
        except Exception:
            log.exception("capture writer failed and stopped, rows from now on are lost")
            self._queue.close()  # rows that come are counted lost, not left for no one to write
            self._queue.count_lost(self._queue.take().kinds())
        finally:
            try:
                try:
                    self._files.finish_file()
                except (OSError, pa.ArrowException) as exc:
                    log.error("capture file could not be finished", error=str(exc))
                self._summary.finished = stopped
                self._write_summary()
                if self._lock is not None:
                    release(self.directory, self._stem, self._lock)
                    self._lock = None
            finally:  # a flush waits for this
                with self._progress:
                    self._ended = True
                    self._progress.notify_all()

    def _write_until_stopped(self) -> None:
        queue = self._queue
        while True:
            queue.wake.wait(self.flush_seconds)
            queue.wake.clear()
            stopping = self._stopping
            chunk = queue.take()
            if chunk.rows:
                self._write_rows(chunk)
            queue.recycle(chunk)
            try:
                if self._reopen:
                    self._reopen = False
                    self._files.finish_file()
                    self.directory.mkdir(parents=True, exist_ok=True)
                    self._write_summary()
                self._files.rotate_if_old()
            except (OSError, pa.ArrowException) as exc:
                self._files.abandon_file()
                self._log_error("capture file could not be finished or started anew", exc)
            pruned = self._prune()
            self._after_flush(chunk.rows, pruned)
            if stopping:
                return

    def _write_rows(self, chunk: RowChunk) -> None:
        """Append the chunk's rows, batch by batch; each row is written or counted lost. A
        batch the files refuse costs its rows; a bug (not an I/O error) costs the rows not
        written yet, never the writer thread, which goes on with the next chunk."""
        done = 0  # the chunk's rows before this are written or counted lost
        try:
            batch = record_batch(chunk, self.schema, self.capture_id, self._source)
            for start, stop in batch_bounds(chunk):
                part = batch.slice(start, stop - start)
                if self._write_batch(part):
                    self._summary.rows_written += stop - start
                    self._count_connections(part)
                else:
                    self._queue.count_lost(chunk.kinds(start, stop))
                done = stop
        except Exception as exc:
            self._queue.count_lost(chunk.kinds(done))
            self._log_error("capture rows could not be written, rows lost", exc, rows=chunk.rows - done)

    def _write_batch(self, part: pa.RecordBatch) -> bool:
        """Append one batch to the files; False if it is lost."""
        try:
            self._files.write(part)
        except UnfinishedFileError as exc:  # the batch is in the file: only its end marker is missing
            self._log_error("capture file could not be finished", exc)
        except Exception as exc:  # whatever failed, the stream is not to be trusted after it
            self._files.abandon_file()
            self._log_error("capture write failed, rows lost", exc)
            return False
        return True

    def _count_connections(self, written: pa.RecordBatch) -> None:
        """Rows per connection in the file just written to, for the summary's index. A file
        whose rows cannot all be counted is left out of the index: readers count such a file
        themselves, where a partial count would hide connections from them."""
        name = self._files.files[-1].name
        if name in self._unindexed:
            return
        try:
            counts = self._summary.connections.setdefault(name, {})
            for entry in pc.value_counts(written.column("connection_id")).to_pylist():
                counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
        except Exception as exc:
            self._summary.connections.pop(name, None)
            self._unindexed.add(name)
            self._log_error("capture file left out of the connection index", exc, file=name)

    def _prune(self) -> bool:
        """Keep the directory's capture files within ``max_bytes`` once more has been written
        since the last look; True if a file was removed."""
        written = self._files.bytes_written
        if self.max_bytes is None or written == self._pruned_at:
            return False
        self._pruned_at = written
        try:
            removed = prune(self.directory, self.max_bytes)
        except OSError as exc:
            self._log_error("capture files could not be pruned", exc)
            return False
        # Of this capture's files, those not left: removed here, or by another writer pruning
        # the same directory (a --workers sibling), which counts them in its own summary.
        own = {path.name for path in self._files.files} - self._removed
        gone = own - removed.left
        self._removed.update(gone)
        self._summary.forget(gone | set(removed.files))
        if not removed.files:
            return bool(gone)
        self._summary.files_removed += len(removed.files)
        self._summary.bytes_removed += removed.bytes
        log.info(
            "capture files removed",
            directory=str(self.directory),
            files=len(removed.files),
            bytes=removed.bytes,
            oldest=removed.files[0],
            max_bytes=self.max_bytes,
        )
        return True

    def _after_flush(self, processed: int, pruned: bool = False) -> None:
        summary = self._summary
        kept = len(self._files.files) - len(self._removed)
        changed = summary.rows_lost != self._queue.lost or len(summary.files) != kept or processed or pruned
        if changed:
            self._write_summary()
        with self._progress:
            self._processed += processed
            self._progress.notify_all()

    def _write_summary(self) -> None:
        summary = self._summary
        summary.updated_wall_ns = time.time_ns()
        summary.rows_lost = self._queue.lost
        summary.rows_lost_by_kind = dict(self._queue.lost_by_kind)
        summary.files = [path.name for path in self._files.files if path.name not in self._removed]
        summary.seal(summary.files[:-1])  # only the newest file is still being written
        try:
            write_summary(self.summary_path, summary)
        except OSError as exc:
            self._log_error("capture summary could not be written", exc)

    def _log_error(self, message: str, exc: BaseException, **fields: object) -> None:
        """From an ``except`` block. A bug (not an I/O error) is logged with its traceback."""
        now = time.monotonic()
        if now >= self._error_logged.get(message, 0.0):
            self._error_logged[message] = now + WARNING_INTERVAL
            bug = not isinstance(exc, OSError | pa.ArrowException)
            emit = log.exception if bug else log.error
            emit(message, error=str(exc), directory=str(self.directory), **fields)


def batch_bounds(chunk: RowChunk) -> Iterator[tuple[int, int]]:
    """Where the chunk's batches start and stop: at most BATCH_ROWS rows and BATCH_BYTES of
    frames each (one row at least), never between rows that share frame bytes."""
    sizes = chunk.frame_bytes() if len(chunk.frames) > BATCH_BYTES else None
    spans = chunk.shared_spans()
    start = 0
    while start < chunk.rows:
        stop = min(chunk.rows, start + BATCH_ROWS)
        if sizes is not None:
            within = int(np.searchsorted(np.cumsum(sizes[start:stop]), BATCH_BYTES, side="right"))
            stop = start + max(1, within)
        if spans is not None:
            stop = min(chunk.rows, keep_together(start, stop, *spans))
        yield start, stop
        start = stop


def keep_together(start: int, stop: int, first: np.ndarray, last: np.ndarray) -> int:
    """Where a batch starting at ``start`` ends, moved off every span of rows that must
    stay in one batch (rows sharing frame bytes): back to before the span, or, when that
    would leave the batch empty, on past it."""
    end = stop
    while True:
        inside = (first < end) & (end <= last)
        if not inside.any():
            return end
        end = int(first[inside].min())
        if end <= start:
            break
    end = stop
    while True:
        inside = (first < end) & (end <= last)
        if not inside.any():
            return end
        end = int(last[inside].max()) + 1
