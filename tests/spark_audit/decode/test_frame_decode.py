"""Bodies to facts with kafka-python: plain Python, no Spark."""

from __future__ import annotations

import uuid

from protocol import request_class, response_class
from protocol.testing import encode_request, encode_response
from spark_audit.decode import decode, errors
from tests.support.audit_builders import (
    Transaction,
    end_txn_facts,
    metadata_answer,
    produce_frame,
    records,
    txn_offset_commit_facts,
)
from tests.support.consumer_group_frames import heartbeat_answer, heartbeat_request
from tests.support.kafka_frames import join_group_request


def facts_of(frame: bytes, api_key: int, version: int, direction: str) -> list[dict]:
    return decode(api_key, version, direction, frame, len(frame))


def test_produce_request_gives_one_fact_per_record_batch():
    batch = records(3, producer_id=7, base_sequence=10) + records(2)
    got = facts_of(produce_frame(1, acks=-1, batch=batch, transactional_id="tx"), 0, 9, "request")
    assert [
        (f["producer_id"], f["base_sequence"], f["record_count"], f["acks"], f["transactional_id"])
        for f in got
    ] == [
        (7, 10, 3, -1, "tx"),
        (-1, -1, 2, -1, "tx"),
    ]
    assert all(f["topic"] == "t" and f["partition"] == 0 and f["crc"] > 0 for f in got)


def test_produce_answer_gives_acks_and_errors():
    cls = response_class(0)
    part = cls.TopicProduceResponse.PartitionProduceResponse
    body = cls(
        version=9,
        responses=[
            cls.TopicProduceResponse(
                name="t",
                partition_responses=[part(index=0, error_code=0, base_offset=5), part(index=1, error_code=6)],
            )
        ],
    )
    got = facts_of(encode_response(body, 3), 0, 9, "response")
    assert [(f["fact"], f["partition"], f["error_code"]) for f in got] == [
        ("produce_ack", 0, 0),
        ("produce_ack", 1, 6),
        ("error", 1, 6),
    ]
    assert got[-1]["topic"] == "t"


def test_metadata_leaders_and_offset_fetch_of_both_layouts():
    meta = response_class(3)
    topic = meta.MetadataResponseTopic(
        name="t",
        error_code=0,
        partitions=[
            meta.MetadataResponseTopic.MetadataResponsePartition(
                partition_index=0, leader_id=111, leader_epoch=4, error_code=0, replica_nodes=[], isr_nodes=[]
            )
        ],
    )
    got = facts_of(encode_response(meta(version=12, brokers=[], topics=[topic]), 1), 3, 12, "response")
    assert [(f["fact"], f["leader_id"], f["leader_epoch"]) for f in got] == [("leader", 111, 4)]

    fetch = response_class(9)
    old = fetch(
        version=5,
        error_code=0,
        topics=[
            fetch.OffsetFetchResponseTopic(
                name="t",
                partitions=[
                    fetch.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                        partition_index=2, committed_offset=-1, error_code=0
                    )
                ],
            )
        ],
    )
    got = facts_of(encode_response(old, 1), 9, 5, "response")
    assert [(f["fact"], f["group_id"], f["partition"], f["offset"]) for f in got] == [
        ("fetched_offset", None, 2, -1)
    ]
    group = fetch.OffsetFetchResponseGroup
    new = fetch(
        version=8,
        groups=[
            group(
                group_id="g",
                error_code=0,
                topics=[
                    group.OffsetFetchResponseTopics(
                        name="t",
                        partitions=[
                            group.OffsetFetchResponseTopics.OffsetFetchResponsePartitions(
                                partition_index=0, committed_offset=42, error_code=0
                            )
                        ],
                    )
                ],
            )
        ],
    )
    got = facts_of(encode_response(new, 1), 9, 8, "response")
    assert [(f["fact"], f["group_id"], f["offset"]) for f in got] == [("fetched_offset", "g", 42)]


def test_a_metadata_leader_counts_its_replicas_and_in_sync_replicas_in_every_version():
    for version in range(response_class(3).max_version + 1):
        answer = metadata_answer(1, {0: (1, [1, 2, 3], [1, 3]), 1: (2, [2, 3], [2, 3])}, version=version)
        got = [f for f in facts_of(answer, 3, version, "response") if f["fact"] == "leader"]
        assert [(f["partition"], f["isr_size"], f["replica_size"]) for f in got] == [(0, 2, 3), (1, 2, 2)]


def test_metadata_and_describe_cluster_answers_name_their_cluster():
    # Also a Metadata answer without partitions (a client that asked for no topic): the
    # connection's cluster, which the offsets and produce checks keep apart.
    for version in range(response_class(3).max_version + 1):
        got = facts_of(metadata_answer(1, {}, version=version, cluster="cA"), 3, version, "response")
        assert [f for f in got if f["fact"] == "cluster"] == (
            [{"fact": "cluster", "cluster_id": "cA"}] if version >= 2 else []
        )
    describe = response_class(60)(
        version=0,
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        cluster_id="cB",
        controller_id=1,
        brokers=[],
    )
    assert facts_of(encode_response(describe, 1), 60, 0, "response") == [
        {"fact": "cluster", "cluster_id": "cB"}
    ]


