"""The relay engine's own mechanics, on real loopback sockets with the test as client and broker.

The relay scenarios themselves (repairs, closing, hostile peers, real clients) run through
the engine and through tasks in the other test modules; these check what only the engine
does: which sockets epoll watches, how receives are shared out, one heap of deadlines, and
that what goes wrong on one connection stays there.
"""

from __future__ import annotations

import gc
import math
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import structlog
import trio
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from trio.testing import wait_all_tasks_blocked

from corrfix.capture import CaptureWriter, read_capture
from corrfix.core import (
    CLOSE_GRACE,
    LOOPBACK,
    Address,
    ConnectionConfig,
    ConnectionCore,
    Event,
    RepairConfig,
    RepairMachine,
)
from corrfix.proxy import _engine as engine_module
from corrfix.proxy._engine import Relayed, RelayEngine
from corrfix.proxy._engine_metrics import EngineCollector
from corrfix.proxy._handoff import HandoffLock
from corrfix.proxy._health import Liveness
from corrfix.proxy._observer import SerializedObserver
from corrfix.proxy._sinks import ConnectionSinks, ProxyStats
from corrfix.proxy._spares import FrameSpares
from corrfix.proxy._streams import receive_buffer
from protocol import BIG_FRAME, ApiKey, FrameDecoder, parse_request_header
from protocol.testing import request_frame
from tests.support.fake_broker import answers, echo_answer, read_frames
from tests.support.polling import wait_until
from tests.support.produce_frames import produce_frame, record_batch

TEST_DEADLINE = 20.0
"""A hang guard around each test's network steps, not a timed assertion."""
NO_PROBES = ConnectionConfig(repair=RepairConfig(probe_min=TEST_DEADLINE, probe_after=TEST_DEADLINE))
"""For tests that count the frames the broker reads: on a loaded machine a slow answer is
worth a probe (adaptive, from the latency seen), and the probe is a frame too."""


async def tcp_pair(buffers: int | None = None) -> tuple[trio.SocketStream, trio.SocketStream]:
    """Both ends of one loopback TCP connection; with ``buffers``, either end can write that
    much at once (the receive windows are set before the handshake)."""
    listener = trio.socket.socket()
    await listener.bind((LOOPBACK, 0))
    listener.listen(1)
    near = trio.socket.socket()
    if buffers is not None:
        for sock in (near, listener):  # the accepted socket inherits the listener's
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers)
    await near.connect(listener.getsockname())
    far, _ = await listener.accept()
    listener.close()
    return trio.SocketStream(near), trio.SocketStream(far)


_opened: list[trio.SocketStream] = []


@pytest.fixture(autouse=True)
def _close_every_link() -> Iterator[None]:
    """Every socket of the test's links is closed once it is over, not left to the garbage
    collector, whose warning would land in whichever later test collects it. Outside trio's
    run by then, so closed by descriptor."""
    yield
    while _opened:
        descriptor = _opened.pop().socket.detach()
        if descriptor >= 0:
            os.close(descriptor)


@dataclass
class Link:
    """One relayed connection: the test plays its client and its broker; the proxy's two sockets
    sit in between, relayed by the engine once :meth:`adopt` hands them over."""

    client: trio.SocketStream
    proxy_client: trio.SocketStream
    proxy_upstream: trio.SocketStream
    broker: trio.SocketStream
    name: str
    relayed: Relayed | None = None
    over: trio.Event = field(default_factory=trio.Event)
    over_at: float | None = None
    error: Exception | None = None

    @classmethod
    async def open(cls, name: str, buffers: int | None = None) -> Link:
        client, proxy_client = await tcp_pair(buffers)
        proxy_upstream, broker = await tcp_pair(buffers)
        _opened.extend((client, proxy_client, proxy_upstream, broker))  # not the link: tests watch it go
        return cls(client, proxy_client, proxy_upstream, broker, name)

    def adopt(
        self,
        engine: RelayEngine,
        nursery: trio.Nursery,
        config: ConnectionConfig | None = None,
        observer: object = None,
    ) -> Relayed:
        config = config or ConnectionConfig()
        core = ConnectionCore(
            config, RepairMachine(config.repair), trio.current_time(), record_frames=observer is not None
        )
        log = structlog.get_logger("corrfix.proxy").bind(connection=self.name)
        sinks = ConnectionSinks(self.name, log, ProxyStats(), Address(LOOPBACK, 9092), None, observer)  # type: ignore[arg-type]
        self.relayed = engine.adopt(
            core,
            self.proxy_client,
            self.proxy_upstream,
            sinks,
            close_linger=config.close_linger,
            on_end=self._close,
        )
        nursery.start_soon(self._closed_when_cancelled)
        return self.relayed

    def _close(self) -> None:
        """What the proxy does, in trio's thread, when the engine is done or the proxy stops:
        take the connection out of the engine and close both sockets."""
        if self.over.is_set():
            return
        assert self.relayed is not None
        self.relayed.forget()
        self.error = self.relayed.error
        self.over_at = trio.current_time()
        self.proxy_upstream.socket.close()
        self.proxy_client.socket.close()
        self.over.set()

    async def _closed_when_cancelled(self) -> None:
        """The proxy's task that closes what the engine still holds when the proxy stops."""
        try:
            await self.over.wait()
        finally:
            self._close()

    @property
    def reason(self) -> str:
        assert self.relayed is not None
        return self.relayed.core.closed().reason

    async def round_trip(self, correlation_id: int) -> None:
        """One request through the proxy, answered by the test's broker, back to the client."""
        await self.client.send_all(request_frame(ApiKey.LIST_OFFSETS, correlation_id, correlation_id))
        (request,) = await read_frames(self.broker, 1)
        await self.broker.send_all(answer_to(request))
        assert answers(await read_frames(self.client, 1)) == [(correlation_id, correlation_id)]


