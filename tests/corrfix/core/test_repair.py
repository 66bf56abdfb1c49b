"""The repair state machine against a reference model: the client gets exactly its own
answers, in its own order, with its own ids, or a closed connection, never a mismatch."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from corrfix.core import MAX_CORRELATION_ID, RepairConfig, RepairKind, RepairMachine
from protocol import ApiKey, ProtocolError, request_class
from protocol.testing import encode_request, encode_response, request_frame, response_frame
from tests.support.kafka_frames import join_group_request
from tests.support.produce_frames import produce_frame, record_batch
from tests.support.repair_model import (
    DELAY,
    DUPLICATE,
    LOSE,
    NORMAL,
    STRAY,
    TRANSFORMS,
    ClientRequest,
    Harness,
)

CONFIG = RepairConfig(probe_after=1.0, probe_min=0.02, max_requeues=3, request_deadline=60.0)

client_requests = st.lists(
    st.builds(
        ClientRequest,
        api_key=st.sampled_from([ApiKey.METADATA, ApiKey.PRODUCE]),
        correlation_id=st.integers(-(2**31), 2**31 - 1),
        token=st.integers(0, 2**64 - 1),
        acks=st.sampled_from([0, 1, -1]),
    ),
    min_size=1,
    max_size=25,
)
fates = st.lists(st.sampled_from([NORMAL, NORMAL, LOSE, DUPLICATE, DELAY, STRAY]), max_size=40)
# How the proxy runs the machine: flow events with capture, answer events with metrics, and
# the router's answer transform. Without answer events, in-order answers are taken inline.
settings_of_the_proxy = st.fixed_dictionaries(
    {
        "flow_events": st.booleans(),
        "answer_events": st.booleans(),
        "transform": st.sampled_from(TRANSFORMS),
    }
)


def run_interleaved(harness: Harness, requests: list[ClientRequest], data: st.DataObject) -> None:
    pending = deque(requests)
    while pending:
        step = data.draw(st.sampled_from(["send", "broker", "network", "read", "time"]))
        if step == "send" or not (harness.broker_inbox or harness.network or harness.delayed):
            if harness.machine.accepting_requests and harness.closed is None:
                harness.client_sends(pending.popleft())
            else:
                harness.drain()
                if harness.closed is not None:
                    return
                harness.client_sends(pending.popleft())
        elif step == "broker" and harness.broker_inbox:
            harness.broker_processes_one()
        elif step == "network" and (harness.network or harness.delayed):
            if not harness.network:
                harness.network.append(harness.delayed.pop(0))
            harness.network_delivers_one()
        elif step == "read" and (harness.network or harness.delayed):  # several answers in one read
            if not harness.network:
                harness.network.append(harness.delayed.pop(0))
            harness.network_delivers(data.draw(st.integers(2, 6)))
        elif step == "time":
            harness.time_passes(data.draw(st.sampled_from([0.001, 0.05, 0.5, 2.0])))
        if harness.closed is not None:
            return
    harness.drain()


@settings(max_examples=400, deadline=None)
@given(requests=client_requests, script=fates, proxy=settings_of_the_proxy, data=st.data())
def test_client_sees_only_its_own_answers_in_order(requests, script, proxy, data):
    harness = Harness(CONFIG, fates=deque(script), **proxy)
    run_interleaved(harness, requests, data)
    expected = harness.expected_answers()
    assert harness.delivered == expected[: len(harness.delivered)]
    if harness.closed is None:
        assert harness.delivered == expected
        assert harness.machine.outstanding == 0
        assert harness.machine.outstanding_bytes == 0
        assert harness.machine.held_bytes == 0
    else:
        assert RepairKind.GIVE_UP in harness.events


@settings(max_examples=200, deadline=None)
@given(requests=client_requests, proxy=settings_of_the_proxy, data=st.data())
def test_no_faults_means_no_repairs(requests, proxy, data):
    harness = Harness(CONFIG, **proxy)
    run_interleaved(harness, requests, data)
    assert harness.closed is None
    assert harness.delivered == harness.expected_answers()
    assert set(harness.events) <= {RepairKind.PROBE_SENT}


@settings(max_examples=200, deadline=None)
@given(
    requests=client_requests,
    script=st.lists(st.sampled_from([NORMAL, LOSE, DUPLICATE, DELAY, STRAY]), max_size=CONFIG.max_requeues),
    proxy=settings_of_the_proxy,
    data=st.data(),
)
def test_a_few_faults_are_always_repaired(requests, script, proxy, data):
    harness = Harness(CONFIG, fates=deque(script), **proxy)
    run_interleaved(harness, requests, data)
    assert harness.closed is None
    assert harness.delivered == harness.expected_answers()


class Recorded:
    """Hypothesis's draws, kept so that a second run can make the same choices."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.values: list[object] = []

    def draw(self, strategy: st.SearchStrategy) -> object:
        value = self.data.draw(strategy)
        self.values.append(value)
        return value


