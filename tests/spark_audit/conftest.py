"""One SparkSession for the whole test run (a session costs about 10 s to start).

local[2] and small settings: the machine has two cores, and other test runs share it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the audit extra is not installed (pip install '.[audit]')")

from pyspark.sql import SparkSession  # noqa: E402

from spark_audit import AuditOptions, run_audit  # noqa: E402
from spark_audit.source import register  # noqa: E402
from tests.support.audit_builders import (  # noqa: E402
    WIRE_CAPTURE,
    produce_answer,
    produce_frame,
    records,
    req,
    resp,
    row,
    write_capture,
)

FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("corrfix-audit-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", FAST_JVM)
        .config("spark.executor.extraJavaOptions", FAST_JVM)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def small_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two captures in one directory. Proxy: a client sends the same Produce batch twice
    and both are acknowledged (appended twice). Wire: the broker answers an acks=0 Produce."""
    directory = tmp_path_factory.mktemp("small-capture")
    frames = {cid: produce_frame(cid, acks=1) for cid in (1, 2)}
    answers = {cid: produce_answer(cid) for cid in (1, 2)}
    upstream = {uid: produce_frame(uid, acks=1) for uid in (0, 1)}
    upstream_answers = {uid: produce_answer(uid) for uid in (0, 1)}

    def framed(build, connection, seq, side, cid, uid, frame):
        return build(
            connection, seq, side, 0, cid=cid, uid=uid, frame=frame, frame_length=len(frame), api_version=9
        )

    proxy = [row("p1", 0, "open", client_address="127.0.0.1:5000", upstream_address="127.0.0.1:9092")]
    for n, (cid, uid) in enumerate(((1, 0), (2, 1))):
        seq = 1 + 4 * n
        proxy += [
            framed(req, "p1", seq, "client", cid, uid, frames[cid]),
            framed(req, "p1", seq + 1, "upstream", cid, uid, upstream[uid]),
            framed(resp, "p1", seq + 2, "upstream", cid, uid, upstream_answers[uid]),
            framed(resp, "p1", seq + 3, "client", cid, uid, answers[cid]),
        ]
    proxy.append(row("p1", 9, "close", reason="client closed"))
    write_capture(directory, proxy)

    acks0 = produce_frame(1, acks=0, batch=records(value=b"w"))
    wire = [
        row("w1", 0, "open", source="wire", reason="syn"),
        framed(req, "w1", 1, "client", 1, None, acks0),
        framed(resp, "w1", 2, "client", 1, None, produce_answer(1)),
        row("w1", 3, "close", source="wire", reason="fin"),
    ]
    write_capture(directory, [{**r, "source": "wire", "capture_id": WIRE_CAPTURE} for r in wire])
    return directory


@pytest.fixture(scope="session")
def small_report(spark: SparkSession, small_capture: Path) -> dict:
    """The whole audit of :func:`small_capture`."""
    return run_audit(spark, AuditOptions(str(small_capture)))
