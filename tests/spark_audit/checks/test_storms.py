"""Check 4, error storms, leader changes, ISR shrinks and rebalances, on hand-built facts."""

from __future__ import annotations

import uuid

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import GROUP_ACTIVITY, error_storms, isr_shrinks, leader_changes, rebalances
from tests.support.audit_builders import CAPTURE, MS, fact, facts_df, heartbeat_facts, metadata_facts

S = 1000  # ms


def error(conn, seq, code, wall_ms, api_key=0):
    return fact(
        conn, seq, "error", direction="response", api_key=api_key, cid=seq, wall_ms=wall_ms, error_code=code
    )


def leader(conn, seq, wall_ms, leader_id, epoch, partition=0):
    return fact(
        conn,
        seq,
        "leader",
        direction="response",
        api_key=3,
        cid=seq,
        wall_ms=wall_ms,
        topic="t",
        partition=partition,
        leader_id=leader_id,
        leader_epoch=epoch,
        error_code=0,
    )


def change(wall_ms, from_leader, to_leader, from_epoch, to_epoch):
    """A :func:`leader_changes` row of partition ``t-0``, of answers that name no cluster."""
    return Row(
        topic="t",
        partition=0,
        wall_ns=wall_ms * MS,
        from_leader=from_leader,
        to_leader=to_leader,
        from_epoch=from_epoch,
        to_epoch=to_epoch,
        cluster_id=None,
    )


def storm_window(start_ns, category, *, errors, leader_changes, codes, storm, isr_shrinks=0, connections=1):
    """An :func:`error_storms` row (of one connection of :data:`CAPTURE`, unless told)."""
    return Row(
        window_start_ns=start_ns,
        category=category,
        errors=errors,
        leader_changes=leader_changes,
        isr_shrinks=isr_shrinks,
        connections=connections,
        error_codes=codes,
        capture_ids=[CAPTURE] if connections else [],
        storm=storm,
    )


def group_window(group, start_ns, *, generations=(), storm=False, **counts):
    """A :func:`rebalances` row of one capture: counts not given are 0."""
    numbers = {name: counts.get(name, 0) for name in ("joins", "syncs", "leaves", "heartbeats")}
    return Row(
        group_id=group,
        window_start_ns=start_ns,
        **numbers,
        generations=list(generations),
        members=counts.get("members", 0),
        rebalance_errors=counts.get("rebalance_errors", 0),
        capture_ids=[CAPTURE],
        storm=storm,
    )


def test_error_storms_per_window_and_category(spark):
    rows = [error("a", i, 6, 100 * i) for i in range(3)]  # NOT_LEADER_OR_FOLLOWER, window 0
    rows += [error("b", 10 + i, 19, 20 * S + i) for i in range(2)]  # NOT_ENOUGH_REPLICAS, window 20 s
    rows += [error("b", 20, 3, 500)]  # UNKNOWN_TOPIC_OR_PARTITION: no category
    rows += [leader("a", 30, 50, 1, 4), leader("b", 31, 60, 1, 4), leader("b", 32, 900, 2, 5)]
    expected = [
        storm_window(0, "leader_election", errors=3, leader_changes=1, codes=[6], storm=True),
        storm_window(20 * S * MS, "isr_shrink", errors=2, leader_changes=0, codes=[19], storm=False),
    ]
    assertDataFrameEqual(error_storms(facts_df(spark, rows), 10, threshold=4), expected)


def test_leader_changes_are_deduplicated_across_clients(spark):
    rows = [
        leader("a", 1, 10, 1, 4),
        leader("b", 2, 20, 1, 4),
        leader("a", 3, 30, 2, 6),
        leader("b", 4, 40, 2, 6),
    ]
    expected = [change(30, 1, 2, 4, 6)]
    assertDataFrameEqual(leader_changes(facts_df(spark, rows)), expected)