class Replayed:
    def __init__(self, values: list[object]) -> None:
        self.values = iter(values)

    def draw(self, strategy: st.SearchStrategy) -> object:
        return next(self.values)


@settings(max_examples=200, deadline=None)
@given(requests=client_requests, script=fates, transform=st.sampled_from(TRANSFORMS), data=st.data())
def test_counts_kept_by_the_machine_are_those_its_events_would_give(requests, script, transform, data):
    """Metrics without capture have the machine count requests and answers itself, instead of
    making a Forwarded and an Answered for each: the same traffic, lost answers, re-sends,
    probes and acks=0 replies included, gives the same counts and latencies both ways."""
    events_on = {"flow_events": True, "answer_events": True}
    with_events = Harness(CONFIG, fates=deque(script), transform=transform, **events_on)
    recorded = Recorded(data)
    run_interleaved(with_events, requests, recorded)  # type: ignore[arg-type]
    counting = Harness(
        CONFIG,
        fates=deque(script),
        flow_events=False,
        answer_events=False,
        transform=transform,
        count_inline=True,
    )
    run_interleaved(counting, requests, Replayed(recorded.values))  # type: ignore[arg-type]
    assert counting.delivered == with_events.delivered
    assert counting.counts.requests == with_events.counts.requests
    assert counting.counts.answers == with_events.counts.answers
    assert sum(counting.counts.requests.values()) == len(counting.sent)  # each request, once


def test_ids_are_owned_upstream_and_restored_for_the_client():
    machine = RepairMachine(CONFIG)
    actions = machine.client_frames(
        [request_frame(ApiKey.METADATA, 500, 1), request_frame(ApiKey.METADATA, -7, 2)], 0.0
    )
    assert [int.from_bytes(f[8:12], "big") for f in actions.to_upstream] == [0, 1]
    delivered = machine.upstream_frames([response_frame(0, 1), response_frame(1, 2)], 0.01).to_client
    assert [int.from_bytes(f[4:8], "big", signed=True) for f in delivered] == [500, -7]


@pytest.mark.parametrize("held", [False, True], ids=["alone", "with an answer held behind it"])
def test_a_transform_that_raises_leaves_the_state_the_general_path_leaves(held):
    """An answer the transform rejects (a malformed Metadata answer, too many brokers): the
    inline path (no answer events) must leave what _on_response leaves, which the close
    that follows reports: the request still owed, its answer never delivered."""

    def reject(api_key: int, api_version: int, frame: bytearray) -> bytearray:
        if frame[8:16] == (1).to_bytes(8, "big"):
            raise ProtocolError("malformed Metadata answer")
        return frame

    outcomes = []
    for answer_events in (False, True):  # the inline path, then _on_response's
        machine = RepairMachine(CONFIG, transform=reject, flow_events=False, answer_events=answer_events)
        machine.client_frames(
            [request_frame(ApiKey.METADATA, 70, 1), request_frame(ApiKey.PRODUCE, 71, 2)], 0.0
        )
        answers = [response_frame(0, 1)]
        if held:  # the second answer overtook the first, which was lost: its re-send is owed first
            machine.upstream_frames([response_frame(1, 2)], 0.01)
            answers = [response_frame(2, 1)]
        with pytest.raises(ProtocolError):
            machine.upstream_frames(answers, 0.02)
        owed = machine.outstanding
        closing = machine.upstream_closed()
        outcomes.append((owed, closing.close, closing.to_client, [e.kind for e in closing.events]))
    assert outcomes[0] == outcomes[1]
    owed, close, delivered, events = outcomes[0]
    assert owed == 2 and "2 requests unanswered" in close and delivered == []
    assert events == [RepairKind.POSSIBLE_DUPLICATE]  # the Produce, whether or not an answer was held


