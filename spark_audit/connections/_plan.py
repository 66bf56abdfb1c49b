"""Which connections each partition reads: whole connections, balanced by row count.

The plan runs on the driver on every query plan, so it must stay cheap. It starts from a
per-file index, rows per connection: the capture writer records it in the capture's
summary (``connections``), and for files it does not cover (older captures, imports, a
file still being written) it is read from the ``connection_id`` and ``capture_id``
columns of each file, memory-mapped (only those two columns' pages are touched, and only
up to the file's last whole batch, so a file still being written is safe to read). The
connections are then dealt out largest first, each to the partition with the fewest rows so
far (the classic greedy bound: no partition exceeds the mean by more than the largest
connection).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from corrfix.capture.format import connection_indexes
from spark_audit.source import is_local, open_file, stream_batches

SEPARATOR = "\x00"
"""Between capture id and connection id in a connection key (in neither id)."""

FileIndex = dict[str, dict[str, int]]
"""Per file: rows per connection key."""


def connection_keys(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """``capture_id`` NUL ``connection_id`` per row: a connection, unique across captures."""
    key = pc.binary_join_element_wise(batch.column("capture_id"), batch.column("connection_id"), SEPARATOR)
    return key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key


def index_file(path: str) -> dict[str, int]:
    """Rows per connection key in one capture file, read memory-mapped."""
    counts: dict[str, int] = {}
    with open_file(path) as source:
        for batch in stream_batches(source, path):
            grouped = pa.table({"key": connection_keys(batch)}).group_by("key").aggregate([([], "count_all")])
            for key, n in zip(
                grouped.column("key").to_pylist(), grouped.column("count_all").to_pylist(), strict=True
            ):
                counts[key] = counts.get(key, 0) + n
    return counts


def summary_index(path: str) -> dict[str, dict[str, int]]:
    """Rows per connection key of the files the capture summaries under ``path`` index
    (file name -> counts); empty for remote paths and for summaries without an index."""
    if not is_local(path):
        return {}
    local = Path(path.removeprefix("file://"))
    directory = local if local.is_dir() else local.parent
    known: dict[str, dict[str, int]] = {}
    for index in connection_indexes(directory):
        for name, counts in index.rows.items():
            if counts:
                known[name] = {f"{index.capture_id}{SEPARATOR}{conn}": n for conn, n in counts.items()}
    return known


def index_files(files: Iterable[str], known: dict[str, dict[str, int]] | None = None) -> FileIndex:
    """Rows per connection key of each file: from ``known`` (:func:`summary_index`) where it
    has the file, else read from the file itself."""
    known = known or {}
    return {file: known.get(Path(file).name) or index_file(file) for file in files}


@dataclass(frozen=True)
class Assignment:
    """One partition: its connection keys and the files that hold their rows."""

    connections: tuple[str, ...]
    files: tuple[str, ...]
    rows: int


def assign(index: FileIndex, partitions: int) -> list[Assignment]:
    """Whole connections dealt into at most ``partitions`` partitions by rows (none empty)."""
    totals: dict[str, int] = {}
    where: dict[str, list[str]] = {}
    for file, counts in index.items():
        for key, n in counts.items():
            totals[key] = totals.get(key, 0) + n
            where.setdefault(key, []).append(file)
    if not totals:
        return []
    count = max(1, min(partitions, len(totals)))
    heap = [(0, i) for i in range(count)]
    members: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for key in sorted(totals, key=lambda k: (-totals[k], k)):
        load, i = heapq.heappop(heap)
        members[i].append(key)
        loads[i] = load + totals[key]
        heapq.heappush(heap, (loads[i], i))
    order = list(index)
    out = []
    for keys, rows in zip(members, loads, strict=True):
        held = {file for key in keys for file in where[key]}
        out.append(Assignment(tuple(sorted(keys)), tuple(f for f in order if f in held), rows))
    return out
