"""The sends of batches without a producer id, summed per batch (and home: the
connections' address and named cluster, :mod:`._clusters`) in each partition: a
Produce-heavy capture has one such fact per batch sent, and the duplicate check only counts
them per batch, so the JVM gets one row per batch and partition instead.

A batch is identified by :data:`BATCH`: topic, partition, CRC, record count, first
timestamp and length. The CRC alone is 32 bits, and chance collisions between different
batches of one partition become likely at tens of thousands of batches; a resend keeps the
batch's bytes, so its copies agree on every field of the key, while a chance collision
almost never does. ``lineages`` counts the send lineages among a batch's sends (a request
and corrfix's re-sends of it are one lineage: same capture, connection and ``lineage_id``;
a send without lineage is its own), so that ``sends - lineages`` is the re-sends corrfix
made. Connections are whole in a partition, so lineages sum exactly across partitions.

The sums are exactly the partial aggregates of ``spark_audit.checks.duplicates_of_sends``:
sends, acknowledged and unanswered sends, lineages, the first send (least wall time,
capture, connection, correlation id, nulls first) and the last send's time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import ApiKey
from spark_audit.connections._clusters import HOME
from spark_audit.connections._codes import combined, dense, ordered, sort_order
from spark_audit.decode import FACT_SCHEMA

BATCH = ("topic", "partition", "crc", "record_count", "first_timestamp", "batch_length")
FIRST = ("wall_ns", "capture_id", "connection_id", "correlation_id")
LINEAGE = ("capture_id", "connection_id", "lineage_id")
BATCH_SENDS_SCHEMA = pa.schema(
    [
        *[FACT_SCHEMA.field(name).with_nullable(True) for name in (*BATCH, *HOME, *FIRST)],
        pa.field("sends", pa.int64()),
        pa.field("acknowledged_sends", pa.int64()),
        pa.field("unanswered_sends", pa.int64()),
        pa.field("last_wall_ns", pa.int64()),
        pa.field("lineages", pa.int64()),
    ]
)
"""Per batch (:data:`BATCH`) and home (:data:`HOME`: the sends' connections' upstream
address and the cluster their answers named, which Spark resolves to a cluster): the first
send's columns, then the sums."""


def plain_batches(facts: pa.Table) -> pa.Array:
    """Which of ``facts`` are sends of a Produce batch without a producer id, outside a
    transaction: the duplicate check's batches."""
    fact, api_key = facts.column("fact"), facts.column("api_key")
    chosen = pc.and_(pc.equal(fact, "produce_batch"), pc.equal(api_key, ApiKey.PRODUCE))
    plain = pc.and_(pc.is_valid(facts.column("crc")), pc.less(facts.column("producer_id"), 0))
    chosen = pc.and_(chosen, pc.and_(plain, pc.is_null(facts.column("transactional_id"))))
    out = pc.fill_null(chosen, False)
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _reduce(
    column: pa.ChunkedArray, order: np.ndarray, starts: np.ndarray, ufunc: np.ufunc, fill: int
) -> pa.Array:
    """``ufunc`` over each group's non-null values of ``column`` in ``order`` (null when the
    group has none)."""
    values = pc.fill_null(pc.cast(column, pa.int64()), fill).to_numpy(zero_copy_only=False)[order]
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)[order].astype(np.int64)
    return pa.array(ufunc.reduceat(values, starts), pa.int64(), mask=np.add.reduceat(valid, starts) == 0)


def _lineages(t: pa.Table, order: np.ndarray, new: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The number of distinct lineages in each group of ``t`` in ``order`` (sorted by group;
    ``new`` marks each group's first row, at ``starts``). A send without lineage is one of
    its own. Only groups of more than one send are sorted: most batches are sent once."""
    sizes = np.diff(np.append(starts, t.num_rows))
    out = np.ones(len(starts), np.int64)
    if not (sizes > 1).any():
        return out
    group = np.cumsum(new) - 1
    rows = np.flatnonzero(sizes[group] > 1)
    sub = t.select(list(LINEAGE)).take(pa.array(order[rows])).combine_chunks()
    lineage = sub.column("lineage_id").chunk(0)
    alone = lineage.is_null().to_numpy(zero_copy_only=False)
    ids = pc.fill_null(lineage, 0).to_numpy(zero_copy_only=False).astype(np.int64) & 0xFFFFFFFF
    # One int per lineage; ``alone`` in it, so that a lineage numbered 0 never runs together
    # with the sends without one (each of which counts by itself).
    key = combined([*(dense(sub.column(name)) for name in LINEAGE[:-1]), alone.astype(np.int64), ids])
    mine = group[rows]
    by_lineage = np.lexsort((key, mine))
    key, mine_sorted = key[by_lineage], mine[by_lineage]
    first = np.ones(len(by_lineage), dtype=bool)
    first[1:] = (key[1:] != key[:-1]) | (mine_sorted[1:] != mine_sorted[:-1])
    counts = np.bincount(mine_sorted[first | alone[by_lineage]], minlength=len(starts))
    return np.where(sizes > 1, counts, out)


def sum_sends(sends: pa.Table) -> pa.Table:
    """:data:`BATCH_SENDS_SCHEMA` rows of ``sends`` (rows of :func:`plain_batches`). The
    sends are ordered, not moved: only each batch's first send is gathered."""
    n = sends.num_rows
    if n == 0:
        return BATCH_SENDS_SCHEMA.empty_table()
    batch = combined([dense(sends.column(name)) for name in (*BATCH, *HOME)])
    wall = sends.column("wall_ns")
    tie = combined([ordered(sends.column(name)) for name in FIRST[1:]], keep_order=True)
    by_wall = [pc.fill_null(wall, 0).to_numpy(zero_copy_only=False).astype(np.int64)]
    if wall.null_count:  # nulls first
        by_wall.insert(0, pc.is_valid(wall).to_numpy(zero_copy_only=False).astype(np.int64))
    order = sort_order(batch, *by_wall, tie)  # per batch, the first send first
    grouped = batch[order]
    new = np.zeros(n, dtype=bool)
    new[0] = True
    new[1:] = grouped[1:] != grouped[:-1]
    starts = np.flatnonzero(new)
    firsts = sends.select([*BATCH, *HOME, *FIRST]).take(pa.array(order[starts]))
    acknowledged = sends.column("acknowledged")
    acked = pc.fill_null(acknowledged, False).to_numpy(zero_copy_only=False)[order].astype(np.int64)
    unanswered = pc.is_null(acknowledged).to_numpy(zero_copy_only=False)[order].astype(np.int64)
    low = np.iinfo(np.int64).min
    columns = {name: firsts.column(name) for name in (*BATCH, *HOME, *FIRST)}
    columns.update(
        sends=pa.array(np.diff(np.append(starts, n)), pa.int64()),
        acknowledged_sends=pa.array(np.add.reduceat(acked, starts), pa.int64()),
        unanswered_sends=pa.array(np.add.reduceat(unanswered, starts), pa.int64()),
        last_wall_ns=_reduce(wall, order, starts, np.maximum, low),
        lineages=pa.array(_lineages(sends, order, new, starts), pa.int64()),
    )
    return pa.table([columns[f.name].cast(f.type) for f in BATCH_SENDS_SCHEMA], schema=BATCH_SENDS_SCHEMA)