def test_skip_ahead_requeues_the_skipped_request_and_holds_the_later_answer():
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, 10, 1), request_frame(ApiKey.METADATA, 11, 2)], 0.0)
    actions = machine.upstream_frames([response_frame(1, 2)], 0.01)
    assert actions.to_client == []
    assert [int.from_bytes(f[8:12], "big") for f in actions.to_upstream] == [2]
    assert [e.kind for e in actions.repairs] == [RepairKind.SKIP_DETECTED, RepairKind.REQUEUE]
    assert machine.held_bytes > 0
    late = machine.upstream_frames([response_frame(0, 1)], 0.02)
    assert late.to_client == [] and [e.kind for e in late.repairs] == [RepairKind.STALE_DROP]
    delivered = machine.upstream_frames([response_frame(2, 1)], 0.03).to_client
    assert [int.from_bytes(f[4:8], "big") for f in delivered] == [10, 11]
    assert machine.held_bytes == 0


def test_reply_to_acks0_produce_is_dropped_and_proves_older_loss():
    machine = RepairMachine(CONFIG)
    machine.client_frames(
        [request_frame(ApiKey.METADATA, 1, 1), request_frame(ApiKey.PRODUCE, 2, 2, acks=0)], 0.0
    )
    actions = machine.upstream_frames([response_frame(1, 2)], 0.01)
    assert actions.to_client == []
    kinds = [e.kind for e in actions.repairs]
    assert kinds == [RepairKind.STALE_DROP, RepairKind.SKIP_DETECTED, RepairKind.REQUEUE]
    # With nothing older outstanding, a stray reply is simply dropped.
    machine2 = RepairMachine(CONFIG)
    machine2.client_frames([request_frame(ApiKey.PRODUCE, 5, 5, acks=0)], 0.0)
    actions2 = machine2.upstream_frames([response_frame(0, 5)], 0.01)
    assert actions2.to_client == [] and [e.kind for e in actions2.repairs] == [RepairKind.STALE_DROP]


def test_probe_finds_a_lost_answer_with_one_request_in_flight():
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, 9, 1)], 0.0)
    assert machine.next_deadline() == pytest.approx(CONFIG.probe_after)
    assert machine.tick(0.5).to_upstream == []
    probe = machine.tick(CONFIG.probe_after).to_upstream
    assert len(probe) == 1 and int.from_bytes(probe[0][4:6], "big") == 18
    probe_id = int.from_bytes(probe[0][8:12], "big")
    actions = machine.upstream_frames([response_frame(probe_id, 0)], 1.01)
    kinds = [e.kind for e in actions.repairs]
    assert kinds == [RepairKind.SKIP_DETECTED, RepairKind.REQUEUE, RepairKind.PROBE_FOUND_LOSS]
    resent_id = int.from_bytes(actions.to_upstream[0][8:12], "big")
    delivered = machine.upstream_frames([response_frame(resent_id, 1)], 1.02).to_client
    assert [int.from_bytes(f[4:8], "big") for f in delivered] == [9]


def test_no_probe_before_the_first_request_past_the_sasl_preamble():
    """A SASL broker takes one ApiVersions before SaslHandshake; a probe would be a second."""
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(18, 1, 0)], 0.0)
    assert machine.next_deadline() == pytest.approx(CONFIG.request_deadline)  # only the give-up
    assert machine.tick(10 * CONFIG.probe_after).to_upstream == []
    machine.client_frames([request_frame(ApiKey.METADATA, 2, 1)], 11 * CONFIG.probe_after)
    assert machine.next_deadline() < CONFIG.request_deadline  # a probe is due again


