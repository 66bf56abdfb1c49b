"""Requests matched to their answers on one side of each connection: one shuffle by connection,
then vectorised matching per group of connections (:mod:`.pair_arrow`).

A broker answers one connection's requests in order, so per connection and correlation id
a response belongs to the latest request with that id before it, and a request's answer is
the first response with its id after it (and before the id's next request: ids wrap).
Ordering problems follow in the same pass: a request is *overtaken* when a later
request's answer arrives first, that is, when the earliest answer to any later request
comes before its own answer (or it never gets one).

Window functions did this before, at two sorts of every row per matching plus one for
the ordering; one grouped Arrow pass is an order of magnitude cheaper.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_audit.acks import expects_answer, with_acks
from spark_audit.pair_arrow import PAIRS_SCHEMA, match

PAIRS_SPARK_SCHEMA = from_arrow_schema(PAIRS_SCHEMA)

KEY = ["capture_id", "connection_id"]
"""A connection: its id is unique only within its capture."""

BUCKETS = 64
"""Groups the connections are hashed into for matching: each is one Python call."""

_REQUEST_ONLY = [
    "skipped",
    "overtaken_seq",
    "overtaken_wall_ns",
    "overtaken_cid",
    "overtaken_api_key",
    "overtaken_client_correlation_id",
    "previous_request_cid",
]

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
    """Every request with an id, and every stray answer, with their partners
    (:data:`~.pair_arrow.PAIRS_SCHEMA`): ``request_*`` and ``nth`` on responses; ``answer_*``,
    ``expects`` (False only for acks=0 Produce), ``skipped`` and ``overtaken_*`` on requests.

    One shuffle: acks are read and the frame bytes dropped first, then whole connections
    (hashed into :data:`BUCKETS` groups, so Python is called per bucket, not per
    connection) are matched by :func:`~.pair_arrow.match`."""
    is_request = F.col("direction") == "request"
    frames = frames.filter(F.col(id_column).isNotNull())
    if "acks" not in frames.columns:  # the job's cached headers carry them already
        frames = with_acks(frames)
    f = frames.select(
        *KEY,
        "seq",
        "direction",
        *_CARRIED,
        F.col(id_column).alias("cid"),
        F.when(is_request, expects_answer(F.col("api_key"), F.col("acks"))).alias("expects"),
        F.pmod(F.xxhash64(*KEY), F.lit(BUCKETS)).alias("_bucket"),
    )
    return f.groupBy("_bucket").applyInArrow(match, PAIRS_SPARK_SCHEMA)


def requests(pairs: DataFrame) -> DataFrame:
    """Request rows of :func:`matched`, with their answer (null if none)."""
    return pairs.filter(F.col("direction") == "request").drop(
        "direction", "request_seq", "request_mono_ns", "request_expects", "nth"
    )


def responses(pairs: DataFrame) -> DataFrame:
    """Stray answers of :func:`matched`: ``request_seq`` null for an orphan, ``nth`` > 1 for a
    duplicate, ``request_expects`` false for a reply to acks=0 Produce."""
    return pairs.filter(F.col("direction") == "response").drop(
        "direction", "expects", "answer_seq", "answer_wall_ns", "answer_mono_ns", *_REQUEST_ONLY
    )


def overtaken(reqs: DataFrame) -> DataFrame:
    """Requests with ``skipped`` and ``overtaken_*`` (the first later answer, when skipped).

    :func:`matched` computes them in its one pass over each connection; this keeps the
    checks' reading order explicit."""
    return reqs