def answer_to(request: bytes | bytearray) -> bytes:
    header = parse_request_header(request)
    assert header.body_offset is not None
    return echo_answer(request, header.body_offset)


def padded_request(correlation_id: int, size: int) -> bytes:
    """A ListOffsets-keyed request of ``size`` bytes (the proxy reads only its header)."""
    small = request_frame(ApiKey.LIST_OFFSETS, correlation_id, correlation_id)
    padded = small[:-8] + bytes(size - len(small)) + small[-8:]
    padded[:4] = (len(padded) - 4).to_bytes(4, "big")
    return bytes(padded)


def available(stream: trio.SocketStream) -> int:
    """Bytes waiting in the socket right now, read and dropped without waiting."""
    total = 0
    while True:
        try:
            chunk = os.read(stream.socket.fileno(), 1 << 20)
        except BlockingIOError:
            return total
        if not chunk:
            return total
        total += len(chunk)


async def count_until(stream: trio.SocketStream, total: int) -> None:
    """Read and drop bytes until ``total`` have arrived."""
    while total > 0:
        data = await stream.receive_some(1 << 20)
        assert data, "closed early"
        total -= len(data)


async def _polite_broker(link: Link) -> None:
    """Reads until the proxy ends its stream to the broker, then closes, as a broker does."""
    while await link.broker.receive_some(65536):
        pass
    await link.broker.aclose()


async def polite_client(link: Link) -> None:
    """Reads until the proxy ends its stream, then closes, as a well-behaved client does."""
    while await link.client.receive_some(65536):
        pass
    await link.client.aclose()


async def polite_broker(link: Link) -> None:
    """Reads until the proxy ends the broker's stream, then closes, as a broker does."""
    while await link.broker.receive_some(65536):
        pass
    await link.broker.aclose()


# -- epoll's interest follows the backlog and the core ---------------------------------------


async def test_epollout_is_watched_only_while_a_socket_holds_unsent_bytes():
    engine = RelayEngine()
    async with trio.open_nursery() as nursery:
        link = await Link.open("c1")
        # Small buffers on the way to the client, so a 1 MiB answer cannot go at once.
        link.client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        link.proxy_client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        relayed = link.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await wait_all_tasks_blocked()
            assert relayed.interest() == (select.EPOLLIN, select.EPOLLIN)
            await link.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 7, 7))
            (request,) = await read_frames(link.broker, 1)
            big = bytearray(padded_request(0, 1024 * 1024))
            big[8:12] = request[8:12]  # the upstream id
            answer = answer_to(big)
            await link.broker.send_all(answer)
            await wait_all_tasks_blocked()
            client_interest, upstream_interest = relayed.interest()
            assert client_interest == select.EPOLLIN | select.EPOLLOUT  # bytes wait for the client
            assert upstream_interest == select.EPOLLIN
            (delivered,) = await read_frames(link.client, 1)
            await wait_all_tasks_blocked()
            assert relayed.interest() == (select.EPOLLIN, select.EPOLLIN)  # nothing left to send
        assert len(delivered) == len(answer) and delivered[4:8] == (7).to_bytes(4, "big")
        nursery.cancel_scope.cancel()


async def test_a_side_that_stops_reading_leaves_the_set():
    """A client's end of stream: no more reads from it, so epoll stops watching its socket
    (a level-triggered set would otherwise report its end of stream on every pass)."""
    engine = RelayEngine()
    async with trio.open_nursery() as nursery:
        link = await Link.open("c1")
        relayed = link.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await link.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 3, 3))
            await link.client.send_eof()
            (request,) = await read_frames(link.broker, 1)
            # Returns only once the engine waits: a socket left in the set would be reported
            # (its end of stream) on every pass, and the engine would never wait.
            await wait_all_tasks_blocked()
            assert relayed.interest() == (0, select.EPOLLIN)  # still owed an answer
            await link.broker.send_all(answer_to(request))
            assert answers(await read_frames(link.client, 1)) == [(3, 3)]
            assert await link.broker.receive_some(100) == b""  # then the broker's side is half-closed
            await link.broker.aclose()
            assert await link.client.receive_some(100) == b""
            await link.over.wait()
        assert link.reason == "client closed"
        nursery.cancel_scope.cancel()


# -- big frames land in their own buffers -----------------------------------------------------


async def test_an_idle_connection_keeps_no_guessed_buffer():
    """A receive that fills both the guessed buffer and the shared one makes the engine read
    again, into a new guessed buffer, and find nothing: that buffer goes back to the engine's
    spares instead of staying with the idle connection's decoder."""
    shared = 64 * 1024
    engine = RelayEngine(receive_size=shared)
    async with trio.open_nursery() as nursery:
        link = await Link.open("idle", buffers=1 << 20)
        relayed = link.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await link.client.send_all(padded_request(1, BIG_FRAME))  # the decoder now guesses
            (upstream,) = await read_frames(link.broker, 1)
            await link.broker.send_all(answer_to(upstream))
            await read_frames(link.client, 1)
            # A guessed-size request and a request the size of the shared buffer, written before
            # the engine runs: one receive takes exactly all of it.
            both = padded_request(2, BIG_FRAME) + padded_request(3, shared)
            assert os.write(link.client.socket.fileno(), both) == len(both)
            upstream_requests = await read_frames(link.broker, 2)
            await link.broker.send_all(b"".join(answer_to(r) for r in upstream_requests))
            assert len(await read_frames(link.client, 2)) == 2
            await wait_all_tasks_blocked()
            decoder = relayed.core.client_decoder
            assert decoder.big and decoder.buffered == 0  # still guessing, nothing pending
            assert decoder._frame is None, "an idle connection holds a frame-sized buffer"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("threaded", [False, True], ids=["task", "thread"])