def test_rebalances_per_group_and_window(spark):
    def call(conn, seq, api, wall_ms, group="g", **answer):
        out = [
            fact(
                conn, seq, "group", direction="request", api_key=api, cid=seq, wall_ms=wall_ms, group_id=group
            )
        ]
        if answer:
            out.append(
                fact(
                    conn,
                    seq + 1,
                    answer.pop("fact"),
                    direction="response",
                    api_key=api,
                    cid=seq,
                    wall_ms=wall_ms + 1,
                    **answer,
                )
            )
        return out

    rows = (
        call("a", 1, 11, 0, fact="generation", generation_id=1, member_id="m1", error_code=0)
        + call("a", 3, 14, 10)
        + call("b", 5, 11, 100, fact="generation", generation_id=2, member_id="m2", error_code=0)
        + call("a", 7, 12, 200, fact="error", error_code=27)
        + call("a", 9, 11, 300, fact="generation", generation_id=2, member_id="m1", error_code=0)
        + call("a", 11, 13, 400)
        + call("c", 13, 12, 15 * S, group="other")
    )
    expected = [
        group_window(
            "g",
            0,
            generations=[1, 2],
            joins=3,
            syncs=1,
            leaves=1,
            heartbeats=1,
            members=2,
            rebalance_errors=1,
            storm=True,
        ),
        group_window("other", 10 * S * MS, heartbeats=1),
    ]
    assertDataFrameEqual(rebalances(facts_df(spark, rows), 10, threshold=2), expected)


def test_a_leader_seen_without_its_epoch_is_no_change(spark):
    rows = [  # a: Metadata v7 or later, with epochs; b: an older version, without
        leader("a", 1, 10, 1, 4),
        leader("b", 2, 20, 1, None),
        leader("a", 3, 30, 2, 5),
        leader("b", 4, 40, 2, None),
        leader("b", 5, 50, 3, None),  # a leader that no answer with epochs named
        leader("b", 6, 60, 1, None, partition=1),  # only ever seen without epochs
        leader("b", 7, 70, 1, None, partition=1),
    ]
    expected = [
        change(30, 1, 2, 4, 5),
        change(50, 2, 3, 5, None),
    ]
    assertDataFrameEqual(leader_changes(facts_df(spark, rows)), expected)


def test_a_topic_being_created_is_no_leader_election(spark):
    # The broker answers LEADER_NOT_AVAILABLE for the topic itself, with no partitions,
    # while it auto-creates the topic; a partition without a leader has the error on it.
    rows = [{**error("a", i, 5, 100 * i, api_key=3), "topic": "new"} for i in range(12)]
    rows += [{**error("b", 20, 5, 50, api_key=3), "topic": "t", "partition": 0}]
    expected = [storm_window(0, "leader_election", errors=1, leader_changes=0, codes=[5], storm=False)]
    assertDataFrameEqual(error_storms(facts_df(spark, rows), 10, threshold=10), expected)


def test_a_consumer_fenced_by_a_new_leader_epoch_counts_as_leader_election(spark):
    # A Fetch v9+ carries the consumer's leader epoch; after an election, the broker checks
    # it before leadership: FENCED_LEADER_EPOCH (an old epoch), UNKNOWN_LEADER_EPOCH (newer
    # than the broker knows yet), where an older Fetch would get NOT_LEADER_OR_FOLLOWER.
    rows = [error("a", i, 74, 100 * i, api_key=1) for i in range(8)]
    rows += [error("a", 10 + i, 75, 900 + i, api_key=1) for i in range(2)]
    expected = [storm_window(0, "leader_election", errors=10, leader_changes=0, codes=[74, 75], storm=True)]
    assertDataFrameEqual(error_storms(facts_df(spark, rows), 10, threshold=10), expected)


def test_one_rebalance_of_a_large_group_is_no_rebalance_error_storm(spark):
    # The coordinator asks each member to rejoin by answering its Heartbeat with
    # REBALANCE_IN_PROGRESS: one such answer per member and rebalance, however calm.
    rows = [error(f"m{i}", i, 27, 100 * i, api_key=12) for i in range(12)]
    rows += [error("m0", 20 + i, 27, 2000 + i, api_key=14) for i in range(2)]  # SyncGroup: rebalanced again
    rows += [error("m1", 30, 25, 3000, api_key=8)]  # OffsetCommit: UNKNOWN_MEMBER_ID, it was removed
    got = error_storms(facts_df(spark, rows), 10, threshold=10).select("category", "errors", "storm")
    assertDataFrameEqual(got, [Row(category="rebalance", errors=3, storm=False)])


