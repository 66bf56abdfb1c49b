"""The hand-written Produce walk against kafka-python, for every Produce version."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ApiKey, parse_request_header, request_class, response_body_offset, response_class
from protocol.testing import encode_request, encode_response
from spark_audit.decode import _frame_decode as dec
from spark_audit.decode._produce_scalar import produce_batch_facts
from tests.support.audit_builders import records

PRODUCE_REQUEST = request_class(ApiKey.PRODUCE)

batches = st.builds(
    records,
    n=st.integers(1, 3),
    producer_id=st.sampled_from([-1, 0, 7, 2**40]),
    base_sequence=st.integers(0, 2**31 - 1),
)
partitions = st.lists(
    st.tuples(st.integers(0, 2**31 - 1), st.one_of(st.none(), st.just(b""), st.lists(batches, max_size=2))),
    max_size=3,
)
topics = st.lists(st.tuples(st.text(max_size=8), st.uuids(), partitions), max_size=3)


def _frame(version: int, acks: int, transactional_id: str | None, topic_list: list) -> bytes:
    data = []
    for name, topic_id, parts in topic_list:
        pdata = [
            PRODUCE_REQUEST.TopicProduceData.PartitionProduceData(
                index=index, records=b"".join(batch) if isinstance(batch, list) else batch
            )
            for index, batch in parts
        ]
        named = {"topic_id": topic_id} if version >= 13 else {"name": name}
        data.append(PRODUCE_REQUEST.TopicProduceData(**named, partition_data=pdata))
    kwargs = {"acks": acks, "timeout_ms": 1000, "topic_data": data}
    if version >= 3:
        kwargs["transactional_id"] = transactional_id
    return encode_request(PRODUCE_REQUEST(version=version, **kwargs), 5, "client")


def _kafka_python(frame: bytes, version: int) -> list[dict]:
    body = PRODUCE_REQUEST.decode(frame[parse_request_header(frame).body_offset :], version=version)
    return list(dec._produce_batches(body))


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(0, PRODUCE_REQUEST.max_version),
    acks=st.sampled_from([-1, 0, 1]),
    transactional_id=st.one_of(st.none(), st.text(max_size=8)),
    topic_list=topics,
)
def test_the_walk_gives_what_kafka_python_gives(version, acks, transactional_id, topic_list):
    frame = _frame(version, acks, transactional_id, topic_list)
    walked = produce_batch_facts(frame, parse_request_header(frame).body_offset, version)
    assert walked == _kafka_python(frame, version)
    assert dec.decode(0, version, "request", frame, len(frame)) == walked


@settings(max_examples=100, deadline=None)
@given(version=st.integers(0, PRODUCE_REQUEST.max_version), cut=st.integers(1, 60), topic_list=topics)
def test_a_damaged_body_falls_back_to_kafka_python(version, cut, topic_list):
    frame = _frame(version, 1, None, topic_list)
    damaged = frame[: max(len(frame) - cut, 12)]
    walked = produce_batch_facts(damaged, parse_request_header(frame).body_offset, version)
    if walked is not None:  # a walk that succeeds on a cut body read exactly what is there
        assert walked == _kafka_python(damaged, version)


def test_topic_ids_read_as_kafka_python_prints_them():
    topic_id = uuid.UUID(int=42)
    frame = _frame(13, 1, None, [("", topic_id, [(0, [records(1)])])])
    walked = produce_batch_facts(frame, parse_request_header(frame).body_offset, 13)
    assert walked is not None and walked[0]["topic"] == str(topic_id)


RESPONSE = response_class(0)


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(0, RESPONSE.max_version),
    topic_list=st.lists(
        st.tuples(
            st.text(max_size=6),
            st.lists(st.tuples(st.integers(0, 9), st.sampled_from([0, 0, 6, 19, 20])), max_size=3),
        ),
        max_size=3,
    ),
)
def test_produce_answer_errors_match_the_generic_walk(version, topic_list):
    part = RESPONSE.TopicProduceResponse.PartitionProduceResponse
    body = RESPONSE(
        version=version,
        responses=[
            RESPONSE.TopicProduceResponse(
                name=name, partition_responses=[part(index=i, error_code=code) for i, code in parts]
            )
            for name, parts in topic_list
        ],
    )
    frame = encode_response(body, 1)
    decoded = RESPONSE.decode(frame[response_body_offset(frame, 0, version) :], version=version)
    assert list(dec.produce_errors(decoded)) == list(dec.errors(decoded))
