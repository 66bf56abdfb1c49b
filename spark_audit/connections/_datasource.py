"""``spark.read.format("corrfix-transactions")``: whole connections per partition, each
reduced in ``read()`` to its transactions (:func:`connection_pass`).

``partitions()`` plans from the per-file connection index (:mod:`._plan`); ``read()``
gathers its connections' rows from every file that holds them, reading each file
memory-mapped up to its last whole batch, joins consecutive batches into groups (one copy
of the columns the pass reads, :data:`GROUP_ROWS`), and reads Produce acks and bodies
straight from each group's frame bytes. Options: ``path`` (``load(path)``), ``partitions``
(default 2) and ``min_partition_rows`` (default 200,000: a small capture stays one
partition, one Python worker); ``table``: ``transactions`` (the default) or ``facts``, the
decoded broker-side bodies of the same connections (two narrow tables cost the JVM less than
one wide one); ``audit``, the audit table instead of the transactions (:func:`audit_pass`:
checks 1 and 2, latency summaries, no row per request), with the options ``window_s``
(default 10) and ``slow_min_ms`` (default 100); or ``audit_and_facts``, both of those from
one gathering of the rows (:data:`AUDIT_AND_FACTS_SCHEMA`), what the default audit reads.
With ``sum_plain_sends=true`` the facts sum the sends of batches without a producer id per
batch (``batch_sends`` rows) instead of one ``fact`` row per send. ``group_rows`` (default
262,144) is how many rows of consecutive batches are joined and read as one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from protocol import ApiKey
from spark_audit.connections._acks import UNKNOWN, produce_acks
from spark_audit.connections._audit import AUDIT_AND_FACTS_SCHEMA, AUDIT_SCHEMA, audit_and_facts, audit_pass
from spark_audit.connections._clusters import OPENS_SCHEMA, open_rows
from spark_audit.connections._heap import keep_heap
from spark_audit.connections._matching import CONNECTION_CODE
from spark_audit.connections._pass import (
    FACTS_SCHEMA,
    HEADER_COLUMNS,
    TRANSACTIONS_SCHEMA,
    connection_pass,
    decode_broker,
    facts_pass,
)
from spark_audit.connections._plan import SEPARATOR, assign, connection_keys, index_files, summary_index
from spark_audit.decode import FACT_SCHEMA
from spark_audit.source import list_files, open_file, stream_batches

TRANSACTIONS_SOURCE = "corrfix-transactions"
TRANSACTIONS_SPARK_SCHEMA: StructType = from_arrow_schema(TRANSACTIONS_SCHEMA)
FACTS_SPARK_SCHEMA: StructType = from_arrow_schema(FACTS_SCHEMA)
AUDIT_SPARK_SCHEMA: StructType = from_arrow_schema(AUDIT_SCHEMA)
AUDIT_AND_FACTS_SPARK_SCHEMA: StructType = from_arrow_schema(AUDIT_AND_FACTS_SCHEMA)
TABLES = {
    "transactions": TRANSACTIONS_SPARK_SCHEMA,
    "facts": FACTS_SPARK_SCHEMA,
    "audit": AUDIT_SPARK_SCHEMA,
    "audit_and_facts": AUDIT_AND_FACTS_SPARK_SCHEMA,
}
DEFAULT_WINDOW_S = 10.0
DEFAULT_SLOW_MIN_MS = 100.0
BATCH_ROWS = 65_536
DEFAULT_MIN_PARTITION_ROWS = 200_000
GROUP_ROWS = 262_144
"""Rows read together. Each numpy or Arrow call of the pass has a fixed cost of some
microseconds; over the writer's batches (16,384 rows) it was a fifth of the pass. Joining
batches costs one copy of the columns read."""
GROUP_BYTES = 64 * 1024 * 1024
"""And at most this many bytes of them (the columns read, frames included): the join
copies them, so this bounds the copy a Python worker holds at once."""
READ_COLUMNS = frozenset({*HEADER_COLUMNS, "frame", "frame_length", "upstream_address"})
"""The columns a group keeps: what the pass and the body decode read, and the open rows'
upstream address (each connection's cluster, :mod:`._clusters`)."""


@dataclass(frozen=True)
class Connections(InputPartition):
    """Whole connections (keys) and the files holding their rows."""

    connections: tuple[str, ...]
    files: tuple[str, ...]


def _headers(batch: pa.RecordBatch, rows: np.ndarray | None, codes: np.ndarray) -> pa.Table:
    """The pass's columns of ``rows`` of ``batch`` (all if None), with acks read in place
    and each row's connection code (``codes``, per row of the batch)."""
    names = batch.schema.names
    n = batch.num_rows if rows is None else len(rows)
    index = None if rows is None else pa.array(rows)
    columns: dict[str, pa.Array] = {CONNECTION_CODE: pa.array(codes if rows is None else codes[rows])}
    for name in HEADER_COLUMNS:
        if name in names:
            column = batch.column(name)
            columns[name] = column if index is None else column.take(index)
        else:
            columns[name] = pa.nulls(n, TRANSACTIONS_SCHEMA.field(name).type)
    acks = np.full(n, UNKNOWN, np.int64)
    produce = pc.and_(pc.equal(columns["api_key"], ApiKey.PRODUCE), pc.equal(columns["direction"], "request"))
    at = np.flatnonzero(pc.fill_null(produce, False).to_numpy(zero_copy_only=False))
    if len(at) and "frame" in names:
        in_batch = at if rows is None else rows[at]
        versions = columns["api_version"].to_numpy(zero_copy_only=False)[at].astype(np.int64)
        acks[at] = produce_acks(batch.column("frame"), in_batch, versions)
    columns["acks"] = pa.array(acks, pa.int16(), mask=acks == UNKNOWN)
    return pa.table(columns)


def _wanted(connections: tuple[str, ...]) -> dict[str, tuple[pa.Array, np.ndarray]]:
    """The connection ids of each capture among connection keys, and where each id's key
    is among them."""
    ids: dict[str, tuple[list[str], list[int]]] = {}
    for at, key in enumerate(connections):
        capture, _, connection = key.partition(SEPARATOR)
        names, places = ids.setdefault(capture, ([], []))
        names.append(connection)
        places.append(at)
    return {
        capture: (pa.array(names, pa.string()), np.array(places, np.int64))
        for capture, (names, places) in ids.items()
    }


def _codes(
    batch: pa.RecordBatch, keys: pa.Array, wanted: dict[str, tuple[pa.Array, np.ndarray]]
) -> np.ndarray:
    """Each row's connection as its place among the partition's connection ``keys``
    (``wanted``, by capture), -1 for rows of other connections: which rows are the
    partition's, and the pass's connection code (:data:`CONNECTION_CODE`) for free. A batch
    of one capture, the usual case, is matched on its connection ids alone."""
    captures = pc.unique(batch.column("capture_id"))
    if len(captures) == 1 and captures[0].is_valid:
        found = wanted.get(captures[0].as_py())
        if found is None:
            return np.full(batch.num_rows, -1, np.int64)
        ids, places = found
        local = pc.fill_null(pc.index_in(batch.column("connection_id"), value_set=ids), -1).to_numpy()
        return np.where(local >= 0, places[np.maximum(local, 0)], -1)
    return pc.fill_null(pc.index_in(connection_keys(batch), value_set=keys), -1).to_numpy().astype(np.int64)


def _batches(part: Connections) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Each batch holding rows of the partition's connections, from every file that holds
    them, with each row's connection code (:func:`_codes`; -1: not the partition's)."""
    keys, wanted = pa.array(part.connections, pa.string()), _wanted(part.connections)
    for path in part.files:
        with open_file(path) as source:
            for batch in stream_batches(source, path):
                codes = _codes(batch, keys, wanted)
                if (codes >= 0).any():
                    yield batch, codes


def _joined(batches: list[pa.RecordBatch], codes: list[np.ndarray]) -> tuple[pa.RecordBatch, np.ndarray]:
    """Batches of one schema, each cut to the columns the pass reads, as one batch, and
    their rows' connection codes. A lone batch is passed as it is (its rows read where they
    are); joined batches keep only the partition's rows, so no other row is copied."""
    if len(batches) == 1:
        return batches[0], codes[0]
    kept = []
    for batch, code in zip(batches, codes, strict=True):
        mine = code >= 0
        kept.append((batch, code) if mine.all() else (batch.filter(pa.array(mine)), code[mine]))
    joined = pa.Table.from_batches([batch for batch, _ in kept]).combine_chunks()
    [whole] = joined.to_batches()  # one array per column: a join stays under GROUP_BYTES
    return whole, np.concatenate([code for _, code in kept])


