"""The transactions DataFrame: from the ``corrfix-transactions`` Data Source where pyarrow
can open the capture (no shuffle: whole connections per partition), else from any capture
DataFrame by one shuffle by connection and the same pass per group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_audit.connections._audit import (
    AUDIT_AND_FACTS_SCHEMA,
    AUDIT_SCHEMA,
    TABLE_COLUMN,
    audit_and_facts,
    audit_pass,
)
from spark_audit.connections._clusters import open_rows
from spark_audit.connections._datasource import (
    AUDIT_AND_FACTS_SPARK_SCHEMA,
    AUDIT_SPARK_SCHEMA,
    DEFAULT_SLOW_MIN_MS,
    DEFAULT_WINDOW_S,
    FACTS_SPARK_SCHEMA,
    TRANSACTIONS_SOURCE,
    TRANSACTIONS_SPARK_SCHEMA,
    Connections,
    TransactionsDataSource,
    read_connections,
)
from spark_audit.connections._pass import (
    FACTS_SCHEMA,
    HEADER_COLUMNS,
    TRANSACTIONS_SCHEMA,
    broker_frames,
    connection_pass,
    decode_table,
    facts_pass,
)
from spark_audit.connections._plan import assign, index_files, summary_index
from spark_audit.decode import DECODED_KEYS
from spark_audit.source import FrameTrim, Via, is_local, list_files, load_capture, reachable_by_pyarrow

KEY = ["capture_id", "connection_id"]
BUCKETS = 64
"""Groups the connections are hashed into by the shuffle path: each is one Python call."""
DRIVER_BYTES = 16 << 20
"""Local captures up to this size are passed on the driver and handed to Spark as a local
relation: a session's first Python Data Source use costs seconds, which a demo-sized
capture should not wait for."""
DRIVER_BYTES_CONF = "spark.corrfix.audit.driverPassBytes"
"""The Spark setting that overrides :data:`DRIVER_BYTES` (0: always the Data Source)."""
BODIES = FrameTrim(api_keys=DECODED_KEYS)
"""The frames the pass reads: acks from Produce requests, facts from the decoded api keys."""


def _by_connection(rows: DataFrame) -> DataFrame:
    bucket = F.pmod(F.xxhash64(*KEY), F.lit(BUCKETS)).alias("_bucket")
    return rows.select("*", bucket)


def transactions_of(rows: DataFrame) -> DataFrame:
    """The transactions of capture rows (every row; frames where :data:`BODIES` keeps them):
    one shuffle by connection, then the pass per group of whole connections."""
    return (
        _by_connection(rows)
        .groupBy("_bucket")
        .applyInArrow(
            lambda table: connection_pass(table.drop_columns(["_bucket"])), TRANSACTIONS_SPARK_SCHEMA
        )
    )


def _facts_of_table(table: pa.Table, sum_plain_sends: bool) -> pa.Table:
    """The facts pass over a group of whole connections' rows."""
    return facts_pass(decode_table(broker_frames(table)), sum_plain_sends, open_rows(table))


def facts_of(rows: DataFrame, sum_plain_sends: bool = False) -> DataFrame:
    """The facts of the same rows, by the same shuffle."""

    def one_pass(table: pa.Table) -> pa.Table:
        return _facts_of_table(table, sum_plain_sends)

    return _by_connection(rows).groupBy("_bucket").applyInArrow(one_pass, FACTS_SPARK_SCHEMA)


def audit_of(
    rows: DataFrame,
    window_s: float = DEFAULT_WINDOW_S,
    slow_min_ms: float = DEFAULT_SLOW_MIN_MS,
    with_facts: bool = False,
) -> DataFrame:
    """The audit table of the same rows, by the same shuffle; ``with_facts``, the facts too
    (plain sends summed), from the same shuffle, as one table (:data:`AUDIT_AND_FACTS_SCHEMA`)."""

    def one_pass(table: pa.Table) -> pa.Table:
        audit = audit_pass(table.drop_columns(["_bucket"]), window_s, slow_min_ms)
        if not with_facts:
            return audit
        return audit_and_facts(audit, _facts_of_table(table, sum_plain_sends=True))

    schema = AUDIT_AND_FACTS_SPARK_SCHEMA if with_facts else AUDIT_SPARK_SCHEMA
    return _by_connection(rows).groupBy("_bucket").applyInArrow(one_pass, schema)


def _rows(spark: SparkSession, path: str) -> DataFrame:
    columns = [*HEADER_COLUMNS, "frame_length", "frame", "upstream_address"]
    return load_capture(spark, path, columns, trim=BODIES, via="binaryfile")


def _small(spark: SparkSession, path: str) -> bool:
    """A local capture small enough to pass on the driver (see :data:`DRIVER_BYTES`)."""
    if not is_local(path):
        return False
    limit = int(spark.conf.get(DRIVER_BYTES_CONF, str(DRIVER_BYTES)) or DRIVER_BYTES)
    return sum(Path(file).stat().st_size for file in list_files(path)) <= limit


