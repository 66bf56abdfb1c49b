"""``corrfix replay``: send a capture's client requests again, to corrfix or straight to a broker.

Each captured client connection gets its own TCP connection to the target, replayed
concurrently with the others. Its requests leave in their captured order, at their
captured times scaled by ``1/speed`` (or without waiting), pipelined as they were: a
request does not wait for the answers to its predecessors unless the capture shows it did.

That last rule is causal order, and it holds across connections too: a request is sent
only after every response the capture shows arriving *before* that request was sent has
arrived in the replay (or was given up on). So an admin client's CreateTopics is answered
before the producer's first Produce goes out, even as fast as possible or against a slower
target. Only requests that expect an answer count; acks=0 Produce never holds anyone up.

Everything is bounded: the connect, and each response (``--response-timeout``). A missing
response ends its connection the way a client's request timeout would: the requests still
waiting on it count as missing, the ones not yet sent as not sent.

Requests that name topics by id carry the captured cluster's ids; they are rewritten to the
target's ids before they leave (:mod:`corrfix.replay._topic_ids`), learned from the replayed
answers, or from a Metadata request of our own when none has named the topic yet.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import heapq
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import trio

from corrfix._argtypes import count as _count
from corrfix._argtypes import positive as _positive
from corrfix._argtypes import positive_size as _positive_size
from corrfix.capture import CaptureFormatError
from corrfix.core import parse_host_port
from corrfix.replay._plan import PlannedConnection, PlannedRequest, ReplayPlan, load_plan
from corrfix.replay._report import Outcome, ReplayResult, Status, build_report, render_json, render_text
from corrfix.replay._topic_ids import DEFAULT_LOOKUP_VERSION, TopicIdMap, carries_topic_ids, metadata_request
from protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    ApiKey,
    FrameDecoder,
    ProtocolError,
    response_correlation_id,
)

DEFAULT_RESPONSE_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 5.0
_RECEIVE_SIZE = 65536


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    host: str
    port: int
    speed: float | None = 1.0  # None: as fast as causal order allows
    response_timeout: float = DEFAULT_RESPONSE_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class CausalGate:
    """Holds a request until the responses captured before it have been settled in the replay.

    Captured responses are numbered in capture-time order; a request needs the first ``k``
    of them, where ``k`` counts those captured before it was sent. Settled means answered,
    given up on, or never to be sent.

    Times are the capture's wall clock, which can step back (NTP) mid-capture; read as is,
    a request could then wait for the answer to a request sent after it on its own
    connection, forever. So a request's time is never earlier than its connection's
    previous ones, nor an answer's than its request's: waiting then only ever points
    back in time, and no request can wait on itself.
    """

    def __init__(self, requests: list[PlannedRequest]) -> None:
        self._sent_ns: dict[int, int] = {}
        latest: dict[str, int] = {}
        for r in requests:  # each connection's requests in their order
            latest[r.connection_id] = max(r.wall_ns, latest.get(r.connection_id, r.wall_ns))
            self._sent_ns[r.index] = latest[r.connection_id]
        answered = {
            r.index: max(r.captured_response_ns, self._sent_ns[r.index])
            for r in requests
            if r.captured_response_ns is not None and r.expects_response and not r.truncated
        }
        gated = sorted(answered, key=lambda index: (answered[index], index))
        self._times = [answered[index] for index in gated]
        self._position = {index: i for i, index in enumerate(gated)}
        self._settled = [False] * len(gated)
        self._prefix = 0  # the first _prefix responses are all settled
        self._waiters: list[tuple[int, int, trio.Event]] = []
        self._order = itertools.count()

    def needed(self, request: PlannedRequest) -> int:
        return bisect.bisect_left(self._times, self._sent_ns.get(request.index, request.wall_ns))

    async def wait(self, request: PlannedRequest) -> None:
        needed = self.needed(request)
        if self._prefix >= needed:
            return
        event = trio.Event()
        heapq.heappush(self._waiters, (needed, next(self._order), event))
        await event.wait()

    def settle(self, request: PlannedRequest) -> None:
        position = self._position.get(request.index)
        if position is None or self._settled[position]:
            return
        self._settled[position] = True
        while self._prefix < len(self._settled) and self._settled[self._prefix]:
            self._prefix += 1
        while self._waiters and self._waiters[0][0] <= self._prefix:
            heapq.heappop(self._waiters)[2].set()


class _Run:
    """What all connections of one replay share."""

    def __init__(self, plan: ReplayPlan, config: ReplayConfig) -> None:
        self.config = config
        self.first_ns = plan.first_ns
        self.gate = CausalGate(plan.requests)
        self.outcomes = {r.index: Outcome(r) for r in plan.requests}
        self.strays: list[tuple[str, int]] = []
        self.start = 0.0
        self.topic_ids = TopicIdMap()
        metadata_versions = [DEFAULT_LOOKUP_VERSION]
        for frame, api_key, api_version in plan.naming_answers:
            self.topic_ids.learn_capture(frame, api_key, api_version)
        for request in plan.requests:
            if request.api_key == ApiKey.METADATA and request.api_version is not None:
                metadata_versions.append(request.api_version)
        self.topic_ids.lookup_version = max(v for v in metadata_versions if v >= 10)

    def now_ns(self) -> int:
        return int(trio.current_time() * 1e9)

    async def frame_for(self, request: PlannedRequest) -> bytes:
        """The bytes to send: the captured frame, with the target's topic ids where it names topics by id."""
        if request.api_key is None or not carries_topic_ids(request.api_key, request.api_version or 0):
            return request.frame
        if wanted := self.topic_ids.unresolved(request.frame):
            await self.look_up(wanted)
        return self.topic_ids.rewrite(request.frame)

    async def look_up(self, names: set[str]) -> None:
        """Ask the target for these topics' ids with a Metadata request on a connection of our own."""
        self.topic_ids.asked |= names
        version = self.topic_ids.lookup_version
        config = self.config
        try:
            with trio.fail_after(config.connect_timeout + config.response_timeout):
                stream = await trio.open_tcp_stream(config.host, config.port)
                async with stream:
                    await stream.send_all(metadata_request(names, 1, version))
                    decoder = FrameDecoder(config.max_frame_size, peer=config.target)
                    frames: list[bytearray] = []
                    while not frames:
                        data = await stream.receive_some(_RECEIVE_SIZE)
                        if not data:
                            return
                        frames = decoder.feed(data)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ProtocolError):
            return  # the topics count as missing on the target
        self.topic_ids.learn_target(bytes(frames[0]), ApiKey.METADATA, version)

    async def wait_turn(self, request: PlannedRequest) -> None:
        speed = self.config.speed
        if speed is not None:
            await trio.sleep_until(self.start + (request.wall_ns - self.first_ns) / 1e9 / speed)
        await self.gate.wait(request)


