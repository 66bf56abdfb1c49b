"""Check 4, error storms per time window, from the broker-side answers' error codes.

- ``leader_election``: NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE (but not on a topic
  of a Metadata answer: that is a topic being created), FENCED_LEADER_EPOCH and
  UNKNOWN_LEADER_EPOCH (what a Fetch v9+ carrying the consumer's leader epoch gets from a
  broker after an election, checked before leadership), plus leader changes (epoch or
  leader id) seen in Metadata answers;
- ``rebalance``: REBALANCE_IN_PROGRESS (but not to a Heartbeat: that is the coordinator
  asking a member to rejoin, once per member and rebalance), UNKNOWN_MEMBER_ID,
  ILLEGAL_GENERATION, and their analogues in KIP-848's consumer protocol:
  FENCED_MEMBER_EPOCH, UNRELEASED_INSTANCE_ID, STALE_MEMBER_EPOCH; and FENCED_INSTANCE_ID
  (two static members with one ``group.instance.id``);
- ``isr_shrink``: NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, plus ISR shrinks
  (fewer in-sync replicas than replicas) seen in Metadata answers;
- ``coordinator_move``: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE.

A window is a storm when its errors plus leader changes plus ISR shrinks reach
``threshold``. Rebalances
are also counted per consumer group and window: JoinGroup, SyncGroup and LeaveGroup
requests, and the generations the JoinGroup answers handed out; for groups on the consumer
protocol (KIP-848), the ConsumerGroupHeartbeat requests that join (member epoch 0) or leave
(-1, -2), and the member epochs their answers handed out when they differ from the one sent.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from protocol import ApiKey
from spark_audit.checks._windows import window_start

CATEGORIES: dict[str, tuple[int, ...]] = {
    "leader_election": (5, 6, 74, 75),
    "rebalance": (22, 25, 27, 82, 110, 111, 113),
    "isr_shrink": (19, 20),
    "coordinator_move": (15, 16),
}
LEADER_NOT_AVAILABLE = 5
REBALANCE_IN_PROGRESS = 27
CONSUMER_HEARTBEAT = ApiKey.CONSUMER_GROUP_HEARTBEAT
GROUP_LIFE = (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.LEAVE_GROUP, ApiKey.HEARTBEAT, CONSUMER_HEARTBEAT)
JOINING_EPOCH = 0
LEAVING_EPOCHS = (-1, -2)  # -2: a static member leaving, to come back with its instance id
_JOIN = ["capture_id", "connection_id", "correlation_id", "api_key"]
_PARTITION = ["cluster_id", "topic", "partition"]
"""A partition: topics of one name on two clusters (Metadata answers name theirs) are two."""
GROUP_ACTIVITY = "joins > 0 or leaves > 0 or rebalance_errors > 0 or size(generations) > 0"
"""Rebalance windows worth reporting: heartbeats alone are a group at rest. A group on the
consumer protocol can rebalance without a member joining or leaving (a subscription or a
topic's partitions changed): the new member epochs handed out show it."""


def _category():  # noqa: ANN202 - a Column
    column = F.lit(None).cast("string")
    for name, codes in reversed(CATEGORIES.items()):
        column = F.when(F.col("error_code").isin(*codes), name).otherwise(column)
    return column


def leader_changes(facts: DataFrame) -> DataFrame:
    """Each partition's leader changes, in the order first seen by any client:
    ``topic, partition, wall_ns, from_leader, to_leader, from_epoch, to_epoch, cluster_id``.

    Metadata answers before v7 carry no leader epoch. Where answers with epochs name the
    same leader of the partition, one without is the same leadership as far as it can tell,
    not a change: clients of both kinds on one cluster would otherwise give two changes
    (to the same leader) per real one."""
    sightings = (
        _leaders(facts)
        .groupBy(*_PARTITION, "leader_epoch", "leader_id")
        .agg(F.min("wall_ns").alias("wall_ns"))
    )
    same_leader = Window.partitionBy(*_PARTITION, "leader_id")
    with_epoch = F.max(F.col("leader_epoch").isNotNull().cast("int")).over(same_leader)
    seen = (
        sightings.withColumn("with_epoch", with_epoch)
        .filter(F.col("leader_epoch").isNotNull() | (F.col("with_epoch") == 0))
        .drop("with_epoch")
    )
    order = Window.partitionBy(*_PARTITION).orderBy("wall_ns", "leader_epoch", "leader_id")
    with_prev = seen.select(
        "*",
        F.lag("leader_id").over(order).alias("from_leader"),
        F.lag("leader_epoch").over(order).alias("from_epoch"),
    )
    return with_prev.filter(F.col("from_leader").isNotNull()).select(
        "topic",
        "partition",
        "wall_ns",
        "from_leader",
        F.col("leader_id").alias("to_leader"),
        "from_epoch",
        F.col("leader_epoch").alias("to_epoch"),
        "cluster_id",
    )


def _leaders(facts: DataFrame) -> DataFrame:
    """The ``leader`` facts of partitions with a leader, read without error. An answer
    before Metadata v2 names no cluster: where answers that do name one cluster only for
    the topic and partition, it is that cluster's (clients of old and new versions on one
    cluster make one timeline, not two)."""
    leaders = facts.filter(
        (F.col("fact") == "leader") & (F.col("error_code") == 0) & (F.col("leader_id") >= 0)
    )
    named = F.collect_set("cluster_id").over(Window.partitionBy("topic", "partition"))
    only = F.when(F.size(named) == 1, named.getItem(0))
    return leaders.withColumn("cluster_id", F.coalesce(F.col("cluster_id"), only))


def isr_shrinks(facts: DataFrame) -> DataFrame:
    """Each partition's ISR shrinks, in the order first seen by any client: ``topic,
    partition, wall_ns`` (the first answer with fewer in-sync replicas than replicas),
    ``replicas``, ``min_isr`` (the fewest in sync any answer listed before the return),
    ``last_under_wall_ns`` (the last answer still short), ``expanded_wall_ns`` (the first
    answer with every replica in sync again; null: none in the capture) and
    ``under_replicated_ms`` (to the return, or at least to the last answer still short),
    ``cluster_id``.

    The answers of every client make one timeline per partition, so a shrink that several
    clients saw is one shrink, from the first answer that showed it to the first that no
    longer did. A partition already short in the capture's first answer counts as a shrink
    there."""
    seen = _leaders(facts).filter(F.col("isr_size").isNotNull() & F.col("replica_size").isNotNull())
    under = F.col("isr_size") < F.col("replica_size")
    order = Window.partitionBy(*_PARTITION).orderBy("wall_ns", "isr_size", "replica_size")
    sightings = seen.select(*_PARTITION, "wall_ns", "isr_size", "replica_size", under.alias("under"))
    starts = F.col("under") & ~F.coalesce(F.lag("under").over(order), F.lit(False))
    so_far = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    numbered = sightings.withColumn("shrink", F.sum(starts.cast("int")).over(so_far))
    short, back = F.col("under"), ~F.col("under")
    episodes = (
        numbered.filter(F.col("shrink") > 0)
        .groupBy(*_PARTITION, "shrink")
        .agg(
            F.min(F.when(short, F.col("wall_ns"))).alias("wall_ns"),
            F.max(F.when(short, F.col("replica_size"))).alias("replicas"),
            F.min(F.when(short, F.col("isr_size"))).alias("min_isr"),
            F.max(F.when(short, F.col("wall_ns"))).alias("last_under_wall_ns"),
            F.min(F.when(back, F.col("wall_ns"))).alias("expanded_wall_ns"),
        )
    )
    until = F.coalesce(F.col("expanded_wall_ns"), F.col("last_under_wall_ns"))
    return episodes.select(
        "topic",
        "partition",
        "wall_ns",
        "replicas",
        "min_isr",
        "last_under_wall_ns",
        "expanded_wall_ns",
        ((until - F.col("wall_ns")) / 1e6).alias("under_replicated_ms"),
        "cluster_id",
    )


def _topic_being_created() -> Column:
    """A Metadata answer's LEADER_NOT_AVAILABLE on a topic rather than on a partition: the
    broker says so, with no partitions, while it auto-creates the topic. A partition whose
    leader is gone carries the error itself."""
    return F.coalesce(
        (F.col("api_key") == ApiKey.METADATA)
        & F.col("partition").isNull()
        & (F.col("error_code") == LEADER_NOT_AVAILABLE),
        F.lit(False),
    )


def _asked_to_rejoin() -> Column:
    """A Heartbeat answered REBALANCE_IN_PROGRESS: how the coordinator asks each member to
    rejoin, once per member and rebalance, however calm. The rebalances themselves are
    counted per group (:func:`rebalances`)."""
    return F.coalesce(
        (F.col("api_key") == ApiKey.HEARTBEAT) & (F.col("error_code") == REBALANCE_IN_PROGRESS), F.lit(False)
    )


def _sightings(
    events: DataFrame, window_s: float, category: str, change: int = 0, shrink: int = 0
) -> DataFrame:
    """Events read from Metadata answers (leader changes, ISR shrinks) as rows of the error
    windows: counted once each, on no connection."""
    return events.select(
        window_start(F.col("wall_ns"), window_s).alias("window_start_ns"),
        F.lit(category).alias("category"),
        F.lit(0).alias("error"),
        F.lit(change).alias("change"),
        F.lit(shrink).alias("shrink"),
        F.lit(None).cast("string").alias("connection"),
        F.lit(None).cast("short").alias("error_code"),
        F.lit(None).cast("string").alias("capture_id"),
    )


def error_storms(facts: DataFrame, window_s: float, threshold: int) -> DataFrame:
    """Per window and category: ``errors``, ``leader_changes``, ``isr_shrinks``, ``connections``,
    ``error_codes`` (sorted), ``capture_ids`` (the captures whose answers carried the errors)
    and ``storm``; only windows with something in them. Windows are fixed, ``window_s`` long,
    counted from the Unix epoch (:func:`window_start`): a burst across a boundary counts in
    two windows."""
    errors = facts.filter((F.col("fact") == "error") & ~_topic_being_created() & ~_asked_to_rejoin())
    errors = errors.withColumn("category", _category())
    errors = errors.filter(F.col("category").isNotNull()).select(
        window_start(F.col("wall_ns"), window_s).alias("window_start_ns"),
        "category",
        F.lit(1).alias("error"),
        F.lit(0).alias("change"),
        F.lit(0).alias("shrink"),
        F.concat_ws("/", "capture_id", "connection_id").alias("connection"),
        "error_code",
        "capture_id",
    )
    changes = _sightings(leader_changes(facts), window_s, "leader_election", change=1)
    shrinks = _sightings(isr_shrinks(facts), window_s, "isr_shrink", shrink=1)
    windows = (
        errors.unionByName(changes)
        .unionByName(shrinks)
        .groupBy("window_start_ns", "category")
        .agg(
            F.sum("error").alias("errors"),
            F.sum("change").alias("leader_changes"),
            F.sum("shrink").alias("isr_shrinks"),
            F.count_distinct("connection").alias("connections"),
            F.sort_array(F.collect_set("error_code")).alias("error_codes"),
            F.sort_array(F.collect_set("capture_id")).alias("capture_ids"),
        )
    )
    counted = F.col("errors") + F.col("leader_changes") + F.col("isr_shrinks")
    return windows.withColumn("storm", counted >= threshold)


def rebalances(facts: DataFrame, window_s: float, threshold: int) -> DataFrame:
    """Per consumer group and window: ``joins``, ``syncs``, ``leaves``, ``heartbeats``,
    ``generations`` (sorted ids handed out), ``members``, ``rebalance_errors`` (answers to
    the group's requests with a rebalance error, OffsetCommits refused for one included:
    ILLEGAL_GENERATION, STALE_MEMBER_EPOCH...), ``capture_ids`` and ``storm`` (at least
    ``threshold`` generations in the window).

    A ConsumerGroupHeartbeat (KIP-848) is a join when it sends member epoch 0, a leave when
    it sends -1 or -2, else a heartbeat; its answer hands out a generation (the group epoch
    the member moves to) only when the member epoch differs from the one sent: the same
    epoch is a member at rest, however often it heartbeats."""
    groups = facts.filter((F.col("fact") == "group") & (F.col("direction") == "request"))
    requests = groups.filter(F.col("api_key").isin(*GROUP_LIFE, ApiKey.OFFSET_COMMIT)).select(
        *_JOIN,
        "group_id",
        "wall_ns",
        F.col("member_id").alias("sent_member_id"),
        F.col("generation_id").alias("sent_epoch"),
    )
    answers = facts.filter(
        (F.col("direction") == "response")
        & F.col("api_key").isin(*GROUP_LIFE, ApiKey.OFFSET_COMMIT)
        & F.col("fact").isin("generation", "error")
    ).select(
        *_JOIN, "fact", "generation_id", "member_id", "error_code", F.col("wall_ns").alias("answer_wall_ns")
    )
    named = requests.join(answers, _JOIN, "left")
    rebalance_codes = CATEGORIES["rebalance"]
    heartbeat = F.col("api_key") == CONSUMER_HEARTBEAT
    moved = ~heartbeat | (F.col("generation_id") != F.col("sent_epoch"))
    joined_ok = (F.col("fact") == "generation") & (F.col("error_code") == 0) & moved
    member = F.coalesce(F.col("member_id"), F.col("sent_member_id"))  # an answer at rest names none
    refused = F.when((F.col("fact") == "error") & F.col("error_code").isin(*rebalance_codes), 1)
    commit = F.col("api_key") == ApiKey.OFFSET_COMMIT
    per_request = named.groupBy(*_JOIN, "group_id", "wall_ns", "sent_epoch").agg(
        F.max(F.when(joined_ok, F.col("generation_id"))).alias("generation_id"),
        F.max(F.when(joined_ok, member)).alias("member_id"),
        # an OffsetCommit answer carries its error on every partition: one per request
        F.when(commit, F.max(F.coalesce(refused, F.lit(0)))).otherwise(F.count(refused)).alias("errors"),
    )
    # Commits count only when the group refused them for a rebalance: the others are a group at rest.
    per_request = per_request.filter(~commit | (F.col("errors") > 0))
    counted = per_request.groupBy(
        "group_id", window_start(F.col("wall_ns"), window_s).alias("window_start_ns")
    )
    joining = heartbeat & (F.col("sent_epoch") == JOINING_EPOCH)
    leaving = heartbeat & F.col("sent_epoch").isin(*LEAVING_EPOCHS)
    out = counted.agg(
        F.count(F.when((F.col("api_key") == ApiKey.JOIN_GROUP) | joining, 1)).alias("joins"),
        F.count(F.when(F.col("api_key") == ApiKey.SYNC_GROUP, 1)).alias("syncs"),
        F.count(F.when((F.col("api_key") == ApiKey.LEAVE_GROUP) | leaving, 1)).alias("leaves"),
        F.count(F.when((F.col("api_key") == ApiKey.HEARTBEAT) | (heartbeat & ~joining & ~leaving), 1)).alias(
            "heartbeats"
        ),
        F.sort_array(F.collect_set("generation_id")).alias("generations"),
        F.count_distinct("member_id").alias("members"),
        F.sum("errors").cast("long").alias("rebalance_errors"),
        F.sort_array(F.collect_set("capture_id")).alias("capture_ids"),
    )
    return out.withColumn("storm", F.size("generations") >= threshold)