def test_a_lost_probe_answer_is_counted_but_not_resent():
    """Every answer the link loses is accounted for, the probe's own included."""
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, 9, 1)], 0.0)
    first_probe = machine.tick(CONFIG.probe_after).to_upstream[0]
    first_probe_id = int.from_bytes(first_probe[8:12], "big")
    second_probe = machine.tick(10 * CONFIG.probe_after).to_upstream[0]
    second_probe_id = int.from_bytes(second_probe[8:12], "big")
    # The request's and the first probe's answers were lost; the second probe's arrives.
    actions = machine.upstream_frames([response_frame(second_probe_id, 0)], 10.01 * CONFIG.probe_after)
    skips = [e for e in actions.repairs if e.kind == RepairKind.SKIP_DETECTED]
    assert [(e.api_key, e.upstream_correlation_id) for e in skips] == [
        (ApiKey.METADATA, 0),
        (18, first_probe_id),
    ]
    assert len(actions.to_upstream) == 1  # only the request is re-sent


def test_no_probe_while_nothing_is_owed_to_the_client():
    """A probe outlived the slow answer it was sent for: probing again could only find the
    probe's own answer lost, and after a client leaves it would follow the broker's EOF."""
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, 9, 1)], 0.0)
    assert len(machine.tick(CONFIG.probe_after).to_upstream) == 1
    delivered = machine.upstream_frames([response_frame(0, 1)], CONFIG.probe_after + 0.001).to_client
    assert len(delivered) == 1 and machine.outstanding == 0
    assert machine.next_deadline() is None
    assert machine.tick(100 * CONFIG.probe_after).to_upstream == []


def test_probe_timeout_adapts_to_observed_latency():
    machine = RepairMachine(CONFIG)
    now = 0.0
    for i in range(20):
        machine.client_frames([request_frame(ApiKey.METADATA, i, i)], now)
        machine.upstream_frames([response_frame(i, i)], now + 0.002)
        now += 0.01
    machine.client_frames([request_frame(ApiKey.METADATA, 99, 99)], now)
    deadline = machine.next_deadline()
    assert deadline is not None
    assert deadline - now == pytest.approx(CONFIG.probe_min, abs=0.01)


def test_the_probe_timer_takes_one_sample_per_batch_of_answers():
    """Like TCP timing one segment per round trip: the first answer of a batch that was sent
    once; answers read together share their round trip."""
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, i, i) for i in range(3)], 0.0)
    machine.upstream_frames([response_frame(i, i) for i in range(3)], 0.1)
    machine.client_frames([request_frame(ApiKey.METADATA, 3, 3)], 0.2)
    # One sample of 0.1 s: smoothed 0.1, variation 0.05, so the probe is due 0.3 s after the
    # send (three samples would have narrowed the variation to 0.028).
    assert machine.next_deadline() == pytest.approx(0.2 + 0.1 + 4 * 0.05)


def test_each_api_key_is_timed_even_when_its_answers_come_behind_anothers():
    """One sample per api key and batch: Metadata answered right behind Produce in every read
    still learns its own round trip, so its lost answer is probed for in time."""
    machine = RepairMachine(CONFIG)
    now = 0.0
    for i in range(0, 100, 2):
        machine.client_frames(
            [request_frame(ApiKey.PRODUCE, i, i), request_frame(ApiKey.METADATA, i + 1, i)], now
        )
        machine.upstream_frames([response_frame(i, i), response_frame(i + 1, i)], now + 0.005)
        now += 0.01
    machine.client_frames([request_frame(ApiKey.METADATA, 200, 200)], now)
    deadline = machine.next_deadline()
    assert deadline is not None and deadline - now == pytest.approx(CONFIG.probe_min, abs=0.01)


