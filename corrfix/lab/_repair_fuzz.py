"""Random and damaged input for a RepairMachine, with its invariants checked after every call.

The reference model (``repair_model.py``) drives the machine with well-formed frames and
an honest-but-lossy broker. Here the client also sends damaged real frames, noise and
short frames, the broker also sends stray ids, duplicates, out-of-order and truncated
answers, and time jumps arbitrarily. After every call the machine's bookkeeping must be
consistent, the only error may be :class:`protocol.ProtocolError` for a frame the wire
layer itself rejects, and every answer the client gets must be the right one, in its
order. A final honest phase then checks that whatever the machine still owes is
delivered or the connection closed: nothing hangs.

All randomness comes from a ``random.Random``, so hypothesis (``st.randoms()``) and the
bench's seeded loop drive the same code.
"""

from __future__ import annotations

import itertools
import random
from collections import deque

from kafka.protocol.sasl import SaslHandshakeRequest

from corrfix.core import MAX_CORRELATION_ID, Actions, RepairConfig, RepairMachine
from corrfix.core._repair import MAX_ACKS0_MARKERS, _Probe, _Request
from protocol import ApiKey, ProtocolError, RequestHeader, parse_request_header, produce_acks
from protocol.testing import encode_request, mutate, request_frame, request_seeds

HEAL_STEPS = 2000
"""Honest-phase steps: enough to answer every request several times over."""


def random_config(rnd: random.Random) -> RepairConfig:
    return RepairConfig(
        probe_after=rnd.choice([0.05, 1.0]),
        probe_min=0.01,
        max_requeues=rnd.randint(0, 3),
        request_deadline=rnd.choice([2.0, 60.0]),
        max_outstanding=rnd.choice([3, 1000]),
        max_outstanding_bytes=rnd.choice([64, 1 << 20]),
        max_held_bytes=rnd.choice([64, 1 << 20]),
        produce_policy=rnd.choice(["requeue", "disconnect"]),
        max_probes_outstanding=rnd.randint(1, 4),
    )


