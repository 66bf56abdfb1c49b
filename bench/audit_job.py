"""Time one ``corrfix audit`` run inside an already started Spark session (JVM start excluded).

Run as its own process by :mod:`audit_bench`; prints one JSON object. The session is
started and warmed first, with a trivial job and one read of a two-row Python Data Source
that runs no corrfix code (:func:`spark_ceiling.warm_up`): Spark's first use of Python
Data Sources in a session costs about 10 s here whatever the source, which is start-up
like the JVM's. Then spark_audit's ``run_audit`` is timed on the capture. Exit status 3 means the audit is not
available (import or start failed).

Then, in the same session, the *floor*: one read of the capture's header columns through
the same Data Source, summed and nothing else, the best of two runs after one untimed
one. No audit through this Data Source can beat it, so the audit's rate is also given as
a fraction of it. Last, Spark's own *ceilings* (:mod:`spark_ceiling`), which run no
corrfix code at all.

    python bench/audit_job.py CAPTURE_DIR
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import spark_ceiling

FLOOR_COLUMNS = spark_ceiling.HEADER_COLUMNS


def _floor(spark: object, path: str) -> int:
    """Rows read by one pass over the capture's header columns (the floor's timed work)."""
    from pyspark.sql import functions as F

    from spark_audit.source import load_capture

    [row] = load_capture(spark, path, FLOOR_COLUMNS).agg(F.count("*"), F.sum("seq")).collect()
    return row[0]


def _seconds(run: Callable[[], object]) -> float:
    start = time.monotonic()
    run()
    return time.monotonic() - start


def main() -> int:
    path = sys.argv[1]
    try:
        from spark_audit import AuditOptions, get_session, run_audit
    except ImportError as exc:
        print(json.dumps({"error": f"spark_audit is not importable: {exc}"}))
        return 3
    started = time.monotonic()
    try:
        spark, _ = get_session("local[2]", {"spark.driver.memory": "3g"})
        spark.range(1000).count()  # the JVM's first job
        spark_ceiling.warm_up(spark, Path(path))
    except Exception as exc:  # pyspark raises its own error types when the JVM cannot start
        print(json.dumps({"error": f"Spark did not start: {exc}"}))
        return 3
    session_s = time.monotonic() - started
    try:
        begin = time.monotonic()
        try:
            report = run_audit(spark, AuditOptions(path=path))
        except Exception as exc:  # report, do not crash the bench
            print(json.dumps({"error": f"the audit failed: {type(exc).__name__}: {exc}"}))
            return 3
        result = {
            "seconds": time.monotonic() - begin,
            "session_start_s": session_s,
            "report_elapsed_s": report.get("elapsed_s"),
            "findings": report.get("summary", {}).get("by_severity"),
        }
        try:  # the audit's figure stands even if these fail
            result["floor_rows"] = _floor(spark, path)  # also the untimed run
            result["floor_seconds"] = min(
                _seconds(lambda: _floor(spark, path)) for _ in range(spark_ceiling.RUNS)
            )
            result["ceilings_rows_per_s"] = spark_ceiling.measure(spark, Path(path))
        except Exception as exc:  # pyspark raises its own error types
            result["ceilings_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
