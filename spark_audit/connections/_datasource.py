"""``spark.read.format("corrfix-transactions")``: whole connections per partition, each
reduced in ``read()`` to its transactions (:func:`connection_pass`).

``partitions()`` plans from the per-file connection index (:mod:`._plan`); ``read()``
gathers its connections' rows from every file that holds them, reading each file
memory-mapped up to its last whole batch, and reads Produce acks straight from the mapped
frame bytes, so no frame is copied. Options: ``path`` (``load(path)``), ``partitions``
(default 2) and ``min_partition_rows`` (default 200,000: a small capture stays one
partition, one Python worker).
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
from spark_audit.connections._pass import (
    HEADER_COLUMNS,
    TRANSACTIONS_SCHEMA,
    broker_frames,
    connection_pass,
    decode_table,
)
from spark_audit.connections._plan import assign, connection_keys, index_files
from spark_audit.decode import FACT_SCHEMA
from spark_audit.source import list_files, open_file, stream_batches

TRANSACTIONS_SOURCE = "corrfix-transactions"
TRANSACTIONS_SPARK_SCHEMA: StructType = from_arrow_schema(TRANSACTIONS_SCHEMA)
BATCH_ROWS = 65_536
DEFAULT_MIN_PARTITION_ROWS = 200_000


@dataclass(frozen=True)
class Connections(InputPartition):
    """Whole connections (keys) and the files holding their rows."""

    connections: tuple[str, ...]
    files: tuple[str, ...]


def _headers(batch: pa.RecordBatch, rows: np.ndarray | None) -> pa.Table:
    """The pass's columns of ``rows`` of ``batch`` (all if None), with acks read in place."""
    names = batch.schema.names
    n = batch.num_rows if rows is None else len(rows)
    index = None if rows is None else pa.array(rows)
    columns = {}
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


def gather(part: Connections) -> tuple[pa.Table, pa.Table]:
    """Every row of the partition's connections, from every file that holds them, without
    frames; and the facts of their broker-side bodies, decoded a batch at a time (so only
    one batch's frames are ever copied)."""
    wanted = pa.array(part.connections, pa.string())
    tables, facts = [], []
    for path in part.files:
        with open_file(path) as source:
            for batch in stream_batches(source, path):
                mine = pc.is_in(connection_keys(batch), value_set=wanted).to_numpy(zero_copy_only=False)
                if not mine.any():
                    continue
                every = mine.all()
                tables.append(_headers(batch, None if every else np.flatnonzero(mine)))
                if "frame" in batch.schema.names:
                    facts.append(decode_table(broker_frames(batch, None if every else mine)))
    if not tables:
        return pa.table({}), FACT_SCHEMA.empty_table()
    return pa.concat_tables(tables), pa.concat_tables([FACT_SCHEMA.empty_table(), *facts])


def read_connections(part: Connections) -> Iterator[pa.RecordBatch]:
    """The transactions of one partition, as batches of :data:`TRANSACTIONS_SCHEMA`."""
    rows, facts = gather(part)
    if rows.num_rows:
        yield from connection_pass(rows, facts).to_batches(max_chunksize=BATCH_ROWS)


class TransactionsReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        path = options.get("path") or options.get("paths")
        if not path:
            raise ValueError(f'{TRANSACTIONS_SOURCE}: give a capture directory: .load("DIR")')
        self.path = path
        self.partition_count = int(options.get("partitions", 2))
        self.min_rows = int(options.get("min_partition_rows", DEFAULT_MIN_PARTITION_ROWS))

    def partitions(self) -> list[InputPartition]:
        index = index_files(list_files(self.path))
        total = sum(sum(counts.values()) for counts in index.values())
        count = max(1, min(self.partition_count, total // max(self.min_rows, 1)))
        planned = [Connections(a.connections, a.files) for a in assign(index, count)]
        return list(planned) or [Connections((), ())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Connections)
        return read_connections(partition)


class TransactionsDataSource(DataSource):
    """The ``corrfix-transactions`` format (:data:`TRANSACTIONS_SCHEMA`)."""

    @classmethod
    def name(cls) -> str:
        return TRANSACTIONS_SOURCE

    def schema(self) -> StructType:
        return TRANSACTIONS_SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TransactionsReader(dict(self.options))