class _ConnectionReplay:
    """One captured connection, replayed on one TCP connection."""

    def __init__(self, conn: PlannedConnection, run: _Run) -> None:
        self.conn = conn
        self.run = run
        self.outcomes = [run.outcomes[r.index] for r in conn.requests]
        self.unsent: collections.deque[Outcome] = collections.deque()
        # Sent and answer expected, by correlation id (oldest first); acks=0 sends apart.
        self.waiting: dict[int, collections.deque[Outcome]] = collections.defaultdict(collections.deque)
        self.unanswerable: dict[int, Outcome] = {}
        self.timers: dict[int, trio.CancelScope] = {}
        self.sent_all = False
        self.stopped = False
        self.nursery: trio.Nursery | None = None

    async def replay(self) -> None:
        for outcome in self.outcomes:
            if outcome.request.truncated:
                self._settle(outcome, Status.SKIPPED)
            elif outcome.request.correlation_id is None:
                outcome.detail = "the captured frame has no request header"
                self._settle(outcome, Status.SKIPPED)
            else:
                self.unsent.append(outcome)
        if not self.unsent:
            return
        await self.run.wait_turn(self.unsent[0].request)
        config = self.run.config
        try:
            with trio.fail_after(config.connect_timeout):
                stream = await trio.open_tcp_stream(config.host, config.port)
        except (OSError, trio.TooSlowError) as exc:
            self._stop(f"cannot connect to {config.target}: {exc or 'timed out'}")
            return
        async with stream, trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._receive, stream)
            await self._send(stream)

    async def _send(self, stream: trio.SocketStream) -> None:
        first = True
        while self.unsent:
            outcome = self.unsent[0]
            if not first:
                await self.run.wait_turn(outcome.request)
                if self.stopped:  # given up on while waiting (the wake-up can beat the cancel)
                    return
            first = False
            frame = await self.run.frame_for(outcome.request)
            if self.stopped:  # given up on while the target was asked for topic ids
                return
            # Registered before the send: the answer can arrive while send_all still runs.
            self.unsent.popleft()
            self._expect(outcome)
            try:
                await stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._unexpect(outcome)
                self.unsent.appendleft(outcome)
                self._stop(f"sending failed: {exc}")
                return
        self.sent_all = True
        self._maybe_done()

    def _expect(self, outcome: Outcome) -> None:
        outcome.sent_ns = self.run.now_ns()
        request = outcome.request
        assert request.correlation_id is not None and self.nursery is not None
        if not request.expects_response:
            outcome.status = Status.NO_ANSWER_EXPECTED
            self.unanswerable[request.correlation_id] = outcome
            return
        self.waiting[request.correlation_id].append(outcome)
        scope = trio.CancelScope()
        self.timers[request.index] = scope
        self.nursery.start_soon(self._expire, outcome, scope)

    def _unexpect(self, outcome: Outcome) -> None:
        """Undo :meth:`_expect` for a request that could not be sent."""
        outcome.sent_ns = None
        outcome.status = Status.NOT_SENT
        request = outcome.request
        assert request.correlation_id is not None
        self.unanswerable.pop(request.correlation_id, None)
        queue = self.waiting.get(request.correlation_id)
        if queue and any(o is outcome for o in queue):
            queue.remove(outcome)
            if not queue:
                del self.waiting[request.correlation_id]
        if (scope := self.timers.pop(request.index, None)) is not None:
            scope.cancel()

    async def _expire(self, outcome: Outcome, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(self.run.config.response_timeout)
            outcome.detail = f"no response within {self.run.config.response_timeout:g} s"
            self._stop("abandoned: an earlier response on this connection timed out")

    async def _receive(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(self.run.config.max_frame_size, peer=self.run.config.target)
        while True:
            try:
                data = await stream.receive_some(_RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._stop(f"receiving failed: {exc}")
                return
            if not data:
                self._stop("the target closed the connection")
                return
            try:
                frames = decoder.feed(data)
                for frame in frames:
                    self._answer(bytes(frame), response_correlation_id(frame))
            except ProtocolError as exc:
                self._stop(f"bad frame from the target: {exc}")
                return
            self._maybe_done()

    def _answer(self, frame: bytes, correlation_id: int) -> None:
        queue = self.waiting.get(correlation_id)
        if queue:
            outcome = queue.popleft()
            if not queue:
                del self.waiting[correlation_id]
            self.timers.pop(outcome.request.index).cancel()
        elif correlation_id in self.unanswerable:
            outcome = self.unanswerable.pop(correlation_id)
        else:
            self.run.strays.append((self.conn.connection_id, correlation_id))
            return
        outcome.response = frame
        outcome.received_ns = self.run.now_ns()
        self.run.topic_ids.learn_target(frame, outcome.request.api_key, outcome.request.api_version)
        if outcome.request.expects_response:
            self._settle(outcome, Status.ANSWERED)

    def _maybe_done(self) -> None:
        if self.sent_all and not self.waiting and self.nursery is not None:
            self.nursery.cancel_scope.cancel()

    def _stop(self, why: str) -> None:
        """Give up on this connection: what waits is missing, what is unsent is not sent."""
        self.stopped = True
        for queue in self.waiting.values():
            for outcome in queue:
                outcome.detail = outcome.detail or why
                self._settle(outcome, Status.MISSING)
        self.waiting.clear()
        while self.unsent:
            outcome = self.unsent.popleft()
            outcome.detail = why
            self._settle(outcome, Status.NOT_SENT)
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()

    def _settle(self, outcome: Outcome, status: Status) -> None:
        outcome.status = status
        self.run.gate.settle(outcome.request)


async def replay(plan: ReplayPlan, config: ReplayConfig) -> ReplayResult:
    """Replay every connection of ``plan`` against the target, concurrently."""
    run = _Run(plan, config)
    run.start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for conn in plan.connections:
            nursery.start_soon(_ConnectionReplay(conn, run).replay)
    return ReplayResult(
        target=config.target,
        speed=config.speed,
        outcomes=list(run.outcomes.values()),
        stray_responses=run.strays,
        started_ns=int(run.start * 1e9),
        elapsed_s=trio.current_time() - run.start,
        topic_ids=run.topic_ids.summary(),
    )


# -- command line ----------------------------------------------------------------------------


def _target(text: str) -> tuple[str, int]:
    host, port = parse_host_port(text)
    if not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, port


def register_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``corrfix replay``."""
    p = subparsers.add_parser(
        "replay",
        help="re-send a capture's client requests to corrfix or a broker and report what differs",
        description="Open one connection per captured client connection and re-send its requests in "
        "order, keeping their timing (scaled by --speed) and their causal order across connections. "
        "Report missing responses, error codes that differ from the capture, and latency per api key.",
    )
    p.add_argument("capture", type=Path, metavar="DIR", help="capture directory (or one capture file)")
    p.add_argument("--target", type=_target, required=True, metavar="HOST:PORT", help="corrfix or a broker")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed",
        type=_positive,
        default=1.0,
        metavar="X",
        help="X times faster than captured (default 1)",
    )
    pace.add_argument(
        "--as-fast-as-possible",
        action="store_true",
        help="no waiting between requests; still in order, pipelined as captured, and in causal order",
    )
    p.add_argument(
        "--connection", action="append", metavar="ID", help="replay only this connection id (repeatable)"
    )
    p.add_argument(
        "--response-timeout",
        type=_positive,
        default=DEFAULT_RESPONSE_TIMEOUT,
        metavar="SECONDS",
        help=f"give up on a response after this long; its connection is then closed "
        f"(default {DEFAULT_RESPONSE_TIMEOUT:g})",
    )
    p.add_argument(
        "--connect-timeout",
        type=_positive,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="SECONDS",
        help=f"(default {DEFAULT_CONNECT_TIMEOUT:g})",
    )
    p.add_argument("--max-frame-size", type=_positive_size, default=DEFAULT_MAX_FRAME_SIZE, metavar="BYTES")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--max-differences",
        type=_count,
        default=50,
        metavar="N",
        help="differences listed in the text report",
    )
    p.set_defaults(run=run_replay)
    return p


def run_replay(args: argparse.Namespace) -> int:
    """0: replayed without differences; 1: differences; 2: nothing could be replayed."""
    if not args.capture.exists():  # else it reads as a capture with no requests
        print(f"corrfix replay: {args.capture} does not exist", file=sys.stderr)
        return 2
    try:
        plan = load_plan(args.capture, set(args.connection) if args.connection else None)
    except (OSError, CaptureFormatError) as exc:
        print(f"corrfix: cannot read capture {args.capture}: {exc}", file=sys.stderr)
        return 2
    if not plan.connections:
        what = "the selected connections" if args.connection else args.capture
        print(f"corrfix: no client requests to replay in {what}", file=sys.stderr)
        return 2
    host, port = args.target
    config = ReplayConfig(
        host=host,
        port=port,
        speed=None if args.as_fast_as_possible else args.speed,
        response_timeout=args.response_timeout,
        connect_timeout=args.connect_timeout,
        max_frame_size=args.max_frame_size,
    )
    result = trio.run(replay, plan, config)
    report = build_report(result)
    print(render_json(report) if args.json else render_text(report, args.max_differences))
    return 1 if report["differences_total"] else 0
