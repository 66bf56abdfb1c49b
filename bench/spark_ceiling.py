"""Spark's own ceilings on this machine: what any audit in Spark pays before its first check.

The audit goal is a rate in frames per second through every check. These figures bound
it from above whatever the checks do, because they run no corrfix code at all:

- ``read``: a Python Data Source that yields one in-memory Arrow batch of the capture's
  header columns over and over (no file, no filtering), summed. It is the cost of Spark
  turning the Arrow batches a Python Data Source yields into JVM rows.
- ``shuffle_sort``: the same rows through one window function over each connection's
  frames in ``seq`` order (a shuffle by connection and a sort), with every column used.
  Check 1 (upstream ordering) needs each connection's frames in order, and a connection's
  frames lie in several files, so no audit can do less.
- ``python_pass``: the same rows through ``mapInArrow`` with a function that returns its
  input, summed. Any check whose per-frame work runs in Python costs at least this.

Each is the best of ``RUNS`` timed runs after one untimed one, as a ceiling should be on a
shared machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

HEADER_COLUMNS = ["connection_id", "seq", "kind", "side", "direction", "wall_ns", "api_key"]
"""The header columns every header check reads (``connection_id`` first)."""
ROWS = 4_000_000
"""Rows per measured run, split evenly over ``PARTITIONS``."""
PARTITIONS = 2
"""One per core."""
BATCH_ROWS = 65_536
RUNS = 2
VARIANTS = 8
"""Copies of the sample batch per partition, each with its own connection ids, so the
shuffle by connection spreads over every core as it does on a real capture."""
SOURCE_NAME = "bench-ceiling"


def sample_batch(capture: Path, columns: list[str], schema: pa.Schema) -> pa.RecordBatch:
    """Up to ``BATCH_ROWS`` rows of the capture's first file, so the strings are the real ones."""
    first = min(capture.glob("*.arrows"))
    with ipc.open_stream(pa.memory_map(str(first))) as reader:
        table = reader.read_all().select(columns).slice(0, BATCH_ROWS)
    return table.cast(schema).combine_chunks().to_batches()[0]


def _repeating_source(batch: pa.RecordBatch, struct: object, rows: int) -> type:
    """A Data Source class yielding ``batch`` (``connection_id`` first) until each partition
    has ``rows / PARTITIONS``.

    Defined in a function so that cloudpickle ships it by value to Python workers, which
    do not have bench/ on their path."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    def renamed(batch: pa.RecordBatch, suffix: str) -> pa.RecordBatch:
        """``batch`` with ``suffix`` on every connection id: more connections, as in a big capture."""
        ids = pc.binary_join_element_wise(batch.column(0), pa.scalar(suffix), "")
        return batch.set_column(0, batch.schema.field(0), ids.cast(batch.schema.field(0).type))

    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue().to_pybytes()
    per_partition = rows // PARTITIONS

    class Repeat(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(index) for index in range(PARTITIONS)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            [one] = ipc.open_stream(payload).read_all().to_batches()
            variants = [renamed(one, f"-{partition.value}-{index}") for index in range(VARIANTS)]
            left, index = per_partition, 0
            while left > 0:
                batch = variants[index % VARIANTS]
                yield batch if left >= batch.num_rows else batch.slice(0, left)
                left -= batch.num_rows
                index += 1

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> object:
            return struct

        def reader(self, schema: object) -> DataSourceReader:
            return Repeat()

    return Ceiling


def _best_rate(run: Callable[[], object], rows: int) -> float:
    """Rows per second of the fastest of ``RUNS`` timed runs, after one untimed run."""
    run()
    best = float("inf")
    for _ in range(RUNS):
        start = time.monotonic()
        run()
        best = min(best, time.monotonic() - start)
    return rows / best


def measure(spark: object, capture: Path, rows: int = ROWS) -> dict[str, float]:
    """Rows per second of each ceiling, in ``spark`` (already warmed), on rows shaped like
    the header columns of ``capture``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_audit.schema import arrow_schema, spark_schema

    struct = spark_schema(HEADER_COLUMNS)
    batch = sample_batch(capture, HEADER_COLUMNS, arrow_schema(struct))
    spark.dataSource.register(_repeating_source(batch, struct, rows))
    read_rows = rows // PARTITIONS * PARTITIONS

    def frames() -> object:
        return spark.read.format(SOURCE_NAME).load()

    def identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    def ordered_pass() -> object:
        """One window over each connection's frames in ``seq`` order, touching every column."""
        ordered = Window.partitionBy("connection_id").orderBy("seq")
        gap = F.col("wall_ns") - F.lag("wall_ns").over(ordered)
        upstream_requests = (F.col("side") == "upstream") & (F.col("direction") == "request")
        return (
            frames()
            .select(gap.alias("gap"), upstream_requests.alias("hit"), F.length("kind").alias("k"), "api_key")
            .agg(F.sum("gap"), F.count_if("hit"), F.sum("k"), F.max("api_key"))
            .collect()
        )

    return {
        "read": _best_rate(lambda: frames().agg(F.sum("seq")).collect(), read_rows),
        "shuffle_sort": _best_rate(ordered_pass, read_rows),
        "python_pass": _best_rate(
            lambda: frames().mapInArrow(identity, struct).agg(F.sum("seq")).collect(), read_rows
        ),
    }
