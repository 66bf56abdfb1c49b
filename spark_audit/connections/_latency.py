"""Check 3's numbers without a JVM row per request: each partition's latencies as
mergeable summaries per api key and per (window, api key), merged on the driver; and the
few requests slow enough to be candidates for a slow-request finding.

The percentiles keep ``percentile_approx``'s contract (accuracy :data:`ACCURACY`: a rank
error of at most one in that many) and its value: the ``ceil(p * n)``-th smallest latency.
A partition keeps every latency of a group up to :data:`ACCURACY` of them, so up to that
size per partition the result is exact, which is also where Spark's is; above it, every
``s``-th latency with weight ``s`` (``s = ceil(n / ACCURACY)``), a rank error of at most
``n / ACCURACY`` summed over partitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_audit.connections._anomalies import rows_where, side_rows
from spark_audit.connections._codes import sort_order

ACCURACY = 10_000
"""``percentile_approx``'s accuracy: the relative rank error is at most its inverse."""
QUANTILES = (("p50_ms", 0.5), ("p99_ms", 0.99))
NS_PER_S = 1_000_000_000
_NO_KEY = -(1 << 40)
"""Stands for a null api key or window in the grouping keys (no real one is this low)."""

LATENCY_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string()),
        pa.field("connection_id", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("wall_ns", pa.int64()),
        pa.field("api_key", pa.int16()),
        pa.field("correlation_id", pa.int32()),
        pa.field("latency_ms", pa.float64()),
    ]
)
"""One answered request (``spark_audit.checks.latencies``' rows)."""

SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("by_window", pa.bool_()),
        pa.field("window_start_ns", pa.int64()),
        pa.field("api_key", pa.int16()),
        pa.field("requests", pa.int64()),
        pa.field("max_ms", pa.float64()),
        pa.field("sample_ms", pa.binary()),
        pa.field("sample_weights", pa.binary()),
    ]
)
"""One group's summary: per api key (``by_window`` false) or per window and api key;
``sample_ms`` and ``sample_weights`` are float64 and int64 arrays, sorted by latency."""


def answered_requests(transactions: pa.Table) -> pa.Table:
    """Every client-side request that expected and got an answer, with its latency."""
    reqs = side_rows(transactions, "client", "request")
    reqs = rows_where(reqs, pc.and_(reqs.column("expects"), pc.is_valid(reqs.column("answer_seq"))))
    latency_ns = pc.subtract(reqs.column("answer_mono_ns"), reqs.column("mono_ns"))
    return pa.table(
        {
            "capture_id": reqs.column("capture_id"),
            "connection_id": reqs.column("connection_id"),
            "seq": reqs.column("seq"),
            "wall_ns": pc.subtract(reqs.column("answer_wall_ns"), latency_ns),
            "api_key": reqs.column("api_key"),
            "correlation_id": reqs.column("cid"),
            "latency_ms": pc.divide(pc.cast(latency_ns, pa.float64()), 1e6),
        },
        schema=LATENCY_SCHEMA,
    )


def window_starts(wall_ns: np.ndarray, window_s: float) -> np.ndarray:
    """Start of each ``wall_ns``'s window, computed as Spark's ``window_start`` does (in
    doubles, so the two always agree)."""
    size = int(window_s * NS_PER_S)
    return np.floor(wall_ns.astype(np.float64) / np.float64(size)).astype(np.int64) * size


def _filled(column: pa.ChunkedArray, fill: float) -> np.ndarray:
    return pc.fill_null(column, fill).to_numpy(zero_copy_only=False)


