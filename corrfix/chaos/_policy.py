"""Sans-IO fault injection for Kafka responses: the decisions behind ``corrfix chaos``.

The chaos relay sits between a client (or the corrfix proxy) and a broker and damages
*responses* only: it drops, duplicates or delays them, and can kill a connection now and
then. Requests always pass unchanged, because a lost or reordered response is the fault
corrfix exists to repair, while a damaged request would only test the broker.

This module holds no sockets, no clock and no trio, so every rule can be tested with
plain function calls. :class:`ChaosPolicy` owns the rules, the seeded random generator and
the counters; it is shared by all connections of one relay so that "drop every 25th
Produce response" is exact across the whole run. :class:`ConnectionChaos` is the
per-connection half: it decodes frames in both directions, remembers which api key each
in-flight correlation id belongs to, and asks the policy for one :class:`Decision` per
response.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import protocol
from protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    BytesLike,
    FrameDecoder,
    ProtocolError,
    SaslV0Tokens,
    is_sasl_v0_handshake,
)

UNKNOWN_API = -1
"""Pseudo api key of a response whose request was not seen (a stray reply, e.g. to acks=0)."""
SASL_TOKEN_API = -2
"""Pseudo api key of a raw SASL token answer (after SaslHandshake v0); never subject to chaos."""

MAX_TRACKED_REQUESTS = 65536
"""In-flight requests remembered per connection; the oldest are forgotten beyond this, so a
broker that never answers some requests cannot make the relay grow without bound."""


class Action(StrEnum):
    """What happens to one response frame."""

    FORWARD = "forward"
    DROP = "drop"
    DUPLICATE = "duplicate"
    DELAY = "delay"


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one response. ``kill`` means: apply ``action``, then close both sides.

    ``api_version`` and ``correlation_id`` are None when unknown (a stray reply has a
    correlation id but no version; a raw SASL token has neither).
    """

    action: Action
    api_key: int
    api_version: int | None = None
    correlation_id: int | None = None
    delay_seconds: float = 0.0
    kill: bool = False


def _check_every(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be 0 (off) or a positive count, not {value}")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be between 0 and 1, not {value}")


@dataclass(frozen=True, slots=True)
class ChaosRules:
    """What to damage and how often. Zero means off for every count and probability.

    ``*_every`` and ``*_probability`` of one fault combine with "or". Every fault counts
    the same stream of *matching* responses (those whose api key is in ``apis``, or all
    when ``apis`` is empty), independently of the other faults, so each "every Nth" is
    exact. When several faults fire on one response, the strongest wins: drop, then
    duplicate, then delay. ``kill_every`` counts all responses, whatever ``apis`` says,
    because a dying connection does not pick which API it hurts.
    """

    drop_every: int = 0
    drop_probability: float = 0.0
    duplicate_every: int = 0
    duplicate_probability: float = 0.0
    delay_every: int = 0
    delay_probability: float = 0.0
    delay_seconds: float = 1.0
    kill_every: int = 0
    apis: frozenset[int] = frozenset()
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("drop_every", "duplicate_every", "delay_every", "kill_every"):
            _check_every(name, getattr(self, name))
        for name in ("drop_probability", "duplicate_probability", "delay_probability"):
            _check_probability(name, getattr(self, name))
        if self.delay_seconds < 0:
            raise ValueError(f"delay_seconds must not be negative, not {self.delay_seconds}")
        object.__setattr__(self, "apis", frozenset(self.apis))

    @property
    def active(self) -> bool:
        """True if any rule can fire; a relay with no active rule is a plain relay."""
        return any(
            (
                self.drop_every,
                self.drop_probability,
                self.duplicate_every,
                self.duplicate_probability,
                self.delay_every,
                self.delay_probability,
                self.kill_every,
            )
        )


@dataclass(slots=True)
class ApiCounts:
    """What the relay did to the responses of one api key, for the summary."""

    responses: int = 0
    forwarded: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    kills: int = 0

    def add(self, other: ApiCounts) -> None:
        self.responses += other.responses
        self.forwarded += other.forwarded
        self.dropped += other.dropped
        self.duplicated += other.duplicated
        self.delayed += other.delayed
        self.kills += other.kills


_ACTION_FIELD = {
    Action.FORWARD: "forwarded",
    Action.DROP: "dropped",
    Action.DUPLICATE: "duplicated",
    Action.DELAY: "delayed",
}


def api_label(api_key: int) -> str:
    """A readable name for an api key, including the relay's pseudo keys."""
    if api_key == UNKNOWN_API:
        return "unknown"
    if api_key == SASL_TOKEN_API:
        return "sasl-token"
    return protocol.api_name(api_key)


