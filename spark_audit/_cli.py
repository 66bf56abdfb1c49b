"""The audit's command line: ``corrfix audit DIR -o REPORT_DIR``, ``python -m spark_audit``
and spark-submit take the same arguments.

pyspark is imported only when the command runs, so ``corrfix`` can list the command
without the ``audit`` extra installed. Exit status: 0, or 1 when ``--fail-on`` finds a
finding that severe, 2 when the audit cannot run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from spark_audit._catalog import CHECKS, SEVERITIES

INSTALL_HINT = "pip install 'corrfix[audit]' (pyspark and pandas<3; Spark needs Java 17 or later)"


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The audit's options, shared by every entry point."""
    p.add_argument("path", help="capture directory or file: a local path, or a URI (s3://, hdfs://, ...)")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="REPORT_DIR",
        help="where report.json and report.html go",
    )
    p.add_argument("--fail-on", choices=SEVERITIES, help="exit 1 when a finding is at least this severe")
    p.add_argument(
        "--check",
        action="append",
        choices=list(CHECKS),
        dest="checks",
        help="run only this check (repeatable)",
    )
    p.add_argument(
        "--window", type=float, default=10.0, metavar="S", help="time window in seconds (default 10)"
    )
    p.add_argument(
        "--slow-factor", type=float, default=10.0, help="slow: above this times the api's p50 (default 10)"
    )
    p.add_argument(
        "--slow-min-ms", type=float, default=100.0, help="slow: and at least this long (default 100 ms)"
    )
    p.add_argument(
        "--storm-threshold",
        type=int,
        default=10,
        metavar="N",
        help="errors per window for a storm (default 10)",
    )
    p.add_argument(
        "--rebalance-threshold",
        type=int,
        default=3,
        metavar="N",
        help="generations per window and group for a rebalance storm (default 3)",
    )
    p.add_argument(
        "--max-findings",
        type=int,
        default=1000,
        metavar="N",
        help="findings listed per check (all are counted)",
    )
    p.add_argument(
        "--via",
        choices=("auto", "datasource", "binaryfile"),
        default="auto",
        help="how to read the files (default: the Data Source where pyarrow reaches the path, "
        "else binaryFile)",
    )
    p.add_argument(
        "--tables",
        metavar="DIR",
        help="also write the transactions, facts and anomalies tables as Parquet under DIR",
    )
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting (repeatable)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    return p


def register_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``audit`` to a ``corrfix`` subcommand parser; ``args.run(args)`` runs it."""
    p = subparsers.add_parser(
        "audit",
        help="audit a capture with Spark: ordering, client view, latency, storms, offset loss, duplicates",
        description="Read a capture directory with Spark (local mode unless spark-submit or --master says "
        "otherwise), run the checks, and write report.json and report.html.",
    )
    add_arguments(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the audit described by parsed arguments; the exit status."""
    try:
        from spark_audit._job import AuditOptions, run_audit
        from spark_audit._progress import Progress
        from spark_audit._session import get_session, moves_rows_through_jvm
        from spark_audit.report import exit_status, write_report
    except ImportError as exc:
        print(f"corrfix audit needs the audit extra: {INSTALL_HINT} ({exc})", file=sys.stderr)
        return 2
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"corrfix audit: --conf wants KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        conf[key] = value
    options = AuditOptions(
        path=args.path,
        checks=tuple(args.checks or CHECKS),
        window_s=args.window,
        slow_factor=args.slow_factor,
        slow_min_ms=args.slow_min_ms,
        storm_threshold=args.storm_threshold,
        rebalance_threshold=args.rebalance_threshold,
        max_findings=args.max_findings,
        via=args.via,
        tables=args.tables,
    )
    try:
        quick = not moves_rows_through_jvm(options.path, options.via, options.tables)
        spark, started = get_session(args.master, conf, quick_jvm=quick)
    except Exception as exc:  # pyspark raises its own errors when the JVM cannot start
        print(f"corrfix audit: Spark did not start ({exc}); {INSTALL_HINT}", file=sys.stderr)
        return 2
    progress = Progress(spark.sparkContext, quiet=args.quiet)
    try:
        try:
            report = run_audit(spark, options, progress)
        except (FileNotFoundError, ValueError) as exc:
            print(f"corrfix audit: {exc}", file=sys.stderr)
            return 2
        finally:
            progress.close()
        json_path, html_path = write_report(report, args.output)
    finally:
        if started:
            spark.stop()
    summary = report["summary"]["by_severity"]
    if not args.quiet:
        print(
            f"{summary['error']} errors, {summary['warning']} warnings, {summary['info']} info "
            f"in {report['elapsed_s']:.1f} s: {json_path}, {html_path}"
        )
    return exit_status(report, args.fail_on)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spark_audit`` and spark-submit (see :mod:`spark_audit.__main__`)."""
    parser = argparse.ArgumentParser(prog="spark_audit", description="Audit a corrfix capture with Spark.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
