"""The Arrow IPC stream files of one capture: naming, appending batches, rotation.

Each file is a complete Arrow IPC stream with the capture's schema. Each batch is
gathered in a user-space buffer and handed to the OS in one write before ``write``
returns (rather than one write per Arrow buffer, dozens per batch), so a reader sees every
whole batch at once; a file is finished with the end-of-stream marker when it rotates or
the capture closes.
Names sort in time order: the capture's start time (UTC), its id, then a file counter.

By default the files stay out of the page cache once written. After each batch, the
kernel is asked to start writing it back and to drop the pages of a batch written
earlier, whose writeback has had a batch's time to finish (``POSIX_FADV_DONTNEED``: it
drops clean pages and only starts writeback on dirty ones, so it never waits for the
disk, and what a slow disk has not taken yet stays cached as before). A sidecar capturing
hundreds of MB/s would otherwise fill the page cache with files nobody reads soon and
evict what a Kafka broker on the same host serves consumers from.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc

from corrfix.capture.format import FILE_SUFFIX

_BUFFER_BYTES = 1 << 20  # a batch larger than this goes out in more than one write


class UnfinishedFileError(OSError):
    """A batch was written and is readable, but the file it filled could not be finished
    (its end-of-stream marker): the batch's rows are in the file, not lost."""


def capture_stem(capture_id: str, started_wall_ns: int) -> str:
    """``capture-20250102T030405.123456Z-1a2b3c4d``: the common start of a capture's file names."""
    started = datetime.fromtimestamp(started_wall_ns / 1e9, UTC)
    return f"capture-{started:%Y%m%dT%H%M%S.%fZ}-{capture_id[:8]}"


class CaptureFiles:
    """Appends record batches to the current file; starts a new one by size or by age."""

    def __init__(
        self,
        directory: Path,
        stem: str,
        schema: pa.Schema,
        *,
        rotate_bytes: int,
        rotate_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        keep_page_cache: bool = False,
    ) -> None:
        self.directory = directory
        self.stem = stem
        self.schema = schema
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self._clock = clock
        self.files: list[Path] = []
        self.bytes_written = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._opened_at = 0.0
        self._release_cache = not keep_page_cache and hasattr(os, "posix_fadvise")
        self._fd = -1  # the current file's descriptor, for the advice
        self._written = 0  # where the last batch of the current file ended
        self._released = 0  # the file's bytes before this have been dropped from the cache

    def write(self, batch: pa.RecordBatch) -> None:
        """Append one batch; it is readable when this returns, even when finishing the file
        it filled then fails (:class:`UnfinishedFileError`)."""
        self.rotate_if_old()
        if self._writer is None:
            self._open()
        assert self._writer is not None and self._sink is not None
        before = self._sink.tell()
        self._writer.write_batch(batch)
        self._sink.flush()
        size = self._sink.tell()
        self.bytes_written += size - before
        if self._release_cache:
            self._leave_page_cache(size)
        if size >= self.rotate_bytes:
            try:
                self.finish_file()
            except (OSError, pa.ArrowException) as exc:
                raise UnfinishedFileError(f"{self.files[-1]} could not be finished: {exc}") from exc

    def _leave_page_cache(self, size: int) -> None:
        """Start writeback of what was just written; drop what was written the batch before."""
        fd = self._fd
        try:
            if self._written > self._released:
                os.posix_fadvise(fd, self._released, self._written - self._released, os.POSIX_FADV_DONTNEED)
                self._released = self._written
            os.posix_fadvise(fd, self._written, size - self._written, os.POSIX_FADV_DONTNEED)
        except OSError:  # advice only: a file system that ignores it costs the cache, not the capture
            self._release_cache = False
        self._written = size

    def rotate_if_old(self) -> None:
        """Finish the current file once it is ``rotate_seconds`` old, even if idle."""
        if self._writer is not None and self._clock() - self._opened_at >= self.rotate_seconds:
            self.finish_file()

    def finish_file(self) -> None:
        """Write the end-of-stream marker and close; the next batch starts a new file."""
        writer, sink = self._writer, self._sink
        self._writer = self._sink = None
        try:
            if writer is not None:
                writer.close()
            if sink is not None and self._release_cache:
                sink.flush()
                with contextlib.suppress(OSError):  # the rest of the file: writeback starts, clean pages go
                    os.posix_fadvise(self._fd, self._released, 0, os.POSIX_FADV_DONTNEED)
        finally:
            if sink is not None:
                sink.close()

    def abandon_file(self) -> None:
        """After a failed write: close without trusting the stream; the next batch starts anew."""
        with contextlib.suppress(OSError, pa.ArrowException):
            self.finish_file()

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.stem}-{len(self.files) + 1:06d}{FILE_SUFFIX}"
        raw = pa.OSFile(str(path), "wb")
        sink = pa.BufferedOutputStream(raw, _BUFFER_BYTES)
        try:
            self._writer = pa.ipc.new_stream(sink, self.schema)
            sink.flush()
        except BaseException:
            sink.close()
            raise
        self._sink = sink
        self._fd = raw.fileno()
        self._opened_at = self._clock()
        self._written = self._released = 0
        self.files.append(path)
