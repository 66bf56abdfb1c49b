"""The vectorised Produce decode against the scalar one, frame by frame, on every version."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import request_class, response_class
from protocol.testing import encode_request, encode_response
from spark_audit.decode import FACT_SCHEMA, decode
from spark_audit.decode._facts import decode_batches, decode_rows
from spark_audit.decode._produce_vectorised import decode_requests, decode_responses
from tests.support.audit_builders import produce_answer, produce_frame, records

REQUEST = request_class(0)
RESPONSE = response_class(0)

names = st.one_of(st.just("t"), st.text(max_size=3), st.text(min_size=120, max_size=140))
batches = st.builds(
    records,
    n=st.integers(1, 3),
    producer_id=st.sampled_from([-1, 0, 2**40]),
    base_sequence=st.integers(0, 2**31 - 1),
    value=st.one_of(st.binary(min_size=1, max_size=8), st.just(b"w" * 300)),  # CRCs on both sides of 2^31
)
request_partitions = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.lists(batches, max_size=2)), max_size=2)
common_topic = st.tuples(names, st.integers(0, 2**31 - 1), batches).map(lambda t: [(t[0], [(t[1], [t[2]])])])
"""One topic, one partition, one batch: the shape the vectorised decode takes."""
request_topics = st.one_of(common_topic, st.lists(st.tuples(names, request_partitions), max_size=2))


def _request(
    version: int, acks: int, transactional_id: str | None, client_id: str | None, topics: list
) -> bytes:
    data = [
        REQUEST.TopicProduceData(
            name=name,
            partition_data=[
                REQUEST.TopicProduceData.PartitionProduceData(index=index, records=b"".join(batch) or None)
                for index, batch in parts
            ],
        )
        for name, parts in topics
    ]
    kwargs: dict[str, Any] = {"acks": acks, "timeout_ms": 1000, "topic_data": data}
    if version >= 3:
        kwargs["transactional_id"] = transactional_id
    return encode_request(REQUEST(version=version, **kwargs), 7, client_id)


def _common_request(version: int, transactional_id: str | None, topics: list) -> bool:
    """Whether the vectorised decode must take this request."""
    if not 3 <= version <= min(12, REQUEST.max_version) or transactional_id is not None or len(topics) != 1:
        return False
    name, parts = topics[0]
    short = version < 9 or len(name.encode()) < 127
    return short and len(parts) == 1 and len(parts[0][1]) == 1


def _batch(frames: list[bytes], versions: list[int], lengths: list[int] | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "frame": pa.array(frames, pa.binary()),
            "frame_length": pa.array(lengths or [len(f) for f in frames], pa.int32()),
            "api_version": pa.array(versions, pa.int16()),
        }
    )


def _taken(decoded: Any, index: int) -> dict[str, Any] | None:
    where = list(decoded.rows)
    if index not in where:
        return None
    at = where.index(index)
    return {name: column[at].as_py() for name, column in decoded.columns.items()}


FILLER = produce_frame(1, version=7)
"""A common-shape request around the one under test, so offsets into the shared buffer matter."""


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(0, REQUEST.max_version),
    acks=st.sampled_from([-1, 0, 1]),
    transactional_id=st.sampled_from([None, None, "tx"]),
    client_id=st.one_of(st.none(), st.just(""), st.just("c" * 200)),
    topics=request_topics,
)
def test_requests_read_as_the_scalar_decode_reads_them(version, acks, transactional_id, client_id, topics):
    frame = _request(version, acks, transactional_id, client_id, topics)
    decoded = decode_requests(_batch([FILLER, frame, FILLER], [7, version, 7]))
    got = _taken(decoded, 1)
    assert list(decoded.rows) == ([0, 1, 2] if got is not None else [0, 2])
    assert (got is not None) == _common_request(version, transactional_id, topics)
    if got is not None:
        [expected] = decode(0, version, "request", frame, len(frame))
        assert {"fact": "produce_batch", "transactional_id": None, **got} == expected


def _damage(frame: bytes, at: int, value: int, cut: bool) -> tuple[bytes, int]:
    """The frame with one byte changed, or cut short (then its length says more than it holds)."""
    if cut:
        return frame[: at % len(frame)], len(frame)
    damaged = bytearray(frame)
    damaged[at % len(frame)] = value
    return bytes(damaged), len(frame)


damage = {"at": st.integers(0, 400), "value": st.integers(0, 255), "cut": st.booleans()}


@settings(max_examples=200, deadline=None)
@given(version=st.integers(3, 12), client_id=st.sampled_from([None, "client"]), **damage)
def test_a_damaged_request_is_taken_only_if_the_scalar_decode_agrees(version, client_id, at, value, cut):
    batch = records(2, producer_id=5, base_sequence=9)
    whole = produce_frame(3, version=version, batch=batch, client_id=client_id)
    frame, length = _damage(whole, at, value, cut)
    got = _taken(decode_requests(_batch([frame], [version], [length])), 0)
    if got is not None:
        assert [{"fact": "produce_batch", "transactional_id": None, **got}] == decode(
            0, version, "request", frame, length
        )


response_topics = st.lists(
    st.tuples(
        names,
        st.lists(
            st.tuples(
                st.integers(0, 9),
                st.sampled_from([0, 6, 19]),
                st.integers(-1, 2**40),
                st.lists(st.integers(0, 3), max_size=1),
                st.one_of(st.none(), st.just("bad")),
            ),
            max_size=2,
        ),
    ),
    max_size=2,
)


def _response(version: int, topics: list) -> bytes:
    topic = RESPONSE.TopicProduceResponse
    part = topic.PartitionProduceResponse
    body = RESPONSE(
        version=version,
        throttle_time_ms=3,
        responses=[
            topic(
                name=name,
                partition_responses=[
                    part(
                        index=index,
                        error_code=code,
                        base_offset=offset,
                        log_start_offset=4,
                        record_errors=[part.BatchIndexAndErrorMessage(batch_index=i) for i in record_errors],
                        error_message=message,
                    )
                    for index, code, offset, record_errors, message in parts
                ],
            )
            for name, parts in topics
        ],
    )
    return encode_response(body, 11)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(0, RESPONSE.max_version), topics=response_topics)
def test_answers_read_as_the_scalar_decode_reads_them(version, topics):
    frame = _response(version, topics)
    filler = produce_answer(2)
    decoded = decode_responses(_batch([filler, frame], [9, version]))
    got = _taken(decoded, 1)
    parts = topics[0][1] if len(topics) == 1 else []
    common = (
        3 <= version <= min(12, RESPONSE.max_version)
        and len(topics) == 1
        and (version < 9 or len(topics[0][0].encode()) < 127)
        and len(parts) == 1
        and (version < 8 or (not parts[0][3] and parts[0][4] is None))
    )
    assert (got is not None) == common
    if got is not None:
        expected = decode(0, version, "response", frame, len(frame))
        assert expected[0] == {"fact": "produce_ack", **got}
        assert [f["fact"] for f in expected[1:]] == (["error"] if got["error_code"] else [])


@settings(max_examples=200, deadline=None)
@given(version=st.integers(3, 12), **damage)
def test_a_damaged_answer_is_taken_only_if_the_scalar_decode_agrees(version, at, value, cut):
    frame, length = _damage(_response(version, [("topic", [(4, 6, 2**40, [], None)])]), at, value, cut)
    got = _taken(decode_responses(_batch([frame], [version], [length])), 0)
    if got is not None:
        assert {"fact": "produce_ack", **got} == decode(0, version, "response", frame, length)[0]


def test_a_sliced_batch_with_nulls_reads_like_the_whole_one():
    frame = produce_frame(4, version=9, batch=records(1, producer_id=3, base_sequence=1))
    frames = pa.array([FILLER, None, frame, FILLER], pa.binary())
    lengths = pa.array([len(FILLER), None, len(frame), len(FILLER)], pa.int32())
    whole = pa.RecordBatch.from_pydict(
        {"frame": frames, "frame_length": lengths, "api_version": pa.array([7, 7, 9, 7], pa.int16())}
    )
    decoded = decode_requests(whole.slice(1))
    assert list(decoded.rows) == [1, 2]
    assert decoded.columns["producer_id"].to_pylist() == [3, -1]


def test_a_topic_name_that_is_not_utf8_is_left_to_the_scalar_decode():
    frame = produce_frame(5, version=7, topic="ab")
    at = frame.index(b"\x00\x02ab") + 2
    broken = frame[:at] + b"\xff\xfe" + frame[at + 2 :]
    decoded = decode_requests(_batch([FILLER, broken, FILLER], [7, 7, 7]))
    assert list(decoded.rows) == [0, 2]
    assert decoded.columns["topic"].to_pylist() == ["t", "t"]


def test_a_whole_frame_whose_row_says_it_was_longer_is_left_to_the_scalar_decode():
    assert list(decode_requests(_batch([FILLER], [7], [len(FILLER) + 1])).rows) == []
    assert list(decode_responses(_batch([produce_answer(1)], [9], [len(produce_answer(1)) - 1])).rows) == []


def _resized(frame: bytes) -> bytes:
    return (len(frame) - 4).to_bytes(4, "big") + frame[4:]


def test_a_client_id_length_below_minus_one_is_left_to_the_scalar_decode():
    frame = bytearray(produce_frame(6, version=9, client_id=None))
    frame[12:14] = (-2).to_bytes(2, "big", signed=True)
    assert list(decode_requests(_batch([bytes(frame)], [9])).rows) == []
    assert [f["fact"] for f in decode(0, 9, "request", bytes(frame), len(frame))] == ["undecodable"]


def test_header_tagged_fields_are_left_to_the_scalar_decode():
    frame = produce_frame(7, version=9, client_id="c")
    at = 12 + 2 + 1  # the header's tagged fields, after the one-byte client id
    assert frame[at] == 0
    tagged = _resized(frame[:at] + bytes([1, 0, 1, 0]) + frame[at + 1 :])  # one tag: 0, one byte
    assert [f["fact"] for f in decode(0, 9, "request", tagged, len(tagged))] == ["produce_batch"]
    assert list(decode_requests(_batch([tagged], [9])).rows) == []


def test_bytes_after_the_body_are_left_to_the_scalar_decode():
    for version in (7, 9):
        request = _resized(produce_frame(8, version=version) + b"\x00\x00")
        answer = _resized(_response(version, [("t", [(0, 0, 1, [], None)])]) + b"\x00\x00")
        assert list(decode_requests(_batch([request], [version])).rows) == []
        assert list(decode_responses(_batch([answer], [version])).rows) == []


def _scalar_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    rows = []
    for place in batch.to_pylist():
        frame = place.pop("frame")
        length = place.pop("frame_length")
        for fact in decode(place["api_key"], place["api_version"], place["direction"], frame, length):
            rows.append({field: {**place, **fact}.get(field) for field in FACT_SCHEMA.names})
    return rows


def _key(row: dict[str, Any]) -> tuple:
    return tuple((k, repr(v)) for k, v in sorted(row.items()))


def test_decode_batches_gives_the_scalar_facts_with_either_path():
    frames = [
        (0, "request", 9, produce_frame(1, version=9, batch=records(2, producer_id=4, base_sequence=6))),
        (0, "request", 9, produce_frame(2, version=9, transactional_id="tx")),  # scalar: a transaction
        (0, "request", 2, produce_frame(3, version=2)),  # scalar: too old
        (0, "response", 9, produce_answer(1)),
        (0, "response", 9, produce_answer(4, error_code=6, topic="u", partition=3)),
        (0, "response", 9, produce_answer(5)[:-3]),  # cut: undecodable, by the scalar path
        (3, "response", 9, b"\x00\x00\x00\x05\x00\x00\x00\x06\x00"),  # Metadata, scalar
    ]
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "capture_id": "cap",
                "connection_id": "c1",
                "seq": seq,
                "wall_ns": 1000 + seq,
                "direction": direction,
                "api_key": key,
                "api_version": version,
                "correlation_id": seq,
                "frame": frame,
                "frame_length": len(produce_answer(5)) if seq == 5 else len(frame),
            }
            for seq, (key, direction, version, frame) in enumerate(frames)
        ],
        schema=pa.schema(
            [
                ("capture_id", pa.string()),
                ("connection_id", pa.string()),
                ("seq", pa.int64()),
                ("wall_ns", pa.int64()),
                ("direction", pa.string()),
                ("api_key", pa.int16()),
                ("api_version", pa.int16()),
                ("correlation_id", pa.int32()),
                ("frame", pa.binary()),
                ("frame_length", pa.int32()),
            ]
        ),
    )
    got = [row for out in decode_batches(iter([batch])) for row in out.to_pylist()]
    expected = _scalar_rows(batch)
    assert sorted(map(_key, got)) == sorted(map(_key, expected))
    assert {"produce_batch", "produce_ack", "error", "undecodable"} <= {r["fact"] for r in got}


@settings(max_examples=100, deadline=None)
@given(
    picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12)), min_size=1, max_size=12),
    chosen=st.lists(st.booleans(), min_size=12, max_size=12),
    sliced=st.booleans(),
)
def test_rows_read_in_place_read_as_the_same_rows_copied(picks, chosen, sliced):
    kinds = [
        (produce_frame(1, version=9, batch=records(2, producer_id=4, base_sequence=6)), produce_answer(1)),
        (produce_frame(2, version=7, topic="ab"), produce_answer(2, error_code=6, topic="u", partition=3)),
        (produce_frame(3, version=9, transactional_id="tx"), produce_answer(3)[:-3]),  # left to the scalar
        (b"\x00\x00\x00\x01\x00", b""),  # too short for anything
    ]
    for direction, decode_shape in ((0, decode_requests), (1, decode_responses)):
        frames = [kinds[kind][direction] for kind, _ in picks]
        versions = [min(max(version, 3), 12) for _, version in picks]
        whole = _batch([FILLER, *frames], [7, *versions], [len(FILLER), *(len(f) for f in frames)])
        batch = whole.slice(1) if sliced else whole
        offset = 0 if sliced else 1
        at = np.flatnonzero(np.array(chosen[: len(picks)])) + offset
        copied = decode_shape(batch.take(pa.array(at, pa.int64())))
        in_place = decode_shape(batch, at)
        assert list(in_place.rows) == list(copied.rows)
        assert {k: v.to_pylist() for k, v in in_place.columns.items()} == {
            k: v.to_pylist() for k, v in copied.columns.items()
        }


def test_decode_rows_of_a_mask_gives_the_facts_of_those_rows_alone():
    frames = [produce_frame(1, version=9), produce_answer(1), produce_frame(2, version=2), produce_answer(9)]
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "capture_id": "cap",
                "connection_id": "c1",
                "seq": seq,
                "wall_ns": seq,
                "direction": "request" if seq % 2 == 0 else "response",
                "api_key": 0,
                "api_version": 9 if seq != 2 else 2,
                "correlation_id": seq,
                "frame": frame,
                "frame_length": len(frame),
            }
            for seq, frame in enumerate(frames)
        ]
    )
    among = np.array([False, True, True, False])
    got = [row for out in decode_rows(batch, among) for row in out.to_pylist()]
    want = [row for out in decode_batches(iter([batch.filter(pa.array(among))])) for row in out.to_pylist()]
    assert sorted(map(_key, got)) == sorted(map(_key, want))
    assert sorted(r["seq"] for r in got) == [1, 2]
