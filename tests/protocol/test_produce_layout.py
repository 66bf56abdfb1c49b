"""The one Produce layout, held against Apache Kafka's JSON schema and kafka-python's batches."""

from __future__ import annotations

from kafka.protocol.schemas import load_json
from kafka.record.default_records import DefaultRecordBatch

from protocol import (
    PRODUCE_FIRST_FLEXIBLE,
    PRODUCE_FIRST_TOPIC_ID,
    PRODUCE_FIRST_TRANSACTIONAL_ID,
    RECORD_BATCH_HEADER,
    RECORD_BATCH_HEADER_SIZE,
    RECORD_BATCH_MAGIC_OFFSET,
)
from tests.support.produce_frames import record_batch

SCHEMA = load_json("ProduceRequest")


def _field(fields: list[dict], name: str) -> dict:
    return next(field for field in fields if field["name"] == name)


def _first(versions: str) -> int:
    assert versions.endswith("+"), versions
    return int(versions[:-1])


def test_version_boundaries_are_the_schemas():
    assert _first(SCHEMA["flexibleVersions"]) == PRODUCE_FIRST_FLEXIBLE
    assert _first(_field(SCHEMA["fields"], "TransactionalId")["versions"]) == PRODUCE_FIRST_TRANSACTIONAL_ID
    topic = _field(SCHEMA["fields"], "TopicData")["fields"]
    assert _first(_field(topic, "TopicId")["versions"]) == PRODUCE_FIRST_TOPIC_ID
    assert _field(topic, "Name")["versions"] == f"0-{PRODUCE_FIRST_TOPIC_ID - 1}"


def test_the_batch_header_reads_what_kafka_python_wrote():
    assert RECORD_BATCH_HEADER_SIZE == DefaultRecordBatch.HEADER_STRUCT.size == 61
    data = record_batch(4242, records=3)
    fields = RECORD_BATCH_HEADER.unpack_from(data)
    batch = DefaultRecordBatch(data)
    assert fields[3] == data[RECORD_BATCH_MAGIC_OFFSET] == batch.magic == 2
    assert fields[1] + 12 == len(data)
    assert (fields[4], fields[9], fields[10], fields[11], fields[12]) == (
        batch.crc,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        3,
    )