def test_a_partition_without_a_leader_is_no_change(spark):
    # Its only replica's broker died: no leader (-1, LEADER_NOT_AVAILABLE) under a new
    # epoch, then the broker came back and leads again under the next one.
    rows = [
        leader("a", 1, 10, 1, 4),
        {**leader("b", 2, 20, -1, 5), "error_code": 5},
        {**leader("a", 3, 30, -1, 5), "error_code": 5},
        leader("b", 4, 40, 1, 6),
    ]
    expected = [change(40, 1, 1, 4, 6)]
    assertDataFrameEqual(leader_changes(facts_df(spark, rows)), expected)


FULL = (1, [1, 2, 3], [1, 2, 3])
"""Partition 0 led by broker 1, its three replicas in sync."""


def short(*isr):
    """Partition 0 led by broker 1, of its three replicas only ``isr`` in sync."""
    return (1, [1, 2, 3], list(isr))


def shrink(wall_ms, *, min_isr, last_ms, back_ms):
    """An :func:`isr_shrinks` row of partition ``t-0`` (three replicas)."""
    until = back_ms if back_ms is not None else last_ms
    return Row(
        topic="t",
        partition=0,
        wall_ns=wall_ms * MS,
        replicas=3,
        min_isr=min_isr,
        last_under_wall_ns=last_ms * MS,
        expanded_wall_ns=None if back_ms is None else back_ms * MS,
        under_replicated_ms=float(until - wall_ms),
        cluster_id="c1",
    )


def test_an_isr_shrink_seen_by_two_clients_counts_once(spark):
    # acks=1 producers and consumers never get NOT_ENOUGH_REPLICAS: their Metadata answers
    # are all that shows the shrink, and each client's answers show it again.
    rows = metadata_facts("a", 1, 10, {0: FULL})
    rows += metadata_facts("b", 2, 20, {0: short(1, 2)})
    rows += metadata_facts("a", 3, 30, {0: short(1, 2)})
    rows += metadata_facts("b", 4, 40, {0: short(1, 2)})
    facts = facts_df(spark, rows)
    assertDataFrameEqual(isr_shrinks(facts), [shrink(20, min_isr=2, last_ms=40, back_ms=None)])
    expected = [
        storm_window(
            0, "isr_shrink", errors=0, leader_changes=0, isr_shrinks=1, codes=[], storm=False, connections=0
        )
    ]
    assertDataFrameEqual(error_storms(facts, 10, threshold=2), expected)


def test_a_partition_with_its_whole_isr_counts_nothing(spark):
    rows = metadata_facts("a", 1, 10, {0: FULL, 1: (2, [2, 3], [3, 2])})
    rows += metadata_facts("b", 2, 20, {0: FULL, 1: (2, [2, 3], [2, 3])})
    rows += metadata_facts("a", 3, 30, {0: (2, [1, 2, 3], [2, 3, 1]), 1: (2, [2], [2])})  # a new leader
    facts = facts_df(spark, rows)
    assert isr_shrinks(facts).count() == 0
    assert [r.category for r in error_storms(facts, 10, threshold=2).collect()] == ["leader_election"]


