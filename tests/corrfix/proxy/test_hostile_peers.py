"""Hostile peers against a running proxy: each is logged clearly and closed; everyone else carries on.

Every test runs an in-process proxy in front of a scripted broker, with a well-behaved
"bystander" client connected before the hostile peer arrives. Each test checks the same
four things: the hostile connection is closed by the proxy (the test sees end of stream
or a reset, and never a partial frame); one clear log line names what went wrong; the
bystander's answers stay correct before, during and after; and the proxy forgets the
hostile connection (its count of live connections returns to the bystander alone),
which is the count-based signal that nothing is kept.

Memory in bytes is measured only in :func:`test_rss_stays_bounded_under_a_storm_of_hostile_peers`,
on a ``corrfix proxy`` child process, so the test process's own allocations do not blur it.
"""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import struct
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from corrfix._netutil import free_ports
from corrfix.core import LOOPBACK, Address, RepairConfig
from corrfix.lab import CorrfixProcess
from corrfix.proxy import Proxy, ProxyConfig
from protocol import ApiKey, FrameDecoder, frame, parse_request_header
from protocol.testing import request_frame
from tests.support.fake_broker import answers, api_versions_answer, echo_answer, read_frames
from tests.support.polling import wait_until

# Answers from the echo broker are not real Kafka bodies: use an api key corrfix never decodes.
MAX_FRAME = 1024 * 1024
FRAME_TIMEOUT = 0.5
REQUEST_DEADLINE = 1.0
"""Only for the broker that never answers: a stall of the loaded machine that long must not
make the proxy give up on the bystanders of the other scenes."""
TEST_DEADLINE = 20.0
"""A hang guard around each test's network steps, not a timed assertion."""

REPAIR = RepairConfig(probe_after=0.1, probe_min=0.01, request_deadline=TEST_DEADLINE)


# -- the scripted broker -------------------------------------------------------------------

Behaviour = Callable[["ScriptedBroker", trio.SocketStream], Awaitable[None]]


async def echo(broker: ScriptedBroker, stream: trio.SocketStream) -> None:
    """Answer every request in order: ApiVersions for real (the proxy's probes), others echoed."""
    decoder = FrameDecoder()
    while data := await stream.receive_some(65536):
        out = bytearray()
        for request in decoder.feed(data):
            header = parse_request_header(request)
            if header.api_key == ApiKey.API_VERSIONS:  # the proxy's own probe
                out += api_versions_answer(header.correlation_id, header.api_version)
            else:
                broker.requests += 1
                assert header.body_offset is not None
                out += echo_answer(request, header.body_offset)
        await stream.send_all(out)


async def silent(broker: ScriptedBroker, stream: trio.SocketStream) -> None:
    """Accept, read every request, never answer."""
    broker.hostile_connected.set()
    decoder = FrameDecoder()
    while data := await stream.receive_some(65536):
        frames = decoder.feed(data)
        broker.requests += sum(parse_request_header(f).api_key != ApiKey.API_VERSIONS for f in frames)


async def deaf(broker: ScriptedBroker, stream: trio.SocketStream) -> None:
    """Accept, then neither read nor answer: the proxy's sends back up into its own buffers."""
    broker.hostile_connected.set()
    await trio.sleep_forever()


