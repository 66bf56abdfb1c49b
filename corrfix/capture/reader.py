"""Read capture directories back: every Arrow IPC stream file, up to its last whole batch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc

from .schema import CAPTURE_SCHEMA, FILE_SUFFIX, SCHEMA_VERSION, VERSION_KEY


class CaptureFormatError(ValueError):
    """A file is not a corrfix capture, or of a schema version this reader does not know."""


def capture_files(path: Path) -> list[Path]:
    """The capture files of a directory (or the single file given), oldest first by name."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob(f"*{FILE_SUFFIX}") if p.is_file())


def iter_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """Record batches of every file, in order. A file still being written (or cut short by
    a crash) yields what was flushed, up to its last whole batch."""
    for file in capture_files(path):
        with pa.OSFile(str(file), "rb") as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                continue  # not even a schema flushed yet
            _check_schema(file, reader.schema)
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):
                    break  # a batch only partly written
                yield batch


def read_capture(path: Path) -> pa.Table:
    """All rows of a capture directory as one table with :data:`CAPTURE_SCHEMA`.

    Columns a newer writer added at the end (same schema version) are left out."""
    batches = [batch.select(CAPTURE_SCHEMA.names) for batch in iter_batches(path)]
    if not batches:
        return CAPTURE_SCHEMA.empty_table()
    return pa.Table.from_batches(batches).cast(CAPTURE_SCHEMA)


def _check_schema(file: Path, schema: pa.Schema) -> None:
    version = (schema.metadata or {}).get(VERSION_KEY)
    if version is None:
        raise CaptureFormatError(f"{file} is not a corrfix capture (no schema version)")
    if int(version) > SCHEMA_VERSION:
        raise CaptureFormatError(
            f"{file} has capture schema version {int(version)}; this corrfix reads up to {SCHEMA_VERSION}"
        )
