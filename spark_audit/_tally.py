"""The findings of every check, counted per check, kind, severity and window (the timeline)
and ranked: each check's first ``limit`` findings, worst first, then by time.

Two ways, one contract. :func:`tally_tables` is the definition, in Spark SQL: a ``groupBy``
and a window over the union of every check's findings, two shuffles. When the findings are
few (the audit knows a bound before they are computed: no check finds more findings than it
has input rows), :func:`finding_rows` hands the driver the findings themselves as JSON, and
:func:`tally_rows` counts and ranks them in Python: on a small capture the two shuffles cost
more than the whole audit's work. Tests hold the two to the same output.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_audit._catalog import SEVERITIES
from spark_audit.checks import window_start

JSON_OPTIONS = {"ignoreNullFields": "false"}
WINDOW = "window_start_ns"
FINDING_TAG = "finding:"
"""Tag of a finding's row handed to the driver: ``finding:<check>``."""
_WINDOW_KEY = "_window_start_ns"
"""The window of a finding handed to the driver, inside its JSON (Spark computes it)."""


def _found(checks: dict[str, DataFrame]) -> DataFrame:
    return functools.reduce(
        DataFrame.unionByName, [df.withColumn("_check", F.lit(name)) for name, df in checks.items()]
    )


def _worst_first() -> Column:
    return F.array_position(F.array(*map(F.lit, reversed(SEVERITIES))), F.col("severity"))


def as_json(df: DataFrame, tag: str) -> DataFrame:
    """``df`` as (tag, n, json): every row as one JSON object, ``n`` 0 (unnumbered)."""
    return df.select(
        F.lit(tag).alias("tag"),
        F.lit(0).cast("long").alias("n"),
        F.to_json(F.struct(*[F.col(c) for c in df.columns]), JSON_OPTIONS).alias("json"),
    )


def tally_tables(checks: dict[str, DataFrame], window_s: float, limit: int) -> list[DataFrame]:
    """Counts per check, kind, severity and window (tag ``counts``) and each check's first
    ``limit`` findings (tag ``top:<check>``, numbered ``n`` from 1), as (tag, n, json) rows."""
    found = _found(checks)
    window = window_start(F.col("wall_ns"), window_s).alias(WINDOW)
    counts = found.groupBy("_check", "kind", "severity", window).count()
    order: list[Column | str] = [_worst_first(), F.col("wall_ns").asc_nulls_last(), "connection_id", "kind"]
    place = F.row_number().over(Window.partitionBy("_check").orderBy(*order))
    top = found.withColumn("_n", place).filter(F.col("_n") <= limit)
    finding_columns = [c for c in top.columns if c not in ("_check", "_n")]
    return [
        as_json(counts, "counts"),
        top.select(
            F.concat(F.lit("top:"), F.col("_check")).alias("tag"),
            F.col("_n").cast("long").alias("n"),
            F.to_json(F.struct(*[F.col(c) for c in finding_columns]), JSON_OPTIONS).alias("json"),
        ),
    ]


def finding_rows(checks: dict[str, DataFrame], window_s: float) -> DataFrame:
    """Every finding as a (tag ``finding:<check>``, n 0, json) row, its window start in the
    JSON, for :func:`tally_rows`; no shuffle of its own."""
    found = _found(checks)
    columns = [F.col(c) for c in found.columns if c != "_check"]
    window = window_start(F.col("wall_ns"), window_s).alias(_WINDOW_KEY)
    return found.select(
        F.concat(F.lit(FINDING_TAG), F.col("_check")).alias("tag"),
        F.lit(0).cast("long").alias("n"),
        F.to_json(F.struct(*columns, window), JSON_OPTIONS).alias("json"),
    )


def _rank(finding: dict[str, Any]) -> tuple[Any, ...]:
    """:func:`tally_tables`' order: worst first, then time (nulls last), connection and kind
    (nulls first, as Spark's ascending order)."""
    severity = finding["severity"]
    worst = len(SEVERITIES) - SEVERITIES.index(severity) if severity in SEVERITIES else 0
    wall, connection, kind = finding["wall_ns"], finding["connection_id"], finding["kind"]
    return (
        worst,
        wall is None,
        wall if wall is not None else 0,
        connection is not None,
        connection or "",
        kind is not None,
        kind or "",
    )


def tally_rows(
    rows: Iterable[tuple[str, str]], limit: int
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """:func:`tally_tables` on the driver, from :func:`finding_rows`' (tag, json) rows: the
    ``counts`` rows, and each check's first ``limit`` findings by ``top:<check>``."""
    counts: dict[tuple[str, Any, Any, Any], int] = {}
    per_check: dict[str, list[dict[str, Any]]] = {}
    for tag, text in rows:
        check = tag[len(FINDING_TAG) :]
        finding = json.loads(text)
        window = finding.pop(_WINDOW_KEY)
        key = (check, finding["kind"], finding["severity"], window)
        counts[key] = counts.get(key, 0) + 1
        per_check.setdefault(check, []).append(finding)
    top = {  # ties in every ranked column keep the order Spark gave the rows (a stable sort)
        f"top:{check}": sorted(found, key=_rank)[:limit] for check, found in per_check.items()
    }
    counted = [
        {"_check": c, "kind": k, "severity": s, WINDOW: w, "count": n} for (c, k, s, w), n in counts.items()
    ]
    return counted, top
