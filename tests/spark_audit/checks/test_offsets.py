"""Check 5, committed-offset loss, on hand-built facts."""

from __future__ import annotations

import functools

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import offset_losses
from tests.support.audit_builders import (
    CAPTURE,
    MS,
    Transaction,
    connection_fact,
    end_txn_facts,
    fact,
    facts_df,
    txn_offset_commit_facts,
)


def commit(conn, seq, wall_ms, offset, partition=0, error_code=0):
    call = functools.partial(fact, conn, api_key=8, cid=seq, topic="t", partition=partition)
    return [
        call(seq, "commit", direction="request", wall_ms=wall_ms, group_id="g", offset=offset),
        call(seq + 1, "commit_ack", direction="response", wall_ms=wall_ms + 1, error_code=error_code),
    ]


def fetch(conn, seq, wall_ms, offset, partition=0, stable=None):
    """An OffsetFetch of group g answered ``offset``; ``stable``: its ``require_stable``."""
    request = {"group_id": "g", "require_stable": stable}
    return [
        fact(conn, seq, "group", direction="request", api_key=9, cid=seq, wall_ms=wall_ms, **request),
        fact(
            conn,
            seq + 1,
            "fetched_offset",
            direction="response",
            api_key=9,
            cid=seq,
            wall_ms=wall_ms + 1,
            topic="t",
            partition=partition,
            offset=offset,
            error_code=0,
        ),
    ]


def test_committed_offset_loss(spark):
    rows = (
        fetch("a", 1, 0, -1)  # nothing committed yet: not a loss
        + commit("a", 3, 10, 5)
        + commit("a", 5, 20, 9)
        + commit("a", 7, 30, 11, error_code=25)  # refused: not a good offset
        + commit("a", 9, 40, 3, partition=1)
        + fetch("b", 11, 50, 9)  # fine
        + [fact("x", 13, "group", direction="request", api_key=42, cid=13, wall_ms=60, group_id="g")]
        + fetch("c", 15, 70, -1)
        + fetch("d", 17, 80, -1)
    )
    expected = [
        Row(
            group_id="g",
            topic="t",
            partition=0,
            last_offset=9,
            committed_wall_ns=21 * MS,
            wall_ns=71 * MS,
            capture_id=CAPTURE,
            connection_id="c",
            fetches=2,
            deleted_wall_ns=60 * MS,
            cluster_id=None,
        ),
    ]
    assertDataFrameEqual(offset_losses(facts_df(spark, rows)), expected)


def test_offsets_deleted_by_offset_delete_explain_the_loss(spark):
    def offset_delete(seq, wall_ms, partition):  # kafka-consumer-groups --delete-offsets
        return fact(
            "x",
            seq,
            "group",
            direction="request",
            api_key=47,
            cid=seq,
            wall_ms=wall_ms,
            group_id="g",
            topic="t",
            partition=partition,
        )

    rows = (
        commit("a", 1, 0, 5)
        + commit("a", 3, 10, 7, partition=1)
        + [offset_delete(5, 20, 0), offset_delete(6, 20, 2)]  # partition 1's offsets are kept
        + fetch("b", 7, 30, -1)
        + fetch("b", 9, 40, -1, partition=1)
    )
    got = offset_losses(facts_df(spark, rows)).select("partition", "deleted_wall_ns")
    assertDataFrameEqual(
        got, [Row(partition=0, deleted_wall_ns=20 * MS), Row(partition=1, deleted_wall_ns=None)]
    )


def test_a_deletion_the_broker_refused_explains_no_loss(spark):
    def refused(seq, wall_ms, api_key, error_code, where, answer_names):
        call = functools.partial(fact, "x", api_key=api_key, cid=seq)
        return [
            call(seq, "group", direction="request", wall_ms=wall_ms, group_id="g", **where),
            call(
                seq + 1,
                "error",
                direction="response",
                wall_ms=wall_ms + 1,
                error_code=error_code,
                **answer_names,
            ),
        ]

    partition = {"topic": "t", "partition": 0}
    rows = (
        commit("a", 1, 0, 5)
        + refused(3, 10, 42, 68, {}, {"group_id": "g"})  # DeleteGroups: GROUP_NOT_EMPTY
        + refused(5, 20, 47, 86, partition, partition)  # OffsetDelete: GROUP_SUBSCRIBED_TO_TOPIC
        + refused(7, 30, 47, 69, partition, {})  # OffsetDelete: GROUP_ID_NOT_FOUND, for the request
        + fetch("b", 9, 40, -1)
    )
    got = offset_losses(facts_df(spark, rows)).select("partition", "deleted_wall_ns")
    assertDataFrameEqual(got, [Row(partition=0, deleted_wall_ns=None)])