def _sample(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``values`` (no NaN), at most :data:`ACCURACY` of them, with weights."""
    values = np.sort(values)
    n = len(values)
    if n <= ACCURACY:
        return values, np.ones(n, np.int64)
    step = math.ceil(n / ACCURACY)
    at = np.arange(step - 1, n, step)
    if at[-1] != n - 1:
        at = np.append(at, n - 1)
    return values[at], np.diff(np.concatenate(([-1], at))).astype(np.int64)


def summaries(lat: pa.Table, window_s: float) -> pa.Table:
    """:data:`SUMMARY_SCHEMA` rows of ``lat`` (:func:`answered_requests`): per api key, and per
    window and api key."""
    if lat.num_rows == 0:
        return SUMMARY_SCHEMA.empty_table()
    api = _filled(pc.cast(lat.column("api_key"), pa.int64()), _NO_KEY).astype(np.int64)
    ms = _filled(lat.column("latency_ms"), np.nan).astype(np.float64)
    wall = lat.column("wall_ns")
    window = np.where(
        _filled(pc.is_valid(wall), False), window_starts(_filled(wall, 0).astype(np.int64), window_s), _NO_KEY
    )
    out: list[dict[str, Any]] = []
    for by_window, keys in ((False, np.zeros_like(api)), (True, window)):
        order = sort_order(keys, api)
        k, a = keys[order], api[order]
        bounds = np.flatnonzero((k[1:] != k[:-1]) | (a[1:] != a[:-1])) + 1
        for rows in np.split(order, bounds):
            start, key = int(keys[rows[0]]), int(api[rows[0]])
            values = ms[rows]
            values = values[~np.isnan(values)]
            sample, weights = _sample(values)
            out.append(
                {
                    "by_window": by_window,
                    "window_start_ns": None if not by_window or start == _NO_KEY else start,
                    "api_key": None if key == _NO_KEY else key,
                    "requests": len(rows),
                    "max_ms": float(values.max()) if len(values) else None,
                    "sample_ms": sample.tobytes(),
                    "sample_weights": weights.tobytes(),
                }
            )
    return pa.Table.from_pylist(out, schema=SUMMARY_SCHEMA)


def slow_candidates(lat: pa.Table, min_ms: float) -> pa.Table:
    """The requests a slow-request threshold can pick: it is never below ``min_ms``."""
    return lat.filter(pc.fill_null(pc.greater(lat.column("latency_ms"), min_ms), False))


def _quantile(values: np.ndarray, cumulative: np.ndarray, p: float) -> float | None:
    if len(values) == 0:
        return None
    rank = math.ceil(p * int(cumulative[-1]))
    return float(values[min(int(np.searchsorted(cumulative, rank, "left")), len(values) - 1)])


def _none_first(value: int | None) -> tuple[bool, int]:
    return (value is not None, value or 0)


def merge_summaries(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The report's ``latency.by_api`` and ``latency.by_window`` rows from every partition's
    :data:`SUMMARY_SCHEMA` rows: requests, p50_ms, p99_ms and max_ms, in the report's order."""
    merged: dict[tuple[bool, int | None, int | None], list[dict[str, Any]]] = {}
    for row in rows:
        merged.setdefault((row["by_window"], row["window_start_ns"], row["api_key"]), []).append(row)
    by_api, by_window = [], []
    for (windowed, start, api_key), parts in merged.items():
        values = np.concatenate([np.frombuffer(p["sample_ms"], np.float64) for p in parts])
        weights = np.concatenate([np.frombuffer(p["sample_weights"], np.int64) for p in parts])
        order = np.argsort(values, kind="stable")
        values, cumulative = values[order], np.cumsum(weights[order])
        maxima = [p["max_ms"] for p in parts if p["max_ms"] is not None]
        stats = {
            "requests": sum(p["requests"] for p in parts),
            **{name: _quantile(values, cumulative, p) for name, p in QUANTILES},
            "max_ms": max(maxima) if maxima else None,
        }
        if windowed:
            by_window.append({"window_start_ns": start, "api_key": api_key, **stats})
        else:
            by_api.append({"api_key": api_key, **stats})
    by_api.sort(key=lambda r: _none_first(r["api_key"]))
    by_window.sort(key=lambda r: (_none_first(r["window_start_ns"]), _none_first(r["api_key"])))
    return by_api, by_window
