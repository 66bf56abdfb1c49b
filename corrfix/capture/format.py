"""The capture contract: one Arrow schema, versioned, the names its rows use, and how to read it.

docs/capture-format.md describes it. The audit reads captures through this module alone,
so it imports nothing but pyarrow.

One row per event on a connection: a frame on either side, the connection opening or
closing, or a repair. Frame rows carry both correlation ids where the proxy knows them,
so an audit can follow a request from the client through every re-send to its answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc

SCHEMA_VERSION = 2
"""2: a frame row may keep only the head of its frame and name the row holding the rest
(``frame_seq``). Version 1 files have no such rows and are read as they are."""
VERSION_KEY = b"corrfix.capture.schema_version"
SOURCE_KEY = b"corrfix.capture.source"
CAPTURE_ID_KEY = b"corrfix.capture.id"
FILE_SUFFIX = ".arrows"
SUMMARY_SUFFIX = ".capture.json"
SUMMARY_FORMAT = "corrfix-capture-summary"


class RowKind(StrEnum):
    FRAME = "frame"
    OPEN = "open"
    CLOSE = "close"
    REPAIR = "repair"


class Side(StrEnum):
    """Which TCP connection a frame crossed."""

    CLIENT = "client"  # client <-> proxy
    UPSTREAM = "upstream"  # proxy <-> broker


class Direction(StrEnum):
    """Which way it went: requests travel towards the broker, responses away from it."""

    REQUEST = "request"
    RESPONSE = "response"


class Source(StrEnum):
    PROXY = "proxy"  # written by corrfix proxy --capture-dir
    WIRE = "wire"  # imported from a tcpdump capture taken without corrfix


CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("connection_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("side", pa.string()),
        pa.field("direction", pa.string()),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("mono_ns", pa.int64(), nullable=False),
        pa.field("api_key", pa.int16()),
        pa.field("api_version", pa.int16()),
        pa.field("client_correlation_id", pa.int32()),
        pa.field("upstream_correlation_id", pa.int32()),
        pa.field("frame_length", pa.int32()),
        pa.field("frame", pa.binary()),
        pa.field("client_address", pa.string()),
        pa.field("upstream_address", pa.string()),
        pa.field("event", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("attempt", pa.int32()),
        pa.field("new_upstream_correlation_id", pa.int32()),
        pa.field("frame_seq", pa.int64()),
    ],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
"""Columns, in order. ``frame`` holds the frame bytes including the 4-byte size prefix,
truncated to the snap length; ``frame_length`` is the original length. Where ``frame_seq``
is set, ``frame`` is only the first :data:`SHARED_HEAD` bytes and the rest are those of the
row ``frame_seq`` of the same connection, which is in the same record batch
(:func:`with_shared_frames` joins them)."""

SHARED_HEAD = 512
"""Bytes a client-side frame row keeps of its own frame when the upstream row of the same
frame holds the rest: its header, with the client's correlation id, and the start of the
body (a Produce request's acks)."""
BINARY_MAX_BYTES = (1 << 31) - 1
"""The most bytes one Arrow ``binary`` array holds (32-bit offsets): more than any frame's
stored bytes."""
SHARED_MIN = 1024
"""Frames are shared only from this many stored bytes on: below it a reference saves less
than it costs."""


def schema_for(capture_id: str, source: Source) -> pa.Schema:
    """The schema with this capture's file-level metadata."""
    metadata = dict(CAPTURE_SCHEMA.metadata or {})
    metadata[SOURCE_KEY] = source.value.encode()
    metadata[CAPTURE_ID_KEY] = capture_id.encode()
    return CAPTURE_SCHEMA.with_metadata(metadata)


class CaptureFormatError(ValueError):
    """A file is not a corrfix capture, or of a schema version this reader does not know."""


def capture_files(path: Path) -> list[Path]:
    """The capture files of a directory (or the single file given), oldest first by name. By
    the name, not the path: an older file moved into a folder below is still read first."""
    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob(f"*{FILE_SUFFIX}") if p.is_file()), key=lambda p: (p.name, p))


