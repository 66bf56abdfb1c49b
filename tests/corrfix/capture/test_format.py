"""The reader's side of the versioning rule: columns added at the end are ignored."""

from __future__ import annotations

import pyarrow as pa

from corrfix.capture import CaptureWriter, capture_files, read_capture
from corrfix.capture import format as format_module
from corrfix.capture.format import CAPTURE_SCHEMA, FILE_SUFFIX, Source, schema_for
from protocol import ApiKey
from protocol.testing import request_frame
from tests.support.capture_shell import Shell


def test_columns_added_at_the_end_do_not_break_reading(tmp_path):
    schema = schema_for("abc", Source.PROXY)
    row = {name: None for name in CAPTURE_SCHEMA.names}
    row.update(capture_id="abc", source="proxy", connection_id="c1", seq=0, kind="open", wall_ns=1, mono_ns=1)
    batch = pa.RecordBatch.from_pylist([row], schema=schema)
    newer = batch.append_column(pa.field("added_later", pa.int32()), pa.array([7], pa.int32()))
    newer = newer.replace_schema_metadata(schema.metadata)
    for name, data in (("a", batch), ("b", newer)):
        with (
            pa.OSFile(str(tmp_path / f"{name}{FILE_SUFFIX}"), "wb") as sink,
            pa.ipc.new_stream(sink, data.schema) as w,
        ):
            w.write_batch(data)
    table = read_capture(tmp_path)
    assert table.schema.names == CAPTURE_SCHEMA.names and table.num_rows == 2


def test_files_moved_into_a_subdirectory_are_read_in_name_order(tmp_path):
    """The contract's order is by file name: an older file moved below the directory (an
    ``old/`` folder) is still read before the newer ones, so each connection stays in seq order."""
    with CaptureWriter(tmp_path, rotate_bytes=1, flush_seconds=60.0) as writer:
        shell = Shell(writer)
        shell.open()
        assert writer.flush(timeout=10)
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
    first, *newer = writer.stats.files
    assert newer
    (tmp_path / "old").mkdir()
    first.rename(tmp_path / "old" / first.name)
    assert [path.name for path in capture_files(tmp_path)] == sorted(p.name for p in writer.stats.files)
    assert read_capture(tmp_path).column("seq").to_pylist() == [0, 1, 2, 3]


def test_a_file_pruned_after_the_listing_is_skipped(tmp_path, monkeypatch):
    """The docs tell operators to remove the oldest files themselves: one removed while a
    reader (``capture info``, the audit) had listed it raised FileNotFoundError."""
    with CaptureWriter(tmp_path, rotate_bytes=1, flush_seconds=60.0) as writer:
        shell = Shell(writer)
        shell.open()
        assert writer.flush(timeout=10)
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
    oldest = writer.stats.files[0]
    listed = capture_files(tmp_path)
    assert len(listed) > 1
    oldest.unlink()  # as the reader goes through its listing
    monkeypatch.setattr(format_module, "capture_files", lambda path: listed)
    rows = read_capture(tmp_path)
    assert rows.num_rows and rows.column("seq").to_pylist()[0] > 0
