"""Produce requests built by kafka-python, the independent side of the Produce-reader tests."""

from __future__ import annotations

import uuid

from kafka.protocol.producer import ProduceRequest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from protocol import parse_request_header
from protocol.testing import encode_request

TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def record_batch(producer_id: int, *, transactional: bool = False, records: int = 1, compression: int = 0):
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 20,
    )
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * i, headers=[])
    return bytes(builder.build())


def legacy_batch() -> bytes:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"v")
    return bytes(builder.build())


def topic(version: int, partitions):
    P = ProduceRequest
    key = {"topic_id": TOPIC_ID} if version >= 13 else {"name": "t"}
    return P.TopicProduceData(
        **key,
        partition_data=[
            P.TopicProduceData.PartitionProduceData(index=i, records=r) for i, r in enumerate(partitions)
        ],
    )


def produce_frame(
    version: int,
    *,
    transactional_id: str | None = None,
    acks: int = 1,
    timeout_ms: int = 30_000,
    topics: list[list[bytes | None]] | None = None,
    client_id: str | None = "producer-1",
):
    if topics is None:
        topics = [[record_batch(1000)]]
    request = ProduceRequest[version](
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[topic(version, parts) for parts in topics],
    )
    framed = bytearray(encode_request(request, correlation_id=77, client_id=client_id))
    return framed, parse_request_header(framed)