async def test_big_frames_are_received_into_their_own_buffers_and_arrive_intact(threaded, monkeypatch):
    """Requests and answers of 128 KiB and more, sizes changing so that guesses go wrong, some
    sent two at a time: every byte arrives, in order, and the big ones were received into the
    buffers the decoders offered (``feed`` was told of bytes ``filled`` there), some of them
    buffers of earlier frames the engine was done with."""
    filled: list[int] = []
    feed = FrameDecoder.feed

    def counting_feed(self: FrameDecoder, data: object, filled_bytes: int = 0) -> list[bytearray]:
        if filled_bytes:
            filled.append(filled_bytes)
        return feed(self, data, filled_bytes)  # type: ignore[arg-type]

    monkeypatch.setattr(FrameDecoder, "feed", counting_feed)
    reused: list[int] = []
    take = FrameSpares.take

    def counting_take(self: FrameSpares, size: int) -> bytearray:
        known = {id(frame) for frame in self._frames}  # ids: a list of them would hold them
        buffer = take(self, size)
        if id(buffer) in known:
            reused.append(size)
        return buffer

    monkeypatch.setattr(FrameSpares, "take", counting_take)
    engine = RelayEngine(threaded=threaded)
    sizes = [[300_000], [300_000], [200], [200_000, 200_000], [1_500_000], [300_000, 90], [5_000_000]]
    async with trio.open_nursery() as nursery:
        link = await Link.open("big")
        link.adopt(engine, nursery, NO_PROBES)
        with trio.fail_after(TEST_DEADLINE):
            cid = 0
            for batch in sizes:
                requests = []
                for size in batch:
                    cid += 1
                    requests.append(padded_request(cid, size))
                await link.client.send_all(b"".join(requests))
                relayed = await read_frames(link.broker, len(requests))
                assert [len(r) for r in relayed] == [len(r) for r in requests]
                assert [bytes(r[12:]) for r in relayed] == [r[12:] for r in requests]
                sent = [answer_to(r) for r in relayed]
                await link.broker.send_all(b"".join(sent))
                delivered = await read_frames(link.client, len(requests))
                expected = [
                    a[:4] + c.to_bytes(4, "big") + a[8:]
                    for a, c in zip(sent, range(cid - len(batch) + 1, cid + 1), strict=True)
                ]
                assert [bytes(d) for d in delivered] == expected
        nursery.cancel_scope.cancel()
    # At the least the 5 MB frame's bytes after its first receive (a MiB at most), both ways.
    assert sum(filled) > 8_000_000
    assert reused  # the second 300 KB request landed in the first one's buffer, and came out whole


async def test_a_capture_of_big_frames_holds_their_bytes_while_buffers_are_reused(tmp_path):
    """Capture keeps references to a pass's frames until the pass ends: a buffer the engine
    reuses must not be one of them. Two connections' answers of one size are written before
    the engine's task runs, so one pass delivers one (the newest buffer of that size) and
    wants a buffer of that size for the other (the task mode, as a thread could wake between
    the two writes)."""
    writer = CaptureWriter(tmp_path, snaplen=1 << 20, flush_seconds=0.05).start()
    engine = RelayEngine()
    sent: dict[str, list[bytes]] = {"a": [], "b": []}
    delivered: dict[str, list[bytes]] = {"a": [], "b": []}
    try:
        async with trio.open_nursery() as nursery:
            links = [
                await Link.open("a", buffers=1 << 20),
                await Link.open("b", buffers=1 << 20),
            ]
            for link in links:
                link.adopt(engine, nursery, NO_PROBES, observer=SerializedObserver(writer))
            with trio.fail_after(TEST_DEADLINE):
                for cid in range(1, 9):
                    relayed = []
                    for mark, link in enumerate(links):
                        request = bytearray(padded_request(cid, 200_000))
                        request[-8:] = bytes([cid * 2 + mark]) * 8  # every request's bytes differ
                        sent[link.name].append(bytes(request))
                        await link.client.send_all(request)
                        (upstream,) = await read_frames(link.broker, 1)
                        relayed.append(upstream)
                    for link, upstream in zip(links, relayed, strict=True):  # no await between
                        answer = answer_to(upstream)
                        assert os.write(link.broker.socket.fileno(), answer) == len(answer)
                    for link in links:
                        delivered[link.name] += [bytes(a) for a in await read_frames(link.client, 1)]
            nursery.cancel_scope.cancel()
    finally:
        writer.close()
    frames = [r for r in read_capture(tmp_path).to_pylist() if r["kind"] == "frame" and r["side"] == "client"]
    for name in ("a", "b"):
        mine = [r for r in frames if r["connection_id"].endswith(name)]
        assert [r["frame"] for r in mine if r["direction"] == "request"] == sent[name]
        assert [r["frame"] for r in mine if r["direction"] == "response"] == delivered[name]
        assert [a[8:] for a in delivered[name]] == [answer_to(r)[8:] for r in sent[name]]


# -- fairness ----------------------------------------------------------------------------------

RECEIVE = 2048
FAIR = 2