def test_give_up_after_max_requeues_closes_the_client():
    config = RepairConfig(max_requeues=1)
    machine = RepairMachine(config)
    machine.client_frames([request_frame(ApiKey.METADATA, 1, 1), request_frame(ApiKey.METADATA, 2, 2)], 0.0)
    first = machine.upstream_frames([response_frame(1, 2)], 0.0)  # answer to 0 skipped
    resent = int.from_bytes(first.to_upstream[0][8:12], "big")
    machine.client_frames([request_frame(ApiKey.METADATA, 3, 3)], 0.0)
    third_id = resent + 1
    actions = machine.upstream_frames([response_frame(third_id, 3)], 0.0)
    assert actions.close is not None and "gave up" in actions.close
    assert RepairKind.GIVE_UP in [e.kind for e in actions.repairs]
    assert machine.accepting_requests is False


def test_disconnect_policy_refuses_to_resend_a_non_idempotent_produce():
    machine = RepairMachine(RepairConfig(produce_policy="disconnect"))
    machine.client_frames([request_frame(ApiKey.PRODUCE, 1, 1), request_frame(ApiKey.METADATA, 2, 2)], 0.0)
    actions = machine.upstream_frames([response_frame(1, 2)], 0.0)
    assert actions.to_upstream == []
    assert actions.close is not None and "non-idempotent" in actions.close


def test_a_give_up_still_delivers_the_answers_read_with_the_answer_that_caused_it():
    """Nothing received is lost on a close: an answer that arrived in the same read as the one
    that made the machine give up, to a request the client is owed before the one given up,
    reaches the client. A probe lets the re-send of the first request overtake the second."""
    machine = RepairMachine(RepairConfig(produce_policy="disconnect"))
    machine.client_frames([request_frame(ApiKey.METADATA, 10, 1)], 0.0)  # upstream id 0
    assert len(machine.tick(CONFIG.probe_after).to_upstream) == 1  # a probe, id 1
    machine.client_frames(
        [request_frame(ApiKey.PRODUCE, 11, 2), request_frame(ApiKey.METADATA, 12, 3)], 1.0
    )  # ids 2 and 3
    (resent,) = machine.upstream_frames([response_frame(1, 0)], 1.01).to_upstream  # 0's answer lost
    resent_id = int.from_bytes(resent[8:12], "big")
    assert resent_id == 4
    # The Produce's answer was lost, and corrfix must not re-send it: it gives up on the
    # connection. The answer to the Metadata re-sent is in the same read.
    actions = machine.upstream_frames([response_frame(3, 3), response_frame(resent_id, 1)], 1.02)
    assert actions.close is not None and "non-idempotent" in actions.close
    assert [(int.from_bytes(f[4:8], "big"), f[8:16]) for f in actions.to_client] == [
        (10, (1).to_bytes(8, "big"))
    ]
    flagged = [e.client_correlation_id for e in actions.repairs if e.kind is RepairKind.POSSIBLE_DUPLICATE]
    assert flagged == [11]  # the Produce given up, whose answer the broker may have lost after appending


def test_a_give_up_still_delivers_the_answer_that_caused_it_when_it_is_owed_first():
    """The answer that proves a loss can itself be owed to the client before the request it
    proves lost (its re-send overtook that request): giving up must not drop it."""
    machine = RepairMachine(RepairConfig(produce_policy="disconnect"))
    machine.client_frames([request_frame(ApiKey.METADATA, 10, 1)], 0.0)  # upstream id 0
    assert len(machine.tick(CONFIG.probe_after).to_upstream) == 1  # a probe, id 1
    machine.client_frames([request_frame(ApiKey.PRODUCE, 11, 2)], 1.0)  # id 2
    (resent,) = machine.upstream_frames([response_frame(1, 0)], 1.01).to_upstream  # 0's answer lost
    assert int.from_bytes(resent[8:12], "big") == 3
    actions = machine.upstream_frames([response_frame(3, 1)], 1.02)  # and the Produce's too
    assert actions.close is not None and "non-idempotent" in actions.close
    assert [int.from_bytes(f[4:8], "big") for f in actions.to_client] == [10]


def test_requeue_policy_flags_a_possible_duplicate():
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.PRODUCE, 1, 1), request_frame(ApiKey.METADATA, 2, 2)], 0.0)
    actions = machine.upstream_frames([response_frame(1, 2)], 0.0)
    assert RepairKind.POSSIBLE_DUPLICATE in [e.kind for e in actions.repairs]


