"""Check 6, duplicate produce, from the record batches the broker was sent.

- Without a producer id, the broker cannot tell a re-sent batch from a new one. A batch is
  identified by topic, partition, CRC, record count, first timestamp and length
  (:data:`BATCH`): a re-send, corrfix's or the client's own, keeps the batch's bytes, so
  its copies agree on all of them, while two different batches that share a CRC by chance
  almost never do. A batch sent in two or more Produce requests is ``appended_twice`` when
  two or more of them were acknowledged (error 0), and ``possible_duplicate`` when fewer
  were but the acknowledged and the unanswered sends together are two or more (an answer
  was not captured, for example lost on the way back: the broker may still have appended
  it). A send answered with an error was not appended, so it counts for neither, except
  NOT_ENOUGH_REPLICAS_AFTER_APPEND and REQUEST_TIMED_OUT, which leave the records in the
  leader's log: the pass gives those sends a null ``acknowledged``, as unanswered ones.
  ``corrfix_resends`` says how many of the sends were corrfix's re-sends: sends of one
  lineage (same capture, connection and ``lineage_id``, the client correlation id that an
  upstream request and its re-sends share); the others are separate requests, such as a
  client's own retry.
- With a producer id, the broker de-duplicates by sequence. Per producer id, epoch and
  partition, each batch's base sequence should follow the previous batch's last one
  (wrapping at 2^31): ``sequence_gap`` when it jumps ahead, ``sequence_reused`` when a
  different batch (another CRC) reuses sequences; ``retried`` when the same batch was sent
  again, which the broker de-duplicates. Sequences the broker does not hold are free to
  take: a refused batch's, and all of them after UNKNOWN_PRODUCER_ID (clients before
  KIP-360 renumber and restart under the same producer id and epoch).

Topics and producer ids are a cluster's (each broker hands out producer ids from its own
cluster's counter): batches and sequences are compared within one cluster only
(:mod:`._clusters`), and the findings carry its ``cluster_id``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from protocol import ApiKey
from spark_audit.checks._clusters import HOME, KEY, Clusters, resolve, with_homes

_CALL = ["capture_id", "connection_id", "correlation_id"]
BATCH = ["topic", "partition", "crc", "record_count", "first_timestamp", "batch_length"]
"""What identifies a batch without a producer id."""
_FIRST = ["wall_ns", "capture_id", "connection_id", "correlation_id"]
"""A batch's first send: the least of these, in this order."""
SEQUENCE_WRAP = 1 << 31


def attempts(facts: DataFrame, clusters: Clusters | None = None) -> DataFrame:
    """Each record batch in each Produce request, with ``acknowledged`` (its partition's answer
    was error 0; null when no answer was captured), which the per-connection pass put on the
    batch's row (:func:`spark_audit.connections.merge_acks`), and its connection's home
    (:data:`HOME`: upstream address, the cluster its answers named)."""
    batches = facts.filter((F.col("fact") == "produce_batch") & (F.col("api_key") == ApiKey.PRODUCE))
    return with_homes(batches, facts, clusters or Clusters.of(facts)).select(
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
        "first_timestamp",
        "batch_length",
        "lineage_id",
        "transactional_id",
        "acknowledged",
        *HOME,
    )


