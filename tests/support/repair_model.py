"""A scripted broker and network around a RepairMachine, for property tests without sockets.

The broker answers requests strictly in the order it receives them, as a real one does,
but a fault script can make it lose an answer, answer twice, answer late (so a later
answer overtakes it) or reply to an acks=0 Produce. Each answer echoes the request's
token, so the client side can check that it got its own answer and nothing else.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from corrfix.core import Answered, Forwarded, RepairConfig, RepairKind, RepairMachine
from protocol import ApiKey, parse_request_header, produce_acks
from protocol.testing import request_frame, response_frame

NORMAL, LOSE, DUPLICATE, DELAY, STRAY = "normal", "lose", "duplicate", "delay", "stray"


def token_of_request(frame: bytes) -> int:
    return int.from_bytes(frame[-8:], "big")


class FlowCounts:
    """A :class:`~corrfix.core.FlowCounter` that keeps every answer's latency in order."""

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}
        self.answers: list[tuple[int, float]] = []

    def answer(self, api_key: int, seconds: float) -> None:
        self.answers.append((api_key, seconds))


@dataclass
class ClientRequest:
    api_key: int
    correlation_id: int
    token: int
    acks: int = 1

    @property
    def expects_response(self) -> bool:
        return not (self.api_key == ApiKey.PRODUCE and self.acks == 0)


_TRANSFORMS: dict[str, Callable[[int, int, bytearray], bytes | bytearray] | None] = {
    "none": None,
    "same": lambda api_key, api_version, frame: frame,
    "bytearray": lambda api_key, api_version, frame: bytearray(frame),
    "bytes": lambda api_key, api_version, frame: bytes(frame),
}
TRANSFORMS = tuple(_TRANSFORMS)


@dataclass
class Harness:
    config: RepairConfig
    fates: deque[str] = field(default_factory=deque)
    now: float = 0.0
    flow_events: bool = True
    answer_events: bool | None = None
    """The proxy's settings: flow events with capture, answer events with metrics. Without
    answer events the machine delivers in-order answers inline, without _on_response."""
    transform: str = "none"
    """The answer transform: none, one that returns the frame, or a copy (bytearray, bytes)."""
    count_inline: bool = False
    """The machine counts requests and answers into ``counts`` (metrics without capture)."""

    def __post_init__(self) -> None:
        self.machine = RepairMachine(
            self.config,
            transform=_TRANSFORMS[self.transform],
            flow_events=self.flow_events,
            answer_events=self.answer_events,
        )
        self.broker_inbox: deque[bytes] = deque()
        self.network: list[bytearray] = []  # answers on their way to the proxy, in order
        self.delayed: list[bytearray] = []  # answers that will be overtaken
        self.sent: list[ClientRequest] = []
        self.delivered: list[tuple[int, int]] = []
        self.events: list[RepairKind] = []
        self.closed: str | None = None
        self.upstream_sends = 0
        self.counts = FlowCounts()  # kept by the machine with count_inline, else from its events
        if self.count_inline:
            self.machine.counter = self.counts

    def _apply(self, actions) -> None:
        for frame in actions.to_upstream:
            self.broker_inbox.append(bytes(frame))  # the shell copies before the next call
            self.upstream_sends += 1
        for frame in actions.to_client:
            cid = int.from_bytes(frame[4:8], "big", signed=True)
            self.delivered.append((cid, int.from_bytes(frame[8:16], "big")))
        self.events.extend(event.kind for event in actions.repairs)
        for event in actions.events:
            if type(event) is Forwarded:
                self.counts.requests[event.api_key] = self.counts.requests.get(event.api_key, 0) + 1
            elif type(event) is Answered:
                self.counts.answers.append((event.api_key, event.seconds))
        if actions.close is not None:
            assert self.closed is None, "closed twice"
            self.closed = actions.close

    def client_sends(self, request: ClientRequest) -> None:
        self.sent.append(request)
        frame = request_frame(request.api_key, request.correlation_id, request.token, request.acks)
        self._apply(self.machine.client_frames([frame], self.now))

    def broker_processes_one(self) -> None:
        frame = self.broker_inbox.popleft()
        header = parse_request_header(frame)
        fate = self.fates.popleft() if self.fates else NORMAL
        token = 0 if header.api_key == ApiKey.API_VERSIONS else token_of_request(frame)
        answer = response_frame(header.correlation_id, token)
        if header.api_key == ApiKey.PRODUCE and produce_acks(frame, header) == 0:
            if fate == STRAY:
                self.network.append(answer)
            return
        if fate == LOSE:
            return
        if fate == DELAY:
            self.delayed.append(answer)
            return
        self.network.append(answer)
        if fate == DUPLICATE:
            self.network.append(bytearray(answer))

    def network_delivers_one(self) -> None:
        self.network_delivers(1)

    def network_delivers(self, count: int) -> None:
        """Up to ``count`` answers in one read, as a shell hands over what one receive framed."""
        frames, self.network[:count] = self.network[:count], []
        self._apply(self.machine.upstream_frames(frames, self.now))
        if self.delayed and not self.network:
            self.network.append(self.delayed.pop(0))

    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._apply(self.machine.tick(self.now))

    def drain(self, max_steps: int = 100_000) -> None:
        """Let the broker, the network and the timers run until nothing is owed."""
        for _ in range(max_steps):
            if self.closed is not None:
                return
            if self.network or self.delayed:
                if not self.network:
                    self.network.append(self.delayed.pop(0))
                self.network_delivers_one()
            elif self.broker_inbox:
                self.broker_processes_one()
            elif self.machine.outstanding:
                deadline = self.machine.next_deadline()
                assert deadline is not None, "requests owed but no timer set: the connection would hang"
                self.time_passes(max(deadline - self.now, 0.0))
            else:
                return
        raise AssertionError("did not settle")

    def expected_answers(self) -> list[tuple[int, int]]:
        return [(r.correlation_id, r.token) for r in self.sent if r.expects_response]
