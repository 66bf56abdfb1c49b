"""Time one ``corrfix audit`` run inside an already started Spark session (JVM start excluded).

Run as its own process by :mod:`audit_bench`; prints one JSON object. The session is
started and warmed with a trivial job first, then spark_audit's ``run_audit`` is timed on
the capture. Exit status 3 means the audit is not available (import or start failed).

Then, in the same session, the *floor*: one read of the capture's header columns through
the same Data Source, summed and nothing else. No audit through this Data Source can beat
it, so the audit's rate is also given as a fraction of it.

    python bench/audit_job.py CAPTURE_DIR
"""

from __future__ import annotations

import json
import sys
import time

FLOOR_COLUMNS = ["connection_id", "seq", "kind", "side", "direction", "wall_ns", "api_key"]
"""The header columns every header check reads."""


def _floor(spark: object, path: str) -> int:
    """Rows read by one pass over the capture's header columns (the floor's timed work)."""
    from pyspark.sql import functions as F

    from spark_audit.load import load_capture

    [row] = load_capture(spark, path, FLOOR_COLUMNS).agg(F.count("*"), F.sum("seq")).collect()
    return row[0]


def main() -> int:
    path = sys.argv[1]
    try:
        from spark_audit.job import AuditOptions, run_audit
        from spark_audit.session import get_session
    except ImportError as exc:
        print(json.dumps({"error": f"spark_audit is not importable: {exc}"}))
        return 3
    started = time.monotonic()
    try:
        spark, _ = get_session("local[2]", {"spark.driver.memory": "3g"})
        spark.range(1000).count()  # JVM and Python workers up before the clock starts
    except Exception as exc:  # pyspark raises its own error types when the JVM cannot start
        print(json.dumps({"error": f"Spark did not start: {exc}"}))
        return 3
    session_s = time.monotonic() - started
    try:
        begin = time.monotonic()
        report = run_audit(spark, AuditOptions(path=path))
        elapsed = time.monotonic() - begin
        begin = time.monotonic()
        rows = _floor(spark, path)
        floor_s = time.monotonic() - begin
    except Exception as exc:  # the audit is still being written (issue #5): report, do not crash
        print(json.dumps({"error": f"the audit failed: {type(exc).__name__}: {exc}"}))
        return 3
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "floor_seconds": floor_s,
                "floor_rows": rows,
                "session_start_s": session_s,
                "report_elapsed_s": report.get("elapsed_s"),
                "findings": report.get("summary", {}).get("by_severity"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
