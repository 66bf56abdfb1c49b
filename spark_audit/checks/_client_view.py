"""Check 2, what the client saw: the client side of proxy captures (should be clean, since
corrfix repairs it) and every connection of wire captures (where problems show).

Kinds, one row each:

- ``out_of_order``: a request answered after a later request's answer;
- ``answer_missing``: a request never answered although a later one was;
- ``orphan`` / ``duplicate``: an answer to no outstanding request / a second answer;
- ``acks0_reply``: an answer to a Produce with acks=0 (which must get none);
- ``unanswered_at_close`` / ``unanswered_at_capture_end``: a request still owed an answer
  when its connection closed, or when the capture ended (not a fault in itself);
- ``id_not_increasing``: a client correlation id not above the previous one, unless it
  wrapped (dropped by at least 2^30: clients wrap at 2^31, Java's a little before).

On wire captures, ``capture_gap`` names the capture gap next to an ``out_of_order``,
``answer_missing`` or ``orphan`` finding that explains it (see
:func:`spark_audit.connections.capture_gaps`); the report makes those ``capture_gap``
findings at info level.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.checks._pairing import KEY, overtaken, requests, responses, side_pairs
from spark_audit.connections import END_OF_CAPTURE_REASONS, WRAP_DROP

COLUMNS = [
    "seq",
    "wall_ns",
    "kind",
    "api_key",
    "correlation_id",
    "related_correlation_id",
    "close_reason",
    "capture_gap",
]


def client_pairs(transactions: DataFrame) -> DataFrame:
    """Client-side pairs, by the client's own correlation ids."""
    return side_pairs(transactions, "client")


def _shape(df: DataFrame, **columns: Column) -> DataFrame:
    return df.select(*KEY, *[columns[name].alias(name) for name in COLUMNS])


def _null_int() -> Column:
    return F.lit(None).cast("int")


def order_violations(pairs: DataFrame) -> DataFrame:
    """``out_of_order`` and ``answer_missing``; time and related id are the overtaking answer's."""
    skipped = overtaken(requests(pairs)).filter("skipped")
    return _shape(
        skipped,
        seq=F.col("seq"),
        wall_ns=F.col("overtaken_wall_ns"),
        kind=F.when(F.col("answer_seq").isNotNull(), "out_of_order").otherwise("answer_missing"),
        api_key=F.col("api_key"),
        correlation_id=F.col("cid"),
        related_correlation_id=F.col("overtaken_cid"),
        close_reason=F.lit(None).cast("string"),
        capture_gap=F.col("capture_gap"),
    )


def stray_answers(pairs: DataFrame) -> DataFrame:
    """``orphan``, ``duplicate`` and ``acks0_reply`` answers."""
    kind = (
        F.when(F.col("request_seq").isNull(), "orphan")
        .when(F.col("nth") > 1, "duplicate")
        .when(~F.col("request_expects"), "acks0_reply")
    )
    strays = responses(pairs).withColumn("kind", kind).filter(F.col("kind").isNotNull())
    return _shape(
        strays,
        seq=F.col("seq"),
        wall_ns=F.col("wall_ns"),
        kind=F.col("kind"),
        api_key=F.col("api_key"),
        correlation_id=F.col("cid"),
        related_correlation_id=_null_int(),
        close_reason=F.lit(None).cast("string"),
        capture_gap=F.when(F.col("kind") == "orphan", F.col("capture_gap")),
    )


def unanswered(transactions: DataFrame, pairs: DataFrame) -> DataFrame:
    """Requests owed an answer at the end: at their connection's close, or the capture's end
    (no close row, or a close that only says the capture stopped)."""
    owed = overtaken(requests(pairs)).filter(
        F.col("expects") & F.col("answer_seq").isNull() & ~F.col("skipped")
    )
    closes = transactions.filter(F.col("kind") == "close").select(
        *KEY, F.col("reason").alias("close_reason"), F.col("wall_ns").alias("close_wall_ns")
    )
    joined = owed.join(closes, KEY, "left")
    first_token = F.split(F.coalesce(F.col("close_reason"), F.lit("")), ",").getItem(0)
    at_end = F.col("close_wall_ns").isNull() | first_token.isin(*END_OF_CAPTURE_REASONS)
    return _shape(
        joined,
        seq=F.col("seq"),
        wall_ns=F.col("wall_ns"),
        kind=F.when(at_end, "unanswered_at_capture_end").otherwise("unanswered_at_close"),
        api_key=F.col("api_key"),
        correlation_id=F.col("cid"),
        related_correlation_id=_null_int(),
        close_reason=F.col("close_reason"),
        capture_gap=F.lit(None).cast("string"),
    )


def id_order(pairs: DataFrame) -> DataFrame:
    """``id_not_increasing``: each client request id against the connection's previous one
    (``pairs`` from :func:`client_pairs`, which carry it)."""
    reqs = requests(pairs)
    drop = F.col("previous_request_cid").cast("long") - F.col("cid").cast("long")
    bad = reqs.filter(F.col("previous_request_cid").isNotNull() & (drop >= 0) & (drop < WRAP_DROP))
    return _shape(
        bad,
        seq=F.col("seq"),
        wall_ns=F.col("wall_ns"),
        kind=F.lit("id_not_increasing"),
        api_key=F.col("api_key"),
        correlation_id=F.col("cid"),
        related_correlation_id=F.col("previous_request_cid"),
        close_reason=F.lit(None).cast("string"),
        capture_gap=F.lit(None).cast("string"),
    )


def client_view(transactions: DataFrame, pairs: DataFrame | None = None) -> DataFrame:
    """Every client-view violation, all kinds (``pairs`` from :func:`client_pairs`, reused)."""
    pairs = pairs if pairs is not None else client_pairs(transactions)
    return (
        order_violations(pairs)
        .unionByName(stray_answers(pairs))
        .unionByName(unanswered(transactions, pairs))
        .unionByName(id_order(pairs))
    )
