"""Requests paired with their answers, per side, as the checks read them: the ``frame``
rows of the transactions (:mod:`spark_audit.connections`), where each request carries its
answer and the overtaking answer, if any, and stray answers carry their request.

The pairing itself happens once per connection, in Python, before any row reaches the
JVM (:func:`spark_audit.connections.match`); this module only picks a side's rows and
splits requests from stray answers, keeping the checks' reading order explicit.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_audit.connections import PAIRS_SCHEMA

KEY = ["capture_id", "connection_id"]
"""A connection: its id is unique only within its capture."""

_REQUEST_ONLY = [
    "skipped",
    "overtaken_seq",
    "overtaken_wall_ns",
    "overtaken_cid",
    "overtaken_api_key",
    "overtaken_client_correlation_id",
    "previous_request_cid",
]


def side_pairs(transactions: DataFrame, side: str) -> DataFrame:
    """The pairs of one side (``client`` or ``upstream``): :data:`PAIRS_SCHEMA` columns, and
    ``capture_gap`` (wire captures: the capture gap that explains the pair, if one does)."""
    pairs = transactions.filter((F.col("kind") == "frame") & (F.col("side") == side))
    return pairs.select(*[field.name for field in PAIRS_SCHEMA], "capture_gap")


def requests(pairs: DataFrame) -> DataFrame:
    """Request rows of :func:`side_pairs`, with their answer (null if none)."""
    return pairs.filter(F.col("direction") == "request").drop(
        "direction", "request_seq", "request_mono_ns", "request_expects", "nth"
    )


def responses(pairs: DataFrame) -> DataFrame:
    """Stray answers of :func:`side_pairs`: ``request_seq`` null for an orphan, ``nth`` > 1 for a
    duplicate, ``request_expects`` false for a reply to acks=0 Produce."""
    return pairs.filter(F.col("direction") == "response").drop(
        "direction", "expects", "answer_seq", "answer_wall_ns", "answer_mono_ns", *_REQUEST_ONLY
    )


def overtaken(reqs: DataFrame) -> DataFrame:
    """Requests with ``skipped`` and ``overtaken_*`` (the first later answer, when skipped).

    :func:`side_pairs` computes them in its one pass over each connection; this keeps the
    checks' reading order explicit."""
    return reqs
