"""Check 5, committed-offset loss: an OffsetFetch answered -1 (no committed offset) for a
group and partition that had a successful OffsetCommit earlier in the capture.

Commits count once their answer says error 0 for the partition. A TxnOffsetCommit (a
transactional consumer's, such as Kafka Streams exactly-once) counts once its transaction
committed: when the transaction's EndTxn answered a commit without error; an aborted
transaction's offsets were never committed. Times are the answers' wall clocks, so
commits and fetches on different connections compare. A DeleteGroups
request for the group, or an OffsetDelete request for the group and partition, between
the commit and the fetch is reported with the loss: it explains it (an operator deleted
the group or its offsets), but the offsets are gone all the same. A deletion whose answer
refused it explains nothing. A fetch without ``require_stable`` within a second of a
transaction's EndTxn answer is not compared with that transaction's offsets: the commit
marker may not have reached the group coordinator yet.

Groups, topics, transactional ids and producer ids are a cluster's: commits, fetches,
transactions and deletions meet only within one cluster (:mod:`._clusters`), so an offset
committed in one cluster and fetched in another is no loss.
"""

from __future__ import annotations

import functools
import operator

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from protocol import ApiKey
from spark_audit.checks._clusters import KEY, Clusters, by_connection

_CALL = ["capture_id", "connection_id", "correlation_id"]
_PLACE = ["group_id", "topic", "partition"]
_PARTITION = [KEY, *_PLACE]
"""A group's partition, in one cluster: what commits and fetches join on."""
_NAMED = [*_PARTITION, "cluster_id"]
"""The same, with the cluster's id (null for some keys: no join on it)."""
NO_OFFSET = -1
MARKER_GRACE_NS = 1_000_000_000
"""How long after a transaction's EndTxn answer a fetch without ``require_stable`` may still
miss its offsets: the group coordinator holds them apart until the commit marker reaches
it, milliseconds after the answer (markers are written after the answer, and a busy
cluster replicates ``__consumer_offsets`` in well under a second)."""
OFFSET_FACTS = (
    "commit",
    "commit_ack",
    "txn_commit",
    "txn_abort",
    "txn_end_ack",
    "fetched_offset",
    "group",
    "error",
)
"""The facts this check reads."""


def _acknowledged(facts: DataFrame, api_key: int, *extra: str) -> DataFrame:
    """``cluster_key, group_id, topic, partition, cluster_id, offset, wall_ns`` (of the
    answer) and ``extra`` columns of the request, per partition of an ``api_key`` commit its
    answer acknowledged (``facts`` with their clusters: :func:`by_connection`)."""
    commits = facts.filter((F.col("fact") == "commit") & (F.col("api_key") == api_key)).select(
        *_CALL, *_NAMED, "offset", *extra
    )
    acks = facts.filter((F.col("fact") == "commit_ack") & (F.col("error_code") == 0)).select(
        *_CALL, "topic", "partition", "wall_ns"
    )
    return commits.join(acks, [*_CALL, "topic", "partition"]).select(*_NAMED, "offset", "wall_ns", *extra)


def transaction_commits(facts: DataFrame) -> DataFrame:
    """``cluster_key, group_id, topic, partition, cluster_id, offset, wall_ns,
    written_wall_ns`` per offset a TxnOffsetCommit wrote in a transaction that then
    committed, at the time of the EndTxn answer that committed it (the same cluster's: a
    producer id is a cluster's), and of the TxnOffsetCommit's own answer.

    The group coordinator holds a transaction's offsets apart until the transaction ends:
    they count only when the transaction's next EndTxn answered without error after them
    (its transactional id, producer id and epoch) committed it; an abort, a transaction a
    newer producer fenced (no EndTxn of that epoch) or an EndTxn not seen commit nothing."""
    txn = [KEY, "transactional_id", "producer_id", "producer_epoch"]
    offsets = _acknowledged(facts, ApiKey.TXN_OFFSET_COMMIT, *txn[1:])
    ends = facts.filter(F.col("fact").isin("txn_commit", "txn_abort")).select(
        *_CALL, *txn, (F.col("fact") == "txn_commit").alias("committed")
    )
    answered = facts.filter((F.col("fact") == "txn_end_ack") & (F.col("error_code") == 0)).select(
        *_CALL, F.col("wall_ns").alias("ended_wall_ns")
    )
    ended = ends.join(answered, _CALL).drop(*_CALL)
    after = offsets.join(ended, txn).filter(F.col("ended_wall_ns") > F.col("wall_ns"))
    first = after.groupBy(*_NAMED, "offset", "wall_ns", *txn[1:]).agg(
        F.min_by(F.struct("committed", "ended_wall_ns"), "ended_wall_ns").alias("end")
    )
    return first.filter(F.col("end.committed")).select(
        *_NAMED,
        "offset",
        F.col("end.ended_wall_ns").alias("wall_ns"),
        F.col("wall_ns").alias("written_wall_ns"),
        F.lit(True).alias("transactional"),
    )