@pytest.mark.parametrize("producer_id", [-1, 4242])
def test_upstream_close_flags_unanswered_non_idempotent_produces(producer_id):
    """The client re-sends after the disconnect; only a producer id lets the broker de-duplicate."""
    machine = RepairMachine(CONFIG)
    produce, _ = produce_frame(7, topics=[[record_batch(producer_id)]])
    machine.client_frames([produce, request_frame(ApiKey.METADATA, 2, 2)], 0.0)
    actions = machine.upstream_closed()
    flagged = [e for e in actions.repairs if e.kind is RepairKind.POSSIBLE_DUPLICATE]
    assert actions.close is not None
    assert [e.client_correlation_id for e in flagged] == ([77] if producer_id < 0 else [])


def test_backpressure_at_max_outstanding_and_held_bytes():
    machine = RepairMachine(RepairConfig(max_outstanding=3, max_held_bytes=40))
    machine.client_frames([request_frame(ApiKey.METADATA, i, i) for i in range(2)], 0.0)
    assert machine.accepting_requests
    machine.client_frames([request_frame(ApiKey.METADATA, 2, 2)], 0.0)
    assert not machine.accepting_requests
    machine.upstream_frames([response_frame(0, 0)], 0.0)
    assert machine.accepting_requests
    big = response_frame(2, 2) + b""
    big[0:4] = (len(big) - 4 + 40).to_bytes(4, "big")
    big += bytes(40)
    machine.upstream_frames([big], 0.0)  # held behind request 1
    assert not machine.accepting_requests


def test_backpressure_at_max_outstanding_bytes():
    """Requests are kept whole until answered, for re-sending: a broker that reads eagerly
    must not make the proxy keep max_outstanding big Produces, so their bytes pause reading too,
    a lost answer's re-send included."""
    big = request_frame(ApiKey.PRODUCE, 1, 1) + bytes(100)
    big[0:4] = (len(big) - 4).to_bytes(4, "big")
    machine = RepairMachine(RepairConfig(max_outstanding=1000, max_outstanding_bytes=len(big) + 40))
    machine.client_frames([bytearray(big)], 0.0)
    assert machine.outstanding_bytes == len(big)
    assert machine.accepting_requests
    machine.client_frames([request_frame(ApiKey.METADATA, 2, 2), request_frame(ApiKey.METADATA, 3, 3)], 0.0)
    assert not machine.accepting_requests
    machine.upstream_frames([response_frame(1, 2)], 0.0)  # the Produce's answer lost: re-sent, still kept
    assert not machine.accepting_requests
    actions = machine.upstream_frames([response_frame(2, 3), response_frame(3, 1)], 0.0)
    assert not actions.repairs
    assert len(actions.to_client) == 3
    assert machine.outstanding_bytes == 0
    assert machine.accepting_requests


def test_request_deadline_gives_up():
    machine = RepairMachine(RepairConfig(request_deadline=5.0, max_probes_outstanding=1))
    machine.client_frames([request_frame(ApiKey.METADATA, 1, 1)], 0.0)
    machine.tick(1.0)  # probe sent, its answer never comes
    assert machine.next_deadline() == pytest.approx(5.0)
    actions = machine.tick(5.0)
    assert actions.close is not None and "unanswered" in actions.close


def join_group(version: int, rebalance_timeout_ms: int, session_timeout_ms: int = 10_000) -> bytearray:
    return bytearray(join_group_request(version, rebalance_timeout_ms, session_timeout_ms))


@pytest.mark.parametrize("version", range(request_class(ApiKey.JOIN_GROUP).max_version + 1))
def test_a_join_group_gets_the_request_deadline_after_its_rebalance_timeout(version):
    """The coordinator holds a JoinGroup until every member rejoins, for up to the rebalance
    timeout (``max.poll.interval.ms``, often raised to minutes); the client waits that long.
    Giving up at the plain deadline would cut a member off every rebalance that waits for a
    slow one."""
    hold = 600.0 if version >= 1 else 10.0  # v0: the session timeout is the rebalance timeout
    config = RepairConfig(request_deadline=60.0, max_probes_outstanding=1)
    machine = RepairMachine(config)
    machine.client_frames([join_group(version, rebalance_timeout_ms=600_000)], 0.0)
    assert machine.tick(1.0).to_upstream  # probing is not put off: a probe is answered after it
    assert machine.next_deadline() == pytest.approx(hold + 60.0)
    assert machine.tick(hold + 59.0).close is None
    actions = machine.tick(hold + 60.0)
    assert actions.close is not None and f"unanswered after {hold + 60.0:g}s" in actions.close