def test_a_batched_offset_fetch_names_each_partitions_group_in_its_answer(spark):
    # OffsetFetch v8+: one request for groups g and h; the answer names each partition's group.
    call = functools.partial(fact, "b", api_key=9, cid=5, api_version=8)
    answer = functools.partial(call, 6, "fetched_offset", direction="response", wall_ms=11, topic="t")
    rows = [
        *commit("a", 1, 0, 9),
        *commit("a", 3, 2, 4, partition=1),
        call(5, "group", direction="request", wall_ms=10, group_id="g"),
        call(5, "group", direction="request", wall_ms=10, group_id="h"),
        answer(group_id="g", partition=0, offset=9, error_code=0),
        answer(group_id="g", partition=1, offset=-1, error_code=0),
        answer(group_id="h", partition=0, offset=-1, error_code=0),  # h committed nothing: no loss
    ]
    got = offset_losses(facts_df(spark, rows)).select("group_id", "partition", "last_offset", "fetches")
    assertDataFrameEqual(got, [Row(group_id="g", partition=1, last_offset=4, fetches=1)])


def test_a_committed_transactions_offsets_are_commits(spark):
    # Kafka Streams exactly-once, read-process-write apps: the consumer's offsets go to the
    # group coordinator in a TxnOffsetCommit and are committed when EndTxn commits (to the
    # transaction coordinator, often on another connection).
    rows = (
        txn_offset_commit_facts("p", 1, 10, 9)
        + end_txn_facts("t", 3, 20, True, error_code=51)  # CONCURRENT_TRANSACTIONS: retried
        + end_txn_facts("t", 5, 25, True)
        + fetch("c", 7, 2000, -1)  # well after the commit marker
    )
    got = offset_losses(facts_df(spark, rows)).select("partition", "last_offset", "committed_wall_ns")
    assertDataFrameEqual(got, [Row(partition=0, last_offset=9, committed_wall_ns=26 * MS)])


def test_a_transaction_that_committed_one_partition_more_than_once_keeps_its_last_offset(spark):
    # Its TxnOffsetCommits all count at the one EndTxn answer's time; the group keeps the
    # last written, even a lower offset (a consumer that sought back).
    writes = [
        txn_offset_commit_facts("p", 1 + 2 * i, 10 + 2 * i, offset) for i, offset in enumerate((30, 20, 5))
    ]
    for order in ((0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)):
        rows = (
            [row for i in order for row in writes[i]]
            + end_txn_facts("t", 9, 25, True)
            + fetch("c", 11, 2000, -1)
        )
        got = offset_losses(facts_df(spark, rows)).select("last_offset", "committed_wall_ns")
        assertDataFrameEqual(got, [Row(last_offset=5, committed_wall_ns=26 * MS)])


def test_an_uncommitted_transactions_offsets_are_no_commits(spark):
    rows = (
        commit("a", 1, 0, 5)
        + txn_offset_commit_facts("p", 3, 10, 9)
        + end_txn_facts("t", 5, 20, False)  # aborted: offset 9 was never committed
        + end_txn_facts("t", 7, 30, True)  # the next transaction, with no offsets
        + txn_offset_commit_facts(
            "p", 9, 40, 12, txn=Transaction(epoch=1)
        )  # the producer was fenced, never ended it
        + end_txn_facts("t", 11, 50, True, txn=Transaction(epoch=2))  # its successor's transaction
        + txn_offset_commit_facts("p", 13, 60, 14, error_code=47)  # refused: INVALID_PRODUCER_EPOCH
        + end_txn_facts("t", 15, 70, True)
        + fetch("c", 17, 80, -1)
    )
    got = offset_losses(facts_df(spark, rows)).select("last_offset", "committed_wall_ns")
    assertDataFrameEqual(got, [Row(last_offset=5, committed_wall_ns=1 * MS)])


TWO_CLUSTERS = [
    # each cluster's Metadata connection names it; the coordinator connections name nothing
    connection_fact("ma", "a1:9092", "A"),
    connection_fact("ca", "a1:9092"),
    connection_fact("mb", "b1:9092", "B"),
    connection_fact("cb", "b1:9092"),
]
"""Two clusters (a MirrorMaker's source and target), each with a group ``g`` on topic ``t``:
a group coordinator's connection doing only OffsetCommit and OffsetFetch takes the cluster
its broker's address named on another connection."""


