"""Check 6, duplicate produce, from the record batches the broker was sent.

- Without a producer id, the broker cannot tell a re-sent batch from a new one. A batch
  (same topic, partition and CRC) sent in two or more Produce requests is
  ``appended_twice`` when two or more of them were acknowledged (error 0), and
  ``possible_duplicate`` when fewer were but the acknowledged and the unanswered sends
  together are two or more (an answer was not captured, for example lost on the way back:
  the broker may still have appended it). A send answered with an error was not
  appended, so it counts for neither.
- With a producer id, the broker de-duplicates by sequence. Per producer id, epoch and
  partition, each batch's base sequence should follow the previous batch's last one
  (wrapping at 2^31): ``sequence_gap`` when it jumps ahead, ``sequence_reused`` when a
  different batch (another CRC) reuses sequences; ``retried`` when the same batch was sent
  again, which the broker de-duplicates.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from protocol import ApiKey

_CALL = ["capture_id", "connection_id", "correlation_id"]
_BATCH = ["topic", "partition", "crc"]
_FIRST = ["wall_ns", "capture_id", "connection_id", "correlation_id"]
"""A batch's first send: the least of these, in this order."""
SEQUENCE_WRAP = 1 << 31


def attempts(facts: DataFrame) -> DataFrame:
    """Each record batch in each Produce request, with ``acknowledged`` (its partition's answer
    was error 0; null when no answer was captured), which the per-connection pass put on the
    batch's row (:func:`spark_audit.connections.merge_acks`)."""
    batches = facts.filter((F.col("fact") == "produce_batch") & (F.col("api_key") == ApiKey.PRODUCE))
    return batches.select(
        *_CALL,
        "seq",
        "wall_ns",
        "topic",
        "partition",
        "crc",
        "acks",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "record_count",
        "transactional_id",
        "acknowledged",
    )


def batch_sends(tries: DataFrame) -> DataFrame:
    """Each send of a batch without a producer id as a group of one send: the shape
    (:data:`spark_audit.connections.BATCH_SENDS_SCHEMA`) in which the per-connection pass
    hands over its partition's sends already summed per batch."""
    plain = tries.filter(
        F.col("crc").isNotNull() & (F.col("producer_id") < 0) & F.col("transactional_id").isNull()
    )
    return plain.select(
        *_BATCH,
        *_FIRST,
        F.lit(1).cast("long").alias("sends"),
        F.when(F.col("acknowledged"), 1).otherwise(0).cast("long").alias("acknowledged_sends"),
        F.when(F.col("acknowledged").isNull(), 1).otherwise(0).cast("long").alias("unanswered_sends"),
        F.col("wall_ns").alias("last_wall_ns"),
        "record_count",
    )


def duplicate_batches(tries: DataFrame) -> DataFrame:
    """Batches without a producer id sent more than once: ``kind`` appended_twice or
    possible_duplicate, ``sends``, ``acknowledged`` (count), first and last send."""
    return duplicates_of_sends(batch_sends(tries))


def duplicates_of_sends(sends: DataFrame) -> DataFrame:
    """:func:`duplicate_batches` from :func:`batch_sends` rows, or from partial sums of them."""
    grouped = sends.groupBy(*_BATCH).agg(
        F.sum("sends").alias("sends"),
        F.sum("acknowledged_sends").alias("acknowledged"),
        F.sum("unanswered_sends").alias("unanswered"),
        F.min(F.struct(*_FIRST)).alias("first"),
        F.max("last_wall_ns").alias("last_wall_ns"),
        F.max("record_count").alias("record_count"),
    )
    resent = grouped.filter((F.col("sends") > 1) & (F.col("acknowledged") + F.col("unanswered") >= 2))
    return resent.select(
        F.col("first.capture_id").alias("capture_id"),
        F.col("first.connection_id").alias("connection_id"),
        F.col("first.wall_ns").alias("wall_ns"),
        *_BATCH,
        "record_count",
        "sends",
        "acknowledged",
        "unanswered",
        "last_wall_ns",
        F.when(F.col("acknowledged") >= 2, "appended_twice").otherwise("possible_duplicate").alias("kind"),
    )


def sequence_problems(tries: DataFrame) -> DataFrame:
    """Idempotent batches out of sequence: ``kind`` sequence_gap, sequence_reused or retried."""
    producer = ["producer_id", "producer_epoch", "topic", "partition"]
    idempotent = tries.filter((F.col("producer_id") >= 0) & (F.col("base_sequence") >= 0))
    distinct = idempotent.groupBy(*producer, "base_sequence", "crc").agg(
        F.min(F.struct("wall_ns", "capture_id", "connection_id")).alias("first"),
        F.count("*").alias("sends"),
        F.max("record_count").alias("record_count"),
    )
    order = Window.partitionBy(*producer).orderBy("first.wall_ns", "base_sequence")
    previous_end = F.lag((F.col("base_sequence").cast("long") + F.col("record_count")) % SEQUENCE_WRAP).over(
        order
    )
    with_prev = distinct.withColumn("expected_sequence", previous_end)
    kind = (
        F.when(F.col("expected_sequence").isNull(), F.when(F.col("sends") > 1, "retried"))
        .when(F.col("base_sequence") > F.col("expected_sequence"), "sequence_gap")
        .when(F.col("base_sequence") < F.col("expected_sequence"), "sequence_reused")
        .when(F.col("sends") > 1, "retried")
    )
    found = with_prev.withColumn("kind", kind).filter(F.col("kind").isNotNull())
    return found.select(
        F.col("first.capture_id").alias("capture_id"),
        F.col("first.connection_id").alias("connection_id"),
        F.col("first.wall_ns").alias("wall_ns"),
        *producer,
        "base_sequence",
        "expected_sequence",
        "record_count",
        "crc",
        "sends",
        "kind",
    )
