"""Check 3, latency per api key as the client saw it: p50, p99 and max, over the whole
capture and per time window, and the requests slow enough to stand out.

A latency is the first answer's time minus its request's, on the monotonic clock of one
connection (client side: through corrfix it includes any repair). Replies to acks=0
Produce are not answers and are left out. A request is *slow* when its latency is above
``factor`` times its api key's p50, above its p99, and at least ``min_ms``: an outlier
for its own kind of request (a Fetch long-poll is slow by design, and so is its p50).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.checks._pairing import KEY, requests
from spark_audit.checks._windows import window_start
from spark_audit.connections import ACCURACY


def latencies(pairs: DataFrame) -> DataFrame:
    """One row per answered request: its time, api key, id and latency in milliseconds."""
    answered = requests(pairs).filter(F.col("expects") & F.col("answer_seq").isNotNull())
    latency_ns = F.col("answer_mono_ns") - F.col("mono_ns")
    return answered.select(
        *KEY,
        "seq",
        (F.col("answer_wall_ns") - latency_ns).alias("wall_ns"),
        "api_key",
        F.col("cid").alias("correlation_id"),
        (latency_ns / 1e6).alias("latency_ms"),
    )


def _stats() -> list[Column]:
    quantiles = F.percentile_approx("latency_ms", [0.5, 0.99], ACCURACY)
    return [
        F.count("*").alias("requests"),
        quantiles.getItem(0).alias("p50_ms"),
        quantiles.getItem(1).alias("p99_ms"),
        F.max("latency_ms").alias("max_ms"),
    ]


def latency_by_api(lat: DataFrame) -> DataFrame:
    """requests, p50_ms, p99_ms, max_ms per api key over the whole capture."""
    return lat.groupBy("api_key").agg(*_stats())


def latency_by_window(lat: DataFrame, window_s: float) -> DataFrame:
    """The same per time window (``window_start_ns``) and api key."""
    return lat.groupBy(window_start(F.col("wall_ns"), window_s).alias("window_start_ns"), "api_key").agg(
        *_stats()
    )


def slow_requests(
    lat: DataFrame, by_api: DataFrame, factor: float = 10.0, min_ms: float = 100.0
) -> DataFrame:
    """Requests above their api key's outlier threshold (``threshold_ms``)."""
    threshold = F.greatest(F.col("p99_ms"), F.col("p50_ms") * F.lit(factor), F.lit(float(min_ms)))
    stats = by_api.select("api_key", "p50_ms", "p99_ms", threshold.alias("threshold_ms"))
    joined = lat.join(stats, "api_key")
    return joined.filter(F.col("latency_ms") > F.col("threshold_ms")).select(
        *KEY, "seq", "wall_ns", "api_key", "correlation_id", "latency_ms", "p50_ms", "p99_ms", "threshold_ms"
    )
