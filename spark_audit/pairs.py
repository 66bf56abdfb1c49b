"""Requests matched to their answers on one side of each connection, with window functions only.

A broker answers one connection's requests in order, so per connection and correlation id
a response belongs to the latest request with that id before it, and a request's answer is
the first response with its id after it (and before the id's next request: ids wrap).
Ordering problems then follow from one more window: a request is *overtaken* when a later
request's answer arrives first, that is, when the earliest answer to any later request
comes before its own answer (or it never gets one).

All windows grow from one end (never "unbounded following", which Spark evaluates in
quadratic time): "after me" is computed as "before me" in descending order.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .acks import expects_answer, with_produce_acks

KEY = ["capture_id", "connection_id"]
"""A connection: its id is unique only within its capture."""

_CARRIED = [
    "wall_ns",
    "mono_ns",
    "api_key",
    "api_version",
    "client_correlation_id",
    "upstream_correlation_id",
]


def side_frames(headers: DataFrame, side: str) -> DataFrame:
    """Frame rows of one side (``client`` or ``upstream``)."""
    return headers.filter((F.col("kind") == "frame") & (F.col("side") == side))


def matched(frames: DataFrame, id_column: str) -> DataFrame:
    """Every frame with an id, with its partner: ``request_*`` and ``nth`` on responses,
    ``answer_*`` on requests, ``expects`` (False only for acks=0 Produce) on requests."""
    is_request = F.col("direction") == "request"
    frames = frames.filter(F.col(id_column).isNotNull())
    if "frame" in frames.columns:
        frames = with_produce_acks(frames)
    else:
        frames = frames.withColumn("acks", F.lit(None).cast("short"))
    acks = F.col("acks")
    f = frames.select(
        *KEY,
        "seq",
        "direction",
        *_CARRIED,
        F.col(id_column).alias("cid"),
        F.when(is_request, expects_answer(F.col("api_key"), acks)).alias("expects"),
    )
    by_id = Window.partitionBy(*KEY, "cid").orderBy("seq")
    so_far = by_id.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    after = Window.partitionBy(*KEY, "cid").orderBy(F.col("seq").desc())
    after = after.rowsBetween(Window.unboundedPreceding, -1)

    def latest_request(column: str) -> Column:
        return F.when(~is_request, F.last(F.when(is_request, F.col(column)), True).over(so_far))

    def next_response(column: str) -> Column:
        return F.last(F.when(~is_request, F.col(column)), True).over(after)

    responses_so_far = F.sum(F.when(is_request, 0).otherwise(1)).over(so_far)
    f = f.withColumn("_responses", responses_so_far)
    next_request = F.last(F.when(is_request, F.col("seq")), True).over(after)
    answered = next_response("seq").isNotNull() & (
        next_request.isNull() | (next_response("seq") < next_request)
    )
    return f.select(
        *KEY,
        "seq",
        "direction",
        *_CARRIED,
        "cid",
        "expects",
        latest_request("seq").alias("request_seq"),
        latest_request("mono_ns").alias("request_mono_ns"),
        latest_request("expects").alias("request_expects"),
        F.when(
            ~is_request & latest_request("seq").isNotNull(),
            F.col("_responses") - F.last(F.when(is_request, F.col("_responses")), True).over(so_far),
        ).alias("nth"),
        F.when(is_request & answered, next_response("seq")).alias("answer_seq"),
        F.when(is_request & answered, next_response("wall_ns")).alias("answer_wall_ns"),
        F.when(is_request & answered, next_response("mono_ns")).alias("answer_mono_ns"),
    )


def requests(pairs: DataFrame) -> DataFrame:
    """Request rows of :func:`matched`, with their answer (null if none)."""
    return pairs.filter(F.col("direction") == "request").drop(
        "direction", "request_seq", "request_mono_ns", "request_expects", "nth"
    )


def responses(pairs: DataFrame) -> DataFrame:
    """Response rows of :func:`matched`: ``request_seq`` null for an orphan, ``nth`` > 1 for a duplicate."""
    return pairs.filter(F.col("direction") == "response").drop(
        "direction", "expects", "answer_seq", "answer_wall_ns", "answer_mono_ns"
    )


def overtaken(reqs: DataFrame) -> DataFrame:
    """Requests with ``skipped``: it expected an answer and a later request's answer came
    first (its own came later, or never). ``overtaken_*`` describe that first later answer."""
    later = Window.partitionBy(*KEY).orderBy(F.col("seq").desc()).rowsBetween(Window.unboundedPreceding, -1)
    answer = F.when(
        F.col("answer_seq").isNotNull(),
        F.struct(
            F.col("answer_seq").alias("seq"),
            F.col("answer_wall_ns").alias("wall_ns"),
            F.col("cid").alias("cid"),
            F.col("api_key").alias("api_key"),
            F.col("client_correlation_id").alias("client_correlation_id"),
        ),
    )
    first = F.min(answer).over(later)
    out = reqs.withColumn("_first", first)
    skipped = (
        F.col("expects")
        & F.col("_first").isNotNull()
        & (F.col("answer_seq").isNull() | (F.col("answer_seq") > F.col("_first.seq")))
    )
    out = out.withColumn("skipped", skipped)
    fields = ["seq", "wall_ns", "cid", "api_key", "client_correlation_id"]
    return out.select(
        *[c for c in out.columns if c != "_first"],
        *[F.when(F.col("skipped"), F.col(f"_first.{f}")).alias(f"overtaken_{f}") for f in fields],
    )
