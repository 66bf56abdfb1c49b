"""The SparkSession: reuse one that exists (tests, notebooks), else start one.

``--master`` wins, then spark-submit's master, then local mode on every core. Local mode
gets settings that suit small machines: no UI, few shuffle partitions, big Arrow batches to
and from Python (fewer calls), uncompressed cached columns (less CPU), a loopback driver,
quiet logs, the JVM's quick compiler only (unless the audit moves a row per frame through
the JVM), and workers that run this very Python (they need pyarrow, kafka-python and these
packages). Under spark-submit only the runtime ones apply, and never over its own.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from spark_audit.source import Via, reachable_by_pyarrow, register

DEFAULT_MASTER = "local[*]"
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",  # few, big batches to and from Python,
    "spark.sql.execution.arrow.maxBytesPerBatch": str(64 << 20),  # but bounded: Fetch answers are large
    "spark.sql.inMemoryColumnarStorage.compressed": "false",  # cached reads live minutes: save the CPU
    "spark.log.level": "ERROR",  # the JVM's warnings would bury the progress line
}
QUICK_JVM_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
"""Local mode's JVM with its quick compiler only, when the audit moves few rows through it
(the pass runs in Python): the session and a small audit's first plans start about a
second sooner each (bench/README.md), and a row per frame through the JVM goes slower."""
ALWAYS_CONF = {
    "spark.ui.showConsoleProgress": "false",  # the audit prints its own progress line
    "spark.sql.session.timeZone": "UTC",
}


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def moves_rows_through_jvm(path: str, via: Via, tables: str | None) -> bool:
    """Whether an audit hands the JVM a row per frame: the binaryFile fallback, or ``--tables``."""
    return tables is not None or via == "binaryfile" or (via == "auto" and not reachable_by_pyarrow(path))


def get_session(
    master: str | None = None, conf: dict[str, str] | None = None, quick_jvm: bool = True
) -> tuple[SparkSession, bool]:
    """The session to use, and whether this call started it (and so should stop it).
    ``quick_jvm``: a local session's JVM gets :data:`QUICK_JVM_CONF`."""
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active, False
    builder = SparkSession.builder.appName("corrfix-audit")
    settings = dict(ALWAYS_CONF)
    chosen = master or (None if under_spark_submit() else DEFAULT_MASTER)  # None: spark-submit's
    if chosen is not None:
        builder = builder.master(chosen)
        if chosen.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # as spark.driver.host, and no warning
            settings.update(LOCAL_CONF)
            settings.update(QUICK_JVM_CONF if quick_jvm else {})
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if chosen is None:
        _suit_local_mode(spark)
    register(spark)
    return spark, True


def _suit_local_mode(spark: SparkSession) -> None:
    """spark-submit in local mode: what of :data:`LOCAL_CONF` can still change once the
    session runs, unless spark-submit was given it (its master is only known now)."""
    sc = spark.sparkContext
    master = sc.master
    assert master is not None  # typed optional, but a context without one is refused (MASTER_URL_NOT_SET)
    if not master.startswith("local"):
        return
    given = sc.getConf()
    if not given.contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", LOCAL_CONF["spark.sql.shuffle.partitions"])
    if not given.contains("spark.log.level"):
        sc.setLogLevel(LOCAL_CONF["spark.log.level"])
