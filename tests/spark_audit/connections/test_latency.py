"""Latency summaries, without Spark: exact up to ACCURACY latencies per group and
partition; above that, within percentile_approx's rank error (n / ACCURACY)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from spark_audit.connections import ACCURACY, LATENCY_SCHEMA, merge_summaries, summaries


def _lat(ms: np.ndarray, api_key: int = 3) -> pa.Table:
    n = len(ms)
    return pa.table(
        {
            "capture_id": ["c"] * n,
            "connection_id": ["x"] * n,
            "seq": np.arange(n),
            "wall_ns": np.zeros(n, np.int64),
            "api_key": pa.array([api_key] * n, pa.int16()),
            "correlation_id": pa.array(np.arange(n) % 1000, pa.int32()),
            "latency_ms": ms,
        },
        schema=LATENCY_SCHEMA,
    )


@pytest.mark.parametrize("n", [7, ACCURACY, 5 * ACCURACY + 3])
def test_merged_percentiles_keep_the_rank_error_bound(n):
    rng = np.random.default_rng(n)
    ms = rng.lognormal(1.0, 1.0, n)
    parts = np.array_split(rng.permutation(ms), 3)
    rows = [r for part in parts for r in summaries(_lat(part), 10).to_pylist()]
    [by_api], [by_window] = merge_summaries(rows)
    assert by_window == {"window_start_ns": 0, **by_api}  # one window: the same numbers
    assert by_api["requests"] == n and by_api["max_ms"] == ms.max()
    exact = np.sort(ms)
    for name, p in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        rank = math.ceil(p * n)
        got = int(np.searchsorted(exact, by_api[name], "left")) + 1
        if all(len(part) <= ACCURACY for part in parts):
            assert got == rank  # every latency kept: the ceil(p * n)-th, as Spark gives it
        else:
            assert abs(got - rank) <= n / ACCURACY + 3
