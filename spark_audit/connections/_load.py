"""The transactions DataFrame: from the ``corrfix-transactions`` Data Source where pyarrow
can open the capture (no shuffle: whole connections per partition), else from any capture
DataFrame by one shuffle by connection and the same pass per group."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_audit.connections._datasource import (
    TRANSACTIONS_SOURCE,
    TRANSACTIONS_SPARK_SCHEMA,
    TransactionsDataSource,
)
from spark_audit.connections._pass import HEADER_COLUMNS, connection_pass
from spark_audit.decode import DECODED_KEYS
from spark_audit.source import FrameTrim, Via, load_capture, reachable_by_pyarrow

KEY = ["capture_id", "connection_id"]
BUCKETS = 64
"""Groups the connections are hashed into by the shuffle path: each is one Python call."""
BODIES = FrameTrim(api_keys=DECODED_KEYS)
"""The frames the pass reads: acks from Produce requests, facts from the decoded api keys."""


def transactions_of(headers: DataFrame) -> DataFrame:
    """The transactions of capture rows (every row; frames where :data:`BODIES` keeps them):
    one shuffle by connection, then the pass per group of whole connections."""
    bucket = F.pmod(F.xxhash64(*KEY), F.lit(BUCKETS)).alias("_bucket")
    keyed = headers.select("*", bucket)
    return keyed.groupBy("_bucket").applyInArrow(
        lambda table: connection_pass(table.drop_columns(["_bucket"])), TRANSACTIONS_SPARK_SCHEMA
    )


def load_transactions(spark: SparkSession, path: str, via: Via = "auto") -> DataFrame:
    """The transactions of the capture at ``path``."""
    if via == "binaryfile" or (via == "auto" and not reachable_by_pyarrow(path)):
        columns = [*HEADER_COLUMNS, "frame_length", "frame"]
        return transactions_of(load_capture(spark, path, columns, trim=BODIES, via="binaryfile"))
    spark.dataSource.register(TransactionsDataSource)
    partitions = 2 * spark.sparkContext.defaultParallelism
    return spark.read.format(TRANSACTIONS_SOURCE).option("partitions", str(partitions)).load(path)
