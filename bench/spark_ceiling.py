"""Spark's own ceilings on this machine: what Spark costs before any check logic runs.

The audit goal is a rate in frames per second through every check. These figures run no
corrfix code at all, on rows shaped like the capture's header columns, yielded from memory
by a Python Data Source:

- ``read``: the rows, summed. The cost of Spark turning the Arrow batches a Python Data
  Source yields into JVM rows.
- ``window``: the rows through one window function over each connection in ``seq`` order
  (a shuffle by connection, a sort, a pass), every column used.
- ``python_pass``: the rows through ``mapInArrow`` with a function that returns its input.

Checks 1 and 2 between them put every frame next to the other frames of its connection
(check 1 the upstream side, check 2 the client side). A connection's frames lie in several
files, and Spark cannot be told how a Python Data Source partitions its rows, so in a
Spark job every frame goes through a shuffle (``window``) or a pass in Python
(``python_pass``), and the audit cannot beat the faster of the two. Only checks run inside
the Data Source's ``read`` would avoid both, and those are not DataFrame transformations.

Each figure is the best of ``RUNS`` timed runs after one untimed one, as a ceiling should
be on a shared machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.types import StructType

HEADER_COLUMNS = ["connection_id", "seq", "kind", "side", "direction", "wall_ns", "api_key"]
"""The header columns every header check reads."""
ROWS = 4_000_000
"""Rows per measured run, split evenly over ``PARTITIONS``: seconds of work, not milliseconds."""
PARTITIONS = 2
"""One per core."""
BATCH_ROWS = 65_536
"""Rows of the sample batch: big enough that per-batch costs do not count."""
RUNS = 2
"""Timed runs per figure; the fastest counts."""
SOURCE_NAME = "bench-ceiling"
"""The synthetic Data Source's format name."""


def sample_batch(capture: Path, schema: pa.Schema) -> pa.RecordBatch:
    """Up to ``BATCH_ROWS`` rows of the capture's first file, so the strings are the real ones."""
    first = min(capture.glob("*.arrows"))
    with ipc.open_stream(pa.memory_map(str(first))) as reader:
        table = reader.read_all().select(schema.names).slice(0, BATCH_ROWS)
    return table.cast(schema).combine_chunks().to_batches()[0]


def _repeating_source(batch: pa.RecordBatch, struct: StructType, rows: int) -> type[DataSource]:
    """A Data Source class yielding copies of ``batch`` until each partition has
    ``rows / PARTITIONS``, every copy with connection ids of its own.

    Defined in a function so that cloudpickle ships it by value to Python workers, which
    do not have bench/ on their path."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue().to_pybytes()
    per_partition = rows // PARTITIONS

    class Repeat(DataSourceReader):
        """Yields the sample again and again; fresh connection ids make every copy new
        connections, so the shuffle spreads over every core and no ``seq`` repeats."""

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(index) for index in range(PARTITIONS)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            [one] = ipc.open_stream(payload).read_all().to_batches()
            at = one.schema.get_field_index("connection_id")
            field = one.schema.field(at)
            left, copy = per_partition, 0
            while left > 0:
                ids = pc.binary_join_element_wise(one.column(at), pa.scalar(f"-{partition.value}-{copy}"), "")
                fresh = one.set_column(at, field, ids.cast(field.type))
                yield fresh if left >= fresh.num_rows else fresh.slice(0, left)
                left -= fresh.num_rows
                copy += 1

    class Ceiling(DataSource):
        """The format: ``struct``'s columns, as the capture's Data Source would give them."""

        @classmethod
        def name(cls) -> str:
            return SOURCE_NAME

        def schema(self) -> StructType:
            return struct

        def reader(self, schema: StructType) -> DataSourceReader:
            return Repeat()

    return Ceiling


def best_rate(run: Callable[[], object], rows: int) -> float:
    """Rows per second of the fastest of ``RUNS`` timed runs, after one untimed run."""
    run()
    best = float("inf")
    for _ in range(RUNS):
        start = time.monotonic()
        run()
        best = min(best, time.monotonic() - start)
    return rows / best


def _register(spark: SparkSession, capture: Path, rows: int) -> StructType:
    """Register the synthetic source for ``rows`` rows; its schema."""
    from spark_audit.source import arrow_schema, spark_schema

    struct = spark_schema(HEADER_COLUMNS)
    spark.dataSource.register(_repeating_source(sample_batch(capture, arrow_schema(struct)), struct, rows))
    return struct


def warm_up(spark: SparkSession, capture: Path) -> None:
    """Read the synthetic source once, a row per partition: Spark's first use of any Python
    Data Source in a session costs about 10 s here, whatever the source, which is start-up
    like the JVM's and not the audit's."""
    _register(spark, capture, PARTITIONS)
    spark.read.format(SOURCE_NAME).load().count()


def measure(spark: SparkSession, capture: Path, rows: int = ROWS) -> dict[str, float]:
    """Rows per second of each ceiling, in ``spark`` (already warmed), on rows shaped like
    the header columns of ``capture``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    struct = _register(spark, capture, rows)
    read_rows = rows // PARTITIONS * PARTITIONS

    def frames() -> DataFrame:
        return spark.read.format(SOURCE_NAME).load()

    def identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    def window() -> object:
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
        "read": best_rate(lambda: frames().agg(F.sum("seq")).collect(), read_rows),
        "window": best_rate(window, read_rows),
        "python_pass": best_rate(
            lambda: frames().mapInArrow(identity, struct).agg(F.sum("seq")).collect(), read_rows
        ),
    }
