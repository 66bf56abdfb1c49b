"""Readable api and error names, as Spark columns and in Python."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_audit.report import api_name_column, error_name


def test_api_names_for_known_unknown_and_missing_keys(spark: SparkSession):
    df = spark.createDataFrame([(0,), (18,), (68,), (999,), (None,)], "api_key short")
    got = [row[0] for row in df.select(api_name_column(F.col("api_key"))).collect()]
    assert got == ["Produce", "ApiVersions", "ConsumerGroupHeartbeat", "api_999", "?"]


def test_error_names_use_the_current_kafka_name():
    assert (error_name(6), error_name(27), error_name(-12345)) == (
        "NOT_LEADER_OR_FOLLOWER",
        "REBALANCE_IN_PROGRESS",
        "error_-12345",
    )