def test_an_isr_shrink_ends_when_every_replica_is_back_in_sync(spark):
    rows = metadata_facts("a", 1, 10, {0: FULL})
    rows += metadata_facts("b", 2, 20, {0: short(1, 2)})
    rows += metadata_facts("a", 3, 30, {0: short(1)})  # shrinks further: the same shrink
    rows += metadata_facts("b", 4, 40, {0: FULL})
    rows += metadata_facts("a", 5, 45, {0: FULL})
    rows += metadata_facts("a", 6, 11_000, {0: short(1, 3)})  # a second shrink, in the next window
    rows += metadata_facts("b", 7, 11_500, {0: FULL})
    facts = facts_df(spark, rows)
    expected = [
        shrink(20, min_isr=1, last_ms=30, back_ms=40),
        shrink(11_000, min_isr=2, last_ms=11_000, back_ms=11_500),
    ]
    assertDataFrameEqual(isr_shrinks(facts), expected)
    windows = error_storms(facts, 10, threshold=2).collect()
    assert [(r.window_start_ns, r.isr_shrinks) for r in windows] == [(0, 1), (10 * S * MS, 1)]


def test_an_isr_shrink_in_answers_of_an_older_metadata_version(spark):
    # Metadata v1 (no leader epoch) lists replicas and in-sync replicas as v12 does: a
    # client of each version sees the same shrink, and it is one.
    rows = metadata_facts("old", 1, 10, {0: FULL}, version=1)
    rows += metadata_facts("old", 2, 20, {0: short(2, 3)}, version=1)
    rows += metadata_facts("new", 3, 25, {0: short(2, 3)})
    rows += metadata_facts("old", 4, 30, {0: FULL}, version=1)
    facts = facts_df(spark, rows)
    assert {(r.api_version, r.leader_epoch, r.isr_size, r.replica_size) for r in facts.collect()} == {
        (1, None, 3, 3),
        (1, None, 2, 3),
        (12, 4, 2, 3),
    }
    assertDataFrameEqual(isr_shrinks(facts), [shrink(20, min_isr=2, last_ms=25, back_ms=30)])


def test_consumer_protocol_rebalances_count_member_epoch_bumps(spark):
    # KIP-848 (group.protocol=consumer): no JoinGroup or SyncGroup; every member sends
    # ConsumerGroupHeartbeat, and the coordinator's answer hands out a new member epoch
    # (with the assignment it reconciles to) at each rebalance step. Epoch 0 joins, -1 leaves.
    topic = uuid.UUID(int=7)
    rows = heartbeat_facts("a", 1, 0, sent=0, answered=1, assignment={topic: [0, 1]})
    rows += heartbeat_facts("a", 3, 100, sent=1, answered=1)  # at rest: counts nothing
    rows += heartbeat_facts("b", 5, 200, sent=0, answered=2, member="m2", assignment={topic: [1]})
    rows += heartbeat_facts("a", 7, 300, sent=1, answered=2, assignment={topic: [0]})
    rows += heartbeat_facts("a", 9, 400, sent=2, answered=2)
    rows += heartbeat_facts("b", 11, 500, sent=2, answered=0, member="m2", error_code=110)  # fenced
    rows += heartbeat_facts("b", 13, 600, sent=-1, answered=-1, member="m2")
    rows += [
        r
        for i in range(3)
        for r in heartbeat_facts("c", 20 + 2 * i, 15 * S + i, sent=4, answered=4, group="calm")
    ]
    rows += heartbeat_facts("a", 30, 25 * S, sent=2, answered=3)  # a new subscription elsewhere
    groups = rebalances(facts_df(spark, rows), 10, threshold=2)
    expected = [
        group_window(
            "g",
            0,
            generations=[1, 2],
            joins=2,
            leaves=1,
            heartbeats=4,
            members=2,
            rebalance_errors=1,
            storm=True,
        ),
        group_window("calm", 10 * S * MS, heartbeats=3),
        group_window("g", 20 * S * MS, generations=[3], heartbeats=1, members=1),
    ]
    assertDataFrameEqual(groups, expected)
    active = [(r.group_id, r.window_start_ns) for r in groups.filter(GROUP_ACTIVITY).collect()]
    assert sorted(active) == [("g", 0), ("g", 20 * S * MS)]