def batch_sends(tries: DataFrame) -> DataFrame:
    """The sends of batches without a producer id, summed per batch, home and lineage: the
    shape (:data:`spark_audit.connections.BATCH_SENDS_SCHEMA`) in which the per-connection
    pass hands over its partition's sends already summed per batch and home. A send without
    lineage is a lineage of its own."""
    plain = tries.filter(
        F.col("crc").isNotNull() & (F.col("producer_id") < 0) & F.col("transactional_id").isNull()
    )
    alone = F.concat(F.lit("send "), F.monotonically_increasing_id().cast("string"))
    lineage = F.coalesce(F.col("lineage_id").cast("string"), alone)
    per_lineage = plain.groupBy(*BATCH, *HOME, "capture_id", "connection_id", lineage.alias("lineage")).agg(
        F.count("*").alias("sends"),
        F.sum(F.when(F.col("acknowledged"), 1).otherwise(0)).alias("acknowledged_sends"),
        F.sum(F.when(F.col("acknowledged").isNull(), 1).otherwise(0)).alias("unanswered_sends"),
        F.min(F.struct(*_FIRST)).alias("first"),
        F.max("wall_ns").alias("last_wall_ns"),
    )
    return per_lineage.select(
        *BATCH,
        *HOME,
        *[F.col(f"first.{name}").alias(name) for name in _FIRST],
        F.col("sends").cast("long").alias("sends"),
        F.col("acknowledged_sends").cast("long").alias("acknowledged_sends"),
        F.col("unanswered_sends").cast("long").alias("unanswered_sends"),
        "last_wall_ns",
        F.lit(1).cast("long").alias("lineages"),
    )


def duplicate_batches(facts: DataFrame, clusters: Clusters | None = None) -> DataFrame:
    """Batches without a producer id sent more than once in one cluster: ``kind``
    appended_twice or possible_duplicate, ``sends``, ``acknowledged`` and ``unanswered``
    (counts), ``corrfix_resends``, first and last send, ``cluster_id``."""
    clusters = clusters or Clusters.of(facts)
    return duplicates_of_sends(batch_sends(attempts(facts, clusters)), facts, clusters)


def duplicates_of_sends(sends: DataFrame, facts: DataFrame, clusters: Clusters | None = None) -> DataFrame:
    """:func:`duplicate_batches` from :func:`batch_sends` rows, or from partial sums of them:
    each home's cluster is resolved (:func:`resolve`) before the sums of one cluster's
    batch are added up."""
    grouped = (
        resolve(sends, clusters or Clusters.of(facts))
        .groupBy(KEY, "cluster_id", *BATCH)
        .agg(
            F.sum("sends").alias("sends"),
            F.sum("acknowledged_sends").alias("acknowledged"),
            F.sum("unanswered_sends").alias("unanswered"),
            F.sum("lineages").alias("lineages"),
            F.min(F.struct(*_FIRST)).alias("first"),
            F.max("last_wall_ns").alias("last_wall_ns"),
        )
    )
    resent = grouped.filter((F.col("sends") > 1) & (F.col("acknowledged") + F.col("unanswered") >= 2))
    return resent.select(
        F.col("first.capture_id").alias("capture_id"),
        F.col("first.connection_id").alias("connection_id"),
        F.col("first.wall_ns").alias("wall_ns"),
        *BATCH,
        "sends",
        "acknowledged",
        "unanswered",
        (F.col("sends") - F.col("lineages")).alias("corrfix_resends"),
        "last_wall_ns",
        F.when(F.col("acknowledged") >= 2, "appended_twice").otherwise("possible_duplicate").alias("kind"),
        "cluster_id",
    )


DUPLICATE_SEQUENCE_NUMBER = 46
UNKNOWN_PRODUCER_ID = 59
_PRODUCER = [KEY, "producer_id", "producer_epoch", "topic", "partition"]
"""A producer's partition, in one cluster: its sequences follow one another."""


