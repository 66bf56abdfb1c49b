"""Time ``corrfix audit`` runs inside an already started Spark session (JVM start excluded).

Run as its own process by :mod:`audit_bench`; prints one JSON object. First, right after
the session starts and before anything else runs in it, the audit of a small capture of
the demo's size (``DEMO_DIR``, about 1,200 rows): what a user of ``corrfix demo`` waits
for, the session's first Python Data Source use included. Then the session is warmed with
a trivial job and one read of a two-row Python Data Source that runs no corrfix code
(:func:`spark_ceiling.warm_up`): Spark's first use of Python Data Sources in a session
costs about 10 s here whatever the source, which is start-up like the JVM's. Then
spark_audit's ``run_audit`` is timed ``AUDIT_RUNS`` times on the capture (best and median),
each step of the first timed run on its own (the per-step profile), and the rows the
audit's one scan hands to the JVM are counted. Exit status 3 means the audit is not
available (import or start failed).

Then, in the same session, the *floor*: one read of the capture's header columns through
the same Data Source, summed and nothing else, the best of two runs after one untimed
one. No audit through this Data Source can beat it, so the audit's rate is also given as
a fraction of it. Last, Spark's own *ceilings* (:mod:`spark_ceiling`), which run no
corrfix code at all.

    python bench/audit_job.py CAPTURE_DIR [DEMO_DIR]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import spark_ceiling

FLOOR_COLUMNS = spark_ceiling.HEADER_COLUMNS
AUDIT_RUNS = 3


def _steps() -> tuple[object, dict[str, float]]:
    """A quiet progress that records how long each audit step took."""
    import contextlib

    from spark_audit import Progress

    times: dict[str, float] = {}

    class Timed(Progress):
        @contextlib.contextmanager
        def step(self, name: str):  # type: ignore[override]
            began = time.monotonic()
            try:
                yield
            finally:
                times[name] = round(time.monotonic() - began, 3)

    return Timed(None, quiet=True), times


def _jvm_rows(spark: object, path: str) -> int:
    """Rows the audit's one read yields to the JVM: the audit table and the facts, with the
    sends of batches without a producer id summed per batch, as the audit reads them."""
    from spark_audit.connections import load_audit

    return load_audit(spark, path, with_facts=True).count()


def _planning_s(path: str) -> float:
    """The driver's planning, as the Data Source plans: the per-file connection index (from
    the capture's summary where it covers a file) and the assignment."""
    from spark_audit.connections import assign, index_files, summary_index
    from spark_audit.source import list_files

    start = time.monotonic()
    assign(index_files(list_files(path), summary_index(path)), 4)
    return time.monotonic() - start


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
    demo = sys.argv[2] if len(sys.argv) > 2 else None
    try:
        from spark_audit import AuditOptions, get_session, run_audit
    except ImportError as exc:
        print(json.dumps({"error": f"spark_audit is not importable: {exc}"}))
        return 3
    started = time.monotonic()
    try:
        spark, _ = get_session("local[2]", {"spark.driver.memory": "3g"})
    except Exception as exc:  # pyspark raises its own error types when the JVM cannot start
        print(json.dumps({"error": f"Spark did not start: {exc}"}))
        return 3
    result: dict[str, object] = {"session_start_s": time.monotonic() - started}
    try:
        if demo is not None:
            result["demo_s"] = _seconds(lambda: run_audit(spark, AuditOptions(path=demo)))
        spark.range(1000).count()  # the JVM's first job
        spark_ceiling.warm_up(spark, Path(path))
        seconds: list[float] = []
        try:
            for run in range(AUDIT_RUNS):
                progress, steps = _steps()
                begin = time.monotonic()
                report = run_audit(spark, AuditOptions(path=path), progress)
                seconds.append(time.monotonic() - begin)
                if run == 0:
                    result["steps_s"] = steps
        except Exception as exc:  # report, do not crash the bench
            print(json.dumps({"error": f"the audit failed: {type(exc).__name__}: {exc}"}))
            return 3
        result.update(
            seconds=min(seconds),
            runs_s=[round(s, 2) for s in seconds],
            median_s=sorted(seconds)[len(seconds) // 2],
            report_elapsed_s=report.get("elapsed_s"),
            findings=report.get("summary", {}).get("by_severity"),
            counts={
                name: {f"{c['kind']}/{c['severity']}": c["count"] for c in check["counts"]}
                for name, check in report.get("checks", {}).items()
            },
            planning_s=round(_planning_s(path), 3),
            jvm_rows=_jvm_rows(spark, path),
        )
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