async def test_a_flood_on_one_connection_does_not_starve_another():
    """Connection A has 96 KiB of requests waiting, B one request; both are ready on the first
    pass. With 2 KiB receives and two per socket and pass, B's request reaches its broker while
    A has had only a pass or two of receives, and A is then relayed in full."""
    engine = RelayEngine(receive_size=RECEIVE, fair_reads=FAIR)
    flood = [padded_request(i, 1000) for i in range(96)]
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")
        a.proxy_client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024 * 1024)
        with trio.fail_after(TEST_DEADLINE):
            await a.client.send_all(b"".join(flood))  # in the kernel's buffers before the engine looks
            await b.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
            a.adopt(engine, nursery)
            b.adopt(engine, nursery)
            await trio.lowlevel.wait_readable(b.broker.socket)
            relayed_of_a = available(a.broker)
            # A few passes ran (the one that relayed B's request, maybe some after it before this
            # task ran), each with at most FAIR receives from A: A is far from relayed in full.
            assert relayed_of_a <= engine.passes * FAIR * RECEIVE, (relayed_of_a, engine.passes)
            assert relayed_of_a < sum(map(len, flood)) // 2, (relayed_of_a, engine.passes)
            (request,) = await read_frames(b.broker, 1)
            await b.broker.send_all(answer_to(request))
            assert answers(await read_frames(b.client, 1)) == [(1, 1)]
            await count_until(a.broker, sum(map(len, flood)) - relayed_of_a)  # and A in full
        nursery.cancel_scope.cancel()


# -- one heap of deadlines -------------------------------------------------------------------


async def test_every_connection_closes_at_its_own_deadline_from_one_heap(mock_clock):
    """Two idle timeouts (30 s and 10 s) on the MockClock. A's activity at 20 s moves its deadline
    to 50 s: its heap entry for 30 s fires early, finds nothing due and is pushed again. B's client
    leaves at its end of stream; A's does not, so A is closed after the close linger. Both brokers
    close at the proxy's end of stream, as brokers do."""
    mock_clock.autojump_threshold = 0
    engine = RelayEngine()
    start = trio.current_time()
    with capture_logs() as logs, trio.fail_after(1000):  # virtual seconds: a hang guard
        async with trio.open_nursery() as nursery:
            a, b = await Link.open("a"), await Link.open("b")
            config_a = ConnectionConfig(idle_timeout=30.0)
            a.adopt(engine, nursery, config_a)
            b.adopt(engine, nursery, ConnectionConfig(idle_timeout=10.0))
            nursery.start_soon(polite_client, b)
            nursery.start_soon(polite_broker, b)
            await trio.sleep(20)
            await a.round_trip(5)
            nursery.start_soon(polite_broker, a)
            assert not a.over.is_set()
            assert await a.client.receive_some(100) == b""  # A's client reads the end of stream...
            await a.over.wait()  # ...but neither closes nor sends
            await b.over.wait()
            nursery.cancel_scope.cancel()
    assert b.over_at == pytest.approx(start + 10 + CLOSE_GRACE)
    assert a.over_at == pytest.approx(start + 20 + 30 + CLOSE_GRACE + config_a.close_linger)
    assert a.reason == "idle for 30s" and b.reason == "idle for 10s"
    lingered = [
        e["connection"] for e in logs if e["event"] == "client did not close after the proxy's end of stream"
    ]
    assert lingered == ["a"]
    assert engine.connections == 0


# -- what goes wrong on one connection stays there ---------------------------------------------


def set_reset_on_close(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("threaded", [False, True], ids=["task", "thread"])
@pytest.mark.parametrize("vanishing", ["client", "broker"])
async def test_a_vanished_peer_closes_its_own_connection_only(vanishing, threaded):
    engine = RelayEngine(threaded=threaded)
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")
        a.adopt(engine, nursery)
        b.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await a.round_trip(1)
            await b.round_trip(1)
            await a.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 2, 2))
            await read_frames(a.broker, 1)  # outstanding when the peer vanishes
            if vanishing == "client":
                set_reset_on_close(a.client)
                await a.client.aclose()
                # The request read before still reached the broker; then its side is half-closed
                # (after any probe the proxy sent meanwhile).
                while await a.broker.receive_some(65536):
                    pass
                await a.broker.aclose()
            else:
                set_reset_on_close(a.broker)
                await a.broker.aclose()
                nursery.start_soon(polite_client, a)
            await a.over.wait()
            for correlation_id in range(2, 12):
                await b.round_trip(correlation_id)
        expected = "client connection lost" if vanishing == "client" else "upstream closed with 1 requests"
        assert a.reason.startswith(expected), a.reason
        assert not b.over.is_set() and engine.connections == 1
        nursery.cancel_scope.cancel()


class BrokenObserver:
    """An observer with a bug: the connection it watches must be the only one to suffer."""

    snaplen = 0

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        pass

    def events(self, connection: str, events: list[Event]) -> None:
        raise RuntimeError("observer bug")

    def connection_closed(self, connection: str, reason: str) -> None:
        pass


@pytest.mark.parametrize("threaded", [False, True], ids=["task", "thread"])
async def test_a_bug_on_one_connection_costs_that_connection_only(threaded):
    engine = RelayEngine(threaded=threaded)
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")
        a.adopt(engine, nursery, observer=BrokenObserver())
        b.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await a.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
            await a.over.wait()
            await b.round_trip(1)
        assert str(a.error) == "observer bug"
        assert not b.over.is_set() and engine.connections == 1
        nursery.cancel_scope.cancel()


class PassCalls:
    """An observer that gathers each pass's reports: it notes the engine's calls in order."""

    snaplen = 0

    def __init__(self) -> None:
        self.calls: list[str] = []

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        pass

    def events(self, connection: str, events: list[Event]) -> None:
        self.calls.append(f"events {connection}")

    def connection_closed(self, connection: str, reason: str) -> None:
        pass

    def begin_pass(self) -> None:
        self.calls.append("begin")

    def end_pass(self) -> None:
        self.calls.append("end")


