"""Capture files leave the page cache once written back, a batch behind, unless asked to stay."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import corrfix.capture._files as files_module
from corrfix.capture._files import CaptureFiles


def batch(rows: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(range(rows), pa.int64())})


def rows_in(files: CaptureFiles) -> int:
    return sum(pa.ipc.open_stream(path).read_all().num_rows for path in files.files)


@pytest.fixture
def advice(monkeypatch):
    """Every (offset, length) given to POSIX_FADV_DONTNEED, by the file's path."""
    calls: list[tuple[str, int, int]] = []

    def fadvise(fd: int, offset: int, length: int, what: int) -> None:
        assert what == os.POSIX_FADV_DONTNEED
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))

    monkeypatch.setattr(files_module.os, "posix_fadvise", fadvise)
    return calls


def test_each_batch_starts_its_writeback_and_drops_the_one_before(tmp_path, advice):
    schema = batch(1).schema
    files = CaptureFiles(tmp_path, "cap", schema, rotate_bytes=1 << 30, rotate_seconds=3600)
    ends = []
    for rows in (10, 2000, 30):
        files.write(batch(rows))
        ends.append(files._sink.tell())
    files.finish_file()
    path = str(files.files[0])
    # The schema before the first batch is dropped with it; the last batch and the
    # end-of-stream marker go when the file is finished (length 0: to the end).
    assert advice == [
        (path, 0, ends[0]),
        (path, 0, ends[0]),
        (path, ends[0], ends[1] - ends[0]),
        (path, ends[0], ends[1] - ends[0]),
        (path, ends[1], ends[2] - ends[1]),
        (path, ends[1], 0),
    ]
    assert rows_in(files) == 2040  # the advice changes no byte


def test_a_new_file_starts_its_advice_from_its_own_beginning(tmp_path, advice):
    files = CaptureFiles(tmp_path, "cap", batch(1).schema, rotate_bytes=1, rotate_seconds=3600)
    files.write(batch(5))  # rotates after this batch
    files.write(batch(5))
    files.finish_file()
    first, second = (str(path) for path in files.files)
    assert [call[1] for call in advice if call[0] == first] == [0, 0]
    assert [call[1] for call in advice if call[0] == second] == [0, 0]


def test_keep_page_cache_gives_no_advice(tmp_path, advice):
    files = CaptureFiles(
        tmp_path, "cap", batch(1).schema, rotate_bytes=1 << 30, rotate_seconds=3600, keep_page_cache=True
    )
    files.write(batch(5))
    files.write(batch(5))
    files.finish_file()
    assert advice == []


def test_a_file_system_that_refuses_the_advice_costs_the_cache_not_the_capture(tmp_path, monkeypatch):
    calls = []

    def refuse(fd: int, offset: int, length: int, what: int) -> None:
        calls.append(offset)
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(files_module.os, "posix_fadvise", refuse)
    files = CaptureFiles(tmp_path, "cap", batch(1).schema, rotate_bytes=1 << 30, rotate_seconds=3600)
    files.write(batch(5))
    files.write(batch(7))
    files.finish_file()
    assert calls == [0]  # asked once, then no more
    assert rows_in(files) == 12