def test_an_offset_committed_in_one_cluster_is_not_lost_in_another(spark):
    rows = TWO_CLUSTERS + commit("ca", 1, 0, 9) + fetch("cb", 3, 10, -1)  # g on B committed nothing
    assert offset_losses(facts_df(spark, rows)).count() == 0


def test_a_loss_within_one_cluster_is_found_with_its_cluster(spark):
    rows = [
        *TWO_CLUSTERS,
        connection_fact("ca2", "a1:9092"),  # the group's consumer again, on a new connection
        *commit("ca", 1, 0, 9),
        *fetch("cb", 3, 10, 4),  # B's group of the same name is fine
        *fetch("ca2", 5, 20, -1),
    ]
    got = offset_losses(facts_df(spark, rows)).select("connection_id", "last_offset", "cluster_id")
    assertDataFrameEqual(got, [Row(connection_id="ca2", last_offset=9, cluster_id="A")])


def test_a_transaction_of_another_cluster_commits_no_offsets(spark):
    # Producer ids are a cluster's: producer 7's transaction "tx" on B is not A's producer 7.
    rows = [
        *TWO_CLUSTERS,
        connection_fact("tb", "b2:9092", "B"),
        *commit("ca", 1, 0, 5),
        *txn_offset_commit_facts("ca", 3, 10, 9),
        *end_txn_facts("tb", 5, 20, True),
        *fetch("ca", 7, 30, -1),
    ]
    got = offset_losses(facts_df(spark, rows)).select("last_offset", "cluster_id")
    assertDataFrameEqual(got, [Row(last_offset=5, cluster_id="A")])


def test_a_broker_that_named_no_cluster_joins_the_only_cluster(spark):
    # One cluster in the whole audit: its connections are never split, named or not.
    rows = [connection_fact("ma", "a1:9092", "A"), connection_fact("x", "a9:9092")]
    rows += commit("x", 1, 0, 9) + fetch("ma", 3, 10, -1) + fetch("y", 5, 20, -1)  # y: no open row
    got = offset_losses(facts_df(spark, rows)).select("connection_id", "fetches", "cluster_id")
    assertDataFrameEqual(got, [Row(connection_id="ma", fetches=2, cluster_id="A")])


def test_a_broker_that_named_no_cluster_stays_apart_when_there_are_two(spark):
    # Its connections could be either cluster's: they meet only each other.
    rows = [*TWO_CLUSTERS, connection_fact("x", "x1:9092"), connection_fact("x2", "x1:9092")]
    rows += commit("x", 1, 0, 9) + fetch("ca", 3, 10, -1) + fetch("cb", 5, 20, -1) + fetch("x2", 7, 30, -1)
    got = offset_losses(facts_df(spark, rows)).select("connection_id", "cluster_id")
    assertDataFrameEqual(got, [Row(connection_id="x2", cluster_id=None)])


def test_a_fetch_before_the_commit_marker_does_not_see_the_transactions_offsets(spark):
    # The EndTxn answer comes before the commit marker reaches the group coordinator, which
    # holds the offsets apart until then: a fetch without require_stable in between is
    # answered with the offsets committed before the transaction (here none), not a loss. A
    # read_committed consumer sets require_stable and is told UNSTABLE_OFFSET_COMMIT instead,
    # so its -1 is a loss; and after the bound the marker is long there.
    def losses(*rows):
        transaction = txn_offset_commit_facts("p", 3, 10, 9) + end_txn_facts("t", 5, 20, True)  # ended at 21
        found = offset_losses(facts_df(spark, [*transaction, *(r for part in rows for r in part)]))
        return [(r.last_offset, r.wall_ns // MS) for r in found.collect()]

    assert losses(fetch("c", 7, 30, -1)) == []
    assert losses(fetch("c", 7, 30, -1, stable=False)) == []
    assert losses(fetch("c", 7, 30, -1, stable=True)) == [(9, 31)]
    assert losses(fetch("c", 7, 30, -1), fetch("c", 9, 1030, -1)) == [(9, 1031)]
    assert losses(commit("a", 1, 0, 5), fetch("c", 7, 30, -1)) == [(5, 31)]  # what it should have seen