@pytest.mark.parametrize("threaded", [False, True], ids=["task", "thread"])
async def test_an_observer_that_gathers_passes_hears_every_report_inside_one(threaded):
    """One begin and one end per pass, however many connections report to the observer, and
    every report made while serving ready sockets comes between the two (timers fired by the
    task outside a pass report on their own, and capture queues those at once)."""
    engine = RelayEngine(threaded=threaded)
    inner = PassCalls()
    observer = SerializedObserver(inner)
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")
        a.adopt(engine, nursery, observer=observer)
        b.adopt(engine, nursery, observer=observer)
        with trio.fail_after(TEST_DEADLINE):
            for correlation_id in range(3):
                await a.round_trip(correlation_id)
                await b.round_trip(correlation_id)
            await wait_until(lambda: inner.calls[-1:] == ["end"])
        nursery.cancel_scope.cancel()
    calls = inner.calls
    assert calls.count("events a") >= 6 and calls.count("events b") >= 6  # each side of each trip
    depth = 0
    for call in calls:
        if call == "begin":
            assert depth == 0
            depth = 1
        elif call == "end":
            assert depth == 1
            depth = 0
        else:
            assert depth == 1, "a report outside a pass"
    assert depth == 0


# -- the engine's own thread -----------------------------------------------------------------


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "corrfix relay engine"]


async def test_the_thread_closes_an_idle_connection_at_its_deadline():
    """Nothing happens on the connection: only the thread's poll timeout can end it, at the
    idle deadline and not before."""
    engine = RelayEngine(threaded=True)
    config = ConnectionConfig(idle_timeout=0.3)
    async with trio.open_nursery() as nursery:
        link = await Link.open("idle")
        start = trio.current_time()
        link.adopt(engine, nursery, config)
        with trio.fail_after(TEST_DEADLINE):
            await link.round_trip(1)
            active = trio.current_time()
            await link.over.wait()
        assert link.over_at is not None and link.over_at >= active + 0.3 > start
        assert "idle" in link.reason


async def test_a_drain_from_trio_reaches_a_connection_the_thread_relays():
    """The drain changes the core from trio's thread, under the engine's lock: the request the
    broker still owes an answer to is answered, then the connection ends."""
    engine = RelayEngine(threaded=True)
    async with trio.open_nursery() as nursery:
        link = await Link.open("draining")
        relayed = link.adopt(engine, nursery)
        nursery.start_soon(polite_client, link)
        with trio.fail_after(TEST_DEADLINE):
            await link.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 7, 7))
            (request,) = await read_frames(link.broker, 1)
            relayed.apply(relayed.core.drain)
            await link.broker.send_all(answer_to(request))
            await link.over.wait()
        assert relayed.core.machine.outstanding == 0
        assert "drain" in link.reason


async def _busy_thread(engine: RelayEngine, nursery: trio.Nursery) -> tuple[list[Link], int]:
    """Two connections flooded with requests the thread relays over a thousand passes or more
    each (two ready sockets a pass keep it in its burst of passes); returns them and the flood's size."""
    flood = b"".join(padded_request(i, 1000) for i in range(2048))
    busy = [await Link.open(name, buffers=len(flood) + (1 << 20)) for name in ("busy-1", "busy-2")]
    for link in busy:
        await link.client.send_all(flood)  # all in the kernel's buffers before the engine looks
    for link in busy:
        link.adopt(engine, nursery)
    await wait_until(lambda: engine.passes >= 20)
    return busy, len(flood)


async def test_trio_gets_the_lock_between_two_passes_of_a_busy_thread(monkeypatch):
    """A change from trio's thread (here a drain) waits for the pass the thread is in, not until
    the thread runs out of work. With a plain lock the thread took it again first, and trio's
    whole loop stopped: 400 clients connecting at once under load waited seconds. The thread's
    bursts of passes are made as long as the flood."""
    monkeypatch.setattr(engine_module, "BURST", 1_000_000)
    engine = RelayEngine(threaded=True, receive_size=RECEIVE, fair_reads=1)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(TEST_DEADLINE):
            busy, flood = await _busy_thread(engine, nursery)
            before = engine.passes
            assert busy[0].relayed is not None
            busy[0].relayed.apply(lambda now: None)
            waited = engine.passes - before
            relayed = available(busy[0].broker)
        assert relayed < flood // 2, relayed  # the thread was still busy when trio got its turn
        assert waited <= 3, waited
        nursery.cancel_scope.cancel()


async def test_connections_adopted_while_the_thread_is_busy_wait_for_no_pass(monkeypatch):
    """trio's thread hands a connection over without the engine's lock: the thread takes it in
    at its next pass. Each is then relayed as any other."""
    monkeypatch.setattr(engine_module, "BURST", 1_000_000)
    engine = RelayEngine(threaded=True, receive_size=RECEIVE, fair_reads=1)
    trio_thread = threading.get_ident()
    entered: list[int] = []
    enter = HandoffLock.__enter__

    def counted(lock: HandoffLock) -> None:
        entered.append(threading.get_ident())
        enter(lock)

    async with trio.open_nursery() as nursery:
        with trio.fail_after(TEST_DEADLINE):
            busy, flood = await _busy_thread(engine, nursery)
            late = [await Link.open(f"late-{i}") for i in range(10)]
            monkeypatch.setattr(HandoffLock, "__enter__", counted)
            for link in late:
                link.adopt(engine, nursery)
            monkeypatch.setattr(HandoffLock, "__enter__", enter)
            assert available(busy[0].broker) < flood // 2  # the thread was busy throughout
            assert trio_thread not in entered
            for i, link in enumerate(late):
                await link.round_trip(i)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("change", ["drain", "close"])
