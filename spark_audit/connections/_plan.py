"""Which connections each partition reads: whole connections, balanced by row count.

The plan runs on the driver on every query plan, so it must stay cheap. It starts from a
per-file index, rows per connection: the capture writer records it in the capture's
summary (``connections``), and for files it does not cover (older captures, imports, a
file still being written) it is read from the ``connection_id`` and ``capture_id``
columns of each file, memory-mapped (only those two columns' pages are touched, and only
up to the file's last whole batch, so a file still being written is safe to read).

The connections are then put in the order of the first file that holds them and cut into
runs of about equal rows: each cut at the connection boundary nearest to its share of the
rows, so no partition exceeds the mean by more than the largest connection. A partition
reads every file that holds one of its connections, and a run of connections in file order
lives in few files: with rotated files and short-lived connections, the partitions together
read each file about once, not once each.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from corrfix.capture.format import CaptureFormatError, connection_indexes
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
    """Rows per connection key in one capture file, read memory-mapped. A row without a
    capture id or a connection id (the format requires both) makes the file unreadable
    here: no partition could hold its connection."""
    counts: dict[str, int] = {}
    with open_file(path) as source:
        for batch in stream_batches(source, path):
            keys = connection_keys(batch)
            if keys.null_count:
                raise CaptureFormatError(
                    f"{path}: {keys.null_count} of {len(keys)} rows of a batch have no capture_id or "
                    "connection_id, which the capture format requires"
                )
            grouped = pa.table({"key": keys}).group_by("key").aggregate([([], "count_all")])
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
    """Whole connections cut into at most ``partitions`` runs of about equal rows, in the
    order of the files that hold them (none empty)."""
    totals: dict[str, int] = {}
    where: dict[str, list[str]] = {}
    for file, counts in index.items():
        for key, n in counts.items():
            totals[key] = totals.get(key, 0) + n
            where.setdefault(key, []).append(file)
    if not totals:
        return []
    count = max(1, min(partitions, len(totals)))
    position = {file: i for i, file in enumerate(index)}
    keys = sorted(totals, key=lambda k: (position[where[k][0]], k))
    ends = list(itertools.accumulate(totals[k] for k in keys))
    cuts = [0]
    for share in (ends[-1] * i / count for i in range(1, count)):
        at = bisect.bisect_left(ends, share)  # the first connection whose end reaches the share
        before = ends[at - 1] if at else 0
        cuts.append(max(cuts[-1], at + 1 if ends[at] - share <= share - before else at))
    cuts.append(len(keys))
    out = []
    order = list(index)
    for lo, hi in itertools.pairwise(cuts):
        if lo == hi:
            continue
        run = keys[lo:hi]
        held = {file for key in run for file in where[key]}
        rows = sum(totals[key] for key in run)
        out.append(Assignment(tuple(sorted(run)), tuple(f for f in order if f in held), rows))
    return out