def iter_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """Record batches of every file, in order. A file still being written (or cut short by
    a crash) yields what was flushed, up to its last whole batch. A file removed after the
    directory was listed (an operator pruning the oldest) is skipped."""
    for file in capture_files(path):
        try:
            source = pa.OSFile(str(file), "rb")
        except FileNotFoundError:
            continue
        with source:
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
    """All rows of a capture directory as one table with :data:`CAPTURE_SCHEMA`, every
    frame whole (:func:`whole_frames`, batch by batch).

    Columns a newer writer added at the end (same schema version) are left out, and
    columns an older version did not have are null."""
    batches = [whole_frames(_conform(batch)) for batch in iter_batches(path)]
    if not batches:
        return CAPTURE_SCHEMA.empty_table()
    return pa.Table.from_batches(batches).cast(CAPTURE_SCHEMA)


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    names = batch.schema.names
    columns = [
        batch.column(name) if name in names else pa.nulls(batch.num_rows, field.type)
        for name, field in zip(CAPTURE_SCHEMA.names, CAPTURE_SCHEMA, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=CAPTURE_SCHEMA)


def with_shared_frames(table: pa.Table) -> pa.Table:
    """``table`` with every frame whole: :func:`whole_frames` on each of its record batches
    (a row and the row holding the rest of its frame are written in one batch)."""
    if "frame_seq" not in table.column_names or "frame" not in table.column_names:
        return table
    return pa.Table.from_batches([whole_frames(batch) for batch in table.to_batches()], table.schema)


def whole_frames(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with the frame of every row that shares another row's bytes made whole: its
    own head, then the bytes of the row it names after that head. The named row must be in
    this batch, of the same capture and connection; a row whose named row is not (lost, or
    filtered out) keeps its head alone, like a frame cut by the snap length."""
    names = batch.schema.names
    if "frame_seq" not in names or "frame" not in names or batch.num_rows == 0:
        return batch
    named = batch.column("frame_seq")
    if named.null_count == len(named):
        return batch
    rows = np.flatnonzero(named.is_valid().to_numpy(zero_copy_only=False))
    seq = batch.column("seq").to_numpy(zero_copy_only=False)
    holder_seq = pc.fill_null(named, 0).to_numpy(zero_copy_only=False)[rows].astype(np.int64)
    # As written, a pair is within the rows of one connection that have consecutive seqs.
    holders = rows + (holder_seq - seq[rows])
    inside = (holders >= 0) & (holders < batch.num_rows)
    holders = np.where(inside, holders, 0)
    found = inside & (seq[holders] == holder_seq)
    for column in ("capture_id", "connection_id"):
        if column in names:
            values = batch.column(column)
            found &= pc.equal(values.take(pa.array(rows)), values.take(pa.array(holders))).to_numpy(
                zero_copy_only=False
            )
    missing = ~found
    if missing.any():  # rows reordered since they were written: look their holders up by key
        holders[missing], found[missing] = _holders_by_key(batch, rows[missing], holder_seq[missing])
    frame = batch.column("frame")
    heads = frame.take(pa.array(rows))
    rest = pc.binary_slice(frame.take(pa.array(holders)), SHARED_HEAD, BINARY_MAX_BYTES)
    joined = pc.binary_join_element_wise(heads, rest, b"")
    whole = pc.if_else(pa.array(found), joined, heads)
    mask = np.zeros(batch.num_rows, np.bool_)
    mask[rows] = True
    merged = pc.replace_with_mask(frame, pa.array(mask), whole)
    return batch.set_column(names.index("frame"), batch.schema.field("frame"), merged)


def _holders_by_key(
    batch: pa.RecordBatch, rows: np.ndarray, holder_seq: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where the rows named by ``rows`` are, by (capture id, connection id, seq); the first
    of several rows with one key (a file read twice)."""
    names = batch.schema.names
    key = [name for name in ("capture_id", "connection_id") if name in names]
    index = pa.array(np.arange(batch.num_rows, dtype=np.int64))
    holders = (
        pa.table({**{name: batch.column(name) for name in key}, "seq": batch.column("seq"), "_holder": index})
        .group_by([*key, "seq"], use_threads=False)
        .aggregate([("_holder", "min")])
    )
    wanted = pa.table(
        {
            **{name: batch.column(name).take(pa.array(rows)) for name in key},
            "seq": pa.array(holder_seq, pa.int64()),
            "_row": pa.array(np.arange(len(rows), dtype=np.int64)),
        }
    )
    joined = wanted.join(holders, [*key, "seq"], join_type="left outer", use_threads=False).sort_by("_row")
    holder = joined.column("_holder_min")
    found = holder.is_valid().to_numpy(zero_copy_only=False)
    return pc.fill_null(holder, 0).to_numpy(zero_copy_only=False).astype(np.int64), found


def _check_schema(file: Path, schema: pa.Schema) -> None:
    version = (schema.metadata or {}).get(VERSION_KEY)
    if version is None:
        raise CaptureFormatError(f"{file} is not a corrfix capture (no schema version)")
    if int(version) > SCHEMA_VERSION:
        raise CaptureFormatError(
            f"{file} has capture schema version {int(version)}; this corrfix reads up to {SCHEMA_VERSION}"
        )


def summary_documents(directory: Path) -> Iterator[dict[str, Any]]:
    """Every capture summary under ``directory`` as parsed JSON, oldest name first
    (unreadable files and other JSON are skipped)."""
    for file in sorted(directory.rglob(f"*{SUMMARY_SUFFIX}")):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("format") == SUMMARY_FORMAT:
            yield data


@dataclass(frozen=True)
class ConnectionIndex:
    """Rows per connection in each capture file, as a capture's summary records them
    (``connections``): only for files the capture has finished writing, so that the counts
    are the files' own."""

    capture_id: str
    rows: dict[str, dict[str, int]]
    """File name -> connection id -> rows."""


def connection_indexes(directory: Path) -> list[ConnectionIndex]:
    """The per-file connection counts of every capture summary under ``directory`` (the
    newest file of a capture still running is left out: it may hold more than the summary
    says). Summaries without them (older writers, imports) give nothing."""
    found = []
    for data in summary_documents(directory):
        rows = data.get("connections")
        if not isinstance(rows, dict) or not isinstance(data.get("capture_id"), str):
            continue
        files = data.get("files") or []
        if not data.get("finished") and files:
            rows = {name: counts for name, counts in rows.items() if name != files[-1]}
        found.append(ConnectionIndex(data["capture_id"], rows))
    return found