class FuzzHarness:
    """One machine, a client that may send anything and a broker that may answer anything."""

    def __init__(self, config: RepairConfig, rnd: random.Random) -> None:
        self.rnd = rnd
        # How often the client sends a damaged frame (and the broker a truncated one, a quarter as often).
        self.hostility = rnd.choice([0.0, 0.03, 0.1, 0.3])
        # The proxy's settings: flow events with capture, answer events with metrics (without
        # them, in-order answers are taken inline).
        self.machine = RepairMachine(config, flow_events=rnd.random() < 0.5, answer_events=rnd.random() < 0.5)
        if rnd.random() < 0.2:  # exercise the wrap of upstream ids at 2^31
            self.machine._next_upstream_id = MAX_CORRELATION_ID - rnd.randint(0, 3)
        self.now = 0.0
        # (client correlation id, bytes after it) of every request still owed an answer
        self.expected: deque[tuple[int, bytes]] = deque()
        self.inbox: deque[bytes] = deque()  # frames sent upstream, not yet processed by the broker
        self.answered: list[bytes] = []  # honest answers already sent, for duplicates
        self.accepted = 0
        self.delivered = 0
        self.closed: str | None = None
        self.rejected: str | None = None  # the shell closes on a ProtocolError
        self.sasl_raw = False  # SASL v0 tokens carry no ids: stop matching answers to requests

    # -- carrying out actions ----------------------------------------------------------

    def _apply(self, actions: Actions, *, single: bool) -> None:
        machine = self.machine
        if self.closed is not None:
            assert not (actions.to_upstream or actions.to_client or actions.events or actions.close)
            return
        ids = [int.from_bytes(frame[8:12], "big", signed=True) for frame in actions.to_upstream]
        for frame in actions.to_upstream:
            self.inbox.append(bytes(frame))  # the shell copies before the next call
        if machine.raw_mode:
            self.sasl_raw = True
        for frame in actions.to_client:
            self.delivered += 1
            if self.sasl_raw:
                continue
            assert self.expected, "an answer the client never asked for"
            client_id, body = self.expected.popleft()
            assert int.from_bytes(frame[4:8], "big", signed=True) == client_id
            assert bytes(frame[8:]) == body, "the client got another request's answer"
        if actions.close is not None:
            self.closed = actions.close
        elif single and not self.sasl_raw:
            assert len(set(ids)) == len(ids)
            assert all(i in machine._sent or i in (machine._acks0 or ()) for i in ids)
        check_invariants(machine, self.accepted)

    # -- the client --------------------------------------------------------------------

    def _client_frame(self) -> bytearray:
        rnd = self.rnd
        if rnd.random() >= self.hostility:
            if rnd.random() < 0.03:
                mechanism = rnd.choice(["PLAIN", "SCRAM-SHA-256", "GSSAPI"])
                return sasl_handshake_v0(rnd.randint(0, 1000), mechanism)
            if rnd.random() < 0.7:
                api_key = rnd.choice([ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.LIST_OFFSETS])
                cid = rnd.randint(-(2**31), 2**31 - 1)
                return request_frame(api_key, cid, rnd.getrandbits(64), acks=rnd.choice([0, 1, -1]))
            return bytearray(rnd.choice(request_seeds()).frame)  # any api, any version
        if rnd.random() < 0.9:
            framed = mutate(rnd.choice(request_seeds()).frame, rnd, rnd.choice(request_seeds()).frame)
        else:
            framed = bytearray(rnd.randbytes(rnd.randint(0, 12)))
        framed[:4] = max(len(framed) - 4, 0).to_bytes(4, "big")  # the decoder only hands out whole frames
        return framed

    def client_sends(self) -> None:
        frames = [self._client_frame() for _ in range(self.rnd.choice([1, 1, 1, 2, 3]))]
        owed: list[tuple[int, bytes]] = []
        bad = None
        raw = self.machine.raw_mode
        for frame in frames:
            if raw:
                continue
            try:
                header = parse_request_header(frame)
                if header.api_key == ApiKey.PRODUCE and produce_acks(frame, header) == 0:
                    continue
            except ProtocolError as exc:
                bad = exc
                break
            owed.append((header.correlation_id, answer_body(frame, header)))
        copies = [bytearray(frame) for frame in frames]
        try:
            actions = self.machine.client_frames(copies, self.now)
        except ProtocolError as exc:
            assert bad is not None, f"the machine refused a frame the wire layer accepts: {exc}"
            self.rejected = str(exc)
            return
        assert bad is None or self.closed is not None, "a malformed request was accepted"
        if self.closed is None:
            self.expected.extend(owed)
            self.accepted += len(owed)
        self._apply(actions, single=len(frames) == 1)

    # -- the broker --------------------------------------------------------------------

    def _honest_answer(self, frame: bytes) -> bytes | None:
        """Echo what follows the request's id; acks=0 Produce gets nothing, raw tokens a reply."""
        if self.sasl_raw:
            return b"\x00\x00\x00\x05token"
        header = parse_request_header(frame)
        if header.api_key == ApiKey.PRODUCE and produce_acks(frame, header) == 0:
            return None
        payload = frame[8:12] + answer_body(frame, header)
        return len(payload).to_bytes(4, "big") + payload

    def _unused_id(self) -> int:
        for _ in range(100):
            upstream_id = self.rnd.choice([self.rnd.randint(0, 50), self.rnd.randint(-(2**31), 2**31 - 1)])
            if upstream_id not in self.machine._sent:
                return upstream_id
        return -1

    def broker_acts(self) -> None:
        rnd = self.rnd
        roll = rnd.random()
        answer: bytes | None
        if roll < 0.45 and self.inbox:
            answer = self._honest_answer(self.inbox.popleft())
            if answer is not None:
                self.answered.append(answer)
        elif roll < 0.55 and self.inbox:
            self.inbox.popleft()  # lost
            return
        elif roll < 0.65 and len(self.inbox) > 1:
            index = rnd.randrange(1, len(self.inbox))  # answered out of order
            frame = self.inbox[index]
            del self.inbox[index]
            answer = self._honest_answer(frame)
        elif roll < 0.75 and self.answered:
            answer = rnd.choice(self.answered)  # a duplicate, late
        elif roll < 1 - self.hostility / 4:
            payload = self._unused_id().to_bytes(4, "big", signed=True) + rnd.randbytes(rnd.randint(0, 20))
            answer = len(payload).to_bytes(4, "big") + payload  # stray
        else:
            cut = rnd.randint(0, 3)  # too short for a response header
            answer = cut.to_bytes(4, "big") + rnd.randbytes(cut)
        if answer is None:
            return
        self.deliver_upstream([bytearray(answer)])

    def deliver_upstream(self, frames: list[bytearray]) -> None:
        short = any(len(frame) < 8 for frame in frames)
        try:
            actions = self.machine.upstream_frames(frames, self.now)
        except ProtocolError as exc:
            assert short, f"a well-formed answer was refused: {exc}"
            self.rejected = str(exc)
            return
        self._apply(actions, single=len(frames) == 1)

    # -- time and the connection -------------------------------------------------------

    def time_passes(self) -> None:
        deadline = self.machine.next_deadline()
        if deadline is not None and self.rnd.random() < 0.5:
            self.now = max(self.now, deadline)
        else:
            self.now += self.rnd.choice([0.0, 0.001, 0.05, 0.5, 3.0])
        self._apply(self.machine.tick(self.now), single=True)

    def step(self) -> None:
        roll = self.rnd.random()
        if roll < 0.35 and self.machine.accepting_requests:
            self.client_sends()
        elif roll < 0.8:
            self.broker_acts()
        elif roll < 0.98:
            self.time_passes()
        else:
            self._apply(self.machine.upstream_closed(), single=True)
            assert self.closed is not None, "upstream closed but the client connection was not"

    @property
    def over(self) -> bool:
        return self.closed is not None or self.rejected is not None

    def heal(self) -> None:
        """An honest broker from now on: every owed answer arrives, or the connection closes."""
        for _ in range(HEAL_STEPS):
            if self.over:
                return
            if self.inbox:
                answer = self._honest_answer(self.inbox.popleft())
                if answer is not None:
                    self.deliver_upstream([bytearray(answer)])
            elif self.machine.outstanding:
                deadline = self.machine.next_deadline()
                assert deadline is not None, "requests owed but no timer set: the connection would hang"
                self.now = max(self.now, deadline)
                self._apply(self.machine.tick(self.now), single=True)
            else:
                break
        if self.over:
            return
        assert self.machine.outstanding == 0, "the honest phase did not settle"
        if not self.sasl_raw:
            assert not self.expected, "answers owed to the client were never delivered"


