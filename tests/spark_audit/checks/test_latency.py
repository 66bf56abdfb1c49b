"""Check 3: latency per api key, per window, and slow-request outliers."""

from __future__ import annotations

import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import client_pairs, latencies, latency_by_api, latency_by_window, slow_requests
from tests.support.audit_builders import CAPTURE, MS, req, resp, transactions_df

# Metadata requests answered after 1, 2, 3, 4 and 50 ms; ApiVersions after 1 ms; the second
# window (from 10 s) holds the last Metadata request only.
TIMINGS = [(3, 0, 1), (3, 100, 2), (3, 200, 3), (3, 300, 4), (18, 400, 1), (3, 10_000, 50)]


@pytest.fixture(scope="module")
def lat(spark):
    rows = []
    for i, (api, start_ms, took_ms) in enumerate(TIMINGS):
        rows.append(req("l", 2 * i, "client", api, cid=i, wall_ms=start_ms))
        rows.append(resp("l", 2 * i + 1, "client", api, cid=i, wall_ms=start_ms + took_ms))
    return latencies(client_pairs(transactions_df(spark, rows)))


def test_latency_rows(lat):
    expected = [
        Row(
            capture_id=CAPTURE,
            connection_id="l",
            seq=2 * i,
            wall_ns=start * MS,
            api_key=api,
            correlation_id=i,
            latency_ms=float(took),
        )
        for i, (api, start, took) in enumerate(TIMINGS)
    ]
    assertDataFrameEqual(lat, expected)


def test_latency_by_api_and_by_window(lat):
    assertDataFrameEqual(
        latency_by_api(lat),
        [
            Row(api_key=3, requests=5, p50_ms=3.0, p99_ms=50.0, max_ms=50.0),
            Row(api_key=18, requests=1, p50_ms=1.0, p99_ms=1.0, max_ms=1.0),
        ],
    )
    assertDataFrameEqual(
        latency_by_window(lat, 10),
        [
            Row(window_start_ns=0, api_key=3, requests=4, p50_ms=2.0, p99_ms=4.0, max_ms=4.0),
            Row(window_start_ns=0, api_key=18, requests=1, p50_ms=1.0, p99_ms=1.0, max_ms=1.0),
            Row(window_start_ns=10_000 * MS, api_key=3, requests=1, p50_ms=50.0, p99_ms=50.0, max_ms=50.0),
        ],
    )


def test_slow_requests_stand_out_for_their_own_api(lat):
    by_api = latency_by_api(lat.filter("latency_ms < 50"))  # stats without the outlier
    expected = [
        Row(
            capture_id=CAPTURE,
            connection_id="l",
            seq=10,
            wall_ns=10_000 * MS,
            api_key=3,
            correlation_id=5,
            latency_ms=50.0,
            p50_ms=2.0,
            p99_ms=4.0,
            threshold_ms=20.0,
        )
    ]
    assertDataFrameEqual(slow_requests(lat, by_api, factor=10, min_ms=5), expected)
    assert slow_requests(lat, by_api, factor=10, min_ms=100).count() == 0
