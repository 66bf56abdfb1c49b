"""The in-flight tracking and repair state machine of one client connection (sans-IO).

The machine owns the upstream correlation ids. Every request gets a fresh id from a
per-connection counter, so any response can be matched to exactly one send, and a
response that skips ahead of older sends proves those older responses were lost: a broker
answers one connection's requests in order. Skipped requests are re-queued with a fresh
id; responses are held and delivered to the client strictly in its own request order
with its own correlation ids restored. See docs/repair.md for the full semantics.

It does no I/O and reads no clock: the shell feeds frames and the current monotonic time
and carries out the returned :class:`Actions`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from itertools import chain
from typing import Literal

from corrfix.core._events import Answered, Event, FlowCounter, Forwarded, Repaired, RepairKind
from corrfix.core._latency import RetransmitTimer
from protocol import (
    CORRELATION_ID,
    REQUEST_CORRELATION_OFFSET,
    RESPONSE_CORRELATION_OFFSET,
    SASL_KEYS,
    ApiKey,
    ProtocolError,
    RequestHeader,
    RequestHeaderReader,
    SaslV0Tokens,
    api_name,
    client_software,
    fetch_max_wait_ms,
    is_sasl_v0_handshake,
    join_group_rebalance_timeout_ms,
    mis_skips_tagged_fields,
    parse_request_header,
    patch_request_correlation_id,
    produce_acks_at,
    produce_is_idempotent,
    response_correlation_id,
    strip_tagged_fields,
)

# Bound once: reading a member off an Enum class costs about 0.25 µs, and these are read per frame.
_PRODUCE, _FETCH, _API_VERSIONS = ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.API_VERSIONS
_JOIN_GROUP = ApiKey.JOIN_GROUP
# The correlation id read and written where protocol's layout puts it, without the checked
# functions' call (0.1 µs a frame): every id written here is an int32 already.
_read_id, _write_id = CORRELATION_ID.unpack_from, CORRELATION_ID.pack_into

MAX_CORRELATION_ID = 2**31 - 1
PROBE_CLIENT_ID = b"corrfix-probe"
# ApiVersions v0 with request header v1: accepted by every broker, even before SASL.
_PROBE_TEMPLATE = (
    (2 + 2 + 4 + 2 + len(PROBE_CLIENT_ID)).to_bytes(4, "big")
    + _API_VERSIONS.to_bytes(2, "big")
    + (0).to_bytes(2, "big")
    + (0).to_bytes(4, "big")
    + len(PROBE_CLIENT_ID).to_bytes(2, "big")
    + PROBE_CLIENT_ID
)
MAX_ACKS0_MARKERS = 4096
PREAMBLE_KEYS = SASL_KEYS | {ApiKey.API_VERSIONS}
"""What a connection may send before it authenticates. Until it sends anything else, a
probe could be the second ApiVersions a SASL broker sees before SaslHandshake, which it
refuses (Kafka's SaslServerAuthenticator closes the connection)."""

ProducePolicy = Literal["requeue", "disconnect"]


class Phase(Enum):
    """Where a connection is in its life; the machine probes only while ``RELAYING``."""

    PREAMBLE = "preamble"
    """Only ApiVersions and SASL requests so far: a probe could be a second ApiVersions
    before SaslHandshake, which a SASL broker refuses."""
    SASL = "sasl"
    """A SaslHandshake or SaslAuthenticate awaits its answer."""
    RAW_TOKENS = "raw_tokens"
    """SASL v0 tokens travel as bare frames, with no header and no correlation id."""
    RELAYING = "relaying"
    CLOSED = "closed"


ResponseTransform = Callable[[int, int, bytearray], bytes | bytearray]
"""``(api_key, api_version, response frame) -> frame``: rewrites an answer before delivery.
It returns the frame it was given only when it changes nothing, and never changes that frame
in place: a capture reads the broker's bytes from it (:class:`~corrfix.core.Received`), and
knows an answer was delivered unchanged by its being the same object."""
LocalAnswer = Callable[[RequestHeader], bytes | None]
"""Returns the proxy's own answer to a request it must not forward (with the client's id).
Asked about ApiVersions and SASL requests only (``PREAMBLE_KEYS``): what a proxy may answer
itself is version negotiation, and the hot path's requests cost no call."""


@dataclass(frozen=True, slots=True)
class RepairConfig:
    """Tuning of the repair semantics; defaults suit a sidecar in front of a real cluster."""

    probe_after: float = 1.0
    """Upper bound on how long the oldest request may wait before a probe is sent."""
    probe_min: float = 0.02
    """Lower bound on the adaptive probe timeout."""
    max_requeues: int = 3
    request_deadline: float = 300.0
    max_outstanding: int = 1000
    max_outstanding_bytes: int = 64 * 1024 * 1024
    """Bytes of requests kept for re-sending (sent, answer not yet delivered) before reading
    pauses: a broker that reads eagerly (one that pipelines) could otherwise make the proxy
    keep ``max_outstanding`` big Produces."""
    max_held_bytes: int = 64 * 1024 * 1024
    produce_policy: ProducePolicy = "requeue"
    max_probes_outstanding: int = 4
    client_compat: bool = True
    """Rewrite answers that a client is known to misread (docs/repair.md, client compatibility)."""


class Actions:
    """What the shell must do after one call, in this order: send, deliver, then close.

    Frames are handed over by reference and may be patched by a later call into the
    machine, so the shell must copy (or send) them before calling again. A caller may pass
    the same one to every call and take its lists as it goes, as the connection core does:
    a call then costs no object, and frames already added stay there if a later frame of
    the same call raises. A plain slotted class: a dataclass with list factories costs
    twice as much to make.
    """

    __slots__ = ("close", "events", "to_client", "to_upstream")

    def __init__(self) -> None:
        self.to_upstream: list[bytearray] = []
        self.to_client: list[bytearray] = []
        self.events: list[Event] = []
        self.close: str | None = None

    @property
    def repairs(self) -> list[Repaired]:
        """The repair events among :attr:`events`."""
        return [event for event in self.events if isinstance(event, Repaired)]


class _Request:
    """A client request the proxy still owes an answer for."""

    __slots__ = (
        "api_key",
        "api_version",
        "attempts",
        "body_offset",
        "client_correlation_id",
        "first_sent",
        "frame",
        "hold",
        "response",
        "sent_at",
        "seq",
        "upstream_id",
    )

    def __init__(
        self,
        frame: bytearray,
        api_key: int,
        api_version: int,
        correlation_id: int,
        body_offset: int | None,
        now: float,
        upstream_id: int = 0,
        seq: int = 0,
    ) -> None:
        self.frame = frame
        self.api_key = api_key
        self.api_version = api_version
        self.client_correlation_id = correlation_id
        self.body_offset = body_offset
        self.first_sent = now
        self.sent_at = now
        self.attempts = 1
        self.response: bytearray | None = None
        # Only a Fetch may be held by the broker (a long poll): its hold is read when needed.
        self.hold: float | None = None if api_key == _FETCH else 0.0
        self.seq = seq
        self.upstream_id = upstream_id

    def header(self) -> RequestHeader:
        """The frame's header, parsed again for the rare reads of its body (idempotency, a
        Fetch's hold). Its correlation id is the frame's as it is now: the upstream id."""
        return parse_request_header(self.frame)


class _Probe:
    """A proxy-owned ApiVersions request; its answer proves older answers were lost."""

    __slots__ = ("sent_at", "seq", "upstream_id")

    def __init__(self, upstream_id: int, seq: int, now: float) -> None:
        self.upstream_id = upstream_id
        self.seq = seq
        self.sent_at = now


class RepairMachine:
    """Tracks one client connection's requests upstream and repairs what goes missing."""

    __slots__ = (
        "_acks0",
        "_answer_events",
        "_client_gone",
        "_client_order",
        "_compat_client",
        "_flow_events",
        "_fresh_ids_end",
        "_head_since",
        "_headers",
        "_held_bytes",
        "_local_answer",
        "_next_upstream_id",
        "_outstanding_bytes",
        "_preamble",
        "_probe_backoff",
        "_probes_outstanding",
        "_rebalance_wait",
        "_sasl_handshake",
        "_sasl_pending",
        "_sasl_v0",
        "_send_order",
        "_sent",
        "_seq",
        "_timer",
        "_transform",
        "closed",
        "config",
        "counter",
    )

    def __init__(
        self,
        config: RepairConfig | None = None,
        *,
        transform: ResponseTransform | None = None,
        local_answer: LocalAnswer | None = None,
        flow_events: bool = True,
        answer_events: bool | None = None,
    ) -> None:
        self.config = config or RepairConfig()
        # Forwarded and Answered events, one per request: only when something consumes them,
        # as they cost an object each on the hot path. Forwarded links a client's id to the
        # upstream one (capture, request counts); Answered carries a latency (metrics only).
        self._flow_events = flow_events
        self._answer_events = flow_events if answer_events is None else answer_events
        # Without those events, the shell may have the counts kept here instead: it sets
        # this before each call that can count, to the counts of the thread making the call.
        self.counter: FlowCounter | None = None
        self._transform = transform
        self._local_answer = local_answer
        self._next_upstream_id = 0
        # Below this, the next id was never used: until the ids wrap, a send takes the next
        # one without looking it up among the sends still awaiting an answer.
        self._fresh_ids_end = MAX_CORRELATION_ID
        self._seq = 0
        self._headers = RequestHeaderReader()
        # Sends that expect an answer, by upstream id and in send order.
        self._sent: dict[int, _Request | _Probe] = {}
        # Lists, not deques: an empty deque takes 0.76 KiB (one block allocated up front), an
        # empty list 56 bytes, and pop(0) of the few outstanding requests is as quick.
        self._send_order: list[_Request | _Probe] = []
        # Client requests not yet answered to the client, in the client's order.
        self._client_order: list[_Request] = []
        self._outstanding_bytes = 0  # the frames of _client_order, kept for re-sending
        # When the oldest request owed became the oldest: a broker answers in order, so a
        # request's deadline cannot count from before the answer to the one ahead of it.
        self._head_since = 0.0
        # acks=0 Produce sends: upstream id -> send sequence. A reply to one is stray, but
        # proves every older send's answer was lost. Made on the first: most connections
        # never send one, and every connection would keep an empty dict's 64 bytes.
        self._acks0: dict[int, int] | None = None
        self._held_bytes = 0
        self._probes_outstanding = 0
        self._probe_backoff = 0
        self._timer = RetransmitTimer(self.config.probe_min, self.config.probe_after)
        # SASL v0: after a successful SaslHandshake v0, tokens travel as bare frames with no
        # header; protocol's rule says which frames they are.
        self._sasl_handshake: _Request | None = None
        self._rebalance_wait: tuple[_Request, float] | None = None
        """The oldest request when it is a JoinGroup, and how long the coordinator may hold it."""
        self._sasl_v0 = SaslV0Tokens()
        # SaslHandshake / SaslAuthenticate requests not yet answered to the client.
        self._sasl_pending = 0
        # No request outside PREAMBLE_KEYS sent yet: no probes.
        self._preamble = True
        # The client left (client_gone()): nothing more is sent upstream.
        self._client_gone = False
        # The client software (KIP-511) when it misreads ApiVersions' tagged fields.
        self._compat_client: str | None = None
        self.closed: str | None = None

    # -- state the shell reads ---------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Client requests still waiting for their answer to be delivered."""
        return len(self._client_order)

    @property
    def outstanding_bytes(self) -> int:
        """Bytes of the requests still waiting for their answer to be delivered: each is
        kept whole, as a re-send needs it."""
        return self._outstanding_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of answers held back until an older answer arrives."""
        return self._held_bytes

    @property
    def accepting_requests(self) -> bool:
        """False at the memory bounds: the shell must stop reading from the client."""
        return (
            self.closed is None
            and len(self._client_order) < self.config.max_outstanding
            and self._outstanding_bytes < self.config.max_outstanding_bytes
            and self._held_bytes < self.config.max_held_bytes
        )

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do, or None while idle."""
        client_order = self._client_order
        if not client_order or self.closed is not None:
            return None  # nothing owed to the client: nothing to probe for or give up on
        due = self._probe_due()
        head = client_order[0]
        since = head.first_sent
        if since < self._head_since:
            since = self._head_since
        give_up = since + self.config.request_deadline
        if head.api_key == _JOIN_GROUP:
            give_up += self._held_for_rebalance(head)
        return give_up if due is None or give_up < due else due

    # -- events ------------------------------------------------------------------------

    def client_frames(self, frames: list[bytearray], now: float, actions: Actions | None = None) -> Actions:
        """Requests from the client, added to ``actions`` (a new one if None), which is
        returned. A malformed header raises ProtocolError; the requests before it are in
        ``actions`` by then, and must still be sent."""
        if actions is None:
            actions = Actions()
        if self.closed is not None:
            return actions
        # Per frame: the hot path. Attributes read once, the rare cases behind one test each.
        to_upstream = actions.to_upstream
        sasl_v0 = self._sasl_v0
        sent, send_order, client_order = self._sent, self._send_order, self._client_order
        local_answer, flow_events = self._local_answer, self._flow_events
        counts = None if flow_events or self.counter is None else self.counter.requests
        read_fields = self._headers.fields
        for frame in frames:
            if sasl_v0.active and sasl_v0.request_is_token():
                to_upstream.append(frame)
                continue
            api_key, api_version, client_cid, body_offset = read_fields(frame)
            if api_key in PREAMBLE_KEYS:
                if api_key == _API_VERSIONS and self.config.client_compat:
                    self._identify_client(frame)
                if local_answer is not None and self._answer_locally(frame, now):
                    continue
            elif self._preamble:
                self._preamble = False
            upstream_id = self._next_upstream_id
            if upstream_id < self._fresh_ids_end:
                self._next_upstream_id = upstream_id + 1
            else:
                upstream_id = self._allocate_id()
            _write_id(frame, REQUEST_CORRELATION_OFFSET, upstream_id)  # an id of ours: an int32
            seq = self._seq = self._seq + 1
            if api_key == _PRODUCE and produce_acks_at(frame, api_version, body_offset) == 0:
                self._remember_acks0(upstream_id)
            else:
                request = _Request(
                    frame, api_key, api_version, client_cid, body_offset, now, upstream_id, seq
                )
                if api_key in SASL_KEYS:
                    self._sasl_pending += 1
                    if is_sasl_v0_handshake(api_key, api_version):
                        self._sasl_handshake = request
                        sasl_v0.handshake_sent(frame)
                sent[upstream_id] = request
                send_order.append(request)
                client_order.append(request)
                self._outstanding_bytes += len(frame)
            if flow_events:
                actions.events.append(Forwarded(client_cid, upstream_id, api_key, api_version))
            elif counts is not None:
                counts[api_key] = counts.get(api_key, 0) + 1
            to_upstream.append(frame)
        if client_order and client_order[0].response is not None:
            self._deliver_ready(actions)
        return actions

    def upstream_frames(self, frames: list[bytearray], now: float, actions: Actions | None = None) -> Actions:
        """Responses from the broker, added to ``actions`` (a new one if None), which is
        returned. A frame too short for a header raises ProtocolError; the answers before it
        are in ``actions`` by then."""
        if actions is None:
            actions = Actions()
        if self.closed is not None:
            return actions
        sasl_v0 = self._sasl_v0
        timed: dict[int, _Request] = {}  # the first answer of each api key in the batch
        sent, order, client_order = self._sent, self._send_order, self._client_order
        to_client, transform = actions.to_client, self._transform
        answer_events = actions.events if self._answer_events else None
        counter = None if answer_events is not None else self.counter
        plain = self._plain_answers()
        owed = len(client_order)
        remaining = iter(frames)
        for frame in remaining:
            if plain:
                # The usual answer, inline: to the oldest send, which is the oldest request
                # owed to the client (so a request, not a probe), nothing to hold, no event
                # but its Answered. Anything else takes _on_response, which does the same here.
                try:
                    (upstream_id,) = _read_id(frame, RESPONSE_CORRELATION_OFFSET)
                except struct.error:
                    upstream_id = -1  # too short: _on_response says so
                entry = sent.get(upstream_id)
                if entry is not None and client_order and entry is client_order[0] and entry is order[0]:
                    # In _on_response's order, so that a transform that raises leaves the same state.
                    del sent[upstream_id], order[0]
                    self._probe_backoff = 0
                    api_key = entry.api_key
                    if answer_events is not None:
                        answer_events.append(
                            Answered(
                                api_key, entry.client_correlation_id, upstream_id, now - entry.first_sent
                            )
                        )
                    elif counter is not None:
                        counter.answer(api_key, now - entry.first_sent)
                    if transform is not None:
                        rewritten = transform(api_key, entry.api_version, frame)
                        if rewritten is not frame:
                            frame = rewritten if isinstance(rewritten, bytearray) else bytearray(rewritten)
                    _write_id(frame, RESPONSE_CORRELATION_OFFSET, entry.client_correlation_id)
                    del client_order[0]
                    self._outstanding_bytes -= len(entry.frame)
                    to_client.append(frame)
                    if entry.attempts == 1 and api_key not in timed:
                        timed[api_key] = entry
                    continue
            elif sasl_v0.tokens_owed and sasl_v0.answer_is_token():
                self._deliver_ready(actions)  # answers read before the token go first
                to_client.append(frame)
                continue
            answered = self._on_response(frame, now, actions)
            if self.closed is not None:  # gave up: only the answers read, this one included, count
                self._answers_after_give_up(chain((frame,), remaining), actions)
                self._release(actions, "connection closed")
                return actions
            if answered is not None and answered.api_key not in timed:
                timed[answered.api_key] = answered
            plain = self._plain_answers()
        for request in timed.values():
            self._sample_latency(request, now)
        client_order = self._client_order
        if client_order and client_order[0].response is not None:
            self._deliver_ready(actions)  # held answers, once per batch: the order is the client's either way
        if len(client_order) < owed:
            self._head_since = now
        return actions

    @property
    def phase(self) -> Phase:
        if self.closed is not None:
            return Phase.CLOSED
        if self.raw_mode:
            return Phase.RAW_TOKENS
        if self._sasl_pending:
            return Phase.SASL
        if self._preamble:
            return Phase.PREAMBLE
        return Phase.RELAYING

    @property
    def raw_mode(self) -> bool:
        """True while SASL v0 tokens, which carry no header, are being exchanged."""
        return self._sasl_v0.active

    def upstream_closed(self, actions: Actions | None = None) -> Actions:
        """The broker connection ended; whatever is still owed can never arrive on it."""
        if actions is None:
            actions = Actions()
        if self.closed is None:
            self._deliver_ready(actions)
            owed = len(self._client_order)
            reason = "upstream closed" + (f" with {owed} requests unanswered" if owed else "")
            self.closed = reason
            actions.close = reason
            self._release(actions, "upstream closed")
        return actions

    def client_gone(self) -> None:
        """The client left, and the shell ends the broker's stream after the requests already
        sent: a probe or a re-send could only follow that end of stream, and no client waits
        for what it would repair. Answers are still matched until the broker closes, and
        Produces left unanswered are flagged then, as always."""
        self._client_gone = True

    def tick(self, now: float, actions: Actions | None = None) -> Actions:
        """Time passed: send a probe when the oldest send is overdue, give up past the deadline."""
        if actions is None:
            actions = Actions()
        if self.closed is not None:
            return actions
        if self._client_order:
            oldest = self._client_order[0]
            waited = self.config.request_deadline
            if oldest.api_key == _JOIN_GROUP:
                waited += self._held_for_rebalance(oldest)
            since = oldest.first_sent
            if since < self._head_since:
                since = self._head_since
            if now >= since + waited:
                if since == oldest.first_sent:
                    reason = f"unanswered after {waited:g}s"
                else:
                    reason = f"unanswered {waited:g}s after the answer before it"
                self._give_up(oldest, actions, reason)
                self._release(actions, "connection closed")
                return actions
        due = self._probe_due()
        if due is not None and now >= due:
            self._send_probe(now, actions)
        return actions

    # -- internals ---------------------------------------------------------------------

    def _identify_client(self, frame: bytearray) -> None:
        """Remember a client that misreads tagged fields, from its ApiVersions v3+ request."""
        try:
            software = client_software(frame, parse_request_header(frame))
        except ProtocolError:
            return  # the broker judges the request; compatibility is best effort
        if software is not None and mis_skips_tagged_fields(software):
            self._compat_client = str(software)

    def _compat_answer(self, entry: _Request, frame: bytearray, actions: Actions) -> bytearray:
        """The ApiVersions answer without the tagged fields this client would misread."""
        try:
            stripped = strip_tagged_fields(frame, entry.api_version)
        except ProtocolError:
            return frame  # unreadable here too: relayed as the broker sent it
        if stripped is None:
            return frame
        answer, dropped = stripped
        actions.events.append(
            Repaired(
                RepairKind.CLIENT_COMPAT,
                api_key=_API_VERSIONS,
                client_correlation_id=entry.client_correlation_id,
                upstream_correlation_id=entry.upstream_id,
                attempt=entry.attempts,
                reason=f"dropped ApiVersions tagged fields {', '.join(dropped)} for {self._compat_client}, "
                "which misreads them (librdkafka before 2.2.0)",
            )
        )
        return bytearray(answer)

    def _answer_locally(self, frame: bytearray, now: float) -> bool:
        """Queue the proxy's own answer in the client's order, if it has one for this request."""
        assert self._local_answer is not None
        header = parse_request_header(frame)  # a preamble request: the whole header, client id too
        answer = self._local_answer(header)
        if answer is None:
            return False
        request = _Request(
            frame, header.api_key, header.api_version, header.correlation_id, header.body_offset, now
        )
        request.response = bytearray(answer)
        self._held_bytes += len(answer)
        self._client_order.append(request)
        self._outstanding_bytes += len(frame)
        return True

    def _allocate_id(self) -> int:
        """The next upstream id not awaiting an answer; after int32's last, 0 again."""
        upstream_id = self._next_upstream_id
        acks0 = self._acks0 or {}
        while upstream_id in self._sent or upstream_id in acks0:
            upstream_id = upstream_id + 1 if upstream_id < MAX_CORRELATION_ID else 0
        if upstream_id < MAX_CORRELATION_ID:
            self._next_upstream_id = upstream_id + 1
        else:
            self._next_upstream_id = 0
            self._fresh_ids_end = 0  # wrapped: from now on an id may still be in use
        return upstream_id

    def _remember_acks0(self, upstream_id: int) -> None:
        acks0 = self._acks0
        if acks0 is None:
            acks0 = self._acks0 = {}
        acks0[upstream_id] = self._seq
        if len(acks0) > MAX_ACKS0_MARKERS:
            del acks0[next(iter(acks0))]

    def _forget_acks0_before(self, seq: int) -> None:
        acks0 = self._acks0
        while acks0:
            oldest = next(iter(acks0))
            if acks0[oldest] >= seq:
                return
            del acks0[oldest]

    def _plain_answers(self) -> bool:
        """Whether answers need nothing but matching (and their ``Answered`` event, for
        metrics), for now: no SASL exchange or token owed, no acks=0 reply possible, no
        client to compensate."""
        return not (
            self._sasl_pending
            or self._sasl_handshake is not None
            or self._sasl_v0.tokens_owed
            or self._acks0
            or self._compat_client is not None
        )

    def _on_response(self, frame: bytearray, now: float, actions: Actions) -> _Request | None:
        """Match an answer to its send; returns the request if its latency may be sampled."""
        try:
            (upstream_id,) = _read_id(frame, RESPONSE_CORRELATION_OFFSET)
        except struct.error:
            upstream_id = response_correlation_id(frame)  # too short: it says so
        sent = self._sent
        entry = sent.pop(upstream_id, None)
        if entry is None:
            acks0_seq = self._acks0.pop(upstream_id, None) if self._acks0 else None
            if acks0_seq is None:
                actions.events.append(
                    Repaired(RepairKind.STALE_DROP, upstream_correlation_id=upstream_id, reason="unknown")
                )
                return None
            actions.events.append(
                Repaired(
                    RepairKind.STALE_DROP,
                    api_key=_PRODUCE,
                    upstream_correlation_id=upstream_id,
                    reason="reply to acks=0 Produce",
                )
            )
            self._skip_before(acks0_seq, now, actions, evidence="reply to acks=0 Produce")
            return None
        order = self._send_order
        # The broker answers in order: the answer is nearly always to the oldest send.
        if order[0] is entry:
            del order[0]
            found_loss = 0
        else:
            sent[upstream_id] = entry  # its id stays taken while the sends it overtook are re-sent
            found_loss = self._skip_before(entry.seq, now, actions, "later response")
            if self.closed is not None:
                return None
            popped = order.pop(0)
            assert popped is entry
            del sent[upstream_id]
        if self._acks0:
            self._forget_acks0_before(entry.seq)
        self._probe_backoff = 0
        if isinstance(entry, _Probe):
            self._probes_outstanding -= 1
            if found_loss:
                actions.events.append(
                    Repaired(
                        RepairKind.PROBE_FOUND_LOSS,
                        api_key=_API_VERSIONS,
                        upstream_correlation_id=upstream_id,
                        reason=f"{found_loss} earlier answers lost",
                    )
                )
            return None
        api_key = entry.api_key
        if self._answer_events:
            actions.events.append(
                Answered(api_key, entry.client_correlation_id, upstream_id, now - entry.first_sent)
            )
        elif self.counter is not None:
            self.counter.answer(api_key, now - entry.first_sent)
        frame = self._for_client(entry, frame, actions)
        if entry is self._sasl_handshake:
            self._sasl_handshake = None
            self._sasl_v0.handshake_answered(frame)
        client_order = self._client_order
        if client_order[0] is entry:  # the usual case: nothing older is owed, so no need to hold it
            del client_order[0]
            self._outstanding_bytes -= len(entry.frame)
            actions.to_client.append(frame)
            if self._sasl_pending and api_key in SASL_KEYS:
                self._sasl_pending -= 1
        else:
            entry.response = frame
            self._held_bytes += len(frame)
        return entry if entry.attempts == 1 else None  # Karn's rule: a re-sent request's latency is ambiguous

    def _for_client(self, entry: _Request, frame: bytearray, actions: Actions) -> bytearray:
        """The answer as the client gets it: rewritten, if it must be, with the client's id."""
        api_key = entry.api_key
        if self._transform is not None:
            rewritten = self._transform(api_key, entry.api_version, frame)
            if rewritten is not frame:
                frame = rewritten if isinstance(rewritten, bytearray) else bytearray(rewritten)
        if self._compat_client is not None and api_key == _API_VERSIONS:
            frame = self._compat_answer(entry, frame, actions)
        _write_id(frame, RESPONSE_CORRELATION_OFFSET, entry.client_correlation_id)  # read as an int32
        return frame

    def _answers_after_give_up(self, frames: Iterator[bytearray], actions: Actions) -> None:
        """The answer that made the machine give up and the rest of its read: answers already
        received, so those the client is owed before the request given up still reach it (by
        the close's delivery, in the client's order; a re-send can overtake a later request).
        Nothing is repaired or re-sent any more: each answer is only matched to its send."""
        sent = self._sent
        for frame in frames:
            if len(frame) < RESPONSE_CORRELATION_OFFSET + 4:
                return  # a frame too short for a header: nothing after it is read
            (upstream_id,) = _read_id(frame, RESPONSE_CORRELATION_OFFSET)
            entry = sent.pop(upstream_id, None)
            if isinstance(entry, _Request):
                entry.response = self._for_client(entry, frame, actions)
                self._held_bytes += len(entry.response)

    def _skip_before(self, seq: int, now: float, actions: Actions, evidence: str) -> int:
        """Every send older than ``seq`` lost its answer: re-queue the requests among them."""
        order = self._send_order
        skipped = 0
        while order and order[0].seq < seq and self.closed is None:
            lost = order.pop(0)
            del self._sent[lost.upstream_id]
            if isinstance(lost, _Probe):
                # Counted too, so that every answer the link lost is accounted for; a probe
                # is not re-sent (its only purpose was to overtake what it followed).
                self._probes_outstanding -= 1
                actions.events.append(
                    Repaired(
                        RepairKind.SKIP_DETECTED,
                        api_key=_API_VERSIONS,
                        upstream_correlation_id=lost.upstream_id,
                        reason=f"answer to corrfix's probe lost ({evidence})",
                    )
                )
                continue
            skipped += 1
            actions.events.append(
                Repaired(
                    RepairKind.SKIP_DETECTED,
                    api_key=lost.api_key,
                    client_correlation_id=lost.client_correlation_id,
                    upstream_correlation_id=lost.upstream_id,
                    attempt=lost.attempts,
                    reason=evidence,
                )
            )
            self._requeue(lost, now, actions)
        return skipped

    def _requeue(self, request: _Request, now: float, actions: Actions) -> None:
        if self._client_gone:
            return  # owed to no one: left unanswered, as the broker's close finds it
        if self._sasl_pending or self._sasl_v0.active:
            # From a SaslHandshake until authentication completes (KIP-368's re-authentication
            # included), Kafka takes nothing but the exchange: a re-send would make it close
            # the connection and count a failed authentication. Nor can the re-send wait for
            # the exchange to end: the exchange's answers reach the client after this one.
            self._give_up(request, actions, "answer lost during a SASL exchange, which takes nothing else")
            return
        if request.attempts > self.config.max_requeues:
            self._give_up(request, actions, f"answer lost {request.attempts} times")
            return
        possible_duplicate = False
        if request.api_key == _PRODUCE and not produce_is_idempotent(request.frame, request.header()):
            if self.config.produce_policy == "disconnect":
                self._give_up(request, actions, "lost answer to a non-idempotent Produce")
                return
            possible_duplicate = True
        old_id = request.upstream_id
        request.upstream_id = self._allocate_id()
        patch_request_correlation_id(request.frame, request.upstream_id)
        self._seq += 1
        request.seq = self._seq
        request.sent_at = now
        request.attempts += 1
        self._sent[request.upstream_id] = request
        self._send_order.append(request)
        actions.to_upstream.append(request.frame)
        actions.events.append(
            Repaired(
                RepairKind.REQUEUE,
                api_key=request.api_key,
                client_correlation_id=request.client_correlation_id,
                upstream_correlation_id=old_id,
                new_upstream_correlation_id=request.upstream_id,
                attempt=request.attempts,
            )
        )
        if possible_duplicate:
            actions.events.append(
                Repaired(
                    RepairKind.POSSIBLE_DUPLICATE,
                    api_key=_PRODUCE,
                    client_correlation_id=request.client_correlation_id,
                    upstream_correlation_id=request.upstream_id,
                    attempt=request.attempts,
                    reason="re-sent a Produce without a producer id",
                )
            )

    def _deliver_ready(self, actions: Actions) -> None:
        """Hand the client every answer now due in its own order: those before the first gap."""
        order = self._client_order
        ready = 0
        for request in order:
            if request.response is None:
                break
            ready += 1
        if not ready:
            return
        delivered = order[:ready]
        del order[:ready]  # nothing holds these requests any longer
        to_client = actions.to_client
        held = self._held_bytes
        kept = self._outstanding_bytes
        for request in delivered:
            response = request.response
            assert response is not None
            held -= len(response)
            kept -= len(request.frame)
            to_client.append(response)
        self._held_bytes = held
        self._outstanding_bytes = kept
        if self._sasl_pending:
            self._sasl_pending -= sum(1 for request in delivered if request.api_key in SASL_KEYS)

    def _sample_latency(self, request: _Request, now: float) -> None:
        """Feed the probe timer one answer's latency, less what the broker may hold it.

        Once per api key and batch of answers (the first answer of the key to a request sent
        once), as TCP times one segment per round trip: answers read together share their
        round trip, and timing every one was a twentieth of the core's time per request.
        Per api key, because each key has its own estimate: a key whose answers always come
        behind another's in a read must still be timed."""
        hold = request.hold
        if hold is None:
            hold = self._hold(request)
        sample = now - request.sent_at - hold
        self._timer.observe(request.api_key, sample if sample > 0.0 else 0.0)

    def _hold(self, request: _Request) -> float:
        """How long the broker may legitimately keep this request (a Fetch long-poll)."""
        if request.hold is None:
            hold = 0.0
            if request.api_key == _FETCH:
                hold = fetch_max_wait_ms(request.frame, request.header()) / 1000.0
            request.hold = hold
        return request.hold

    def _held_for_rebalance(self, request: _Request) -> float:
        """How long the coordinator may hold this JoinGroup (its rebalance timeout), which the
        request deadline counts from: the client waits that long for it, and giving up sooner
        would cut each member off a rebalance that waits for a slow one, again at each rejoin.
        Probes are not delayed: a conforming broker answers them after the JoinGroup anyway,
        so a lost JoinGroup answer is still found as the rebalance ends."""
        known = self._rebalance_wait
        if known is None or known[0] is not request:
            known = (request, join_group_rebalance_timeout_ms(request.frame, request.header()) / 1000.0)
            self._rebalance_wait = known
        return known[1]

    def _probe_due(self) -> float | None:
        order = self._send_order
        # Only while RELAYING (self.phase, spelt out: this runs on every receive). A probe
        # now could land before or inside a SASL exchange.
        if self._preamble or self._sasl_pending or self._sasl_v0.active or self.closed is not None:
            return None
        if self._client_gone:
            return None
        if not self._client_order:
            return None  # nothing owed to the client: a probe could only find a probe's answer lost
        if not order or self._probes_outstanding >= self.config.max_probes_outstanding:
            return None
        head = order[0]
        last = order[-1]
        backoff = 1 << self._probe_backoff
        if isinstance(last, _Probe):
            # A probe is already behind every request: wait for it before the next one.
            return last.sent_at + self._timer.timeout(_API_VERSIONS) * backoff
        if isinstance(head, _Probe):
            return head.sent_at + self._timer.timeout(_API_VERSIONS) * backoff
        hold = head.hold
        if hold is None:
            hold = self._hold(head)
        return head.sent_at + hold + self._timer.timeout(head.api_key) * backoff

    def _send_probe(self, now: float, actions: Actions) -> None:
        upstream_id = self._allocate_id()
        frame = bytearray(_PROBE_TEMPLATE)
        patch_request_correlation_id(frame, upstream_id)
        self._seq += 1
        probe = _Probe(upstream_id, self._seq, now)
        self._sent[upstream_id] = probe
        self._send_order.append(probe)
        self._probes_outstanding += 1
        self._probe_backoff = min(self._probe_backoff + 1, 6)
        actions.to_upstream.append(frame)
        head = self._send_order[0]
        actions.events.append(
            Repaired(
                RepairKind.PROBE_SENT,
                api_key=_API_VERSIONS,
                upstream_correlation_id=upstream_id,
                reason=f"oldest send waiting {now - head.sent_at:.3f}s",
            )
        )

    def _give_up(self, request: _Request, actions: Actions, reason: str) -> None:
        """Close the client connection. Its caller releases the state (:meth:`_release`) once
        nothing already received is left to match."""
        actions.events.append(
            Repaired(
                RepairKind.GIVE_UP,
                api_key=request.api_key,
                client_correlation_id=request.client_correlation_id,
                upstream_correlation_id=request.upstream_id,
                attempt=request.attempts,
                reason=reason,
            )
        )
        reason = f"gave up on {api_name(request.api_key)} request: {reason}"
        self.closed = reason
        actions.close = reason

    def _flag_undelivered_produces(self, actions: Actions, why: str) -> None:
        """The client re-sends these after the disconnect, and the broker may already have
        appended them (their answer may even be held here, behind an older one): a
        non-idempotent Produce can then be stored twice."""
        for sent in self._client_order:
            if sent.api_key == _PRODUCE and not produce_is_idempotent(sent.frame, sent.header()):
                actions.events.append(
                    Repaired(
                        RepairKind.POSSIBLE_DUPLICATE,
                        api_key=_PRODUCE,
                        client_correlation_id=sent.client_correlation_id,
                        upstream_correlation_id=sent.upstream_id,
                        attempt=sent.attempts,
                        reason=f"{why}; the client may re-send a Produce without a producer id",
                    )
                )

    def _release(self, actions: Actions, ending: str) -> None:
        """The connection is closed: deliver the answers that are ready, flag the Produces
        whose answer the client never gets (``ending`` says how), and drop the rest."""
        self._deliver_ready(actions)
        self._flag_undelivered_produces(actions, f"{ending} before the answer reached the client")
        self._sent.clear()
        self._send_order.clear()
        self._client_order.clear()
        self._outstanding_bytes = 0
        self._acks0 = None
        self._held_bytes = 0
        self._sasl_pending = 0
