"""The connection core without sockets or trio: bytes and ``now`` in, decisions out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corrfix.core import (
    CLOSE_GRACE,
    FLUSH_TIMEOUT,
    HEADER_COPY,
    Answered,
    ConnectionConfig,
    ConnectionCore,
    Forwarded,
    Notice,
    Received,
    RepairConfig,
    Repaired,
    RepairKind,
    RepairMachine,
    RoutingError,
    Sent,
)
from protocol import ApiKey
from protocol.testing import request_frame, response_frame

CONFIG = ConnectionConfig(
    repair=RepairConfig(probe_after=1.0, request_deadline=30.0),
    frame_timeout=5.0,
    close_linger=2.0,
    idle_timeout=60.0,
    max_send_buffer=1000,
)


def make_core(config: ConnectionConfig = CONFIG, **options) -> ConnectionCore:
    return ConnectionCore(config, RepairMachine(config.repair), 0.0, **options)


def notices(core: ConnectionCore) -> list[str]:
    return [event.message for event in core.take_events() if isinstance(event, Notice)]


def test_a_request_goes_upstream_under_the_proxys_id_and_its_answer_comes_back_under_the_clients():
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 500, 7), 1.0)
    (sent,) = core.take_upstream()
    assert int.from_bytes(sent[8:12], "big") == 0
    assert core.take_events() == [Forwarded(500, 0, ApiKey.METADATA, 0)]
    core.receive_upstream(response_frame(0, 7), 1.5)
    assert core.take_client() == [response_frame(500, 7)]
    assert core.take_events() == [Answered(ApiKey.METADATA, 500, 0, 0.5)]


def test_forwarded_events_without_answered_ones_for_a_capture_without_metrics():
    core = ConnectionCore(CONFIG, RepairMachine(CONFIG.repair, flow_events=True, answer_events=False), 0.0)
    core.receive_client(request_frame(ApiKey.METADATA, 500, 7), 1.0)
    assert core.take_events() == [Forwarded(500, 0, ApiKey.METADATA, 0)]
    core.receive_upstream(response_frame(0, 7), 1.5)
    assert core.take_client() == [response_frame(500, 7)]
    assert core.take_events() == []


def test_bytes_split_anywhere_make_the_same_frames():
    frame = request_frame(ApiKey.METADATA, 1, 1)
    core = make_core()
    for i in range(len(frame)):
        core.receive_client(frame[i : i + 1], 1.0)
    assert len(core.take_upstream()) == 1


def test_a_client_end_of_stream_with_nothing_owed_ends_the_brokers_stream_then_waits_the_linger():
    core = make_core()
    core.receive_client(request_frame(ApiKey.PRODUCE, 1, 1, acks=0), 1.0)
    core.receive_client(b"", 2.0)
    assert core.client_eof and core.stop_client and core.end_upstream
    assert not core.end_client and not core.aborted
    assert core.next_deadline() == 2.0 + CONFIG.repair.request_deadline  # the broker must take them
    core.upstream_flushed(3.0)
    assert core.next_deadline() == 3.0 + CONFIG.close_linger
    core.tick(3.0 + CONFIG.close_linger)
    assert notices(core) == ["broker kept its side open after the proxy's end of stream"]
    assert core.stop_upstream and core.end_client and core.close_reason == "client closed"


def test_a_client_end_of_stream_waits_for_what_it_is_owed():
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 9, 1), 1.0)
    core.receive_client(b"", 1.1)
    assert not core.end_upstream  # the answer is still owed
    core.receive_upstream(response_frame(0, 1), 1.2)
    assert core.take_client() == [response_frame(9, 1)]
    assert core.end_upstream


def test_a_broker_that_never_takes_the_requests_gets_the_request_deadline():
    core = make_core()
    core.receive_client(request_frame(ApiKey.PRODUCE, 1, 1, acks=0), 1.0)
    core.receive_client(b"", 1.0)
    core.take_events()
    core.tick(1.0 + CONFIG.repair.request_deadline)
    assert notices(core) == ["broker did not take every request before the request deadline"]
    assert core.end_client and core.stop_upstream


def test_a_lost_client_gets_nothing_more_but_its_requests_still_reach_the_broker():
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 1, 1), 1.0)
    core.client_lost("client connection lost: reset", 1.5)
    assert core.abandon_client and core.stop_client and core.end_upstream
    assert len(core.take_upstream()) == 1
    core.receive_upstream(response_frame(0, 1), 2.0)
    assert core.take_client() == []
    assert core.close_reason == "client connection lost: reset"


def test_nothing_follows_the_brokers_end_of_stream_after_a_client_is_lost():
    """A lost client ends the broker's stream at once, with answers still owed: a probe or a
    re-send after it cannot be sent (the engine drops it, trio's outbox keeps it), and would
    only follow the end of stream. The machine stops repairing once the client is gone."""
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 1, 1) + request_frame(ApiKey.METADATA, 2, 2), 1.0)
    assert len(core.take_upstream()) == 2
    core.client_lost("client connection lost: reset", 1.5)
    core.upstream_flushed(1.5)
    for now in (2.0, 2.5, 4.0, 9.0):
        core.tick(now)
        assert core.take_upstream() == []
    core.receive_upstream(response_frame(1, 2), 9.5)  # the first answer lost: no re-send either
    assert core.take_upstream() == []
    assert core.take_client() == []


def test_a_stalled_request_frame_closes_the_client_but_backpressure_does_not_age_it():
    frame = request_frame(ApiKey.METADATA, 1, 1)
    core = make_core()
    core.receive_client(frame[:5], 1.0)
    assert core.next_deadline() == 1.0 + CONFIG.frame_timeout
    core.pause_client()
    core.tick(1.0 + CONFIG.frame_timeout)
    assert not core.client_gone
    assert core.next_deadline() == 1.0 + CONFIG.idle_timeout
    core.tick(50.0)
    assert not core.client_gone
    core.resume_client(50.0)
    core.tick(50.0 + CONFIG.frame_timeout)
    assert core.client_gone and core.close_reason == f"request frame incomplete for {CONFIG.frame_timeout:g}s"


@pytest.mark.parametrize("stop", ["drain", "client_eof", "finish"])
def test_a_request_frame_left_incomplete_once_reading_stops_is_not_the_clients_stall(stop):
    """The proxy stops reading the client (SIGTERM's drain, its end of stream, a close the
    proxy decided) while a request frame is half in: that frame cannot complete now, so it
    cannot close the client as stalled, and the answer still owed is delivered."""
    core = make_core()
    second = request_frame(ApiKey.METADATA, 2, 2)
    core.receive_client(request_frame(ApiKey.METADATA, 1, 1) + second[:10], 1.0)
    (sent,) = core.take_upstream()
    if stop == "drain":
        core.drain(2.0)
    elif stop == "client_eof":
        core.receive_client(b"", 2.0)
    else:
        core.finish("proxy closing", 2.0)
    core.tick(1.0 + CONFIG.frame_timeout)
    assert not core.client_gone and not core.abandon_client
    core.receive_upstream(response_frame(int.from_bytes(sent[8:12], "big"), 1), 7.0)
    assert core.take_client() == [response_frame(1, 1)]


def test_an_idle_connection_finishes_but_an_outstanding_request_is_not_idleness():
    core = make_core(
        ConnectionConfig(repair=RepairConfig(probe_after=1000.0, request_deadline=1e6), idle_timeout=60.0)
    )
    core.receive_client(request_frame(ApiKey.FETCH, 1, 1), 0.0)
    core.tick(60.0)
    assert not core.end_client  # a long poll
    core.receive_upstream(response_frame(0, 1), 100.0)
    core.tick(160.0)
    assert core.end_client and core.close_reason == "idle for 60s"


def test_a_closing_connection_that_cannot_deliver_in_time_is_aborted():
    core = make_core()
    core.finish("proxy draining", 1.0)
    assert core.end_client and not core.aborted
    core.tick(core.next_deadline())
    assert core.aborted


def test_a_client_lost_while_the_proxy_delivers_its_last_answers_ends_the_connection_at_once():
    """The proxy decided to close (here an idle connection) and the client vanished while the
    last bytes went out: nothing is left to deliver, so the connection ends as soon as the
    broker's side is settled, not at the flush deadline, as finish() decides for a client
    gone before it."""
    core = make_core()
    core.tick(CONFIG.idle_timeout)
    assert core.end_client and core.end_upstream and not core.aborted
    core.client_lost("client connection lost while sending: reset", CONFIG.idle_timeout + 0.1)
    assert not core.aborted  # the broker's side is still ending
    core.upstream_flushed(CONFIG.idle_timeout + 0.1)
    core.receive_upstream(b"", CONFIG.idle_timeout + 0.2)
    assert core.aborted and core.close_reason == "idle for 60s"


def _given_up(deadline: float = 3.0, **options) -> ConnectionCore:
    """A core that gave up on a Metadata left unanswered from 1.0 for ``deadline``, with an
    acks=0 Produce read after it."""
    config = ConnectionConfig(
        repair=RepairConfig(probe_after=1000.0, request_deadline=deadline),
        close_linger=2.0,
        idle_timeout=600.0,
    )
    core = make_core(config, **options)
    core.receive_client(request_frame(ApiKey.METADATA, 1, 1), 1.0)
    core.receive_client(request_frame(ApiKey.PRODUCE, 2, 2, acks=0), 1.5)
    assert len(core.take_upstream()) == 2
    core.tick(1.0 + deadline)
    assert core.machine.closed is not None and core.end_client
    return core


@pytest.mark.parametrize("settles", ["broker closes", "linger passes", "broker is lost"])
def test_after_a_give_up_the_brokers_stream_ends_and_the_connection_waits_for_it(settles):
    """A give-up ends the broker's stream as every close does: the half-close after every
    request read, then the broker read (its answers dropped) until it closes or the linger
    passes. Closing it with requests still queued, or unread bytes, could lose them."""
    core = _given_up()
    assert core.end_upstream and not core.upstream_settled and not core.aborted
    core.upstream_flushed(5.0)
    assert core.next_deadline() == 5.0 + 2.0  # the linger
    core.receive_upstream(response_frame(0, 1), 5.5)  # too late: the machine drops it
    assert core.take_client() == [] and not core.upstream_settled
    if settles == "broker closes":
        core.receive_upstream(b"", 6.0)
    elif settles == "linger passes":
        core.tick(5.0 + 2.0)
    else:
        core.upstream_lost("reset", 6.0)
    assert core.upstream_settled and core.stop_upstream and not core.aborted
    assert core.close_reason.startswith("gave up on Metadata request")


def test_after_a_give_up_a_broker_that_stops_reading_holds_the_connection_for_the_flush_limit_only():
    core = _given_up(deadline=300.0)
    assert core.next_deadline() == 301.0 + FLUSH_TIMEOUT  # not the request deadline
    core.take_events()
    core.tick(301.0 + FLUSH_TIMEOUT)
    assert notices(core) == ["broker did not take every request before the close's time limit"]
    assert core.upstream_settled and core.aborted


def test_a_give_up_after_the_client_is_gone_ends_the_connection_once_the_broker_closes():
    core = _given_up()
    core.client_lost("client connection lost: reset", 4.5)
    assert not core.aborted
    core.upstream_flushed(4.6)
    core.receive_upstream(b"", 4.7)
    assert core.aborted


def test_a_tls_broker_is_settled_once_everything_is_sent_after_a_give_up():
    """TLS cannot half-close: close_notify ends both directions, so there is no close to wait for."""
    core = _given_up(upstream_tls=True)
    assert not core.upstream_settled
    core.upstream_flushed(5.0)
    assert core.upstream_settled and not core.aborted


def test_drain_stops_reading_and_ends_the_broker_stream_once_nothing_is_owed():
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 3, 1), 1.0)
    core.drain(2.0)
    assert core.stop_client and not core.end_upstream
    core.receive_upstream(response_frame(0, 1), 2.5)
    assert core.end_upstream and core.close_reason == "proxy draining"


def test_a_tls_client_hello_on_plaintext_names_tls():
    core = make_core()
    core.receive_client(bytes.fromhex("16030100f4010000f00303"), 1.0)
    assert core.client_gone
    assert core.close_reason is not None and "TLS handshake on a plaintext listener" in core.close_reason


def test_a_broker_that_closes_silently_is_hinted_to_be_tls_unless_it_answered_before():
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 1, 1), 1.0)
    core.take_events()
    core.receive_upstream(b"", 1.1)
    assert notices(core) == ["upstream closed before answering anything"]
    known = make_core(upstream_known_plaintext=lambda: True)
    known.receive_client(request_frame(ApiKey.METADATA, 1, 1), 1.0)
    known.take_events()
    known.receive_upstream(b"", 1.1)
    assert notices(known) == ["upstream closed before answering anything on this connection"]


def test_garbage_from_the_broker_ends_the_connection_as_a_broker_close_does():
    """Nothing more is read from the broker; the client gets what is ready, then the close."""
    core = make_core()
    core.receive_client(request_frame(ApiKey.PRODUCE, 100, 0), 1.0)
    core.take()
    core.receive_upstream(b"\xff\xff\xff\xff", 1.1)
    assert core.stop_upstream and core.end_client and not core.aborted
    assert core.close_reason is not None and "bad response from upstream" in core.close_reason
    assert core.machine.closed is not None
    repairs = [event for event in core.take_events() if isinstance(event, Repaired)]
    assert [event.kind for event in repairs] == [RepairKind.POSSIBLE_DUPLICATE]  # the Produce left unanswered


def test_an_answer_naming_a_broker_the_proxy_cannot_stand_in_for_says_so():
    """A misconfiguration (a fixed port already taken, more brokers than listeners), not a
    broker's fault: the close reason must send the operator to the settings."""

    def no_listener(api_key: int, api_version: int, frame: bytearray) -> bytearray:
        raise RoutingError("broker node id 2's port 19092 is already a proxy listener")

    core = ConnectionCore(CONFIG, RepairMachine(CONFIG.repair, transform=no_listener), 0.0)
    core.receive_client(request_frame(ApiKey.METADATA, 100, 0), 1.0)
    core.take()
    core.receive_upstream(response_frame(0, 0), 1.1)
    assert core.take_client() == []
    assert core.close_reason == (
        "no proxy listener for a broker the answer names: "
        "broker node id 2's port 19092 is already a proxy listener"
    )


SHORT_FRAME = (2).to_bytes(4, "big") + b"\x00\x03"
"""A frame too short for any header: a malformed request or answer."""


def test_requests_read_before_a_malformed_one_still_reach_the_broker():
    core = make_core()
    good = [request_frame(ApiKey.METADATA, 100 + i, i) for i in range(2)]
    core.receive_client(b"".join(good) + SHORT_FRAME, 1.0)
    sent = core.take_upstream()
    assert [int.from_bytes(frame[8:12], "big") for frame in sent] == [0, 1]
    assert core.client_gone and core.end_upstream
    assert core.close_reason is not None and "bad request from client" in core.close_reason


BAD_SIZE = (-1).to_bytes(4, "big", signed=True)
"""A size prefix no frame can have: the stream cannot be framed past it."""


def test_requests_read_before_a_bad_size_prefix_still_reach_the_broker():
    core = make_core()
    good = [request_frame(ApiKey.METADATA, 100 + i, i) for i in range(2)]
    core.receive_client(b"".join(good) + BAD_SIZE, 1.0)
    assert [int.from_bytes(frame[8:12], "big") for frame in core.take_upstream()] == [0, 1]
    assert core.client_gone and core.end_upstream
    assert core.close_reason is not None and "frame size -1" in core.close_reason


@pytest.mark.parametrize("bad", [SHORT_FRAME, BAD_SIZE], ids=["short frame", "bad size"])
def test_answers_read_before_a_malformed_one_are_delivered_before_the_close(bad):
    core = make_core()
    for i in range(2):
        core.receive_client(request_frame(ApiKey.METADATA, 100 + i, i), 1.0)
    core.take_upstream()
    core.receive_upstream(bytes(response_frame(0, 0)) + bad, 1.2)
    assert core.take_client() == [response_frame(100, 0)]
    assert core.end_client and core.stop_upstream
    assert core.close_reason is not None and "bad response from upstream" in core.close_reason


def test_a_held_answer_freed_in_the_read_that_holds_a_malformed_frame_is_delivered():
    core = make_core()
    for i in range(2):
        core.receive_client(request_frame(ApiKey.METADATA, 100 + i, i), 1.0)
    core.take()
    core.receive_upstream(response_frame(1, 1), 1.1)  # 0's answer lost: re-sent as 2, 1's held
    core.take()
    core.receive_upstream(bytes(response_frame(2, 0)) + SHORT_FRAME, 1.2)
    assert core.take_client() == [response_frame(100, 0), response_frame(101, 1)]


def test_a_malformed_answer_is_the_close_reason_even_when_it_comes_with_the_last_one_owed():
    """The client had ended its stream, so the last answer would close the connection as
    ``client closed``; the malformed frame in the same read is what closes it."""
    core = make_core()
    core.receive_client(request_frame(ApiKey.METADATA, 100, 0), 1.0)
    core.take()
    core.receive_client(b"", 1.1)
    core.receive_upstream(bytes(response_frame(0, 0)) + SHORT_FRAME, 1.2)
    assert core.take_client() == [response_frame(100, 0)]
    assert core.close_reason is not None and "bad response from upstream" in core.close_reason


def test_a_recording_core_reports_what_it_received_then_what_it_sent_then_the_machines_events():
    """The order a capture writes its rows in: a frame is sent before the events about it."""
    core = ConnectionCore(CONFIG, RepairMachine(CONFIG.repair, flow_events=True), 0.0, record_frames=True)
    core.receive_client(request_frame(ApiKey.METADATA, 100, 0), 1.0)
    assert [type(event) for event in core.take_events()] == [Received, Sent, Forwarded]
    core.receive_upstream(response_frame(0, 0), 1.5)
    events = core.take_events()
    assert [type(event) for event in events] == [Received, Sent, Answered]
    assert events[1] == Sent("client", [response_frame(100, 0)])


def test_a_lost_answer_is_repaired_through_the_core():
    core = make_core()
    for i in range(2):
        core.receive_client(request_frame(ApiKey.METADATA, 100 + i, i), 1.0)
    core.take_upstream()
    core.take_events()
    core.receive_upstream(response_frame(1, 1), 1.2)  # 0's answer was lost
    kinds = [event.kind for event in core.take_events() if isinstance(event, Repaired)]
    assert kinds == [RepairKind.SKIP_DETECTED, RepairKind.REQUEUE]
    (resent,) = core.take_upstream()
    assert int.from_bytes(resent[8:12], "big") == 2


def test_backpressure_thresholds():
    core = make_core()
    assert core.client_read_allowed(999) and not core.client_read_allowed(1000)
    assert core.upstream_read_allowed(999) and not core.upstream_read_allowed(1000)


def test_the_grace_before_a_proxy_ended_stream_is_short():
    assert 0 < CLOSE_GRACE < 1


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from([ApiKey.METADATA, ApiKey.PRODUCE]), st.integers(0, 1)),
        st.tuples(st.just("answer"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("tick"), st.floats(0, 100), st.just(0)),
        st.tuples(st.just("client_eof"), st.just(0), st.just(0)),
        st.tuples(st.just("client_lost"), st.just(0), st.just(0)),
        st.tuples(st.just("flushed"), st.just(0), st.just(0)),
        st.tuples(st.just("drain"), st.just(0), st.just(0)),
        st.tuples(st.just("upstream_eof"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_decisions_only_ever_turn_on_a_lost_client_is_sent_nothing_and_ticks_keep_up(operations):
    """Nor is the broker, after its end of stream."""
    core = make_core()
    now = 0.0
    flags = (
        "stop_client",
        "abandon_client",
        "end_upstream",
        "end_client",
        "stop_upstream",
        "upstream_settled",
        "aborted",
    )
    before = dict.fromkeys(flags, False)
    token = 0
    ended = False  # the broker's stream was ended
    for op, a, b in operations:
        now += 0.5
        if op == "request" and not core.stop_client:  # a shell reads no client it stopped reading
            token += 1
            core.receive_client(request_frame(a, token, token, acks=b), now)
        elif op == "answer":
            core.receive_upstream(response_frame(a, a), now)
        elif op == "tick":
            now += a
            core.tick(now)
        elif op == "client_eof":
            core.receive_client(b"", now)
        elif op == "client_lost":
            core.client_lost("lost", now)
        elif op == "flushed" and core.end_upstream:
            core.upstream_flushed(now)
            ended = True
        elif op == "drain":
            core.drain(now)
        elif op == "upstream_eof":
            core.receive_upstream(b"", now)
        delivered = core.take_client()
        sent = core.take_upstream()
        core.take_events()
        if core.abandon_client:
            assert delivered == []
        if ended and op != "flushed":
            assert sent == [], f"sent to the broker after its end of stream, on {op}"
        for flag in flags:
            assert getattr(core, flag) or not before[flag], f"{flag} turned off after {op}"
            before[flag] = getattr(core, flag)
        if core.end_client or core.client_gone or core.aborted:  # every close ends the broker's stream
            assert core.end_upstream or core.stop_upstream, f"a close left the broker's stream open, on {op}"
        if op == "tick" and not core.aborted:
            assert core.next_deadline() > now, "a tick left a deadline that is already due"


def _grown(frame: bytes, size: int, fill: int) -> bytes:
    """``frame`` grown to ``size`` bytes of body, its size prefix set to match."""
    out = bytearray(frame) + bytes([fill]) * max(0, size - len(frame))
    out[:4] = (len(out) - 4).to_bytes(4, "big")
    return bytes(out)


def _check_received(events: list, fed: list[bytes]) -> None:
    """Each Received frame is its head as it arrived and, after it, the bytes that arrived;
    a frame sent on in the same call differs from them in its correlation id at most."""
    received = [event for event in events if isinstance(event, Received)]
    assert [len(frame) for event in received for frame in event.frames] == [len(frame) for frame in fed]
    pairs = [pair for event in received for pair in zip(event.heads, event.frames, strict=True)]
    sent = {id(frame) for event in events if isinstance(event, Sent) for frame in event.frames}
    for (head, frame), original in zip(pairs, fed, strict=True):
        assert head == original[:HEADER_COPY]
        assert bytes(frame[len(head) :]) == original[len(head) :]
        if id(frame) in sent:
            assert frame[:4] == original[:4] and frame[12:] == original[12:]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["requests", "answers"]), st.integers(1, 4), st.integers(0, 3000), st.randoms()
        ),
        max_size=25,
    )
)
def test_a_received_frame_is_changed_only_inside_its_head(steps):
    """What a capture relies on to store a forwarded frame once: the core's head copies hold
    what the machine patches, and past the head the frame is as it arrived."""
    core = make_core(record_frames=True)
    token = now = 0
    owed: list[int] = []
    for what, count, size, rnd in steps:
        now += 1
        if what == "requests":
            fed = []
            for _ in range(count):
                token += 1
                api_key = rnd.choice([ApiKey.METADATA, ApiKey.PRODUCE])
                request = request_frame(api_key, token, token, acks=rnd.choice([0, 1]))
                fed.append(_grown(request, size, token % 251))
            core.receive_client(b"".join(fed), now)
            owed += [int.from_bytes(frame[8:12], "big") for frame in core.take_upstream()]
        else:
            rnd.shuffle(owed)  # out of order, some never: held answers, re-sends, strays
            fed = [_grown(response_frame(upstream_id, upstream_id), size, 7) for upstream_id in owed[:count]]
            del owed[:count]
            if not fed:
                continue
            core.receive_upstream(b"".join(fed), now)
            owed += [int.from_bytes(frame[8:12], "big") for frame in core.take_upstream()]
        core.take_client()
        _check_received(core.take_events(), fed)
