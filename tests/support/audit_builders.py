"""Small hand-built captures and facts for the check tests: rows as dicts, frames encoded
with kafka-python, DataFrames with the exact capture and fact schemas."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
from kafka.record.memory_records import MemoryRecordsBuilder
from kafka.record.util import calc_crc32c
from pyspark.sql import DataFrame, SparkSession

from corrfix.capture.format import CAPTURE_SCHEMA, Source, schema_for
from protocol import ApiKey, request_class, response_class
from protocol.testing import encode_request, encode_response
from spark_audit.connections import merge_acks, transactions_of
from spark_audit.decode import FACT_SCHEMA, decode
from spark_audit.source import CAPTURE_SPARK_SCHEMA
from tests.support.consumer_group_frames import heartbeat_answer, heartbeat_request

CAPTURE = "cafe" * 8
WIRE_CAPTURE = "beef" * 8
MS = 1_000_000


def row(
    connection: str,
    seq: int,
    kind: str = "frame",
    *,
    source: str = "proxy",
    wall_ms: float | None = None,
    **values: Any,
) -> dict[str, Any]:
    """A capture row; ``wall_ns`` and ``mono_ns`` default to ``seq`` milliseconds."""
    ns = int((seq if wall_ms is None else wall_ms) * MS)
    base: dict[str, Any] = dict.fromkeys(CAPTURE_SCHEMA.names)
    base.update(
        capture_id=CAPTURE,
        source=source,
        connection_id=connection,
        seq=seq,
        kind=kind,
        wall_ns=ns,
        mono_ns=ns,
    )
    base.update(values)
    return base


def frame_row(
    direction: str,
    connection: str,
    seq: int,
    side: str,
    api_key: int | None,
    cid: int | None = None,
    uid: int | None = None,
    **values: Any,
) -> dict[str, Any]:
    """A frame row; api_version defaults to 1."""
    return row(
        connection,
        seq,
        side=side,
        direction=direction,
        api_key=api_key,
        api_version=values.pop("api_version", 1),
        client_correlation_id=cid,
        upstream_correlation_id=uid,
        **values,
    )


req = functools.partial(frame_row, "request")
resp = functools.partial(frame_row, "response")


def repair(
    connection: str, seq: int, event: str, uid: int | None, cid: int | None = None, **values: Any
) -> dict:
    return row(
        connection,
        seq,
        "repair",
        event=event,
        upstream_correlation_id=uid,
        client_correlation_id=cid,
        **values,
    )


def capture_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    names = CAPTURE_SPARK_SCHEMA.names
    return spark.createDataFrame([tuple(r[n] for n in names) for r in rows], CAPTURE_SPARK_SCHEMA)


def transactions_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """The transactions of ``rows`` (the header checks' input), by the shuffle path."""
    return transactions_of(capture_df(spark, rows))


def write_capture(directory: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` (one capture, one source) as a capture file, as corrfix would name it."""
    first = rows[0]
    schema = schema_for(first["capture_id"], Source(first["source"]))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"capture-20250101T000000.000000Z-{first['capture_id'][:8]}-000001.arrows"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
    return path


def fact(
    connection: str,
    seq: int,
    fact_kind: str,
    *,
    direction: str,
    api_key: int,
    cid: int,
    wall_ms: float | None = None,
    **values: Any,
) -> dict[str, Any]:
    base: dict[str, Any] = dict.fromkeys(FACT_SCHEMA.names)
    base.update(
        capture_id=CAPTURE,
        connection_id=connection,
        seq=seq,
        wall_ns=int((seq if wall_ms is None else wall_ms) * MS),
        direction=direction,
        api_key=api_key,
        api_version=1,
        correlation_id=cid,
        fact=fact_kind,
    )
    base.update(values)
    return base


def connection_fact(connection: str, address: str | None, cluster: str | None = None) -> dict[str, Any]:
    """The ``connection`` fact the per-connection pass gives ``connection``: its upstream
    ``address`` and the ``cluster`` its own answers named (None: none)."""
    place = fact(connection, 0, "connection", direction=None, api_key=None, cid=None)  # type: ignore[arg-type]
    return {**place, "upstream_address": address, "cluster_id": cluster}


def facts_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """Facts as the per-connection pass gives them: each Produce batch with its answer."""
    table = merge_acks(pa.Table.from_pylist(rows, schema=FACT_SCHEMA))
    return spark.createDataFrame(table)


def records(
    n: int = 2,
    producer_id: int = -1,
    base_sequence: int = -1,
    value: bytes = b"v",
    timestamp: int = 1_700_000_000_000,
) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    if producer_id >= 0:
        builder.set_producer_state(producer_id, 0, base_sequence, False)
    for i in range(n):
        builder.append(timestamp=timestamp + i, key=None, value=value + b"%d" % i)
    builder.close()
    return bytes(builder.buffer())


def produce_frame(
    cid: int,
    *,
    acks: int = 1,
    version: int = 9,
    transactional_id: str | None = None,
    client_id: str | None = "client",
    topic: str = "t",
    partition: int = 0,
    batch: bytes | None = None,
) -> bytes:
    cls = request_class(ApiKey.PRODUCE)
    data = cls.TopicProduceData(
        name=topic,
        partition_data=[
            cls.TopicProduceData.PartitionProduceData(index=partition, records=batch or records())
        ],
    )
    kwargs: dict[str, Any] = {"acks": acks, "timeout_ms": 1000, "topic_data": [data]}
    if version >= 3:
        kwargs["transactional_id"] = transactional_id
    return encode_request(cls(version=version, **kwargs), cid, client_id)


ACKS1 = produce_frame(0, acks=1)
"""A Produce request that expects an answer."""
ACKS0 = produce_frame(0, acks=0)
"""A Produce request that must get none."""


def produce_answer(cid: int, error_code: int = 0, topic: str = "t", partition: int = 0) -> bytes:
    """A Produce v9 answer for one partition."""
    cls = response_class(ApiKey.PRODUCE)
    part = cls.TopicProduceResponse.PartitionProduceResponse(
        index=partition, error_code=error_code, base_offset=0
    )
    body = cls(version=9, responses=[cls.TopicProduceResponse(name=topic, partition_responses=[part])])
    return encode_response(body, cid)


Replicas = tuple[int, list[int], list[int]]
"""A Metadata partition's leader, replicas and in-sync replicas."""


def metadata_answer(
    cid: int, partitions: dict[int, Replicas], *, version: int = 12, epoch: int = 4, cluster: str = "c1"
) -> bytes:
    """A Metadata answer of ``version`` of cluster ``cluster`` (from v2) for topic ``t``:
    its ``partitions`` (index: leader, replicas, in-sync replicas), each under leader epoch
    ``epoch`` (from v7)."""
    cls = response_class(ApiKey.METADATA)
    part = cls.MetadataResponseTopic.MetadataResponsePartition
    found = [
        part(
            partition_index=index,
            leader_id=leader,
            leader_epoch=epoch,
            error_code=0,
            replica_nodes=replicas,
            isr_nodes=isr,
            offline_replicas=[],
        )
        for index, (leader, replicas, isr) in partitions.items()
    ]
    topic = cls.MetadataResponseTopic(name="t", error_code=0, is_internal=False, partitions=found)
    body = cls(version=version, brokers=[], cluster_id=cluster, controller_id=1, topics=[topic])
    return encode_response(body, cid)


def metadata_facts(
    connection: str,
    seq: int,
    wall_ms: float,
    partitions: dict[int, Replicas],
    *,
    version: int = 12,
    cluster: str = "c1",
) -> list[dict[str, Any]]:
    """The facts the audit decodes from :func:`metadata_answer`, on ``connection``."""
    answer = metadata_answer(seq, partitions, version=version, cluster=cluster)
    decoded = decode(ApiKey.METADATA, version, "response", answer, len(answer))
    assert decoded, "a Metadata answer with partitions gives facts"
    return [
        {
            **fact(
                connection,
                seq,
                "leader",
                direction="response",
                api_key=ApiKey.METADATA,
                cid=seq,
                wall_ms=wall_ms,
            ),
            "api_version": version,
            **found,
        }
        for found in decoded
    ]


def call_facts(
    connection: str, seq: int, wall_ms: float, api_key: int, version: int, request: bytes, answer: bytes
) -> list[dict[str, Any]]:
    """The facts the audit decodes from ``request`` and ``answer`` (``version`` of
    ``api_key``), the answer a millisecond later, on ``connection``: request seq ``seq``,
    answer ``seq + 1``, correlation id ``seq``."""
    out = []
    for direction, at, wall, frame in (
        ("request", seq, wall_ms, request),
        ("response", seq + 1, wall_ms + 1, answer),
    ):
        decoded = decode(api_key, version, direction, frame, len(frame))
        place = fact(connection, at, "", direction=direction, api_key=api_key, cid=seq, wall_ms=wall)
        out += [{**place, "api_version": version, **found} for found in decoded]
    return out


def heartbeat_facts(
    connection: str,
    seq: int,
    wall_ms: float,
    *,
    sent: int,
    answered: int,
    group: str = "g",
    member: str = "m1",
    error_code: int = 0,
    assignment: dict[uuid.UUID, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """:func:`call_facts` of a ConsumerGroupHeartbeat of ``member`` sent with member epoch
    ``sent`` and answered with ``answered`` (and ``error_code``, ``assignment``)."""
    request = heartbeat_request(seq, group, member, sent)
    answer = heartbeat_answer(seq, answered, error_code=error_code, assignment=assignment)
    return call_facts(connection, seq, wall_ms, ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, request, answer)


class Transaction(NamedTuple):
    """The transaction a TxnOffsetCommit or EndTxn belongs to."""

    transactional_id: str = "tx"
    producer_id: int = 7
    epoch: int = 0


TX = Transaction()
"""Transaction ``tx`` of producer 7, epoch 0."""


def txn_offset_commit_facts(
    connection: str,
    seq: int,
    wall_ms: float,
    offset: int,
    *,
    txn: Transaction = TX,
    error_code: int = 0,
) -> list[dict[str, Any]]:
    """:func:`call_facts` of a TxnOffsetCommit v3 of ``offset`` for group ``g``'s partition
    ``t-0`` in ``txn``, answered ``error_code``."""
    cls, answer_cls = request_class(ApiKey.TXN_OFFSET_COMMIT), response_class(ApiKey.TXN_OFFSET_COMMIT)
    topic = cls.TxnOffsetCommitRequestTopic
    partition = topic.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset)
    body = cls(
        version=3,
        transactional_id=txn.transactional_id,
        group_id="g",
        producer_id=txn.producer_id,
        producer_epoch=txn.epoch,
        generation_id=1,
        member_id="m1",
        topics=[topic(name="t", partitions=[partition])],
    )
    answered = answer_cls.TxnOffsetCommitResponseTopic
    part = answered.TxnOffsetCommitResponsePartition(partition_index=0, error_code=error_code)
    answer = encode_response(answer_cls(version=3, topics=[answered(name="t", partitions=[part])]), seq)
    return call_facts(
        connection, seq, wall_ms, ApiKey.TXN_OFFSET_COMMIT, 3, encode_request(body, seq), answer
    )


def end_txn_facts(
    connection: str,
    seq: int,
    wall_ms: float,
    committed: bool,
    *,
    txn: Transaction = TX,
    error_code: int = 0,
) -> list[dict[str, Any]]:
    """:func:`call_facts` of an EndTxn v3 that commits (or aborts) ``txn``, answered ``error_code``."""
    cls, answer_cls = request_class(ApiKey.END_TXN), response_class(ApiKey.END_TXN)
    transaction = {"transactional_id": txn.transactional_id, "producer_id": txn.producer_id}
    body = cls(version=3, **transaction, producer_epoch=txn.epoch, committed=committed)
    answer = encode_response(answer_cls(version=3, error_code=error_code), seq)
    return call_facts(connection, seq, wall_ms, ApiKey.END_TXN, 3, encode_request(body, seq), answer)


def wire_rows() -> list[dict[str, Any]]:
    """A wire capture with one of each client-view finding: w1 out of order, an acks=0
    reply, an orphan, a duplicate, an id not increasing, an answer missing and a request
    unanswered at close; w2 ids wrapping and a request unanswered at the capture's end; w3
    a lone request."""
    w1 = [
        req("w1", 1, "client", 3, cid=1),
        req("w1", 2, "client", 3, cid=2),
        resp("w1", 3, "client", 3, cid=2),
        resp("w1", 4, "client", 3, cid=1),
        req("w1", 5, "client", 0, cid=3, frame=ACKS0, api_version=9),
        resp("w1", 6, "client", 0, cid=3, api_version=9),
        resp("w1", 7, "client", None, cid=99, reason="unmatched"),
        req("w1", 8, "client", 18, cid=4),
        resp("w1", 9, "client", 18, cid=4),
        resp("w1", 10, "client", 18, cid=4),
        req("w1", 11, "client", 3, cid=4),
        resp("w1", 12, "client", 3, cid=4),
        req("w1", 13, "client", 1, cid=5),
        req("w1", 14, "client", 3, cid=6),
        resp("w1", 15, "client", 3, cid=6),
        req("w1", 16, "client", 3, cid=7),
        row("w1", 17, "close", reason="fin"),
    ]
    w2 = [
        req("w2", 1, "client", 3, cid=2**31 - 1),
        resp("w2", 2, "client", 3, cid=2**31 - 1),
        req("w2", 3, "client", 3, cid=0),
        resp("w2", 4, "client", 3, cid=0),
        req("w2", 5, "client", 3, cid=1),
        row("w2", 6, "close", reason="capture_end,response_gap=10"),
    ]
    w3 = [req("w3", 1, "client", 3, cid=9)]
    return [{**r, "source": "wire"} for r in w1 + w2 + w3]


CRC_COVERS_FROM = 21
"""A v2 batch's CRC-32C covers its bytes from the attributes (offset 21) to its end."""


def with_crc(batch: bytes, crc: int, at: int) -> bytes:
    """``batch`` (one v2 record batch) with the four bytes at ``at`` (in a record's value)
    changed so that its CRC is ``crc``: a different batch that shares another's CRC. CRC is
    linear over GF(2) for a fixed length, so the four bytes solve a 32 x 32 linear system."""

    def crc_with(word: int) -> int:
        data = bytearray(batch)
        data[at : at + 4] = word.to_bytes(4, "big")
        return calc_crc32c(bytes(data[CRC_COVERS_FROM:]))

    base = crc_with(0)
    rows = [(crc_with(1 << bit) ^ base, 1 << bit) for bit in range(32)]  # (image, preimage) pairs
    basis: dict[int, tuple[int, int]] = {}  # leading bit -> (image, preimage)
    for image, preimage in rows:
        for bit in sorted(basis, reverse=True):
            if image >> bit & 1:
                image, preimage = image ^ basis[bit][0], preimage ^ basis[bit][1]
        if image:
            basis[image.bit_length() - 1] = (image, preimage)
    want, word = crc ^ base, 0
    for bit in sorted(basis, reverse=True):
        if want >> bit & 1:
            want, word = want ^ basis[bit][0], word ^ basis[bit][1]
    assert want == 0, "four bytes always reach any CRC-32C"
    data = bytearray(batch)
    data[at : at + 4] = word.to_bytes(4, "big")
    data[17:21] = crc.to_bytes(4, "big")
    assert calc_crc32c(bytes(data[CRC_COVERS_FROM:])) == crc
    return bytes(data)


def offset_commit_frames(cid: int, offset: int, group: str = "g") -> tuple[bytes, bytes]:
    """An OffsetCommit v8 of ``offset`` for ``group``'s partition ``t-0``, and its answer (no error)."""
    cls, answer_cls = request_class(ApiKey.OFFSET_COMMIT), response_class(ApiKey.OFFSET_COMMIT)
    part = cls.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
    )
    topics = [cls.OffsetCommitRequestTopic(name="t", partitions=[part])]
    body = cls(
        version=8,
        group_id=group,
        generation_id_or_member_epoch=1,
        member_id="m1",
        group_instance_id=None,
        topics=topics,
    )
    answered = answer_cls.OffsetCommitResponseTopic
    acked = [
        answered(
            name="t", partitions=[answered.OffsetCommitResponsePartition(partition_index=0, error_code=0)]
        )
    ]
    return encode_request(body, cid), encode_response(
        answer_cls(version=8, throttle_time_ms=0, topics=acked), cid
    )


def offset_fetch_frames(cid: int, offset: int, group: str = "g") -> tuple[bytes, bytes]:
    """An OffsetFetch v7 of ``group``'s partition ``t-0``, and its answer: ``offset`` (-1: none)."""
    cls, answer_cls = request_class(ApiKey.OFFSET_FETCH), response_class(ApiKey.OFFSET_FETCH)
    topics = [cls.OffsetFetchRequestTopic(name="t", partition_indexes=[0])]
    body = cls(version=7, group_id=group, topics=topics, require_stable=False)
    topic = answer_cls.OffsetFetchResponseTopic
    part = topic.OffsetFetchResponsePartition(
        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, metadata="", error_code=0
    )
    answer = answer_cls(
        version=7, throttle_time_ms=0, topics=[topic(name="t", partitions=[part])], error_code=0
    )
    return encode_request(body, cid), encode_response(answer, cid)
