"""Check 4, error storms, leader changes and rebalances, on hand-built facts."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import error_storms, leader_changes, rebalances
from tests.support.audit_builders import CAPTURE, MS, fact, facts_df

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


def storm_window(start_ns, category, *, errors, leader_changes, codes, storm):
    """An :func:`error_storms` row of one connection of :data:`CAPTURE`."""
    return Row(
        window_start_ns=start_ns,
        category=category,
        errors=errors,
        leader_changes=leader_changes,
        connections=1,
        error_codes=codes,
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
    expected = [
        Row(topic="t", partition=0, wall_ns=30 * MS, from_leader=1, to_leader=2, from_epoch=4, to_epoch=6)
    ]
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
        Row(
            group_id="g",
            window_start_ns=0,
            joins=3,
            syncs=1,
            leaves=1,
            heartbeats=1,
            generations=[1, 2],
            members=2,
            rebalance_errors=1,
            capture_ids=[CAPTURE],
            storm=True,
        ),
        Row(
            group_id="other",
            window_start_ns=10 * S * MS,
            joins=0,
            syncs=0,
            leaves=0,
            heartbeats=1,
            generations=[],
            members=0,
            rebalance_errors=0,
            capture_ids=[CAPTURE],
            storm=False,
        ),
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
        Row(topic="t", partition=0, wall_ns=30 * MS, from_leader=1, to_leader=2, from_epoch=4, to_epoch=5),
        Row(topic="t", partition=0, wall_ns=50 * MS, from_leader=2, to_leader=3, from_epoch=5, to_epoch=None),
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
    expected = [
        Row(topic="t", partition=0, wall_ns=40 * MS, from_leader=1, to_leader=1, from_epoch=4, to_epoch=6)
    ]
    assertDataFrameEqual(leader_changes(facts_df(spark, rows)), expected)