def sasl_handshake_v0(correlation_id: int, mechanism: str) -> bytearray:
    request = SaslHandshakeRequest[0](mechanism=mechanism)
    return bytearray(encode_request(request, correlation_id, "c"))


def answer_body(frame: bytes | bytearray, header: RequestHeader) -> bytes:
    """What the honest broker answers after the id: a successful SaslHandshake, else an echo."""
    if header.api_key == ApiKey.SASL_HANDSHAKE and header.api_version == 0:
        return b"\x00\x00\x00\x00\x00\x00"  # error code 0, no mechanisms listed
    return bytes(frame[12:])


def check_invariants(machine: RepairMachine, accepted: int) -> None:
    """The machine's bookkeeping is consistent after every call."""
    if machine.closed is not None:
        assert machine.outstanding == 0 and machine.held_bytes == 0 and machine.outstanding_bytes == 0
        assert not machine.accepting_requests and machine.next_deadline() is None
        assert not machine._sent and not machine._send_order and not machine._acks0
        return
    order = list(machine._send_order)
    assert {entry.upstream_id for entry in order} == set(machine._sent)
    assert len(order) == len(machine._sent), "an upstream id is in flight twice"
    assert all(machine._sent[entry.upstream_id] is entry for entry in order)
    assert all(0 <= entry.upstream_id <= MAX_CORRELATION_ID for entry in order)
    assert all(a.seq < b.seq for a, b in itertools.pairwise(order)), "send order broken"
    probes = sum(isinstance(entry, _Probe) for entry in order)
    assert probes == machine._probes_outstanding <= machine.config.max_probes_outstanding
    owed = machine._client_order
    owed_ids = {id(request) for request in owed}
    assert all(id(entry) in owed_ids for entry in order if isinstance(entry, _Request))
    assert machine.held_bytes == sum(len(r.response) for r in owed if r.response is not None)
    assert machine.outstanding_bytes == sum(len(r.frame) for r in owed)
    assert not owed or owed[0].response is None, "a ready answer was not delivered"
    assert machine.outstanding <= accepted
    acks0 = machine._acks0 or {}  # None until the first acks=0 Produce
    assert len(acks0) <= MAX_ACKS0_MARKERS
    assert not set(acks0) & set(machine._sent)
    if machine.outstanding:
        assert machine.next_deadline() is not None, "requests owed but no timer set"


def run_repair_case(rnd: random.Random, steps: int | None = None) -> FuzzHarness:
    """A random config, a run of hostile steps, then an honest phase."""
    harness = FuzzHarness(random_config(rnd), rnd)
    for _ in range(steps if steps is not None else rnd.randint(1, 60)):
        if harness.over:
            return harness
        harness.step()
    harness.heal()
    return harness
