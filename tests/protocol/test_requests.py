"""Facts read from request bodies (protocol.requests), against requests built by kafka-python."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.default_records import DefaultRecordBatch

from protocol import (
    ProtocolError,
    RequestHeader,
    expects_response,
    fetch_max_wait_ms,
    frame,
    parse_request_header,
    produce_acks,
    produce_is_idempotent,
)
from protocol._requests import _walk_to_acks
from protocol.testing import encode_request
from tests.support.produce_frames import TOPIC_ID, legacy_batch, produce_frame, record_batch

BATCH_HEADER_SIZE = DefaultRecordBatch.HEADER_STRUCT.size
"""61 bytes: what a v2 record batch must hold for its producer id to be read."""

PRODUCE_VERSIONS = list(range(ProduceRequest.max_version + 1))
TRANSACTIONAL_PRODUCE_VERSIONS = [v for v in PRODUCE_VERSIONS if v >= 3]
FETCH_VERSIONS = list(range(FetchRequest.max_version + 1))

ACKS = st.sampled_from([-1, 0, 1])
INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
TRANSACTIONAL_IDS = st.one_of(
    st.none(),
    st.just(""),
    st.text(max_size=200),
    st.just("транзакция-😀" * 40),  # multi-byte: the compact length needs a 2-byte varint
)
# kafka-python compiles codecs on first use; that must not count against the deadline.
SLOW = settings(deadline=None, max_examples=60)


def acks_position(version: int, transactional_id: str | None) -> int:
    """Where acks sits, found by diffing two encodings (independent of produce_acks)."""
    a, _ = produce_frame(version, transactional_id=transactional_id, acks=0x0102)
    b, _ = produce_frame(version, transactional_id=transactional_id, acks=0x7E7D)
    pos = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    assert a[pos : pos + 2] == b"\x01\x02"
    return pos


# -- produce_acks --------------------------------------------------------------------------


@SLOW
@given(
    version=st.sampled_from(PRODUCE_VERSIONS),
    transactional_id=TRANSACTIONAL_IDS,
    acks=ACKS,
    timeout_ms=INT32,
    client_id=st.one_of(st.none(), st.text(max_size=30)),
)
def test_produce_acks_reads_what_kafka_python_wrote(version, transactional_id, acks, timeout_ms, client_id):
    framed, header = produce_frame(
        version, transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, client_id=client_id
    )
    assert produce_acks(framed, header) == acks
    assert expects_response(framed, header) is (acks != 0)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("transactional_id", [None, "", "tx", "é" * 70, "ü" * 9000])
def test_produce_acks_every_version_and_transactional_id_length(version, transactional_id):
    for acks in (-1, 0, 1):
        framed, header = produce_frame(version, transactional_id=transactional_id, acks=acks)
        assert produce_acks(framed, header) == acks
        assert expects_response(framed, header) is (acks != 0)


@SLOW
@given(version=st.sampled_from(PRODUCE_VERSIONS), acks=INT16)
def test_produce_acks_returns_any_int16_as_is(version, acks):
    framed, header = produce_frame(version, acks=acks)
    assert produce_acks(framed, header) == acks


@pytest.mark.parametrize("kind", [bytes, memoryview])
def test_produce_acks_accepts_any_bytes_like(kind):
    framed, header = produce_frame(9, transactional_id="t", acks=-1)
    assert produce_acks(kind(framed), header) == -1


def test_produce_acks_needs_a_body_offset():
    framed, header = produce_frame(9)
    unlocated = RequestHeader(0, 9, 77, "producer-1", None)
    assert header.body_offset is not None
    with pytest.raises(ProtocolError):
        produce_acks(framed, unlocated)


def test_produce_acks_for_a_version_newer_than_kafka_python_knows():
    # v14 keeps the v9+ layout; the hand parser does not need a schema class for it.
    framed, _ = produce_frame(13, transactional_id="tx", acks=0)
    framed[6:8] = (14).to_bytes(2, "big")
    header = parse_request_header(framed)
    assert header.api_version == 14
    assert produce_acks(framed, header) == 0
    assert expects_response(framed, header) is False


def _acks_or_error(read, *args) -> object:
    try:
        return read(*args)
    except ProtocolError as exc:
        return ("error", str(exc))


@settings(max_examples=300)
@given(
    version=st.integers(0, 15),
    body=st.one_of(
        st.binary(max_size=8),
        st.binary(max_size=6).map(lambda rest: b"\xff\xff" + rest),  # a null transactional_id
    ),
)
def test_produce_acks_fast_path_agrees_with_the_walk(version, body):
    header = RequestHeader(0, version, 77, "producer-1", 14)
    framed = bytearray(14) + body  # a header's worth of bytes; the body starts at 14
    assert _acks_or_error(produce_acks, framed, header) == _acks_or_error(_walk_to_acks, framed, 14, version)


@settings(deadline=None, max_examples=80)
@given(
    version=st.sampled_from(PRODUCE_VERSIONS),
    transactional_id=TRANSACTIONAL_IDS,
    data=st.data(),
)
def test_every_truncation_before_acks_is_rejected(version, transactional_id, data):
    framed, header = produce_frame(version, transactional_id=transactional_id, acks=-1)
    pos = acks_position(version, transactional_id)
    cut = data.draw(st.integers(header.body_offset, len(framed)))
    truncated = framed[:cut]
    assert parse_request_header(truncated) == header
    if cut < pos + 2:
        with pytest.raises(ProtocolError):
            produce_acks(truncated, header)
        with pytest.raises(ProtocolError):
            expects_response(truncated, header)
    else:
        assert produce_acks(truncated, header) == -1
    # never an exception: without a transactional id, a body cut before its batch header is
    # whole is not idempotent; the whole frame's one batch carries a producer id (a header
    # alone is enough, see below)
    batch_end = bytes(framed).index(record_batch(1000)) + BATCH_HEADER_SIZE
    if cut == len(framed):
        assert produce_is_idempotent(truncated, header) is True
    elif cut < batch_end and not transactional_id:
        assert produce_is_idempotent(truncated, header) is False


@pytest.mark.parametrize(
    ("version", "body"),
    [
        (3, b"\x00\x10abc"),  # transactional_id longer than the frame
        (3, b"\x00"),  # half a length
        (3, b""),
        (9, b"\x80\x80\x80\x80\x80\x01"),  # varint longer than 5 bytes
        (9, b"\xff\xff\xff\xff\x0f"),  # transactional_id of 4 GB
        (9, b"\x05ab"),
        (9, b""),
        (0, b"\x00"),
    ],
)
def test_malformed_produce_bodies_are_rejected(version, body):
    raw = b"\x00\x00" + version.to_bytes(2, "big") + b"\x00\x00\x00\x01\xff\xff"
    if version >= 9:
        raw += b"\x00"  # header v2: empty tagged fields
    framed = frame(raw + body)
    header = parse_request_header(framed)
    with pytest.raises(ProtocolError):
        produce_acks(framed, header)
    assert produce_is_idempotent(framed, header) is False


@settings(max_examples=100)
@given(
    version=st.integers(0, 20),
    client_id=st.one_of(st.none(), st.text(max_size=5)),
    body=st.binary(max_size=48),
)
def test_garbage_produce_bodies_raise_only_protocol_error(version, client_id, body):
    raw = b"\x00\x00" + version.to_bytes(2, "big") + b"\x00\x00\x00\x01"
    if client_id is None:
        raw += b"\xff\xff"
    else:
        encoded = client_id.encode()
        raw += len(encoded).to_bytes(2, "big") + encoded
    if version >= 9:
        raw += b"\x00"
    framed = frame(raw + body)
    header = parse_request_header(framed)
    try:
        acks = produce_acks(framed, header)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            expects_response(framed, header)
    else:
        assert -(2**15) <= acks < 2**15
        assert expects_response(framed, header) is (acks != 0)
    assert produce_is_idempotent(framed, header) in (True, False)


@settings(deadline=None, max_examples=80)
@given(
    version=st.sampled_from(TRANSACTIONAL_PRODUCE_VERSIONS),
    transactional_id=st.sampled_from([None, "tx"]),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF])), max_size=6
    ),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_mutated_produce_frames_never_raise_anything_but_protocol_error(
    version, transactional_id, edits, cut
):
    framed, header = produce_frame(
        version, transactional_id=transactional_id, topics=[[record_batch(5), record_batch(6)], [None]]
    )
    start = header.body_offset
    for pos, value in edits:
        framed[start + pos % (len(framed) - start)] = value
    if cut is not None:
        framed = framed[: start + cut % (len(framed) - start)]
    with contextlib.suppress(ProtocolError):
        produce_acks(framed, header)
    assert produce_is_idempotent(framed, header) in (True, False)


# -- expects_response ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 4, 12, 13])
def test_other_apis_always_expect_a_response_without_reading_the_body(version):
    request = MetadataRequest[version]()
    framed = bytearray(encode_request(request, correlation_id=1))
    header = parse_request_header(framed)
    # even with no body at all, where a Produce would be rejected
    assert expects_response(framed[: header.body_offset], header) is True


def test_fetch_with_zero_where_produce_has_acks_still_expects_a_response():
    framed = bytearray(encode_request(FetchRequest[4](max_wait_ms=0, min_bytes=0), correlation_id=1))
    header = parse_request_header(framed)
    framed[header.body_offset :] = b"\x00" * (len(framed) - header.body_offset)
    assert expects_response(framed, header) is True


# -- produce_is_idempotent -----------------------------------------------------------------


@SLOW
@given(
    version=st.sampled_from(TRANSACTIONAL_PRODUCE_VERSIONS),
    producer_id=st.integers(0, 2**63 - 1),
    transactional_id=st.sampled_from([None, ""]),
    acks=ACKS,
)
def test_batches_with_a_producer_id_are_idempotent(version, producer_id, transactional_id, acks):
    framed, header = produce_frame(
        version, transactional_id=transactional_id, acks=acks, topics=[[record_batch(producer_id)]]
    )
    assert produce_is_idempotent(framed, header) is True


@pytest.mark.parametrize("version", TRANSACTIONAL_PRODUCE_VERSIONS)
def test_batches_without_a_producer_id_are_not_idempotent(version):
    framed, header = produce_frame(version, topics=[[record_batch(-1)]])
    assert produce_is_idempotent(framed, header) is False
    framed, header = produce_frame(version, transactional_id="", topics=[[record_batch(-1)]])
    assert produce_is_idempotent(framed, header) is False


@pytest.mark.parametrize("version", TRANSACTIONAL_PRODUCE_VERSIONS)
def test_transactional_produce_is_idempotent(version):
    framed, header = produce_frame(
        version, transactional_id="payments-tx", topics=[[record_batch(42, transactional=True)]]
    )
    assert produce_is_idempotent(framed, header) is True
    # decided by the transactional id alone
    framed, header = produce_frame(version, transactional_id="payments-tx", topics=[[None]])
    assert produce_is_idempotent(framed, header) is True


@pytest.mark.parametrize("version", [3, 9, 13])
def test_every_batch_needs_a_producer_id(version):
    with_id, without = record_batch(7), record_batch(-1)
    for topics in (
        [[with_id, without]],
        [[without, with_id]],
        [[with_id], [without]],
        [[without], [with_id]],
    ):
        framed, header = produce_frame(version, topics=topics)
        assert produce_is_idempotent(framed, header) is False, topics
    framed, header = produce_frame(version, topics=[[with_id, record_batch(8)], [record_batch(9, records=5)]])
    assert produce_is_idempotent(framed, header) is True


@pytest.mark.parametrize("version", [3, 9, 13])
def test_partitions_without_records_are_skipped(version):
    framed, header = produce_frame(version, topics=[[None, b"", record_batch(3)]])
    assert produce_is_idempotent(framed, header) is True
    # but a request with no batch at all is not idempotent
    framed, header = produce_frame(version, topics=[[None, b""]])
    assert produce_is_idempotent(framed, header) is False
    framed, header = produce_frame(version, topics=[])
    assert produce_is_idempotent(framed, header) is False


@pytest.mark.parametrize("version", [3, 9])
def test_compressed_batch_with_producer_id_is_idempotent(version):
    framed, header = produce_frame(version, topics=[[record_batch(11, records=20, compression=1)]])
    assert produce_is_idempotent(framed, header) is True


@pytest.mark.parametrize("version", [3, 9, 13])
def test_legacy_record_batches_are_not_idempotent(version):
    framed, header = produce_frame(version, topics=[[legacy_batch()]])
    assert produce_is_idempotent(framed, header) is False


@pytest.mark.parametrize("version", [3, 9, 13])
@pytest.mark.parametrize("length", [17, 40, 60])
def test_record_batch_shorter_than_its_header_is_not_idempotent(version, length):
    # Magic byte 2 at offset 16 but fewer than the 61 bytes of a batch header:
    # kafka-python's DefaultRecordBatch would raise struct.error on it.
    records = bytes(16) + b"\x02" + bytes(length - 17)
    framed, header = produce_frame(version, topics=[[records]])
    assert produce_is_idempotent(framed, header) is False


@pytest.mark.parametrize("version", [3, 9, 13])
def test_batch_header_of_exactly_61_bytes_is_read(version):
    batch = record_batch(99)[:BATCH_HEADER_SIZE]
    framed, header = produce_frame(version, topics=[[batch]])
    assert produce_is_idempotent(framed, header) is True


@pytest.mark.parametrize("version", [3, 9, 13])
def test_null_topic_or_partition_arrays_are_not_idempotent(version):
    # A null array decodes as None in kafka-python; that must not blow up.
    for topic_data in (
        None,
        [ProduceRequest.TopicProduceData(name="t", topic_id=TOPIC_ID, partition_data=None)],
    ):
        request = ProduceRequest[version](transactional_id=None, acks=1, timeout_ms=1, topic_data=topic_data)
        framed = bytearray(encode_request(request, correlation_id=1))
        header = parse_request_header(framed)
        assert produce_acks(framed, header) == 1
        assert produce_is_idempotent(framed, header) is False


def test_version_newer_than_kafka_python_knows_is_not_idempotent():
    framed, _ = produce_frame(13, topics=[[record_batch(5)]])
    framed[6:8] = (14).to_bytes(2, "big")
    assert produce_is_idempotent(framed, parse_request_header(framed)) is False


def test_unlocated_body_is_not_idempotent():
    framed, _ = produce_frame(9, topics=[[record_batch(5)]])
    assert produce_is_idempotent(framed, RequestHeader(0, 9, 77, "producer-1", None)) is False


# -- fetch_max_wait_ms ---------------------------------------------------------------------


def fetch_frame(version: int, max_wait_ms: int):
    F = FetchRequest
    request = F[version](
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        topics=[
            F.FetchTopic(
                topic="t",
                topic_id=TOPIC_ID,
                partitions=[F.FetchTopic.FetchPartition(partition=0, fetch_offset=10)],
            )
        ],
    )
    framed = bytearray(encode_request(request, correlation_id=5, client_id="consumer"))
    return framed, parse_request_header(framed)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_max_wait_every_version(version):
    for wait in (0, 1, 500, 30_000, 2**31 - 1):
        framed, header = fetch_frame(version, wait)
        assert fetch_max_wait_ms(framed, header) == wait


@SLOW
@given(version=st.sampled_from(FETCH_VERSIONS), wait=INT32)
def test_fetch_max_wait_any_value(version, wait):
    framed, header = fetch_frame(version, wait)
    assert fetch_max_wait_ms(framed, header) == max(wait, 0)


def test_fetch_max_wait_of_unreadable_requests_is_zero():
    framed, header = fetch_frame(12, 700)
    assert fetch_max_wait_ms(framed[: header.body_offset + 3], header) == 0
    assert fetch_max_wait_ms(framed, RequestHeader(1, 12, 5, "consumer", None)) == 0
    framed[6:8] = (FetchRequest.max_version + 1).to_bytes(2, "big")
    assert fetch_max_wait_ms(framed, parse_request_header(framed)) == 0


@settings(max_examples=100)
@given(version=st.sampled_from(FETCH_VERSIONS), body=st.binary(max_size=64))
def test_fetch_max_wait_of_garbage_never_raises(version, body):
    framed, header = fetch_frame(version, 1)
    garbage = framed[: header.body_offset] + body
    # MaxWaitMs follows ReplicaId up to v14; from v15 the replica id is a tagged field (KIP-903)
    position = header.body_offset + (0 if version >= 15 else 4)
    read = garbage[position : position + 4]
    expected = max(int.from_bytes(read, "big", signed=True), 0) if len(read) == 4 else 0
    assert fetch_max_wait_ms(garbage, header) == expected