def successful_commits(facts: DataFrame) -> DataFrame:
    """``cluster_key, group_id, topic, partition, cluster_id, offset, wall_ns`` (when it
    counts: the answer's), ``written_wall_ns`` (the answer's) and ``transactional`` false, per
    acknowledged OffsetCommit, and per offset of a committed transaction
    (:func:`transaction_commits`), ``transactional`` true."""
    plain = _acknowledged(facts, ApiKey.OFFSET_COMMIT).select(
        "*", F.col("wall_ns").alias("written_wall_ns"), F.lit(False).alias("transactional")
    )
    return plain.unionByName(transaction_commits(facts))


def fetched_offsets(facts: DataFrame) -> DataFrame:
    """``cluster_key, cluster_id, group_id, topic, partition, offset, wall_ns, capture_id,
    connection_id, require_stable`` (of the request) per partition an OffsetFetch answered
    without error (the group named in the answer, else the request)."""
    fetched = facts.filter((F.col("fact") == "fetched_offset") & (F.col("error_code") == 0)).drop(
        "require_stable"  # the request's
    )
    requests = facts.filter((F.col("fact") == "group") & (F.col("api_key") == ApiKey.OFFSET_FETCH)).select(
        *_CALL, F.col("group_id").alias("request_group_id"), "require_stable"
    )
    named = fetched.join(requests, _CALL, "left")
    return named.select(
        KEY,
        "cluster_id",
        F.coalesce(F.col("group_id"), F.col("request_group_id")).alias("group_id"),
        "topic",
        "partition",
        "offset",
        "wall_ns",
        "capture_id",
        "connection_id",
        "require_stable",
    )


def deletions(facts: DataFrame) -> DataFrame:
    """``cluster_key, group_id, topic, partition, cluster_id, wall_ns`` (of the request) per
    DeleteGroups of a group (topic and partition null) and OffsetDelete of a group's
    partition, unless the answer refused it: an error for the group (DeleteGroups:
    GROUP_NOT_EMPTY while it has members), for the partition (OffsetDelete:
    GROUP_SUBSCRIBED_TO_TOPIC) or for the whole request (OffsetDelete: GROUP_ID_NOT_FOUND).
    An unanswered deletion counts."""
    apis = F.col("api_key").isin(ApiKey.DELETE_GROUPS, ApiKey.OFFSET_DELETE)
    requests = facts.filter((F.col("fact") == "group") & apis).select(*_CALL, *_NAMED, "wall_ns")
    refusals = facts.filter((F.col("fact") == "error") & apis).select(
        *[F.col(name).alias(f"refused_{name}") for name in (*_CALL, *_PLACE)]
    )
    same_call = [F.col(name) == F.col(f"refused_{name}") for name in _CALL]
    # an error names what it refuses as far as the answer says: null is all of the request
    covered = [
        F.col(f"refused_{name}").isNull() | (F.col(f"refused_{name}") == F.col(name)) for name in _PLACE
    ]
    refused = functools.reduce(operator.and_, [*same_call, *covered])
    return requests.join(refusals, refused, "left_anti").select(*_NAMED, "wall_ns")


