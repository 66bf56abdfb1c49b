"""What the audit reads: a small local capture, passed on the driver as one local relation,
gives the same audit table and facts as the Data Source."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark_audit.connections import DRIVER_BYTES_CONF, load_audit_input


def _read(spark: SparkSession, path: Path, driver_bytes: str) -> tuple[DataFrame, DataFrame, list[DataFrame]]:
    spark.conf.set(DRIVER_BYTES_CONF, driver_bytes)
    try:
        audit, facts, cached = load_audit_input(spark, str(path))
        assert facts is not None
        return audit.cache(), facts.cache(), cached
    finally:
        spark.conf.unset(DRIVER_BYTES_CONF)


def test_the_driver_relation_equals_the_data_source(spark: SparkSession, small_capture: Path) -> None:
    audit, facts, cached = _read(spark, small_capture, str(1 << 30))
    by_source, facts_by_source, cached_by_source = _read(spark, small_capture, "0")
    assert cached == [] and len(cached_by_source) == 1  # one read for both tables
    assert audit.count() > 0 and facts.count() > 0
    assert audit.schema.names == by_source.schema.names
    assertDataFrameEqual(audit, by_source)
    assertDataFrameEqual(facts, facts_by_source)
    for df in (audit, facts, by_source, facts_by_source):
        df.unpersist()


def test_without_facts_only_the_audit_table_is_read(spark: SparkSession, small_capture: Path) -> None:
    spark.conf.set(DRIVER_BYTES_CONF, "0")
    try:
        audit, facts, cached = load_audit_input(spark, str(small_capture), with_facts=False)
    finally:
        spark.conf.unset(DRIVER_BYTES_CONF)
    assert facts is None and cached == [audit]
    assert load_audit_input(spark, str(small_capture), with_facts=False)[2] == []  # on the driver
