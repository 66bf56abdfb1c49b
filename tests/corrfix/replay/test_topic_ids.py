"""Topic ids translated for a replay, on frames alone: learning ids from answers, rewriting requests."""

from __future__ import annotations

import random
import uuid

import pytest

from corrfix.replay._topic_ids import (
    TopicIdMap,
    carries_topic_ids,
    metadata_request,
    named_topic_ids,
    response_message,
)
from protocol import ApiKey, api_schemas, decode_body, parse_request_header, request_class, response_class
from protocol.testing import encode_request, encode_response, random_message

CASES = [
    (key, version)
    for key in sorted(api_schemas())
    if (cls := request_class(key)) is not None
    for version in range(cls.max_version + 1)
    if carries_topic_ids(key, version)
]


def metadata_answer(topics: dict[str, uuid.UUID], correlation_id: int = 1, version: int = 12) -> bytes:
    cls = response_class(ApiKey.METADATA)[version]
    topic = cls.MetadataResponseTopic
    answer = cls(
        throttle_time_ms=0,
        brokers=[],
        cluster_id="c",
        controller_id=1,
        topics=[
            topic(error_code=0, name=name, topic_id=topic_id, is_internal=False, partitions=[])
            for name, topic_id in topics.items()
        ],
    )
    return encode_response(answer, correlation_id)


def ids_in(frame: bytes) -> set[uuid.UUID]:
    header = parse_request_header(frame)
    message = decode_body(header.api_key, header.api_version, frame[header.body_offset :], request=True)
    return {topic_id for _, topic_id in _all_ids(message, header.api_version)}


def _all_ids(message, version):
    from corrfix.replay._topic_ids import NO_TOPIC_ID, TOPIC_ID, _has_topic_id, _struct_objects

    for struct, obj in _struct_objects(type(message)._struct, message, version):
        if _has_topic_id(struct, version) and getattr(obj, TOPIC_ID) != NO_TOPIC_ID:
            yield None, getattr(obj, TOPIC_ID)


def test_the_apis_that_name_topics_by_id():
    assert {key for key, _ in CASES} >= {
        ApiKey.FETCH,
        ApiKey.PRODUCE,
        ApiKey.OFFSET_COMMIT,
        ApiKey.DELETE_TOPICS,
    }
    assert min(v for k, v in CASES if k == ApiKey.FETCH) == 13
    assert not carries_topic_ids(ApiKey.FETCH, 12)


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_every_topic_id_of_every_request_is_rewritten(api_key, version):
    rnd = random.Random(api_key * 100 + version)
    frame = b""
    for _ in range(20):  # a message that names at least one topic by id
        frame = encode_request(random_message(request_class(api_key), version, rnd), 42, "c")
        if ids_in(frame):
            break
    captured = ids_in(frame)
    assert captured
    topics = TopicIdMap()
    names = {topic_id: f"topic-{i}" for i, topic_id in enumerate(sorted(captured))}
    topics.capture_names.update(names)
    topics.target_ids.update({name: uuid.UUID(int=i + 1) for i, name in enumerate(names.values())})
    rewritten = topics.rewrite(frame)
    assert ids_in(rewritten) == set(topics.target_ids.values())
    assert parse_request_header(rewritten)[:4] == parse_request_header(frame)[:4]
    assert sum(topics.remapped.values()) >= len(captured)


def test_ids_are_learned_from_metadata_answers_and_unknowns_counted():
    capture_id, target_id, stranger = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    topics = TopicIdMap()
    topics.learn_capture(metadata_answer({"orders": capture_id}), ApiKey.METADATA, 12)
    topics.learn_target(metadata_answer({"orders": target_id}), ApiKey.METADATA, 12)
    assert topics.capture_names == {capture_id: "orders"} and topics.target_ids == {"orders": target_id}
    fetch = request_class(ApiKey.FETCH)[16]
    request = fetch(
        replica_id=-1,
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            fetch.FetchTopic(topic_id=topic_id, partitions=[])
            for topic_id in (capture_id, stranger, capture_id)
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    frame = encode_request(request, 5, "c")
    assert ids_in(topics.rewrite(frame)) == {target_id, stranger}
    summary = topics.summary()
    assert summary["remapped"] == [
        {"topic": "orders", "capture_id": str(capture_id), "target_id": str(target_id), "requests": 2}
    ]
    assert summary["unknown_in_capture"] == [{"capture_id": str(stranger), "requests": 1}]


def test_a_topic_the_target_lacks_is_counted_and_left_as_captured():
    capture_id = uuid.uuid4()
    topics = TopicIdMap(capture_names={capture_id: "gone"})
    fetch = request_class(ApiKey.FETCH)[13]
    frame = encode_request(
        fetch(
            replica_id=-1,
            max_wait_ms=1,
            min_bytes=1,
            max_bytes=1,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[fetch.FetchTopic(topic_id=capture_id, partitions=[])],
            forgotten_topics_data=[],
            rack_id="",
        ),
        1,
        "c",
    )
    assert topics.unresolved(frame) == {"gone"}
    assert topics.rewrite(frame) == frame
    assert topics.summary()["missing_on_target"] == [{"topic": "gone", "requests": 1}]


def test_the_lookup_request_asks_by_name_and_its_answer_teaches_ids():
    frame = metadata_request({"b", "a"}, 9, 12)
    header = parse_request_header(frame)
    message = decode_body(ApiKey.METADATA, 12, frame[header.body_offset :], request=True)
    assert [t.name for t in message.topics] == ["a", "b"] and message.allow_auto_topic_creation is False
    answer = metadata_answer({"a": uuid.UUID(int=7)}, correlation_id=9)
    assert list(named_topic_ids(response_message(answer, ApiKey.METADATA, 12), 12)) == [
        ("a", uuid.UUID(int=7))
    ]