SCHEMAS = {
    "facts": FACTS_SCHEMA,
    "audit": AUDIT_SCHEMA,
    "transactions": TRANSACTIONS_SCHEMA,
    "audit_and_facts": AUDIT_AND_FACTS_SCHEMA,
}
_NO_OPTIONS: dict[str, Any] = {}


def _whole_capture(path: str) -> Connections | None:
    """Every connection of the capture as one partition; None when it has none."""
    planned = assign(index_files(list_files(path), summary_index(path)), 1)
    return Connections(planned[0].connections, planned[0].files) if planned else None


def _driver_rows(part: Connections | None, table: str, options: dict[str, Any]) -> pa.Table:
    """The pass over ``part`` here, as one table (the Data Source's ``read()`` on the driver)."""
    schema = SCHEMAS[table]
    if part is None:
        return schema.empty_table()
    return pa.Table.from_batches(list(read_connections(part, table, **options)), schema=schema)


def _on_driver(spark: SparkSession, path: str, table: str, options: dict[str, Any]) -> DataFrame:
    """The same pass, run here on the whole capture as one partition: no Python worker."""
    rows = _driver_rows(_whole_capture(path), table, options)
    return spark.createDataFrame(rows.combine_chunks())  # PySpark 4.3 reads only a table's first chunk


def _read(spark: SparkSession, path: str, table: str, options: dict[str, Any] = _NO_OPTIONS) -> DataFrame:
    if _small(spark, path):
        return _on_driver(spark, path, table, options)
    spark.dataSource.register(TransactionsDataSource)
    partitions = 2 * spark.sparkContext.defaultParallelism
    reader = spark.read.format(TRANSACTIONS_SOURCE).option("partitions", str(partitions))
    for name, value in options.items():
        reader = reader.option(name, str(value).lower() if isinstance(value, bool) else repr(value))
    return reader.option("table", table).load(path)


def _by_fallback(path: str, via: Via) -> bool:
    return via == "binaryfile" or (via == "auto" and not reachable_by_pyarrow(path))


def load_transactions(spark: SparkSession, path: str, via: Via = "auto") -> DataFrame:
    """The transactions of the capture at ``path``."""
    return (
        transactions_of(_rows(spark, path)) if _by_fallback(path, via) else _read(spark, path, "transactions")
    )


def load_facts(spark: SparkSession, path: str, via: Via = "auto", sum_plain_sends: bool = False) -> DataFrame:
    """The facts of the capture at ``path``: ``kind`` fact and fact_count rows (and
    batch_sends rows with ``sum_plain_sends``: :func:`facts_pass`)."""
    if _by_fallback(path, via):
        return facts_of(_rows(spark, path), sum_plain_sends)
    return _read(spark, path, "facts", {"sum_plain_sends": sum_plain_sends})


def load_audit(
    spark: SparkSession,
    path: str,
    via: Via = "auto",
    window_s: float = DEFAULT_WINDOW_S,
    slow_min_ms: float = DEFAULT_SLOW_MIN_MS,
    with_facts: bool = False,
) -> DataFrame:
    """The audit table of the capture at ``path`` (:data:`AUDIT_SCHEMA`); ``with_facts``,
    the audit table and the facts with the plain sends summed, as one DataFrame of
    :data:`AUDIT_AND_FACTS_SCHEMA` (``table`` says which): one plan and one gathering of
    the capture for both. A small local capture is passed here, on the driver, and handed
    to Spark as one local relation (one Arrow transfer)."""
    if _by_fallback(path, via):
        return audit_of(_rows(spark, path), window_s, slow_min_ms, with_facts)
    options: dict[str, Any] = {"window_s": window_s, "slow_min_ms": slow_min_ms}
    if with_facts:
        options["sum_plain_sends"] = True
    return _read(spark, path, "audit_and_facts" if with_facts else "audit", options)


def _views(both: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The audit table and the facts, each with its own columns, of :func:`load_audit` with
    the facts."""
    audit, facts = (
        both.filter(F.col(TABLE_COLUMN) == name).select(*SCHEMAS[name].names) for name in ("audit", "facts")
    )
    return audit, facts


def load_audit_input(
    spark: SparkSession,
    path: str,
    via: Via = "auto",
    window_s: float = DEFAULT_WINDOW_S,
    slow_min_ms: float = DEFAULT_SLOW_MIN_MS,
    with_facts: bool = True,
) -> tuple[DataFrame, DataFrame | None, list[DataFrame]]:
    """What the audit reads: the audit table (:func:`load_audit`), the facts with the plain
    sends summed (None without ``with_facts``), and the DataFrames to cache for both. With
    the facts, both are views of one read, cached once. A small local capture is a local
    relation, and nothing to cache: its rows are already in the driver's memory, and a
    cache would cost a job to build."""
    on_driver = not _by_fallback(path, via) and _small(spark, path)
    read = load_audit(spark, path, via, window_s, slow_min_ms, with_facts)
    audit, facts = _views(read) if with_facts else (read, None)
    return audit, facts, [] if on_driver else [read]