def _visible() -> Column:
    """Whether a fetch (``wall_ns``, ``require_stable``) should have seen a commit
    (``committed_wall_ns``, ``transactional``): not a transaction's offsets fetched without
    ``require_stable`` within :data:`MARKER_GRACE_NS` of the EndTxn answer, before the
    commit marker can have reached the group coordinator (the offsets committed before them
    still count). A fetch with ``require_stable`` in that time is told UNSTABLE_OFFSET_COMMIT,
    no -1."""
    early = (F.col("wall_ns") - F.col("committed_wall_ns")) < MARKER_GRACE_NS
    return ~(F.col("transactional") & ~F.coalesce(F.col("require_stable"), F.lit(False)) & early)


def offset_losses(facts: DataFrame, clusters: Clusters | None = None) -> DataFrame:
    """One row per lost group partition: ``last_offset`` committed (at ``committed_wall_ns``),
    the first fetch that found none (``wall_ns``, its capture and connection), how many
    such fetches, ``deleted_wall_ns`` of a DeleteGroups for the group or an OffsetDelete for
    the partition in between (else null), and ``cluster_id``: the cluster of the group's
    commits and fetches (:mod:`._clusters`; null: a broker that named none, in an audit of
    more than one cluster)."""
    clusters = clusters or Clusters.of(facts)
    facts = by_connection(facts.filter(F.col("fact").isin(*OFFSET_FACTS)), facts, clusters)
    commits = successful_commits(facts).select(
        *_PARTITION,
        F.col("offset").alias("committed"),
        F.col("wall_ns").alias("committed_wall_ns"),
        "written_wall_ns",
        "transactional",
    )
    empty = fetched_offsets(facts).filter(F.col("offset") == NO_OFFSET)
    pairs = empty.join(commits, _PARTITION).filter(
        (F.col("committed_wall_ns") < F.col("wall_ns")) & _visible()
    )
    last = pairs.groupBy(*_NAMED, "wall_ns", "capture_id", "connection_id").agg(
        # A transaction's offsets all count at its EndTxn answer: of one partition's, the
        # group keeps the one written last.
        F.max_by("committed", F.struct("committed_wall_ns", "written_wall_ns")).alias("last_offset"),
        F.max("committed_wall_ns").alias("committed_wall_ns"),
    )
    per_loss = last.groupBy(*_NAMED, "last_offset", "committed_wall_ns").agg(
        F.min_by(F.struct("wall_ns", "capture_id", "connection_id"), "wall_ns").alias("first"),
        F.count("*").alias("fetches"),
    )
    deletes = deletions(facts).select(
        F.col(KEY).alias("deleted_cluster_key"),
        F.col("group_id").alias("deleted_group_id"),
        F.col("topic").alias("deleted_topic"),
        F.col("partition").alias("deleted_partition"),
        F.col("wall_ns").alias("deleted_wall_ns"),
    )
    flat = per_loss.select(
        *_NAMED,
        "last_offset",
        "committed_wall_ns",
        F.col("first.wall_ns").alias("wall_ns"),
        F.col("first.capture_id").alias("capture_id"),
        F.col("first.connection_id").alias("connection_id"),
        "fetches",
    )
    whole_group = F.col("deleted_topic").isNull()  # DeleteGroups; OffsetDelete names partitions
    same_group = (F.col(KEY) == F.col("deleted_cluster_key")) & (
        F.col("group_id") == F.col("deleted_group_id")
    )
    covers = same_group & (
        whole_group
        | ((F.col("topic") == F.col("deleted_topic")) & (F.col("partition") == F.col("deleted_partition")))
    )
    explained = flat.join(deletes, covers, "left").withColumn(
        "deleted_wall_ns",
        F.when(
            (F.col("deleted_wall_ns") > F.col("committed_wall_ns"))
            & (F.col("deleted_wall_ns") < F.col("wall_ns")),
            F.col("deleted_wall_ns"),
        ),
    )
    keys = [
        *_NAMED,
        "last_offset",
        "committed_wall_ns",
        "wall_ns",
        "capture_id",
        "connection_id",
        "fetches",
    ]
    return (
        explained.groupBy(*keys)
        .agg(F.max("deleted_wall_ns").alias("deleted_wall_ns"))
        .select(
            "group_id",
            "topic",
            "partition",
            "last_offset",
            "committed_wall_ns",
            "wall_ns",
            "capture_id",
            "connection_id",
            "fetches",
            "deleted_wall_ns",
            "cluster_id",
        )
    )