async def test_a_connection_changed_right_after_its_adoption_is_changed_whether_taken_in_or_not(change):
    """A drain or a close from trio's thread may find the connection still waiting for the
    thread's next pass: a drain takes it in first, a close leaves nothing behind."""
    engine = RelayEngine(threaded=True)
    async with trio.open_nursery() as nursery:
        first = await Link.open("first")
        first.adopt(engine, nursery)  # starts the thread: the next ones are queued for it
        with trio.fail_after(TEST_DEADLINE):
            await first.round_trip(1)
            for round in range(20):
                link = await Link.open(f"{change}-{round}")
                relayed = link.adopt(engine, nursery)
                if change == "drain":
                    nursery.start_soon(polite_client, link)
                    nursery.start_soon(_polite_broker, link)
                    relayed.apply(relayed.core.drain)
                    assert relayed.admitted  # in the set, where the thread carries the drain out
                    await link.over.wait()
                    assert "drain" in link.reason
                else:
                    link._close()
                    assert relayed.over and relayed.released
                    assert link.proxy_client.socket.fileno() == -1
            await first.round_trip(2)  # the engine serves on
        assert engine.connections == 1
        nursery.cancel_scope.cancel()


async def test_a_connection_queued_while_the_thread_takes_in_another_is_not_left_waiting():
    """trio's thread queues a connection and wakes the thread with one eventfd write; the
    thread reads the eventfd in its pass. A connection queued after the pass looked at the
    queue, but before it read the eventfd, had its wake-up read with the other's: the thread
    then slept in ``poll`` with it still queued, until some other socket or deadline woke it
    (the idle deadline, ten minutes by default)."""
    engine = RelayEngine(threaded=True)
    token = trio.lowlevel.current_trio_token()
    admit = engine._admit
    async with trio.open_nursery() as nursery:
        first, a, b = await Link.open("first"), await Link.open("a"), await Link.open("b")
        first.adopt(engine, nursery)  # starts the thread: the next ones are queued for it
        with trio.fail_after(TEST_DEADLINE):
            await first.round_trip(1)
            # Until the heap's next entry is far off, a deadline would wake the thread soon anyway.
            await wait_until(lambda: bool(engine._heap) and engine._heap[0][0] > trio.current_time() + 10)

        def admit_then_queue_b() -> None:
            """The thread takes ``a`` in; meanwhile trio's thread queues ``b`` (forced here,
            between the queue's check and the eventfd's read, where it can happen by chance)."""
            admit()
            engine._admit = admit  # type: ignore[method-assign]
            trio.from_thread.run_sync(b.adopt, engine, nursery, trio_token=token)

        engine._admit = admit_then_queue_b  # type: ignore[method-assign]
        a.adopt(engine, nursery)
        with trio.fail_after(3.0):  # taken in at the thread's next pass, not at a deadline
            await b.round_trip(3)  # first: traffic on ``a`` would wake the thread anyway
        with trio.fail_after(TEST_DEADLINE):
            await a.round_trip(2)
        nursery.cancel_scope.cancel()


async def test_a_connection_taken_in_right_after_a_failed_pass_still_closes_at_its_deadline():
    """A bug escaping a pass costs the connections the engine had, and only them. A connection
    queued meanwhile is taken in before the next pass: it must be scheduled then, not put on
    the failed pass's list of connections whose deadlines that pass was to read (its
    deadlines then never fired)."""
    engine = RelayEngine(threaded=True)
    token = trio.lowlevel.current_trio_token()
    timers = engine._timers
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")

        def queue_b_then_break(now: float) -> None:
            engine._timers = timers  # type: ignore[method-assign]
            trio.from_thread.run_sync(
                b.adopt, engine, nursery, ConnectionConfig(idle_timeout=0.3), trio_token=token
            )
            raise RuntimeError("timers broke")

        engine._timers = queue_b_then_break  # type: ignore[method-assign]
        with trio.fail_after(TEST_DEADLINE):
            a.adopt(engine, nursery, ConnectionConfig(idle_timeout=0.1))
            await a.over.wait()  # its idle deadline ran the broken timers
            assert str(a.error) == "timers broke"
            await wait_until(lambda: b.relayed is not None and b.relayed.admitted)
            assert b.relayed is not None
            due = b.relayed.scheduled
            await b.over.wait()
        assert due < math.inf  # scheduled when it was taken in
        assert "idle" in b.reason
        nursery.cancel_scope.cancel()


async def test_a_failed_thread_fails_its_connections_and_the_next_one_gets_a_new_thread():
    engine = RelayEngine(threaded=True)
    loop = engine._poll_and_serve

    def broken_once(epoll: select.epoll) -> None:
        engine._poll_and_serve = loop  # type: ignore[method-assign]
        raise RuntimeError("epoll broke")

    engine._poll_and_serve = broken_once  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")
        with capture_logs() as logs, trio.fail_after(TEST_DEADLINE):
            a.adopt(engine, nursery)
            await a.over.wait()
        assert str(a.error) == "epoll broke"
        assert [log["event"] for log in logs] == ["relay engine thread failed"]
        b.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await b.round_trip(1)  # served by a new thread
        nursery.cancel_scope.cancel()


async def test_a_run_that_refuses_the_engine_s_guard_gets_no_thread_and_the_next_connection_one(monkeypatch):
    """The task that stops the thread with the trio run is spawned before the thread: when trio
    refuses it (a run that is ending), no thread is left that nothing would stop, and the next
    connection starts the only one, not a second thread on the same set."""
    engine = RelayEngine(threaded=True)
    spawn = trio.lowlevel.spawn_system_task
    refused: list[str] = []

    def refuse_once(*args: object, **kwargs: object) -> object:
        if not refused:
            refused.append("refused")
            raise RuntimeError("the run is ending")
        return spawn(*args, **kwargs)  # type: ignore[arg-type]

    before = engine_threads()
    async with trio.open_nursery() as nursery:
        first, second = await Link.open("first"), await Link.open("second")
        monkeypatch.setattr(trio.lowlevel, "spawn_system_task", refuse_once)
        with pytest.raises(RuntimeError, match="the run is ending"):
            first.adopt(engine, nursery)
        for stream in (first.client, first.proxy_client, first.proxy_upstream, first.broker):
            stream.socket.close()  # what the proxy's caller does when adopt raises
        assert engine_threads() == before
        second.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await second.round_trip(1)
        assert len(engine_threads()) == len(before) + 1
        nursery.cancel_scope.cancel()