def test_a_join_group_answered_leaves_the_next_request_its_plain_deadline_from_then():
    """A broker answers in order: the request queued behind a JoinGroup that the coordinator
    held for minutes could not be served before it, so its deadline counts from the JoinGroup's
    answer. Counted from its own send, the client was cut off as the rebalance ended."""
    machine = RepairMachine(RepairConfig(request_deadline=60.0, max_probes_outstanding=0))
    (sent,) = machine.client_frames([join_group(5, rebalance_timeout_ms=300_000)], 0.0).to_upstream
    upstream_id = int.from_bytes(sent[8:12], "big")
    machine.client_frames([request_frame(ApiKey.METADATA, 8, 1)], 1.0)
    assert machine.next_deadline() == pytest.approx(360.0)
    machine.upstream_frames([response_frame(upstream_id, 0)], 200.0)
    assert machine.next_deadline() == pytest.approx(260.0)
    assert machine.tick(200.0).close is None
    assert machine.tick(259.0).close is None
    actions = machine.tick(260.0)
    assert actions.close is not None and "unanswered 60s after the answer before it" in actions.close


def test_the_deadline_of_a_request_sent_after_the_answer_before_it_counts_from_its_send():
    machine = RepairMachine(RepairConfig(request_deadline=60.0, max_probes_outstanding=0))
    machine.client_frames([request_frame(ApiKey.METADATA, 1, 1)], 0.0)
    machine.upstream_frames([response_frame(0, 1)], 5.0)
    machine.client_frames([request_frame(ApiKey.METADATA, 2, 2)], 10.0)
    assert machine.next_deadline() == pytest.approx(70.0)
    assert "unanswered after 60s" in (machine.tick(70.0).close or "")


def test_an_unreadable_join_group_gets_the_plain_deadline():
    frame = join_group(5, rebalance_timeout_ms=300_000)[:-6]
    frame[:4] = (len(frame) - 4).to_bytes(4, "big")
    machine = RepairMachine(RepairConfig(request_deadline=60.0, max_probes_outstanding=0))
    machine.client_frames([frame], 0.0)
    assert machine.next_deadline() == pytest.approx(60.0)


def test_upstream_close_closes_the_client_after_delivering_what_it_can():
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, 1, 1), request_frame(ApiKey.METADATA, 2, 2)], 0.0)
    machine.upstream_frames([response_frame(0, 1)], 0.0)
    actions = machine.upstream_closed()
    assert actions.close == "upstream closed with 1 requests unanswered"


def test_upstream_ids_wrap_at_int32_and_skip_ids_in_use():
    machine = RepairMachine(CONFIG)
    machine._next_upstream_id = MAX_CORRELATION_ID
    ids = [
        int.from_bytes(f[8:12], "big")
        for f in machine.client_frames(
            [request_frame(ApiKey.METADATA, i, i) for i in range(3)], 0.0
        ).to_upstream
    ]
    assert ids == [MAX_CORRELATION_ID, 0, 1]


def test_after_wrapping_ids_still_awaiting_an_answer_are_skipped():
    machine = RepairMachine(CONFIG)
    machine.client_frames([request_frame(ApiKey.METADATA, i, i) for i in range(3)], 0.0)  # ids 0, 1, 2
    machine._next_upstream_id = MAX_CORRELATION_ID
    ids = [
        int.from_bytes(f[8:12], "big")
        for f in machine.client_frames(
            [request_frame(ApiKey.METADATA, i, i) for i in range(3, 6)], 0.0
        ).to_upstream
    ]
    assert ids == [MAX_CORRELATION_ID, 3, 4]