def _groups(part: Connections, group_rows: int) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """:func:`_batches` joined up to ``group_rows`` rows and :data:`GROUP_BYTES` each (the
    batches of one group share a schema; a bigger batch is a group alone)."""
    batches: list[pa.RecordBatch] = []
    codes: list[np.ndarray] = []
    rows = size = 0
    for whole, code in _batches(part):
        batch = whole.select([name for name in whole.schema.names if name in READ_COLUMNS])
        if batches and (
            rows + batch.num_rows > group_rows
            or size + batch.nbytes > GROUP_BYTES
            or batch.schema != batches[0].schema
        ):
            yield _joined(batches, codes)
            batches, codes, rows, size = [], [], 0, 0
        batches.append(batch)
        codes.append(code)
        rows += batch.num_rows
        size += batch.nbytes
    if batches:
        yield _joined(batches, codes)


def _gather(
    part: Connections, headers: bool, bodies: bool, group_rows: int
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The partition's rows without frames, with Produce acks (if ``headers``), and the facts
    of their broker-side bodies and their open rows (if ``bodies``), from one scan of the
    files. Rows are read a group of batches at a time (:func:`_groups`): frames are read
    where they are, in the group, and not copied again."""
    rows, facts, opens = [], [FACT_SCHEMA.empty_table()], [OPENS_SCHEMA.empty_table()]
    for batch, codes in _groups(part, group_rows):
        mine = codes >= 0
        every = bool(mine.all())
        if headers:
            rows.append(_headers(batch, None if every else np.flatnonzero(mine), codes))
        if bodies:
            opens.append(open_rows(batch, None if every else mine))
            if "frame" in batch.schema.names:
                facts.append(decode_broker(batch, None if every else mine))
    return (
        pa.concat_tables(rows) if rows else pa.table({}),
        pa.concat_tables(facts),
        pa.concat_tables(opens),
    )


def read_connections(
    part: Connections,
    table: str = "transactions",
    window_s: float = DEFAULT_WINDOW_S,
    slow_min_ms: float = DEFAULT_SLOW_MIN_MS,
    sum_plain_sends: bool = False,
    group_rows: int = GROUP_ROWS,
) -> Iterator[pa.RecordBatch]:
    """One partition's ``table`` (transactions, facts, audit, or audit and facts), as
    batches of its schema."""
    rows, facts, opens = _gather(
        part, headers=table != "facts", bodies=table in ("facts", "audit_and_facts"), group_rows=group_rows
    )
    if table == "facts":
        out = facts_pass(facts, sum_plain_sends, opens)
    elif table in ("audit", "audit_and_facts"):
        out = audit_pass(rows, window_s, slow_min_ms) if rows.num_rows else AUDIT_SCHEMA.empty_table()
        if table == "audit_and_facts":
            out = audit_and_facts(out, facts_pass(facts, sum_plain_sends, opens))
    else:
        out = connection_pass(rows) if rows.num_rows else TRANSACTIONS_SCHEMA.empty_table()
    yield from out.to_batches(max_chunksize=BATCH_ROWS)


class TransactionsReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        path = options.get("path") or options.get("paths")
        if not path:
            raise ValueError(f'{TRANSACTIONS_SOURCE}: give a capture directory: .load("DIR")')
        self.path = path
        self.table = options.get("table", "transactions")
        self.partition_count = int(options.get("partitions", 2))
        self.min_rows = int(options.get("min_partition_rows", DEFAULT_MIN_PARTITION_ROWS))
        self.window_s = float(options.get("window_s", DEFAULT_WINDOW_S))
        self.slow_min_ms = float(options.get("slow_min_ms", DEFAULT_SLOW_MIN_MS))
        self.sum_plain_sends = options.get("sum_plain_sends", "false").lower() == "true"
        self.group_rows = int(options.get("group_rows", GROUP_ROWS))

    def partitions(self) -> list[InputPartition]:
        index = index_files(list_files(self.path), summary_index(self.path))
        total = sum(sum(counts.values()) for counts in index.values())
        count = max(1, min(self.partition_count, total // max(self.min_rows, 1)))
        planned = [Connections(a.connections, a.files) for a in assign(index, count)]
        return list(planned) or [Connections((), ())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Connections)
        keep_heap()  # in the Python worker: the pass's temporaries reuse the heap
        return read_connections(
            partition, self.table, self.window_s, self.slow_min_ms, self.sum_plain_sends, self.group_rows
        )


class TransactionsDataSource(DataSource):
    """The ``corrfix-transactions`` format (:data:`TRANSACTIONS_SCHEMA`, or :data:`FACTS_SCHEMA`
    with ``table=facts``, :data:`AUDIT_SCHEMA` with ``table=audit``,
    :data:`AUDIT_AND_FACTS_SCHEMA` with ``table=audit_and_facts``)."""

    @classmethod
    def name(cls) -> str:
        return TRANSACTIONS_SOURCE

    def schema(self) -> StructType:
        table = self.options.get("table", "transactions")
        if table not in TABLES:
            raise ValueError(f"{TRANSACTIONS_SOURCE}: table is one of {', '.join(TABLES)}, not {table!r}")
        return TABLES[table]

    def reader(self, schema: StructType) -> DataSourceReader:
        return TransactionsReader(dict(self.options))
