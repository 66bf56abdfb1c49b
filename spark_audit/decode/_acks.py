"""Header-level facts as Spark expressions: no Python per row.

The one body field the ordering checks need is a Produce request's ``acks`` (acks=0 is
the only request without an answer). It sits at an offset that depends only on the
client id length, the header's tagged fields and the transactional id, so it can be read
with Spark's own byte functions. Anything unusual (tagged fields in the header, a
transactional id of 127 bytes or more, a cut frame) gives null, which counts as
"expects an answer".

Each offset is computed in its own projection and then referred to by name: written as
one nested expression, every use of an offset would repeat the whole expression for it,
and the tree (and its generated code) would grow exponentially.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from protocol import PRODUCE_FIRST_FLEXIBLE, PRODUCE_FIRST_TRANSACTIONAL_ID, ApiKey


def be_unsigned(frame: Column, offset: Column, size: int) -> Column:
    """Big-endian unsigned integer of ``size`` bytes at 0-based ``offset``; null if cut."""
    return F.when(
        F.length(frame) >= offset + size,
        F.conv(F.hex(F.substr(frame, offset + 1, F.lit(size))), 16, 10).cast("long"),
    )


def be_int16(frame: Column, offset: Column) -> Column:
    """Big-endian signed int16 (one use of ``offset`` less than a when/otherwise would take)."""
    return F.pmod(be_unsigned(frame, offset, 2) + 32768, F.lit(65536)) - 32768


def with_produce_acks(
    df: DataFrame, frame: str = "frame", version: str = "api_version", out: str = "acks"
) -> DataFrame:
    """``df`` plus ``out``: the acks of each Produce request frame (short; null if unreadable).

    Apply it to Produce request rows only; for other rows the value means nothing."""
    f, v = F.col(frame), F.col(version)
    step = df.withColumn("_after", F.lit(14) + F.greatest(be_int16(f, F.lit(12)), F.lit(0)))
    step = step.withColumn(
        "_body",
        F.when(v < PRODUCE_FIRST_FLEXIBLE, F.col("_after")).when(
            be_unsigned(f, F.col("_after"), 1) == 0, F.col("_after") + 1
        ),
    )
    step = step.withColumn("_compact", be_unsigned(f, F.col("_body"), 1)).withColumn(
        "_legacy", be_int16(f, F.col("_body"))
    )
    step = step.withColumn(
        "_acks_at",
        F.when(v < PRODUCE_FIRST_TRANSACTIONAL_ID, F.col("_body"))
        .when(v < PRODUCE_FIRST_FLEXIBLE, F.col("_body") + 2 + F.greatest(F.col("_legacy"), F.lit(0)))
        .when(F.col("_compact") == 0, F.col("_body") + 1)
        .when(F.col("_compact") < 128, F.col("_body") + F.col("_compact")),
    )
    step = step.withColumn(out, be_int16(f, F.col("_acks_at")).cast("short"))
    return step.drop("_after", "_body", "_compact", "_legacy", "_acks_at")


def expects_answer(api_key: Column, acks: Column) -> Column:
    """False only for a Produce with acks=0 (unknown acks count as expecting an answer)."""
    return ~((api_key == ApiKey.PRODUCE) & (F.coalesce(acks, F.lit(-1)) == 0))


def with_acks(headers: DataFrame) -> DataFrame:
    """``headers`` plus ``acks`` from the frame head (null without one), and without ``frame``."""
    if "frame" not in headers.columns:
        return headers.withColumn("acks", F.lit(None).cast("short"))
    return with_produce_acks(headers).drop("frame")
