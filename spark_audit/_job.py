"""The audit job: load a capture, run the chosen checks, return the report as a dict.

The header checks (ordering, client view, latency) share one cached read of the capture's
transactions: whole connections per partition, paired in Python before any row reaches
the JVM (:mod:`spark_audit.connections`); the body checks (storms, offsets, produce) share
the facts decoded from the broker-side bodies in that same pass.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_audit._catalog import CHECKS, SEVERITIES
from spark_audit._progress import Progress
from spark_audit.checks import (
    GROUP_ACTIVITY,
    attempts,
    client_pairs,
    client_view,
    duplicate_batches,
    error_storms,
    latencies,
    latency_by_api,
    latency_by_window,
    leader_changes,
    offset_losses,
    rebalances,
    sequence_problems,
    slow_requests,
    upstream_pairs,
    upstream_skips,
    upstream_strays,
    window_start,
)
from spark_audit.connections import FACT_COLUMNS, load_transactions
from spark_audit.report import (
    client_view_findings,
    duplicate_findings,
    error_name,
    leader_change_findings,
    offset_loss_findings,
    rebalance_findings,
    sequence_findings,
    slow_findings,
    storm_findings,
    upstream_skip_findings,
    upstream_stray_findings,
)
from spark_audit.source import Via, is_local, list_files

REPORT_FORMAT = "corrfix-audit-report"
REPORT_VERSION = 1
BODY_CHECKS = frozenset({"storms", "offsets", "produce"})


@dataclass
class AuditOptions:
    """What to audit and how; the command line maps onto this one to one."""

    path: str
    checks: tuple[str, ...] = tuple(CHECKS)
    window_s: float = 10.0
    slow_factor: float = 10.0
    slow_min_ms: float = 100.0
    storm_threshold: int = 10
    rebalance_threshold: int = 3
    max_findings: int = 1000
    via: Via = "auto"


def _rows(df: DataFrame, order: Sequence[str] = ()) -> list[dict[str, Any]]:
    ordered = df.orderBy(*order) if order else df
    return [row.asDict(recursive=True) for row in ordered.collect()]


class _Collector:
    """Findings of every check: counts by kind and severity, the first ``limit`` rows by
    severity then time, and counts per time window for the timeline. Two Spark actions per
    check, over its findings cached once: each action costs a job, whatever its size."""

    def __init__(self, window_s: float, limit: int) -> None:
        self.window_s = window_s
        self.limit = limit
        self.checks: dict[str, dict[str, Any]] = {}
        self.timeline: list[dict[str, Any]] = []

    def add(self, check: str, *frames: DataFrame) -> None:
        found = functools.reduce(DataFrame.unionByName, frames).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            window = window_start(F.col("wall_ns"), self.window_s).alias("window_start_ns")
            grouped = _rows(found.groupBy("kind", "severity", window).count())
            worst_first = F.array_position(F.array(*map(F.lit, reversed(SEVERITIES))), F.col("severity"))
            order = [worst_first, F.col("wall_ns").asc_nulls_last(), "connection_id", "kind"]
            top = _rows(found.orderBy(*order).limit(self.limit))
        finally:
            found.unpersist()
        counts: dict[tuple[str, str], int] = {}
        marks: dict[tuple[int, str], dict[str, Any]] = {}
        for row in grouped:
            key = (row["kind"], row["severity"])
            counts[key] = counts.get(key, 0) + row["count"]
            if row["window_start_ns"] is not None:
                start, severity = row["window_start_ns"], row["severity"]
                mark = marks.setdefault(
                    (start, severity),
                    {"check": check, "window_start_ns": start, "severity": severity, "count": 0, "kinds": {}},
                )
                mark["count"] += row["count"]
                mark["kinds"][row["kind"]] = row["count"]
        self.timeline.extend(marks.values())
        total = sum(counts.values())
        self.checks[check] = {
            "counts": [{"kind": k, "severity": s, "count": n} for (k, s), n in sorted(counts.items())],
            "findings": top,
            "total": total,
            "truncated": total > len(top),
        }


def _captures(transactions: DataFrame) -> list[dict[str, Any]]:
    per_connection = transactions.filter(F.col("kind") == "connection")
    agg = per_connection.groupBy("capture_id", "source").agg(
        F.sum("rows").alias("rows"),
        F.sum("frames").alias("frames"),
        F.sum("repairs").alias("repairs"),
        F.count("*").alias("connections"),
        F.min("first_wall_ns").alias("first_wall_ns"),
        F.max("last_wall_ns").alias("last_wall_ns"),
    )
    return _rows(agg, ["first_wall_ns"])


class _AuditRun:
    """One audit: the shared inputs, read at most once and cached, and one method per check."""

    def __init__(self, spark: SparkSession, options: AuditOptions, report: dict[str, Any]) -> None:
        self.spark = spark
        self.options = options
        self.report = report
        self.out = _Collector(options.window_s, options.max_findings)
        self._cached: list[DataFrame] = []

    def keep(self, df: DataFrame) -> DataFrame:
        """Cache ``df`` until :meth:`release`: several actions read it."""
        self._cached.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()

    @functools.cached_property
    def transactions(self) -> DataFrame:
        transactions = self.keep(load_transactions(self.spark, self.options.path, self.options.via))
        self.report["captures"] = _captures(transactions)
        return transactions

    @functools.cached_property
    def upstream_pairs(self) -> DataFrame:
        return self.keep(upstream_pairs(self.transactions))

    @functools.cached_property
    def client_pairs(self) -> DataFrame:
        return self.keep(client_pairs(self.transactions))

    @functools.cached_property
    def facts(self) -> DataFrame:
        facts = self.transactions.filter(F.col("kind") == "fact").select(*FACT_COLUMNS)
        counted = self.transactions.filter(F.col("kind") == "fact_count")
        counts = _rows(counted.groupBy("fact").agg(F.sum("rows").alias("count")), ["fact"])
        self.report["decode"] = {"facts": {r["fact"]: r["count"] for r in counts}}
        return facts

    def upstream_ordering(self) -> None:
        self.out.add(
            "upstream_ordering",
            upstream_skip_findings(upstream_skips(self.transactions, self.upstream_pairs)),
            upstream_stray_findings(upstream_strays(self.transactions, self.upstream_pairs)),
        )

    def client_view(self) -> None:
        violations = client_view(self.transactions, self.client_pairs)
        self.out.add("client_view", client_view_findings(violations))

    def latency(self) -> None:
        o = self.options
        lat = self.keep(latencies(self.client_pairs))
        by_api = self.keep(latency_by_api(lat))
        self.report["latency"] = {
            "by_api": _rows(by_api, ["api_key"]),
            "by_window": _rows(latency_by_window(lat, o.window_s), ["window_start_ns", "api_key"]),
        }
        slow = slow_requests(lat, by_api, o.slow_factor, o.slow_min_ms)
        self.out.add("latency", slow_findings(slow))

    def storms(self) -> None:
        o = self.options
        windows = self.keep(error_storms(self.facts, o.window_s, o.storm_threshold))
        groups = self.keep(rebalances(self.facts, o.window_s, o.rebalance_threshold))
        changes = self.keep(leader_changes(self.facts))
        window_rows = _rows(windows, ["window_start_ns", "category"])
        for row in window_rows:
            row["error_names"] = [error_name(c) for c in row["error_codes"]]
        self.report["storms"] = {
            "windows": window_rows,
            "rebalances": _rows(groups.filter(GROUP_ACTIVITY), ["window_start_ns", "group_id"]),
            "leader_changes": _rows(changes, ["wall_ns", "topic", "partition"]),
        }
        self.out.add(
            "storms",
            storm_findings(windows, o.window_s),
            rebalance_findings(groups, o.window_s),
            leader_change_findings(changes),
        )

    def offsets(self) -> None:
        self.out.add("offsets", offset_loss_findings(offset_losses(self.facts)))

    def produce(self) -> None:
        tries = self.keep(attempts(self.facts))
        self.out.add(
            "produce",
            duplicate_findings(duplicate_batches(tries)),
            sequence_findings(sequence_problems(tries)),
        )


def run_audit(spark: SparkSession, options: AuditOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run the chosen checks over the capture at ``options.path``; the report as a dict."""
    started = time.monotonic()
    unknown = sorted(set(options.checks) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks: {', '.join(unknown)}")
    chosen = [c for c in CHECKS if c in options.checks]
    steps = 1 + len(chosen) + (1 if BODY_CHECKS.intersection(chosen) else 0)
    progress = progress or Progress(None, quiet=True)
    progress.total = steps
    if is_local(options.path) and not list_files(options.path):
        raise FileNotFoundError(f"no capture files (*.arrows) under {options.path}")
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "input": options.path,
        "options": {k: v for k, v in asdict(options).items() if k != "path"},
        "spark": {"version": spark.version, "master": spark.sparkContext.master},
    }
    run = _AuditRun(spark, options, report)
    try:
        with progress.step("reading the capture"):
            run.transactions  # noqa: B018 - reads and caches the capture, and counts it
        for check in chosen:
            if check in BODY_CHECKS and "facts" not in vars(run):
                with progress.step("decoding bodies"):
                    run.facts  # noqa: B018 - decodes and caches the bodies
            with progress.step(CHECKS[check].split(":")[0].lower()):
                getattr(run, check)()
    finally:
        run.release()
    report["checks"] = {name: {"title": CHECKS[name], **run.out.checks[name]} for name in chosen}
    report["timeline"] = sorted(
        run.out.timeline, key=lambda r: (r["window_start_ns"], r["check"], r["severity"])
    )
    report["summary"] = _summary(report["checks"])
    report["elapsed_s"] = round(time.monotonic() - started, 3)
    return report


def _summary(checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    by_severity = dict.fromkeys(SEVERITIES, 0)
    by_check: dict[str, dict[str, int]] = {}
    for name, entry in checks.items():
        per = dict.fromkeys(SEVERITIES, 0)
        for count in entry["counts"]:
            per[count["severity"]] += count["count"]
            by_severity[count["severity"]] += count["count"]
        by_check[name] = per
    worst = next((s for s in reversed(SEVERITIES) if by_severity[s]), None)
    return {
        "findings": sum(by_severity.values()),
        "by_severity": by_severity,
        "by_check": by_check,
        "worst": worst,
    }