def _idempotent_batches(facts: DataFrame, clusters: Clusters) -> DataFrame:
    """The idempotent batches sent, one row per distinct batch (producer id, epoch, topic,
    partition, base sequence, CRC): its ``first`` send, ``sends``, ``record_count``,
    ``given_back`` (every send of it answered with an error that appended nothing, its
    sequences free again) and ``state_lost`` (a send of it answered UNKNOWN_PRODUCER_ID)."""
    idempotent = attempts(facts, clusters).filter((F.col("producer_id") >= 0) & (F.col("base_sequence") >= 0))
    idempotent = resolve(idempotent, clusters)
    answer_errors = facts.filter((F.col("fact") == "error") & (F.col("api_key") == ApiKey.PRODUCE)).select(
        *_CALL, "topic", "partition", "error_code"
    )
    sends = idempotent.join(answer_errors, [*_CALL, "topic", "partition"], "left")
    # acknowledged is false for an error answer that leaves nothing appended; a
    # DUPLICATE_SEQUENCE_NUMBER answer says the batch was appended before
    refused = F.coalesce(~F.col("acknowledged"), F.lit(False)) & ~F.coalesce(
        F.col("error_code") == DUPLICATE_SEQUENCE_NUMBER, F.lit(False)
    )
    state_lost = F.coalesce(F.col("error_code") == UNKNOWN_PRODUCER_ID, F.lit(False))
    return sends.groupBy(*_PRODUCER, "cluster_id", "base_sequence", "crc").agg(
        F.min(F.struct("wall_ns", "capture_id", "connection_id")).alias("first"),
        F.count("*").alias("sends"),
        F.max("record_count").alias("record_count"),
        F.min(refused.cast("int")).alias("given_back"),
        F.max(state_lost.cast("int")).alias("state_lost"),
    )


def _restarted() -> Column:
    """A batch whose sequences were free again when it was sent: the last batch that used
    its base sequence was refused (a client before KIP-360, Kafka 2.5, gives a refused
    batch's sequences to the batches after it), or it starts at 0 and the broker lost the
    producer's state since the last batch that did (UNKNOWN_PRODUCER_ID: such a client,
    and a transactional one to this day, starts the partition again at 0 under the same
    producer id and epoch)."""
    order = Window.partitionBy(*_PRODUCER).orderBy("first.wall_ns", "base_sequence", "crc")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    same_base = Window.partitionBy(*_PRODUCER, "base_sequence").orderBy("first.wall_ns", "crc")
    last_lost_ns = F.max(F.when(F.col("state_lost") == 1, F.col("first.wall_ns"))).over(before)
    previous_ns = F.lag("first.wall_ns").over(same_base)
    restart = (F.col("base_sequence") == 0) & last_lost_ns.isNotNull()
    restart &= previous_ns.isNull() | (previous_ns < last_lost_ns)
    return restart | F.coalesce(F.lag("given_back").over(same_base) == 1, F.lit(False))


def sequence_problems(facts: DataFrame, clusters: Clusters | None = None) -> DataFrame:
    """Idempotent batches out of sequence, per cluster: ``kind`` sequence_gap, sequence_reused
    or retried, and ``cluster_id``.

    A different batch that takes sequences the broker does not hold is no reuse: those of
    a batch it refused, or from 0 after it lost the producer's state (:func:`_restarted`)."""
    distinct = _idempotent_batches(facts, clusters or Clusters.of(facts))
    order = Window.partitionBy(*_PRODUCER).orderBy("first.wall_ns", "base_sequence")
    previous_end = F.lag((F.col("base_sequence").cast("long") + F.col("record_count")) % SEQUENCE_WRAP).over(
        order
    )
    with_prev = distinct.withColumn("expected_sequence", previous_end).withColumn("restarted", _restarted())
    kind = (
        F.when(F.col("expected_sequence").isNull(), F.when(F.col("sends") > 1, "retried"))
        .when(F.col("base_sequence") > F.col("expected_sequence"), "sequence_gap")
        .when((F.col("base_sequence") < F.col("expected_sequence")) & ~F.col("restarted"), "sequence_reused")
        .when(F.col("sends") > 1, "retried")
    )
    found = with_prev.withColumn("kind", kind).filter(F.col("kind").isNotNull())
    return found.select(
        F.col("first.capture_id").alias("capture_id"),
        F.col("first.connection_id").alias("connection_id"),
        F.col("first.wall_ns").alias("wall_ns"),
        *_PRODUCER[1:],
        "base_sequence",
        "expected_sequence",
        "record_count",
        "crc",
        "sends",
        "kind",
        "cluster_id",
    )