def test_consumer_protocol_errors_count_as_rebalance_errors(spark):
    # FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID answer a ConsumerGroupHeartbeat of a member
    # the coordinator removed, UNRELEASED_INSTANCE_ID a static member's rejoin while its
    # old instance still holds the id, STALE_MEMBER_EPOCH an OffsetCommit of an old member
    # epoch (the consumer protocol's ILLEGAL_GENERATION).
    rows = heartbeat_facts("a", 1, 0, sent=3, answered=0, error_code=110)
    rows += heartbeat_facts("b", 3, 10, sent=3, answered=0, error_code=25, member="m2")
    rows += heartbeat_facts("c", 5, 20, sent=0, answered=0, error_code=111, member="m3")
    rows += [error("d", 7, 113, 30, api_key=8)]
    facts = facts_df(spark, rows)
    got = error_storms(facts, 10, threshold=4).select("category", "errors", "error_codes", "storm")
    assertDataFrameEqual(
        got, [Row(category="rebalance", errors=4, error_codes=[25, 110, 111, 113], storm=True)]
    )
    [group] = rebalances(facts, 10, threshold=3).collect()
    assert (group.joins, group.generations, group.rebalance_errors) == (1, [], 3)


def test_an_offset_commit_refused_for_a_rebalance_is_one_rebalance_error_of_its_group(spark):
    # A classic consumer that took too long between polls commits with a generation the group
    # has left (ILLEGAL_GENERATION, the Java client's CommitFailedException); one on the
    # consumer protocol with an old member epoch (STALE_MEMBER_EPOCH, which only OffsetCommit
    # and OffsetFetch are answered). Each partition of the answer carries the error.
    def offset_commit(conn, seq, wall_ms, code, generation):
        call = {"direction": "request", "api_key": 8, "cid": seq, "wall_ms": wall_ms}
        request = fact(conn, seq, "group", **call, group_id="g", member_id="m1", generation_id=generation)
        answer = {**call, "direction": "response", "wall_ms": wall_ms + 1, "error_code": code, "topic": "t"}
        failed = [fact(conn, seq + 1 + p, "error", **answer, partition=p) for p in range(2)] if code else []
        return [request, *failed]

    rows = (
        offset_commit("a", 1, 0, 22, 5) + offset_commit("b", 5, 10, 113, 7) + offset_commit("c", 9, 20, 0, 7)
    )
    [group] = rebalances(facts_df(spark, rows), 60, threshold=3).collect()
    assert (group.group_id, group.joins, group.heartbeats, group.rebalance_errors) == ("g", 0, 0, 2)


def test_a_static_member_fenced_by_its_own_instance_id_is_a_rebalance_error(spark):
    # FENCED_INSTANCE_ID: two consumers started with one group.instance.id (a copied config,
    # a pod started before its old self ended); the coordinator fences the older one at its
    # Heartbeat, SyncGroup and OffsetCommit, and the group churns.
    rows = [
        error("a", 1, 82, 0, api_key=12),
        error("a", 3, 82, 4, api_key=14),
        error("b", 5, 82, 8, api_key=8),
    ]
    got = error_storms(facts_df(spark, rows), 10, threshold=3).select(
        "category", "errors", "error_codes", "storm"
    )
    assertDataFrameEqual(got, [Row(category="rebalance", errors=3, error_codes=[82], storm=True)])


def test_partitions_of_one_name_on_two_clusters_are_two_partitions(spark):
    # One audit of captures from two clusters (a MirrorMaker's source and target, a
    # client of both) that have topic t: each cluster's Metadata answers name their own
    # leaders and in-sync replicas, and neither cluster's partition changed.
    rows = []
    for i in range(3):
        rows += metadata_facts("a", 4 * i, 10 * i, {0: FULL}, cluster="source")
        rows += metadata_facts("b", 4 * i + 2, 10 * i + 5, {0: (2, [2, 3, 4], [2])}, cluster="target")
    facts = facts_df(spark, rows)
    assert leader_changes(facts).count() == 0
    [shrunk] = isr_shrinks(facts).collect()
    assert (shrunk.cluster_id, shrunk.wall_ns, shrunk.min_isr, shrunk.expanded_wall_ns) == (
        "target",
        5 * MS,
        1,
        None,
    )