def parse_api_key(text: str) -> int:
    """An api key from a number, a name (case-insensitive, "Request" suffix optional) or
    "unknown" (stray replies). Raises ValueError naming the problem."""
    word = text.strip()
    if not word:
        raise ValueError("empty api key")
    if word.lstrip("-").isdigit():
        key = int(word)
        if key < UNKNOWN_API:
            raise ValueError(f"api key {key} is negative")
        return key
    lowered = word.lower().removesuffix("request")
    if lowered == "unknown":
        return UNKNOWN_API
    for key, schema in protocol.api_schemas().items():
        if schema.name.lower() == lowered:
            return key
    raise ValueError(f"unknown api {text!r} (give a number or a name such as Produce, Fetch, Metadata)")


def parse_api_keys(texts: Iterable[str]) -> frozenset[int]:
    """Api keys from several options, each of which may be a comma-separated list."""
    return frozenset(parse_api_key(part) for text in texts for part in text.split(",") if part.strip())


class ChaosPolicy:
    """The rules, the random generator and the counters of one relay, shared by its connections.

    Owning the generator here (and drawing for every configured probability on every
    matching response, whichever fault wins) makes a seeded run reproducible for a given
    sequence of responses.
    """

    def __init__(self, rules: ChaosRules | None = None) -> None:
        self.rules = rules if rules is not None else ChaosRules()
        # Without a seed, pick one and keep it, so a surprising run can be replayed.
        self.seed: int = self.rules.seed if self.rules.seed is not None else random.randrange(2**32)
        self._rng = random.Random(self.seed)
        r = self.rules
        self._faults = tuple(
            (action, every, probability)
            for action, every, probability in (
                (Action.DROP, r.drop_every, r.drop_probability),
                (Action.DUPLICATE, r.duplicate_every, r.duplicate_probability),
                (Action.DELAY, r.delay_every, r.delay_probability),
            )
            if every or probability
        )
        self.matching_responses = 0
        """Responses that passed the api filter; the "every Nth" counter of all faults."""
        self.total_responses = 0
        """Responses subject to chaos (raw SASL tokens excluded); the ``kill_every`` counter."""
        self.counts: dict[int, ApiCounts] = {}
        self.connections_opened = 0
        self.connections_closed = 0

    def matches(self, api_key: int) -> bool:
        """Whether the api filter lets faults touch this api key."""
        return not self.rules.apis or api_key in self.rules.apis

    def decide(
        self, api_key: int, correlation_id: int | None = None, api_version: int | None = None
    ) -> Decision:
        """The verdict on the next response; advances the counters and the generator."""
        self.total_responses += 1
        action = Action.FORWARD
        if self._faults and self.matches(api_key):
            self.matching_responses += 1
            n = self.matching_responses
            rng = self._rng
            chosen: Action | None = None
            for fault, every, probability in self._faults:
                # Draw for every probabilistic fault, even once one has fired, so the
                # sequence of draws does not depend on which fault wins.
                by_count = bool(every) and n % every == 0
                by_chance = probability > 0 and rng.random() < probability
                if chosen is None and (by_count or by_chance):
                    chosen = fault
            if chosen is not None:
                action = chosen
        kill_every = self.rules.kill_every
        kill = bool(kill_every) and self.total_responses % kill_every == 0
        counts = self._counts(api_key)
        counts.responses += 1
        setattr(counts, _ACTION_FIELD[action], getattr(counts, _ACTION_FIELD[action]) + 1)
        if kill:
            counts.kills += 1
        delay = self.rules.delay_seconds if action is Action.DELAY else 0.0
        return Decision(action, api_key, api_version, correlation_id, delay, kill)

    def passthrough(self, api_key: int) -> Decision:
        """Forward a response that must never be damaged (raw SASL tokens); counted only."""
        counts = self._counts(api_key)
        counts.responses += 1
        counts.forwarded += 1
        return Decision(Action.FORWARD, api_key)

    def connection(self, name: str = "", max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> ConnectionChaos:
        """Per-connection state bound to this policy."""
        self.connections_opened += 1
        return ConnectionChaos(self, name or f"c{self.connections_opened}", max_frame_size)

    def totals(self) -> ApiCounts:
        total = ApiCounts()
        for counts in self.counts.values():
            total.add(counts)
        return total

    def summary(self) -> str:
        """A human-readable table of what was done, per api key."""
        total = self.totals()
        lines = [
            f"chaos summary (seed {self.seed}): {self.connections_opened} connections, "
            f"{total.responses} responses, {total.dropped} dropped, {total.duplicated} duplicated, "
            f"{total.delayed} delayed, {total.kills} connections killed"
        ]
        if self.counts:
            header = ("api", "responses", "forwarded", "dropped", "duplicated", "delayed", "kills")
            rows = [
                (
                    api_label(key),
                    *(
                        str(v)
                        for v in (c.responses, c.forwarded, c.dropped, c.duplicated, c.delayed, c.kills)
                    ),
                )
                for key, c in sorted(self.counts.items())
            ]
            width = max(len(header[0]), *(len(row[0]) for row in rows))
            lines.append(f"  {header[0]:<{width}}" + "".join(f"  {h:>10}" for h in header[1:]))
            lines.extend(f"  {row[0]:<{width}}" + "".join(f"  {v:>10}" for v in row[1:]) for row in rows)
        return "\n".join(lines)

    def summary_fields(self) -> dict[str, object]:
        """The summary as flat fields, for a structured log event."""
        total = self.totals()
        return {
            "seed": self.seed,
            "connections": self.connections_opened,
            "responses": total.responses,
            "dropped": total.dropped,
            "duplicated": total.duplicated,
            "delayed": total.delayed,
            "kills": total.kills,
            "per_api": {
                api_label(key): {
                    "responses": c.responses,
                    "dropped": c.dropped,
                    "duplicated": c.duplicated,
                    "delayed": c.delayed,
                    "kills": c.kills,
                }
                for key, c in sorted(self.counts.items())
            },
        }

    def _counts(self, api_key: int) -> ApiCounts:
        counts = self.counts.get(api_key)
        if counts is None:
            counts = self.counts[api_key] = ApiCounts()
        return counts


@dataclass(slots=True)
class _InFlight:
    api_key: int
    api_version: int


class ConnectionChaos:
    """One relayed connection: frame decoding both ways and the correlation-id map.

    Feed it what the client sent (:meth:`client_data`) before forwarding it, and what the
    broker sent (:meth:`broker_frames`) to get its response frames, then decide each in turn
    (:meth:`response`), stopping at a kill. Both raise :class:`protocol.ProtocolError` on
    garbage; the connection should then be closed.

    SaslHandshake v0 is followed by raw SASL tokens with no Kafka header. Which frames they
    are is protocol's rule (:class:`protocol.SaslV0Tokens`), the one the proxy follows;
    token answers are forwarded untouched.
    """

    __slots__ = (
        "_in_flight",
        "_request_decoder",
        "_response_decoder",
        "_sasl_v0",
        "name",
        "policy",
        "requests",
        "responses",
    )

    def __init__(self, policy: ChaosPolicy, name: str, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.policy = policy
        self.name = name
        self.requests = 0
        self.responses = 0
        self._in_flight: OrderedDict[int, _InFlight] = OrderedDict()
        self._request_decoder = FrameDecoder(max_frame_size, peer=f"{name} client")
        self._response_decoder = FrameDecoder(max_frame_size, peer=f"{name} broker")
        self._sasl_v0 = SaslV0Tokens()

    @property
    def in_flight(self) -> int:
        """Requests seen whose response has not arrived yet."""
        return len(self._in_flight)

    def client_data(self, data: BytesLike) -> None:
        """Bytes from the client; tracks every request they complete. They are forwarded
        unchanged by the caller, so nothing is returned."""
        for frame in self._request_decoder.feed(data):
            self.request(frame)

    def broker_frames(self, data: BytesLike) -> list[bytearray]:
        """Bytes from the broker; the response frames they complete, not yet decided, so a
        caller can stop deciding (and counting) where a kill ends the connection."""
        return self._response_decoder.feed(data)

    def request(self, frame: BytesLike) -> None:
        """One whole request frame (size prefix included) on its way to the broker."""
        self.requests += 1
        if self._sasl_v0.request_is_token():
            return
        header = protocol.parse_request_header(frame)
        if is_sasl_v0_handshake(header.api_key, header.api_version):
            self._sasl_v0.handshake_sent(frame)
        if header.body_offset is not None and not protocol.expects_response(frame, header):
            return  # Produce acks=0: no answer is due, so a reply to it is a stray.
        in_flight = self._in_flight
        in_flight.pop(header.correlation_id, None)  # a reused id now means the newer request
        in_flight[header.correlation_id] = _InFlight(header.api_key, header.api_version)
        if len(in_flight) > MAX_TRACKED_REQUESTS:
            in_flight.popitem(last=False)

    def response(self, frame: BytesLike) -> Decision:
        """One whole response frame (size prefix included) on its way to the client."""
        self.responses += 1
        if self._sasl_v0.answer_is_token():
            return self.policy.passthrough(SASL_TOKEN_API)
        correlation_id = protocol.response_correlation_id(frame)
        request = self._in_flight.pop(correlation_id, None)
        if request is None:
            return self.policy.decide(UNKNOWN_API, correlation_id)
        if is_sasl_v0_handshake(request.api_key, request.api_version):
            self._sasl_v0.handshake_answered(frame)
        return self.policy.decide(request.api_key, correlation_id, request.api_version)

    def close(self) -> None:
        """The connection is gone; forget its requests."""
        self._in_flight.clear()
        self.policy.connections_closed += 1


__all__ = [
    "MAX_TRACKED_REQUESTS",
    "SASL_TOKEN_API",
    "UNKNOWN_API",
    "Action",
    "ApiCounts",
    "ChaosPolicy",
    "ChaosRules",
    "ConnectionChaos",
    "Decision",
    "ProtocolError",
    "api_label",
    "parse_api_key",
    "parse_api_keys",
]