async def test_a_connection_that_cannot_be_taken_in_costs_only_itself():
    """Connections queued together are taken in one after another: one the engine fails to
    take in is closed with the error, and the ones queued after it are still relayed."""
    engine = RelayEngine(threaded=True)
    enter = engine._enter
    async with trio.open_nursery() as nursery:
        first, bad, good = await Link.open("first"), await Link.open("bad"), await Link.open("good")

        def enter_but_bad(relayed: Relayed) -> None:
            if relayed is bad.relayed:
                raise RuntimeError("cannot take it in")
            enter(relayed)

        engine._enter = enter_but_bad  # type: ignore[method-assign]
        first.adopt(engine, nursery)  # starts the thread: the next ones are queued for it
        with trio.fail_after(TEST_DEADLINE):
            await first.round_trip(1)
            with engine._lock:  # the thread waits between passes: both are queued before it looks
                bad.adopt(engine, nursery)
                good.adopt(engine, nursery)
            await bad.over.wait()
            await good.round_trip(2)
        assert str(bad.error) == "cannot take it in"
        nursery.cancel_scope.cancel()


async def test_a_thread_that_fails_to_close_a_connection_as_it_stops_still_makes_way_for_a_new_one():
    """The thread's loop broke, and closing one of its connections then failed too: the engine
    still forgets the dead thread and its set, so the next connection gets a new thread
    rather than a set nobody serves."""
    engine = RelayEngine(threaded=True)
    loop, release = engine._poll_and_serve, engine._release

    def broken_once(epoll: select.epoll) -> None:
        engine._poll_and_serve = loop  # type: ignore[method-assign]
        raise RuntimeError("epoll broke")

    def release_failing_once(relayed: Relayed) -> None:
        engine._release = release  # type: ignore[method-assign]
        release(relayed)
        raise RuntimeError("release broke")

    engine._poll_and_serve = broken_once  # type: ignore[method-assign]
    engine._release = release_failing_once  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        a, b = await Link.open("a"), await Link.open("b")
        with capture_logs() as logs:
            a.adopt(engine, nursery)
            with trio.fail_after(TEST_DEADLINE):
                await wait_until(lambda: not engine_threads())
        assert "relay engine failed to close a connection as it stopped" in [log["event"] for log in logs]
        b.adopt(engine, nursery)
        with trio.fail_after(TEST_DEADLINE):
            await b.round_trip(1)  # served by a new thread
        nursery.cancel_scope.cancel()


def test_the_thread_ends_with_the_trio_run():
    async def relay_one() -> None:
        engine = RelayEngine(threaded=True)
        async with trio.open_nursery() as nursery:
            link = await Link.open("one")
            link.adopt(engine, nursery)
            with trio.fail_after(TEST_DEADLINE):
                await link.round_trip(1)
            assert len(engine_threads()) == 1
            nursery.cancel_scope.cancel()

    before = engine_threads()
    trio.run(relay_one)
    assert engine_threads() == before


async def test_an_ended_connection_is_not_kept_alive_by_its_deadlines():
    """Deadlines sit in one heap, superseded ones until they fire (up to the idle timeout
    ahead). They must not keep an ended connection alive: its decoders keep a buffer the size
    of its last big frame, and its machine the requests it kept for re-sending."""
    engine = RelayEngine()
    size = 2 * BIG_FRAME
    async with trio.open_nursery() as nursery:
        keeper = await Link.open("keeper")  # a live connection: the engine and its heap stay
        keeper.adopt(engine, nursery)
        for i in range(5):
            link = await Link.open(f"c{i}")
            with trio.fail_after(TEST_DEADLINE):
                async with trio.open_nursery() as own:  # ends once the client has closed too
                    link.adopt(engine, own)
                    own.start_soon(polite_client, link)
                    await link.client.send_all(padded_request(1, size))
                    (request,) = await read_frames(link.broker, 1)
                    big = bytearray(padded_request(0, size))
                    big[8:12] = request[8:12]
                    await link.broker.send_all(answer_to(big))
                    await link.client.send_eof()  # the polite client reads the answer, then closes
                    await _polite_broker(link)
        del link
        assert engine._heap  # entries of the ended connections are still there, as designed
        gc.collect()
        ended = [o for o in gc.get_objects() if isinstance(o, Relayed) and o.over]
        assert ended == []
        nursery.cancel_scope.cancel()


async def test_the_engine_s_thread_receives_into_a_buffer_trio_s_readers_do_not_share():
    """trio's thread lends one buffer to every reader of the run (a connection with TLS on one
    side reads its plaintext side into it); the engine's thread receives at the same time, so
    it must not use that one. A loop that is a trio task may."""
    assert RelayEngine(threaded=True)._buffer is not receive_buffer()
    assert RelayEngine(threaded=False)._buffer is receive_buffer()


