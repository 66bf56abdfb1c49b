"""The recorder: a failure while recording costs that call's rows, never the relay's connection."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest

from corrfix.capture._columns import RowColumns, record_batch
from corrfix.capture._recorder import HELD_BYTES, Recorder, _head_is_enough
from corrfix.capture.format import SHARED_HEAD, Source, schema_for
from corrfix.core import HEADER_COPY
from protocol import ApiKey, ProtocolError, RequestHeaderReader, parse_request_header, produce_acks
from protocol.testing import encode_request, request_frame, response_frame
from tests.support.capture_shell import Shell
from tests.support.fake_broker import api_versions_answer
from tests.support.produce_frames import produce_frame


def rows_of(columns: RowColumns) -> list[dict]:
    return record_batch(columns.take(), schema_for("t", Source.PROXY), "t", "proxy").to_pylist()


def test_a_failing_call_loses_its_rows_counted_and_the_next_call_records_cleanly(monkeypatch):
    columns = RowColumns(max_rows=1000, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    shell = Shell(recorder)
    shell.open()
    real = Recorder._upstream_request

    def broken(self, *args):
        real(self, *args)  # its row is packed, then the call fails
        raise RuntimeError("a bug in recording")

    monkeypatch.setattr(Recorder, "_upstream_request", broken)
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0))  # does not raise
    assert shell.sent, "the request still went upstream"
    assert columns.lost == 2 and columns.lost_by_kind == {"frame": 2}
    monkeypatch.setattr(Recorder, "_upstream_request", real)

    shell.broker_answers(response_frame(0, 7))
    rows = rows_of(columns)
    assert [(row["kind"], row["side"], row["direction"]) for row in rows] == [
        ("open", None, None),
        ("frame", "upstream", "response"),
        ("frame", "client", "response"),
    ]
    assert all(row["connection_id"] == "c1" for row in rows)
    assert [row["seq"] for row in rows] == [0, 3, 4]  # the lost rows keep their numbers


def test_a_call_that_fails_before_packing_a_row_still_counts_every_row_it_loses(monkeypatch):
    columns = RowColumns(max_rows=1000, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    shell = Shell(recorder)
    shell.open()

    def broken(self, *args):
        raise RuntimeError("a bug in recording")

    monkeypatch.setattr(Recorder, "_client_request", broken)
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0), request_frame(ApiKey.METADATA, 8, 1))
    assert columns.lost == 4 and columns.lost_by_kind == {"frame": 4}  # two received, two sent


def test_record_batch_refuses_frame_sizes_that_disagree_with_the_bytes_held():
    columns = RowColumns(max_rows=1000, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    Shell(recorder).open()
    chunk = columns.take()
    chunk.frames = memoryview(b"stray")  # bytes no record names
    with pytest.raises(ValueError, match="frame bytes"):
        record_batch(chunk, schema_for("t", Source.PROXY), "t", "proxy")


# -- a pass's rows gathered and queued at its end -------------------------------------------


def _padded(frame: bytearray, size: int) -> bytearray:
    """The frame grown to ``size`` bytes after its size prefix, the prefix set to match."""
    if size <= len(frame):
        return frame
    grown = frame + bytes(range(256)) * (size // 256 + 1)
    grown = grown[:size]
    grown[:4] = (size - 4).to_bytes(4, "big")
    return grown


_SIZES = st.sampled_from([0, 0, 700, 3000])  # 0: as small as it comes; above SHARED_MIN, stored once
actions_drawn = st.lists(
    st.one_of(
        st.tuples(
            st.just("send"),
            st.lists(
                st.tuples(st.sampled_from([ApiKey.METADATA, ApiKey.PRODUCE]), _SIZES), min_size=1, max_size=3
            ),
        ),
        st.tuples(st.just("answer"), st.lists(st.tuples(st.integers(0, 7), _SIZES), min_size=1, max_size=3)),
        st.tuples(st.just("tick")),
        st.tuples(st.just("pass")),
    ),
    max_size=30,
)


def _run(actions: list[tuple], *, in_passes: bool) -> tuple[list[dict], int, list[bytes]]:
    columns = RowColumns(max_rows=10_000, max_bytes=1 << 24)
    recorder = Recorder(columns, snaplen=65536, wall_ns=lambda: 0, mono_ns=lambda: 0)
    shell = Shell(recorder)
    if in_passes:
        recorder.begin_pass()
    shell.open()
    client_id, unanswered, answered = 0, [], 0
    for action in actions:
        if action[0] == "send":
            frames = []
            for api_key, size in action[1]:
                frames.append(_padded(request_frame(api_key, client_id, client_id), size))
                client_id += 1
            shell.client_sends(*frames)
        elif action[0] == "answer":
            frames = []
            for pick, size in action[1]:
                if not unanswered:
                    break
                api_key, upstream_id = unanswered.pop(pick % len(unanswered))
                if api_key == ApiKey.API_VERSIONS:  # a probe
                    frames.append(api_versions_answer(upstream_id))
                else:
                    frames.append(_padded(response_frame(upstream_id, upstream_id), size))
            if frames:
                shell.broker_answers(*frames)
        elif action[0] == "tick":
            shell.tick(shell.now + 10.0)
        elif in_passes:
            recorder.end_pass()
            recorder.begin_pass()
        for frame in shell.sent[answered:]:
            unanswered.append(
                (int.from_bytes(frame[4:6], "big"), int.from_bytes(frame[8:12], "big", signed=True))
            )
        answered = len(shell.sent)
    shell.close()
    if in_passes:
        rows_before_end = columns.accepted
        recorder.end_pass()
        assert rows_before_end < columns.accepted, "a pass's rows wait for its end"
    return rows_of(columns), columns.lost, shell.sent


@settings(max_examples=150, deadline=None)
@given(actions=actions_drawn)
def test_rows_gathered_over_passes_are_the_rows_recorded_call_by_call(actions):
    """Re-sends patch a request's id in place, answers come in any order, probes go out: the
    rows an engine pass gathers and queues at its end are exactly those queued call by call."""
    by_call, lost, sent = _run(actions, in_passes=False)
    by_pass, lost_in_passes, sent_in_passes = _run(actions, in_passes=True)
    assert sent_in_passes == sent
    assert lost == lost_in_passes == 0
    assert by_pass == by_call


def _opened_in_a_pass(max_bytes: int = 1 << 20) -> tuple[RowColumns, Recorder, Shell]:
    """A recorder with a connection opened inside a pass that is still gathering."""
    columns = RowColumns(max_rows=1000, max_bytes=max_bytes)
    recorder = Recorder(columns, snaplen=65536)
    shell = Shell(recorder)
    recorder.begin_pass()
    shell.open()
    return columns, recorder, shell


def test_a_re_send_in_the_same_pass_leaves_the_first_sends_row_with_its_own_id():
    columns, recorder, shell = _opened_in_a_pass()
    shell.client_sends(
        _padded(request_frame(ApiKey.METADATA, 7, 0), 3000), request_frame(ApiKey.METADATA, 8, 1)
    )
    shell.broker_answers(response_frame(1, 1))  # the answer to upstream 0 is lost: re-sent as 2
    assert [int.from_bytes(frame[8:12], "big") for frame in shell.sent] == [0, 1, 2]
    assert columns.accepted == 0
    recorder.end_pass()
    upstream = [row for row in rows_of(columns) if (row["side"], row["direction"]) == ("upstream", "request")]
    assert [row["upstream_correlation_id"] for row in upstream] == [0, 1, 2]
    assert [int.from_bytes(row["frame"][8:12], "big") for row in upstream] == [0, 1, 2]
    assert [len(row["frame"]) for row in upstream] == [3000, len(request_frame(ApiKey.METADATA, 8, 1)), 3000]


def test_a_call_that_fails_inside_a_pass_loses_its_rows_and_keeps_the_pass_earlier_ones(monkeypatch):
    columns, recorder, shell = _opened_in_a_pass()
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0))

    def broken(self, *args):
        raise RuntimeError("a bug in recording")

    monkeypatch.setattr(Recorder, "_upstream_response", broken)
    shell.broker_answers(response_frame(0, 0))
    recorder.end_pass()
    assert columns.lost == 2
    rows = rows_of(columns)
    assert [(row["kind"], row["side"], row["direction"]) for row in rows] == [
        ("open", None, None),
        ("frame", "client", "request"),
        ("frame", "upstream", "request"),
    ]


def test_a_pass_whose_end_fails_is_over_all_the_same(monkeypatch):
    """Else the recorder would stay in the pass: the calls after it gathered, not queued."""
    columns, recorder, shell = _opened_in_a_pass()

    def broken() -> None:
        raise RuntimeError("a bug in queueing")

    monkeypatch.setattr(recorder, "_queue_runs", broken)
    with pytest.raises(RuntimeError):  # the engine logs it and goes on
        recorder.end_pass()
    assert not recorder.in_pass and recorder.passes_ended == 1
    monkeypatch.undo()
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0))
    assert columns.accepted == 3  # outside a pass: queued at once, with the open row held before


def test_rows_queued_before_the_queue_fails_are_not_counted_lost_as_well(monkeypatch):
    """The queue takes the rows that fit and counts the others, then fails (its warning): each
    row is queued or counted lost, once, not the whole call counted lost on top."""
    columns = RowColumns(max_rows=3, max_bytes=1 << 20)
    recorder = Recorder(columns, snaplen=65536)
    shell = Shell(recorder)
    shell.open()

    failures = [RuntimeError("a bug in warning")]

    def fails_once() -> None:
        if failures:
            raise failures.pop()

    monkeypatch.setattr(columns, "_maybe_warn", fails_once)
    shell.client_sends(request_frame(ApiKey.METADATA, 7, 0), request_frame(ApiKey.METADATA, 8, 1))
    assert not failures
    assert (columns.accepted, columns.lost) == (3, 2)  # five rows: the open row and four frames
    assert columns.lost_by_kind == {"frame": 2}
    rows = rows_of(columns)
    assert [(row["side"], row["client_correlation_id"]) for row in rows] == [
        (None, None),
        ("client", 7),
        ("client", 8),
    ]


def test_a_pass_keeping_big_frames_alive_queues_its_rows_early():
    """A stored piece of a frame keeps the whole frame: past HELD_BYTES of them, a pass's rows
    are queued at once instead of at its end."""
    columns, recorder, shell = _opened_in_a_pass(max_bytes=1 << 24)
    shell.client_sends(request_frame(ApiKey.FETCH, 7, 0))
    assert columns.accepted == 0
    shell.broker_answers(_padded(response_frame(0, 0), HELD_BYTES))
    assert columns.accepted == 5  # open, the request on both sides, the answer on both sides
    recorder.end_pass()
    rows = rows_of(columns)
    assert [len(row["frame"]) for row in rows if row["kind"] == "frame"][-2:] == [65536, SHARED_HEAD]


def _head_holds_it(frame: bytes, api_key: int) -> bool:
    """The rule for sharing a client request's bytes, read the long way: a full header parse
    of the first SHARED_HEAD bytes and, for Produce, the acks found there."""
    head = memoryview(frame)[:SHARED_HEAD]
    try:
        header = parse_request_header(head)
        if header.body_offset is None:
            return False
        if api_key == ApiKey.PRODUCE:
            produce_acks(head, header)
    except (ProtocolError, ValueError, struct.error):
        return False
    return True


_name = st.one_of(st.none(), st.integers(0, 700).map(lambda n: "c" * n))


@st.composite
def _requests(draw) -> bytes:
    if draw(st.booleans()):
        version = draw(st.integers(3, 11))
        frame, _ = produce_frame(
            version,
            transactional_id=draw(st.one_of(st.none(), st.integers(0, 600).map(lambda n: "t" * n))),
            acks=draw(st.sampled_from([-1, 0, 1])),
            client_id=draw(_name),
        )
        return bytes(frame)
    request = MetadataRequest[draw(st.sampled_from([4, 9, 12]))](topics=None)  # header v1 and v2
    return encode_request(request, correlation_id=5, client_id=draw(_name))


@settings(max_examples=300, deadline=None)
@given(st.lists(_requests(), min_size=1, max_size=6), st.data())
def test_whether_a_head_is_enough_is_read_as_a_full_parse_would(frames, data):
    headers = RequestHeaderReader()  # one connection's reader, its remembered shape changing
    for frame in frames:
        cut = data.draw(st.sampled_from([len(frame), 600, 511, 40, 13]))  # whole, or cut short
        head = frame[: min(cut, HEADER_COPY)]
        api_key = int.from_bytes(frame[4:6], "big")
        assert _head_is_enough(headers, head, api_key) == _head_holds_it(head, api_key)


@pytest.mark.parametrize("version", [4, 12])
def test_a_header_that_ends_at_the_heads_last_byte_is_enough(version):
    headers = RequestHeaderReader()
    seen = set()
    for length in range(480, 520):
        frame = encode_request(
            MetadataRequest[version](topics=None), correlation_id=5, client_id="c" * length
        )
        enough = _head_is_enough(headers, frame[:HEADER_COPY], ApiKey.METADATA)
        assert enough == _head_holds_it(frame, ApiKey.METADATA)
        seen.add(enough)
    assert seen == {True, False}
