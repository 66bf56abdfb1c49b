"""Check 6, duplicate produce and idempotent sequences, on hand-built facts."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import duplicate_batches, sequence_problems
from tests.support.audit_builders import CAPTURE, MS, connection_fact, fact, facts_df

TIMESTAMP = 1_700_000_000_000
LENGTH = 120


def batch(
    conn,
    seq,
    wall_ms,
    crc,
    *,
    pid=-1,
    base=-1,
    count=2,
    partition=0,
    ts=TIMESTAMP,
    length=LENGTH,
    lineage=None,
):
    return fact(
        conn,
        seq,
        "produce_batch",
        direction="request",
        api_key=0,
        cid=seq,
        wall_ms=wall_ms,
        topic="t",
        partition=partition,
        crc=crc,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=base,
        record_count=count,
        first_timestamp=ts,
        batch_length=length,
        lineage_id=lineage,
        acks=1,
    )


def ack(conn, seq, wall_ms, error_code=0, partition=0):
    return fact(
        conn,
        seq + 1,
        "produce_ack",
        direction="response",
        api_key=0,
        cid=seq,
        wall_ms=wall_ms,
        topic="t",
        partition=partition,
        error_code=error_code,
        offset=0,
    )


def test_duplicate_batches_without_producer_id(spark):
    rows = [
        batch("a", 1, 0, 111),
        ack("a", 1, 1),
        batch("a", 3, 5, 111),
        ack("a", 3, 6),  # re-sent, both acknowledged: appended twice
        batch("a", 5, 10, 222),  # answer lost
        batch("b", 7, 20, 222),
        ack("b", 7, 21),  # re-sent on another connection
        batch("a", 9, 30, 333),
        ack("a", 9, 31),  # sent once
        batch("a", 11, 40, 444),
        ack("a", 11, 41),
        batch("a", 13, 45, 444),
        ack("a", 13, 46, error_code=6),  # re-sent, the second refused: appended once
    ]
    expected = [
        Row(
            capture_id=CAPTURE,
            connection_id="a",
            wall_ns=0,
            topic="t",
            partition=0,
            crc=111,
            record_count=2,
            first_timestamp=TIMESTAMP,
            batch_length=LENGTH,
            sends=2,
            acknowledged=2,
            unanswered=0,
            corrfix_resends=0,
            last_wall_ns=5 * MS,
            kind="appended_twice",
            cluster_id=None,
        ),
        Row(
            capture_id=CAPTURE,
            connection_id="a",
            wall_ns=10 * MS,
            topic="t",
            partition=0,
            crc=222,
            record_count=2,
            first_timestamp=TIMESTAMP,
            batch_length=LENGTH,
            sends=2,
            acknowledged=1,
            unanswered=1,
            corrfix_resends=0,
            last_wall_ns=20 * MS,
            kind="possible_duplicate",
            cluster_id=None,
        ),
    ]
    assertDataFrameEqual(duplicate_batches(facts_df(spark, rows)), expected)


def _kinds(spark, rows) -> list[tuple]:
    found = duplicate_batches(facts_df(spark, rows)).collect()
    return sorted(
        (r.crc, r.first_timestamp, r.kind, r.sends, r.acknowledged, r.corrfix_resends) for r in found
    )


def test_batches_sharing_a_crc_by_chance_are_not_duplicates(spark):
    rows = [  # three different batches with one CRC, each acknowledged once, with no lineage
        batch("a", 1, 0, 111),
        ack("a", 1, 1),
        batch("b", 3, 5, 111, ts=TIMESTAMP + 9),
        ack("b", 3, 6),
        batch("c", 5, 10, 111, length=LENGTH + 4),
        ack("c", 5, 11),
        batch("c", 7, 15, 111, count=3),
        ack("c", 7, 16),
    ]
    assert _kinds(spark, rows) == []


def test_a_resend_by_corrfix_acknowledged_twice_is_appended_twice(spark):
    rows = [  # one client request (lineage 42) sent under upstream ids 1 and 3
        batch("a", 1, 0, 111, lineage=42),
        ack("a", 1, 1),
        batch("a", 3, 5, 111, lineage=42),
        ack("a", 3, 6),
    ]
    assert _kinds(spark, rows) == [(111, TIMESTAMP, "appended_twice", 2, 2, 1)]


def test_a_retry_by_the_client_acknowledged_twice_is_appended_twice(spark):
    rows = [  # the client's own retry: a new correlation id (lineage), here on a new connection
        batch("a", 1, 0, 111, lineage=7),
        ack("a", 1, 1),
        batch("b", 3, 5, 111, lineage=0),
        ack("b", 3, 6),
        batch("c", 5, 10, 222),  # the same on a wire capture, with no lineage at all
        ack("c", 5, 11),
        batch("c", 7, 15, 222),
        ack("c", 7, 16),
    ]
    assert _kinds(spark, rows) == [
        (111, TIMESTAMP, "appended_twice", 2, 2, 0),
        (222, TIMESTAMP, "appended_twice", 2, 2, 0),
    ]


def test_sequence_problems_of_idempotent_producers(spark):
    rows = [
        batch("a", 1, 0, 10, pid=7, base=0, count=2),
        ack("a", 1, 1),
        batch("a", 3, 5, 10, pid=7, base=0, count=2),
        ack("a", 3, 6),  # retried: same batch
        batch("a", 5, 10, 20, pid=7, base=2, count=3),
        ack("a", 5, 11),  # in order
        batch("a", 7, 15, 30, pid=7, base=8, count=1),  # gap: expected 5
        batch("a", 9, 20, 40, pid=7, base=8, count=1),  # another batch reusing 8
        batch("b", 11, 25, 50, pid=8, base=2**31 - 1, count=1),
        batch("b", 13, 30, 60, pid=8, base=0, count=1),  # wrapped: in order
    ]

    def p(wall, pid, base, expected, count, crc, sends, kind, conn="a"):
        return Row(
            capture_id=CAPTURE,
            connection_id=conn,
            wall_ns=wall * MS,
            producer_id=pid,
            producer_epoch=0,
            topic="t",
            partition=0,
            base_sequence=base,
            expected_sequence=expected,
            record_count=count,
            crc=crc,
            sends=sends,
            kind=kind,
            cluster_id=None,
        )

    expected = [
        p(0, 7, 0, None, 2, 10, 2, "retried"),
        p(15, 7, 8, 5, 1, 30, 1, "sequence_gap"),
        p(20, 7, 8, 9, 1, 40, 1, "sequence_reused"),
    ]
    assertDataFrameEqual(sequence_problems(facts_df(spark, rows)), expected)


def test_a_send_refused_after_the_leader_appended_it_may_be_a_duplicate(spark):
    rows = [
        batch("a", 1, 0, 111),
        ack("a", 1, 1, error_code=20),  # NOT_ENOUGH_REPLICAS_AFTER_APPEND: in the leader's log
        batch("a", 3, 5, 111),
        ack("a", 3, 6),
        batch("a", 5, 10, 222),
        ack("a", 5, 11, error_code=7),  # REQUEST_TIMED_OUT: appended, replication not awaited
        batch("b", 7, 15, 222),
        ack("b", 7, 16),
        batch("a", 9, 20, 333),
        ack("a", 9, 21, error_code=19),  # NOT_ENOUGH_REPLICAS: refused before the append
        batch("a", 11, 25, 333),
        ack("a", 11, 26),
    ]
    assert _kinds(spark, rows) == [
        (111, TIMESTAMP, "possible_duplicate", 2, 1, 0),
        (222, TIMESTAMP, "possible_duplicate", 2, 1, 0),
    ]


def refused(conn, seq, wall_ms, error_code):
    """A Produce answer with an error, and the error fact the decode gives with it."""
    error = {**ack(conn, seq, wall_ms, error_code), "fact": "error", "offset": None}
    return [ack(conn, seq, wall_ms, error_code), error]


def test_sequences_an_idempotent_producer_gave_back_or_restarted_are_not_reused(spark):
    # Before KIP-360 (Kafka 2.5) an idempotent producer keeps its producer id and epoch when
    # a batch fails: the batches after a batch the broker refused take over its sequences,
    # and when the broker lost the producer's state (UNKNOWN_PRODUCER_ID, the log's head
    # deleted past the last acknowledged offset) the partition starts again at 0. Neither
    # reuses a sequence the broker holds. (Transactional producers still do the latter.)
    rows = [
        batch("a", 1, 0, 10, pid=7, base=0),
        ack("a", 1, 1),
        batch("a", 3, 10, 20, pid=7, base=2),
        *refused("a", 3, 11, 10),  # MESSAGE_TOO_LARGE: never appended
        batch("a", 5, 15, 30, pid=7, base=4),  # in flight behind it
        *refused("a", 5, 16, 45),  # OUT_OF_ORDER_SEQUENCE_NUMBER: 2 and 3 are missing
        batch("a", 7, 20, 31, pid=7, base=2),  # the same records, given sequence 2
        ack("a", 7, 21),
        batch("a", 9, 25, 40, pid=7, base=4),
        ack("a", 9, 26),
        batch("a", 11, 30, 50, pid=7, base=6),
        *refused("a", 11, 31, 59),  # UNKNOWN_PRODUCER_ID: the broker lost the producer's state
        batch("a", 13, 35, 51, pid=7, base=0),  # the same records from sequence 0
        ack("a", 13, 36),
        batch("a", 15, 40, 60, pid=7, base=2),
        ack("a", 15, 41),
        batch("a", 17, 45, 70, pid=7, base=2),  # reused: 2 was acknowledged
        ack("a", 17, 46),
        batch("a", 19, 50, 80, pid=7, base=0, count=1),  # reused: no state lost since the restart
        ack("a", 19, 51),
        batch("b", 21, 60, 90, pid=9, base=0, count=1),
        *refused("b", 21, 61, 46),  # DUPLICATE_SEQUENCE_NUMBER: appended before
        batch("b", 23, 65, 91, pid=9, base=0, count=1),  # reused
        ack("b", 23, 66),
    ]
    found = sequence_problems(facts_df(spark, rows)).collect()
    assert sorted((r.kind, r.crc, r.expected_sequence) for r in found) == [
        ("sequence_reused", 70, 4),
        ("sequence_reused", 80, 4),
        ("sequence_reused", 91, 1),
    ]


TWO_CLUSTERS = [
    # each cluster's Metadata connection names it; the partition leaders' connections, doing
    # only Produce, name nothing
    connection_fact("ma", "a1:9092", "A"),
    connection_fact("pa", "a1:9092"),
    connection_fact("pa2", "a1:9092"),
    connection_fact("mb", "b1:9092", "B"),
    connection_fact("pb", "b1:9092"),
]
"""Two clusters with a topic ``t`` each (a MirrorMaker's source and target, a client of both)."""


def test_one_producer_id_in_two_clusters_is_two_producers(spark):
    # Each cluster hands out producer ids from its own counter: producer 7 on A and on B.
    rows = [
        *TWO_CLUSTERS,
        batch("pa", 1, 0, 10, pid=7, base=0, count=5),
        ack("pa", 1, 1),
        batch("pb", 3, 5, 20, pid=7, base=0, count=2),  # B's producer 7 starts at 0
        ack("pb", 3, 6),
        batch("pb", 5, 10, 30, pid=7, base=2, count=2),
        ack("pb", 5, 11),
        batch("pa", 7, 15, 40, pid=7, base=5, count=1),
        ack("pa", 7, 16),
    ]
    assert sequence_problems(facts_df(spark, rows)).collect() == []


def test_a_sequence_reused_within_one_cluster_is_found_with_its_cluster(spark):
    rows = [
        *TWO_CLUSTERS,
        batch("pa", 1, 0, 10, pid=7, base=0, count=5),
        ack("pa", 1, 1),
        batch("pb", 3, 5, 20, pid=7, base=0, count=2),
        ack("pb", 3, 6),
        batch("pa2", 5, 10, 30, pid=7, base=3, count=2),  # A's producer 7 again, after a leader move
        ack("pa2", 5, 11),
    ]
    found = sequence_problems(facts_df(spark, rows)).collect()
    assert [(r.kind, r.crc, r.expected_sequence, r.cluster_id) for r in found] == [
        ("sequence_reused", 30, 5, "A")
    ]


def test_one_batch_sent_to_two_clusters_is_no_duplicate(spark):
    # A client of both clusters writes the same batch to each one's topic t.
    rows = [
        *TWO_CLUSTERS,
        batch("pa", 1, 0, 111),
        ack("pa", 1, 1),
        batch("pb", 3, 5, 111),
        ack("pb", 3, 6),
        batch("pa", 5, 10, 222),
        ack("pa", 5, 11),
        batch("pa2", 7, 15, 222),  # the client's own retry, in A: appended twice
        ack("pa2", 7, 16),
        batch("pb", 9, 20, 222),
        ack("pb", 9, 21),
    ]
    found = duplicate_batches(facts_df(spark, rows)).collect()
    assert [(r.crc, r.kind, r.sends, r.cluster_id) for r in found] == [(222, "appended_twice", 2, "A")]