def test_group_requests_name_their_group():
    assert facts_of(join_group_request(5, 6000, 6000, member_id="m"), 11, 5, "request") == [
        {"fact": "group", "group_id": "g", "member_id": "m", "generation_id": None}
    ]
    delete = request_class(42)(version=1, groups_names=["a", "b"])
    assert [f["group_id"] for f in facts_of(encode_request(delete, 1), 42, 1, "request")] == ["a", "b"]
    cls = request_class(47)
    topic = cls.OffsetDeleteRequestTopic(
        name="t", partitions=[cls.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=3)]
    )
    offset_delete = cls(version=0, group_id="g", topics=[topic])
    assert facts_of(encode_request(offset_delete, 1), 47, 0, "request") == [
        {"fact": "group", "group_id": "g", "topic": "t", "partition": 3}
    ]


def test_cut_and_unknown_frames():
    frame = produce_frame(1)
    assert decode(0, 9, "request", frame[:20], len(frame))[0]["fact"] == "undecodable"
    assert decode(3, 12, "request", b"\0" * 12, 12) == []  # Metadata requests are not needed
    assert list(errors(object())) == []


def test_consumer_group_heartbeat_gives_the_member_epochs_sent_and_handed_out():
    topic = uuid.UUID(int=3)
    request = heartbeat_request(4, "g", "m1", 0, owned={topic: [0]}, topics=["t"])
    assert facts_of(request, 68, 1, "request") == [
        {"fact": "group", "group_id": "g", "member_id": "m1", "generation_id": 0}
    ]
    v0 = heartbeat_request(4, "g", "", 5, version=0)
    assert facts_of(v0, 68, 0, "request")[0]["generation_id"] == 5
    answer = heartbeat_answer(4, 9, member="m1", assignment={topic: [0, 1]})
    assert facts_of(answer, 68, 1, "response") == [
        {"fact": "generation", "generation_id": 9, "member_id": "m1", "error_code": 0}
    ]
    fenced = heartbeat_answer(4, 0, error_code=110)
    assert facts_of(fenced, 68, 1, "response") == [
        {"fact": "generation", "generation_id": 0, "member_id": None, "error_code": 110},
        {"fact": "error", "error_code": 110},
    ]
    assert [f["fact"] for f in facts_of(answer[:16], 68, 1, "response")] == ["undecodable"]  # no member
    assert [f["fact"] for f in facts_of(answer, 68, 2, "response")] == ["undecodable"]  # a version unknown


def test_transactional_offset_commits_and_transaction_ends():
    txn = Transaction("tx", producer_id=7, epoch=2)
    rows = txn_offset_commit_facts("p", 1, 0, 9, txn=txn, error_code=47)
    rows += end_txn_facts("t", 3, 10, True, txn=txn)
    rows += end_txn_facts("t", 5, 20, False, txn=txn, error_code=48)
    keys = (
        "fact",
        "group_id",
        "topic",
        "partition",
        "offset",
        "transactional_id",
        "producer_id",
        "producer_epoch",
    )
    assert [tuple(r[k] for k in (*keys, "error_code")) for r in rows] == [
        ("commit", "g", "t", 0, 9, "tx", 7, 2, None),
        ("commit_ack", None, "t", 0, None, None, None, None, 47),
        ("error", None, "t", 0, None, None, None, None, 47),
        ("txn_commit", None, None, None, None, "tx", 7, 2, None),
        ("txn_end_ack", None, None, None, None, None, None, None, 0),
        ("txn_abort", None, None, None, None, "tx", 7, 2, None),
        ("txn_end_ack", None, None, None, None, None, None, None, 48),
        ("error", None, None, None, None, None, None, None, 48),
    ]


def test_an_offset_fetch_says_whether_it_requires_stable_offsets():
    cls = request_class(9)
    topics = [cls.OffsetFetchRequestTopic(name="t", partition_indexes=[0])]
    for version, stable in ((6, None), (7, True), (7, False)):
        asked = {} if stable is None else {"require_stable": stable}
        frame = encode_request(cls(version=version, group_id="g", topics=topics, **asked), 1)
        [group] = facts_of(frame, 9, version, "request")
        assert (group["group_id"], group["require_stable"]) == ("g", bool(stable))
    batched = cls(
        version=8, groups=[cls.OffsetFetchRequestGroup(group_id="h", topics=None)], require_stable=True
    )
    [group] = facts_of(encode_request(batched, 1), 9, 8, "request")
    assert (group["group_id"], group["require_stable"]) == ("h", True)