def reset(stream: trio.SocketStream) -> None:
    """Close with a reset (RST), as a broker that crashes does."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


@pytest.mark.parametrize("noticed", ["on a receive", "on a send"])
async def test_a_broker_reset_flags_the_unanswered_produce_whichever_side_notices_it(noticed):
    """docs/repair.md rule 9: a broker gone with a non-idempotent Produce unanswered flags it as
    a possible duplicate. A send that meets the reset first (a client request relayed in the
    same pass) aborted the connection instead, unflagged."""
    engine = RelayEngine()
    async with trio.open_nursery() as nursery:
        link = await Link.open("reset")
        relayed = link.adopt(engine, nursery)
        nursery.start_soon(polite_client, link)
        with trio.fail_after(TEST_DEADLINE):
            produce, _ = produce_frame(7, topics=[[record_batch(-1)]])  # no producer id: not idempotent
            await link.client.send_all(produce)
            await read_frames(link.broker, 1)  # the broker has it, and may have appended it
            await wait_all_tasks_blocked()
            if noticed == "on a send":
                # The client's next request is ready in the same pass as the broker's reset.
                more = request_frame(ApiKey.METADATA, 8, 8)
                assert os.write(link.client.socket.fileno(), more) == len(more)
            reset(link.broker)
            await link.over.wait()
        nursery.cancel_scope.cancel()
    assert relayed.sinks.repairs["possible_duplicate"] == 1
    assert link.reason.startswith("upstream closed with ")


# -- what /livez and /metrics read of the engine, from another thread --------------------------


async def test_a_pass_that_does_not_end_is_seen_from_another_thread_and_fails_livez():
    """A pass stuck in one connection stops every plaintext connection while trio's loop beats
    on: the engine says how long the pass in progress has run, and ``/livez`` fails on it."""
    engine = RelayEngine(threaded=True)
    entered, release = threading.Event(), threading.Event()
    liveness = Liveness(stall_limit=0)
    liveness.beat(0)
    liveness.listening()

    class Stuck(PassCalls):
        armed = False

        def events(self, connection: str, events: list[Event]) -> None:
            if self.armed:  # the request's events, in the engine's pass
                entered.set()
                release.wait(TEST_DEADLINE)

    async with trio.open_nursery() as nursery:
        link = await Link.open("stuck")
        stuck = Stuck()
        link.adopt(engine, nursery, observer=stuck)
        assert engine.pass_seconds() == 0.0  # between passes
        stuck.armed = True
        with trio.fail_after(TEST_DEADLINE):
            await link.client.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
            await trio.to_thread.run_sync(entered.wait)
            assert engine.pass_seconds() > 0.0
            verdict = liveness.verdict(0, engine.pass_seconds())
            assert not verdict.ok
            assert verdict.detail["reason"].startswith("the relay engine has been in one pass for ")
            release.set()
            (request,) = await read_frames(link.broker, 1)  # the pass went on
            await wait_until(lambda: engine.pass_seconds() == 0.0)
        assert liveness.verdict(0, engine.pass_seconds()).ok
        await link.broker.send_all(answer_to(request))
        assert answers(await read_frames(link.client, 1)) == [(1, 1)]
        nursery.cancel_scope.cancel()


def test_a_thread_s_cpu_time_is_read_for_that_thread_alone():
    """``/metrics`` reads the engine thread's CPU from /proc, from the HTTP thread: a thread that
    spins is charged, and the one that asks is not."""
    done = threading.Event()
    spun: list[float] = []
    native: list[int] = []

    def spin() -> None:
        native.append(threading.get_native_id())
        start = time.thread_time()
        while time.thread_time() - start < 0.2:
            pass
        spun.append(time.thread_time())
        done.wait(TEST_DEADLINE)

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        while not spun:
            pass  # this thread spins too, uncharged to the other
        charged = engine_module.thread_cpu_seconds(native[0])
        assert abs(charged - spun[0]) <= 0.03, (charged, spun[0])  # /proc counts in ticks of 10 ms
    finally:
        done.set()
        thread.join()
    # join() returns once the thread's Python state is gone, a moment before the kernel
    # reaps the task (about 1 in 100 joins here still found its /proc entry): wait for that.
    task = f"/proc/self/task/{native[0]}"
    deadline = time.monotonic() + TEST_DEADLINE
    while os.path.exists(task):
        assert time.monotonic() < deadline, f"{task} outlived its thread"
        os.sched_yield()
    assert engine_module.thread_cpu_seconds(native[0]) == 0.0  # ended: no /proc entry


def test_the_engine_s_cpu_outlives_its_thread_and_the_metrics_read_it():
    """The engine's CPU counter keeps what an ended thread used (a counter never goes back),
    and ``/metrics`` exports it with the connections, the thread and the passes."""
    engine = RelayEngine(threaded=True)
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: engine))
    seen: dict[str, float] = {}

    async def relay_one() -> None:
        async with trio.open_nursery() as nursery:
            link = await Link.open("one")
            link.adopt(engine, nursery)
            with trio.fail_after(TEST_DEADLINE):
                await link.round_trip(1)
            seen["connections"] = registry.get_sample_value("corrfix_engine_connections") or 0
            seen["threads"] = registry.get_sample_value("corrfix_engine_threads") or 0
            seen["passes"] = registry.get_sample_value("corrfix_engine_passes_total") or 0
            nursery.cancel_scope.cancel()

    trio.run(relay_one)
    assert seen["connections"] == 1 and seen["threads"] == 1 and seen["passes"] >= 2
    assert not engine.running_thread
    assert registry.get_sample_value("corrfix_engine_threads") == 0
    kept = engine.cpu_seconds()
    assert kept > 0.0  # the ended thread's own count (time.thread_time), not /proc's ticks
    assert registry.get_sample_value("corrfix_engine_cpu_seconds_total") == kept


def test_the_engine_metrics_are_exported_at_zero_before_the_proxy_runs():
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: None))
    for name in ("connections", "threads", "passes_total", "cpu_seconds_total"):
        assert registry.get_sample_value(f"corrfix_engine_{name}") == 0, name