async def half_answer(broker: ScriptedBroker, stream: trio.SocketStream) -> None:
    """Send half of the first answer, then go quiet while still reading."""
    broker.hostile_connected.set()
    decoder = FrameDecoder()
    sent = False
    while data := await stream.receive_some(65536):
        for request in decoder.feed(data):
            if not sent and parse_request_header(request).api_key != ApiKey.API_VERSIONS:
                broker.requests += 1
                answer = echo_answer(request, parse_request_header(request).body_offset or 0)
                await stream.send_all(answer[: len(answer) // 2])
                sent = True


def closing_mid_response(*, reset: bool) -> Behaviour:
    """Answer the first request, send half the second answer, then close (FIN) or reset (RST)."""

    async def behaviour(broker: ScriptedBroker, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        requests: list[bytearray] = []
        while len(requests) < 2:
            data = await stream.receive_some(65536)
            if not data:
                return
            requests += decoder.feed(data)
        broker.requests += len(requests)
        first, second = (echo_answer(r, parse_request_header(r).body_offset or 0) for r in requests[:2])
        await stream.send_all(first + second[: len(second) // 2])
        if reset:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    return behaviour


@dataclass
class ScriptedBroker:
    """Each new upstream connection takes the next behaviour of ``plan``; ``echo`` once it is empty."""

    plan: deque[Behaviour] = field(default_factory=deque)
    requests: int = 0
    """Client requests received (the proxy's ApiVersions probes are not counted)."""
    active: int = 0
    hostile_connected: trio.Event = field(default_factory=trio.Event)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        behaviour = self.plan.popleft() if self.plan else echo
        self.active += 1
        try:
            async with stream:
                await behaviour(self, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the proxy went away first
        finally:
            self.active -= 1


# -- clients -------------------------------------------------------------------------------


class Bystander:
    """A well-behaved client on its own connection; every round trip checks ids, order and payload."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.next_id = 1

    async def round_trip(self, pipelined: int = 3) -> None:
        ids = list(range(self.next_id, self.next_id + pipelined))
        self.next_id += pipelined
        await self.stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, cid, cid * 31) for cid in ids))
        assert answers(await read_frames(self.stream, pipelined)) == [(cid, cid * 31) for cid in ids]


async def closed_by_proxy(stream: trio.SocketStream) -> bytes:
    """Everything received until the proxy closed the connection (end of stream, or a reset)."""
    received = bytearray()
    for _ in range(10_000):
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:  # closed with our bytes unread: the kernel sends a reset
            break
        if not data:
            break
        received += data
    return bytes(received)


def local_name(stream: trio.SocketStream) -> str:
    host, port = stream.socket.getsockname()[:2]
    return f"{host}:{port}"


def lines_about(logs: list[dict], peer: str, event: str) -> list[dict]:
    return [entry for entry in logs if entry.get("client") == peer and entry["event"] == event]


def set_reset_on_close(stream: trio.SocketStream) -> None:
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


# -- the set-up every test shares ----------------------------------------------------------


@dataclass
class Scene:
    proxy: Proxy
    port: int
    broker: ScriptedBroker
    bystander: Bystander
    logs: list[dict]

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream(LOOPBACK, self.port)

    async def settled(self) -> None:
        """The proxy tracks the bystander alone again, with nothing owed on it."""
        proxy = self.proxy

        def only_bystander() -> bool:
            live = list(proxy._live)
            return proxy.stats.connections_active == 1 and len(live) == 1 and live[0].machine.outstanding == 0

        await wait_until(only_bystander)
        await self.bystander.round_trip()


@contextlib.asynccontextmanager
async def scene(broker: ScriptedBroker | None = None, **config: object) -> AsyncIterator[Scene]:
    """A proxy, a broker and a bystander that has already had one answer."""
    broker = broker or ScriptedBroker()
    settings: dict = {"repair": REPAIR, "max_frame_size": MAX_FRAME, "frame_timeout": FRAME_TIMEOUT, **config}
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            broker_port = await nursery.start(broker.serve)
            proxy = Proxy(ProxyConfig(Address(LOOPBACK, 0), Address(LOOPBACK, broker_port), **settings))
            port = (await nursery.start(proxy.serve))[0].port
            with trio.fail_after(TEST_DEADLINE):
                bystander = Bystander(await trio.open_tcp_stream(LOOPBACK, port))
                await bystander.round_trip()  # its upstream connection is the broker's first
                yield Scene(proxy, port, broker, bystander, logs)
            nursery.cancel_scope.cancel()
    assert not [entry for entry in logs if entry["event"] == "internal error, connection closed"]


async def hostile_client_is_closed(payload: bytes, reason: str, engine: bool) -> None:
    """Send ``payload``; the proxy must close with ``reason`` in a warning, the bystander unharmed."""
    async with scene(engine=engine) as s:
        hostile = await s.connect()
        peer = local_name(hostile)
        await hostile.send_all(payload)
        await s.bystander.round_trip()
        assert await closed_by_proxy(hostile) == b""
        await s.settled()
        assert s.broker.requests == s.bystander.next_id - 1  # nothing of the hostile peer was relayed
    warnings = lines_about(s.logs, peer, "closing connection")
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert reason in warnings[0]["reason"]
    assert [line["reason"] for line in lines_about(s.logs, peer, "connection closed")] == [
        warnings[0]["reason"]
    ]


# -- hostile clients -----------------------------------------------------------------------

NOISE = b"\x3c" + random.Random(7).randbytes(511)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(NOISE, f"frame size {int.from_bytes(NOISE[:4])} is larger than the maximum", id="noise"),
        pytest.param(frame(b"\xff\xfe" + bytes(30)), "request header has api key -2", id="negative-api-key"),
        pytest.param(
            frame(b"\x00\x03"), "request frame of 2 bytes is shorter than a header", id="short-header"
        ),
        pytest.param(
            frame(b"\x00\x03\x00\x01\x00\x00\x00\x07\x7f\xffclient"),
            "request header is truncated inside its client id",
            id="client-id-past-the-end",
        ),
    ],
)
async def test_garbage_bytes(payload, reason, engine):
    await hostile_client_is_closed(payload, f"bad request from client: {reason}", engine)


async def test_an_http_request(engine):
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8\r\n\r\n"
    # "GET " read as a size prefix is 1195725856 bytes: refused before anything is buffered.
    await hostile_client_is_closed(
        request, "bad request from client: frame size 1195725856 is larger", engine
    )


def client_hello() -> bytes:
    """The first flight of a real TLS client, as it would arrive on a plaintext listener."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="kafka.example")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_a_tls_client_hello_on_the_plaintext_port(engine):
    await hostile_client_is_closed(client_hello(), "TLS handshake on a plaintext listener", engine)


@pytest.mark.parametrize(
    ("size", "reason"),
    [(-1, "frame size -1 is negative"), (2**31 - 1, "frame size 2147483647 is larger than the maximum")],
)
async def test_frame_size_of_minus_one_and_int32_max(size, reason, engine):
    await hostile_client_is_closed(size.to_bytes(4, "big", signed=True) + b"\x00\x12\x00\x00", reason, engine)


@pytest.mark.parametrize("cut", [2, 7, 20], ids=["inside-size", "inside-header", "inside-body"])
async def test_half_a_frame_then_a_stall(cut, engine):
    whole = request_frame(ApiKey.LIST_OFFSETS, 9, 9)
    assert cut < len(whole)
    await hostile_client_is_closed(
        bytes(whole[:cut]), f"request frame incomplete for {FRAME_TIMEOUT:g}s", engine
    )


async def test_slowloris(engine):
    """Twenty clients each dribble a frame a byte at a time, never finishing it within the frame
    timeout; each is closed (the timeout counts from the frame's first byte, not the last one),
    nothing reaches the broker, and the proxy tracks none of them afterwards."""
    attackers = 20
    declared = 1000  # bytes the frame announces; far more than any attacker sends in time
    pace = FRAME_TIMEOUT / 5  # the attack's own rhythm, not a wait for the proxy

    async with scene(engine=engine) as s:
        peers: list[str] = []
        received: list[bytes] = []

        async def dribble() -> None:
            stream = await s.connect()
            peers.append(local_name(stream))
            payload = declared.to_bytes(4, "big") + bytes(declared)
            with contextlib.suppress(trio.BrokenResourceError):
                for i in range(4 * 5):  # four frame timeouts' worth of bytes, at most
                    await stream.send_all(payload[i : i + 1])
                    await trio.sleep(pace)
            received.append(await closed_by_proxy(stream))

        async with trio.open_nursery() as attack:
            for _ in range(attackers):
                attack.start_soon(dribble)
            await wait_until(lambda: s.proxy.stats.connections_active == 1 + attackers)
            await s.bystander.round_trip()  # while all twenty are being served
        assert received == [b""] * attackers
        await s.settled()
        assert s.broker.requests == s.bystander.next_id - 1
    for peer in peers:
        (warning,) = lines_about(s.logs, peer, "closing connection")
        assert warning["reason"] == f"request frame incomplete for {FRAME_TIMEOUT:g}s"


async def test_a_thousand_connections_opened_and_dropped(engine):
    """1,000 connections in waves of 100, dropped in four ways: closed at once, reset at once,
    reset after half a request, closed after a whole request without reading the answer. Each
    gets a "connection closed" line, and the proxy ends up tracking the bystander alone."""
    total, wave = 1000, 100
    async with scene(engine=engine) as s:
        half = bytes(request_frame(ApiKey.LIST_OFFSETS, 1, 1)[:9])
        whole = bytes(request_frame(ApiKey.LIST_OFFSETS, 2, 2))

        async def drop(kind: int) -> None:
            stream = await s.connect()
            with contextlib.suppress(trio.BrokenResourceError):
                if kind == 1:
                    set_reset_on_close(stream)
                elif kind == 2:
                    await stream.send_all(half)
                    set_reset_on_close(stream)
                elif kind == 3:
                    await stream.send_all(whole)
            await stream.aclose()

        for start in range(0, total, wave):
            async with trio.open_nursery() as storm:
                for kind in range(start, start + wave):
                    storm.start_soon(drop, kind % 4)
            await s.bystander.round_trip()
        await s.settled()
        assert s.proxy.stats.connections_opened == total + 1
        await wait_until(lambda: s.broker.active == 1)  # every upstream connection closed too
        closing = [line for line in s.logs if line["event"] == "connection closed"]  # before the bystander's
    opened = {line["connection"] for line in s.logs if line["event"] == "connection opened"}
    assert len(opened) == total + 1
    assert {line["connection"] for line in closing} == opened - {"c1"}  # everyone but the bystander
    reasons = {line["reason"].split(":")[0] for line in closing}
    assert reasons <= {"client closed", "client connection lost", "client connection lost while sending"}


# -- hostile brokers -----------------------------------------------------------------------


def big_request(correlation_id: int, size: int) -> bytes:
    """A ListOffsets-keyed request padded to ``size`` bytes (the proxy reads only its header)."""
    small = request_frame(ApiKey.LIST_OFFSETS, correlation_id, correlation_id)
    padded = small[:-8] + bytes(size - len(small)) + small[-8:]
    padded[:4] = (len(padded) - 4).to_bytes(4, "big")
    return bytes(padded)


@pytest.mark.parametrize(
    "behaviour", [silent, deaf, half_answer], ids=["reads-never-answers", "never-reads", "half-an-answer"]
)
async def test_a_broker_that_accepts_and_never_answers(behaviour, engine):
    """The client is not left hanging: after the request deadline the proxy gives up and closes."""
    broker = ScriptedBroker(plan=deque([echo, behaviour]))  # the bystander's connection, then this one
    give_up_soon = RepairConfig(probe_after=0.1, probe_min=0.01, request_deadline=REQUEST_DEADLINE)
    async with scene(broker, repair=give_up_soon, engine=engine) as s:
        client = await s.connect()
        peer = local_name(client)
        await client.send_all(request_frame(ApiKey.LIST_OFFSETS, 5, 5))
        await broker.hostile_connected.wait()
        await s.bystander.round_trip()  # served by its own, healthy, upstream connection
        assert await closed_by_proxy(client) == b""
        await s.settled()
    (give_up,) = lines_about(s.logs, peer, "repair.give_up")
    assert give_up["log_level"] == "warning" and give_up["client_correlation_id"] == 5
    assert give_up["reason"] == f"unanswered after {REQUEST_DEADLINE:g}s"
    (closed,) = lines_about(s.logs, peer, "connection closed")
    assert closed["reason"] == f"gave up on ListOffsets request: unanswered after {REQUEST_DEADLINE:g}s"
    assert lines_about(s.logs, peer, "repair.probe_sent")  # it looked for the answer first


def slow_reader(stall: float) -> Behaviour:
    """Read nothing for ``stall`` seconds (a broker in a long GC pause), then answer everything."""

    async def behaviour(broker: ScriptedBroker, stream: trio.SocketStream) -> None:
        broker.hostile_connected.set()
        await trio.sleep(stall)  # the scenario itself: how long the broker is unresponsive
        await echo(broker, stream)

    return behaviour


async def test_backpressure_from_a_slow_broker_is_not_blamed_on_the_client(engine):
    """A well-behaved client pipelines 16 requests of ~1 MiB to a broker that reads nothing for
    four frame timeouts. The proxy rightly stops reading from the client (its upstream buffer is
    full), which leaves part of a request unread in the client's socket. That stall is the
    proxy's own doing: every answer should still arrive once the broker catches up."""
    count, size = 16, MAX_FRAME - 7  # not a multiple of any receive size: a read ends mid-frame
    repair_config = RepairConfig(probe_after=0.1, probe_min=0.01, request_deadline=60.0)
    broker = ScriptedBroker(plan=deque([echo, slow_reader(4 * FRAME_TIMEOUT)]))
    async with scene(broker, repair=repair_config, engine=engine) as s:
        client = await s.connect()
        payload = b"".join(big_request(100 + i, size) for i in range(count))

        async def send() -> None:
            with contextlib.suppress(trio.BrokenResourceError):  # closed early, with sends pending
                await client.send_all(payload)

        async with trio.open_nursery() as sending:
            sending.start_soon(send)
            got = answers(await read_frames(client, count))
    closing = [line["reason"] for line in s.logs if line["event"] == "closing connection"]
    assert got == [(100 + i, 100 + i) for i in range(count)], closing


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
async def test_a_broker_that_closes_mid_response(reset, engine):
    """The complete answer is delivered, the half one never: the client sees a clean end."""
    broker = ScriptedBroker(plan=deque([echo, closing_mid_response(reset=reset)]))
    async with scene(broker, engine=engine) as s:
        client = await s.connect()
        peer = local_name(client)
        await client.send_all(
            request_frame(ApiKey.LIST_OFFSETS, 1, 11) + request_frame(ApiKey.LIST_OFFSETS, 2, 22)
        )
        await s.bystander.round_trip()
        received = await closed_by_proxy(client)
        await s.settled()
    decoder = FrameDecoder()
    assert answers(decoder.feed(received)) == [(1, 11)] and decoder.buffered == 0  # no partial frame
    (closed,) = lines_about(s.logs, peer, "connection closed")
    assert closed["reason"] == "upstream closed with 1 requests unanswered"
    if reset:
        assert lines_about(s.logs, peer, "upstream connection lost")
    else:
        (mid_frame,) = lines_about(s.logs, peer, "upstream closed mid-frame")
        assert mid_frame["log_level"] == "warning" and mid_frame["buffered"] > 0


# -- memory, in bytes, on a child process --------------------------------------------------


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field_name} for pid {pid}")


def active_connections(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("corrfix_connections_active "):
                return float(line.split()[1])
    raise AssertionError("no corrfix_connections_active gauge")


RSS_GROWTH_BOUND_MIB = 64
PEAK_GROWTH_BOUND_MIB = 160


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
async def test_rss_stays_bounded_under_a_storm_of_hostile_peers(tmp_path, engine):
    """A ``corrfix proxy`` child (max frame 1 MiB, frame timeout 0.5 s) takes 1,000 connections
    opened and dropped, 50 slowloris clients that each send 64 KiB of a 1 MiB frame and stall,
    and 50 garbage and HTTP clients. Bounds, stated generously for a noisy machine: once it
    tracks only the bystander again, its RSS is within 64 MiB of what it was after warm-up, and
    its peak RSS never grew by more than 160 MiB (50 stalled frames hold at most ~3 MiB)."""
    port, metrics_port = free_ports(2)
    broker = ScriptedBroker()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        args = [
            "proxy",
            "--listen",
            f"{LOOPBACK}:{port}",
            "--upstream",
            f"{LOOPBACK}:{broker_port}",
            "--max-frame-size",
            str(MAX_FRAME),
            "--frame-timeout",
            str(FRAME_TIMEOUT),
            "--drain-timeout",
            "1",
            "--metrics",
            f"{LOOPBACK}:{metrics_port}",
            *([] if engine else ["--no-engine"]),
        ]
        child = CorrfixProcess(args, port, tmp_path / "proxy.log")
        await trio.to_thread.run_sync(child.start)
        try:
            assert child._proc is not None
            pid = child._proc.pid
            with trio.fail_after(60):
                bystander = Bystander(await trio.open_tcp_stream(LOOPBACK, port))

                async def storm(waves: int) -> None:
                    async def drop() -> None:
                        stream = await trio.open_tcp_stream(LOOPBACK, port)
                        await stream.aclose()

                    async def stall() -> None:
                        stream = await trio.open_tcp_stream(LOOPBACK, port)
                        with contextlib.suppress(trio.BrokenResourceError):
                            await stream.send_all(MAX_FRAME.to_bytes(4, "big") + bytes(64 * 1024))
                            await closed_by_proxy(stream)

                    async def garbage(payload: bytes) -> None:
                        stream = await trio.open_tcp_stream(LOOPBACK, port)
                        with contextlib.suppress(trio.BrokenResourceError):
                            await stream.send_all(payload)
                            await closed_by_proxy(stream)

                    async with trio.open_nursery() as attack:
                        for _ in range(50):
                            attack.start_soon(stall)
                        for i in range(50):
                            attack.start_soon(garbage, b"GET / HTTP/1.1\r\n\r\n" if i % 2 else b"\xff" * 64)
                        for _ in range(waves):
                            async with trio.open_nursery() as wave:
                                for _ in range(100):
                                    wave.start_soon(drop)
                            await bystander.round_trip()

                async def quiet() -> None:
                    """The child tracks the bystander alone again (its gauge says so)."""
                    while await trio.to_thread.run_sync(active_connections, metrics_port) != 1:
                        await trio.sleep(0.05)
                    await bystander.round_trip()

                await storm(1)  # warm-up: every path has run once
                await quiet()
                baseline, peak_before = rss_kib(pid), rss_kib(pid, "VmHWM")
                await storm(10)
                await quiet()
                after, peak = rss_kib(pid), rss_kib(pid, "VmHWM")
        finally:
            await trio.to_thread.run_sync(child.stop)
        nursery.cancel_scope.cancel()
    records = child.records()
    assert sum(r["event"] == "closing connection" for r in records) == 2 * 100  # stalled + garbage, twice
    assert not [r for r in records if r["event"] == "internal error, connection closed"]
    assert after - baseline < RSS_GROWTH_BOUND_MIB * 1024, (baseline, after)
    assert peak - baseline < PEAK_GROWTH_BOUND_MIB * 1024, (baseline, peak_before, peak)