def sasl_handshake(correlation_id: int, mechanism: str) -> bytearray:
    return bytearray(encode_request(SaslHandshakeRequest[0](mechanism=mechanism), correlation_id, "c"))


def sasl_handshake_answer(correlation_id: int, error_code: int = 0) -> bytearray:
    answer = SaslHandshakeResponse[0](error_code=error_code, mechanisms=["PLAIN", "SCRAM-SHA-256"])
    return bytearray(encode_response(answer, correlation_id))


def raw(data: bytes) -> bytearray:
    return bytearray(len(data).to_bytes(4, "big") + data)


@pytest.mark.parametrize(("mechanism", "rounds"), [("PLAIN", 1), ("SCRAM-SHA-256", 2), ("SCRAM-SHA-512", 2)])
def test_sasl_v0_tokens_pass_untouched_then_tracking_resumes(mechanism, rounds):
    machine = RepairMachine(CONFIG)
    machine.client_frames([sasl_handshake(7, mechanism)], 0.0)
    delivered = machine.upstream_frames([sasl_handshake_answer(0)], 0.01).to_client
    assert int.from_bytes(delivered[0][4:8], "big") == 7
    assert machine.raw_mode and machine.next_deadline() is None  # never probe mid-exchange
    for i in range(rounds):
        token = raw(b"Bob\x00secret" + bytes([i]))  # would parse as a ListTransactions header
        assert machine.client_frames([token], 0.02).to_upstream == [token]
        reply = raw(b"server-token-%d" % i)
        assert machine.upstream_frames([reply], 0.03).to_client == [reply]
    assert not machine.raw_mode
    sent = machine.client_frames([request_frame(ApiKey.METADATA, 8, 8)], 0.04).to_upstream
    assert int.from_bytes(sent[0][8:12], "big") == 1  # tracked again, with a proxy id
    assert machine.upstream_frames([response_frame(1, 8)], 0.05).to_client[0][4:8] == (8).to_bytes(4, "big")


def test_an_answer_lost_before_a_re_authentication_is_not_re_sent_into_it():
    """KIP-368: a client re-authenticates on a live connection, and answers to requests sent
    before its SaslHandshake may still be owed. Once the broker has the SaslHandshake it takes
    only SaslAuthenticate: a re-send makes it close the connection and count a failed
    authentication. The handshake's answer cannot be delivered before the lost one either, so
    the machine gives up at once, re-sending nothing."""
    machine = RepairMachine(CONFIG)
    handshake = bytearray(encode_request(SaslHandshakeRequest[1](mechanism="PLAIN"), 2, "c"))
    machine.client_frames([request_frame(ApiKey.METADATA, 1, 1), handshake], 0.0)
    answer = SaslHandshakeResponse[1](error_code=0, mechanisms=["PLAIN"])
    actions = machine.upstream_frames([bytearray(encode_response(answer, 1))], 0.01)  # Metadata's answer lost
    assert actions.to_upstream == [] and actions.to_client == []
    assert actions.close is not None and "SASL exchange" in actions.close
    assert [e.kind for e in actions.repairs] == [RepairKind.SKIP_DETECTED, RepairKind.GIVE_UP]


def test_failed_sasl_v0_handshake_does_not_enter_raw_mode():
    machine = RepairMachine(CONFIG)
    machine.client_frames([sasl_handshake(7, "PLAIN")], 0.0)
    machine.upstream_frames([sasl_handshake_answer(0, error_code=33)], 0.01)
    assert not machine.raw_mode


def test_sasl_v0_with_an_open_ended_mechanism_stays_a_plain_relay():
    machine = RepairMachine(CONFIG)
    machine.client_frames([sasl_handshake(7, "GSSAPI")], 0.0)
    machine.upstream_frames([sasl_handshake_answer(0)], 0.01)
    for i in range(5):
        token = raw(b"kerberos-%d" % i)
        assert machine.client_frames([token], 0.02).to_upstream == [token]
        assert machine.upstream_frames([raw(b"reply")], 0.03).to_client == [raw(b"reply")]
    assert machine.raw_mode and machine.outstanding == 0
