"""The trio relay against a scripted broker: ids, order, repairs, close and bad input."""

from __future__ import annotations

import errno
import gc
import os
import warnings
from collections import Counter
from collections.abc import Sequence

import pytest
import trio
import trio.testing
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from corrfix.core import Address, Event, RepairConfig
from corrfix.proxy import Proxy, ProxyConfig, ProxyMetrics
from corrfix.proxy._server import ACCEPT_RETRY
from protocol import ApiKey, FrameDecoder
from protocol.testing import request_frame
from tests.support.fake_broker import FakeBroker, answers, echo_answer, read_frames
from tests.support.polling import wait_until
from tests.support.relay import FAST_REPAIR, start_proxy

# Answers from the echo broker are not real Kafka bodies, so use an api key whose answers
# corrfix never decodes (Metadata answers are decoded to rewrite broker addresses).


async def start_pair(
    nursery: trio.Nursery, broker: FakeBroker, engine: bool, repair: RepairConfig = FAST_REPAIR
):
    broker_port = await nursery.start(broker.serve)
    return await start_proxy(nursery, broker_port, repair, engine=engine)


async def test_relays_in_order_with_client_ids_restored(engine):
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            ids = [1000 + i for i in range(50)]
            await stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, cid, cid * 7) for cid in ids))
            got = answers(await read_frames(stream, len(ids)))
        assert got == [(cid, cid * 7) for cid in ids]
        assert [cid for _, cid in broker.requests] == list(range(50))
        nursery.cancel_scope.cancel()


async def test_lost_and_duplicated_answers_are_repaired(engine):
    def script(index: int, api_key: int) -> str:
        if api_key == 18:
            return "answer"
        return {3: "lose", 7: "duplicate", 12: "lose", 13: "lose"}.get(index, "answer")

    broker = FakeBroker(script)
    async with trio.open_nursery() as nursery:
        proxy, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            got: list[tuple[int, int]] = []
            for cid in range(20):  # one in flight: only probes can find these losses
                await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, cid, cid + 100))
                got += answers(await read_frames(stream, 1))
        assert got == [(cid, cid + 100) for cid in range(20)]
        assert proxy.stats.repairs["probe_found_loss"] >= 2
        assert proxy.stats.repairs["stale_drop"] >= 1
        nursery.cancel_scope.cancel()


async def test_acks0_produce_gets_no_answer_and_stray_replies_are_dropped(engine):
    broker = FakeBroker()  # answers everything, acks=0 included, like Tansu
    async with trio.open_nursery() as nursery:
        proxy, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            frames = [request_frame(ApiKey.PRODUCE, i, i, acks=0) for i in range(10)]
            frames.append(request_frame(ApiKey.LIST_OFFSETS, 99, 99))
            await stream.send_all(b"".join(frames))
            got = answers(await read_frames(stream, 1))
        assert got == [(99, 99)]
        assert proxy.stats.repairs["stale_drop"] == 10
        assert proxy.stats.repairs["requeue"] == 0
        nursery.cancel_scope.cancel()


BIG_REQUEST = 256 * 1024


def padded_request(correlation_id: int, size: int) -> bytes:
    """A ListOffsets request of ``size`` bytes (its body padded), echoed whole by the broker."""
    frame = request_frame(ApiKey.LIST_OFFSETS, correlation_id, correlation_id)
    frame[12 + 3 : 12 + 3] = bytes(size - len(frame))  # after the header's client id "c"
    frame[0:4] = (len(frame) - 4).to_bytes(4, "big")
    return bytes(frame)


async def test_a_broker_that_reads_eagerly_gets_at_most_the_outstanding_bytes(engine):
    """Requests are kept whole for re-sending until answered, so ``max_outstanding_bytes`` pauses
    reading the client: a broker that pipelines (reads without answering) must not make the
    proxy keep a thousand big Produces. The broker here reads everything and answers only once
    nothing more comes for a moment; the requests it holds unanswered stay near the bound."""
    bound = 2 * BIG_REQUEST
    unanswered_most = 0

    async def eager_broker(stream: trio.SocketStream) -> None:
        nonlocal unanswered_most
        decoder, unanswered = FrameDecoder(), []
        async with stream:
            while True:
                with trio.move_on_after(0.3) as quiet:
                    data = await stream.receive_some(1 << 20)
                if quiet.cancelled_caught:  # the proxy sends nothing more: answer what it sent
                    await stream.send_all(b"".join(echo_answer(f, 15) for f in unanswered))
                    unanswered.clear()
                    continue
                if not data:
                    return
                unanswered += decoder.feed(data)
                unanswered_most = max(unanswered_most, len(unanswered))

    repair = RepairConfig(probe_after=30.0, max_outstanding_bytes=bound)
    count = 24
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, eager_broker, listeners)
        _, port = await start_proxy(nursery, listeners[0].socket.getsockname()[1], repair, engine=engine)
        with trio.fail_after(30):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            requests = b"".join(padded_request(i, BIG_REQUEST) for i in range(count))
            nursery.start_soon(stream.send_all, requests)
            got = await read_frames(stream, count)
        assert [int.from_bytes(f[4:8], "big") for f in got] == list(range(count))
        # The bound, plus what one receive from the client can carry past it (1 MiB, the engine's).
        assert unanswered_most <= (bound + (1 << 20)) // BIG_REQUEST + 1
        nursery.cancel_scope.cancel()


async def test_client_half_close_still_gets_every_answer(engine):
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, i, i) for i in range(5)))
            await stream.send_eof()
            got = answers(await read_frames(stream, 6))
        assert got == [(i, i) for i in range(5)]
        nursery.cancel_scope.cancel()


async def test_upstream_unreachable_closes_the_client():
    async with trio.open_nursery() as nursery:
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        dead_port = listener.getsockname()[1]
        listener.close()  # nothing listens there now
        _, port = await start_proxy(nursery, dead_port)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            assert await stream.receive_some(100) == b""
        nursery.cancel_scope.cancel()


async def test_upstream_closing_mid_stream_closes_the_client(engine):
    broker = FakeBroker(lambda index, _key: "close" if index == 2 else "answer")
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, i, i) for i in range(5)))
            got = answers(await read_frames(stream, 5))
        assert got == [(0, 0), (1, 1)]
        nursery.cancel_scope.cancel()


async def test_bad_input_closes_only_that_connection(engine):
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            good = await trio.open_tcp_stream("127.0.0.1", port)
            for garbage in (
                b"\xff\xff\xff\xff",
                b"\x7f\xff\xff\xff",
                b"GET / HTTP/1.1\r\n\r\n",
                b"\x00\x00\x00\x02ab",
            ):
                bad = await trio.open_tcp_stream("127.0.0.1", port)
                await bad.send_all(garbage)
                assert await bad.receive_some(100) == b""
            await good.send_all(request_frame(ApiKey.LIST_OFFSETS, 5, 5))
            assert answers(await read_frames(good, 1)) == [(5, 5)]
        nursery.cancel_scope.cancel()


async def test_requests_before_a_bad_frame_in_the_same_read_still_reach_the_broker(engine):
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            good = b"".join(bytes(request_frame(ApiKey.LIST_OFFSETS, cid, cid)) for cid in (5, 6))
            await client.send_all(good + b"\x00\x00\x00\x02ab")
            await read_frames(client, 2)  # the proxy closes the connection: no answer is owed
            await wait_until(lambda: len(broker.requests) == 2)
        nursery.cancel_scope.cancel()
    assert broker.requests == [(ApiKey.LIST_OFFSETS, 0), (ApiKey.LIST_OFFSETS, 1)]


async def test_answers_before_a_bad_frame_from_the_broker_reach_the_client_before_the_close(engine):
    broker = FakeBroker(lambda index, _api_key: "garbage" if index == 1 else "answer")
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)
        with trio.fail_after(10):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            requests = (bytes(request_frame(ApiKey.LIST_OFFSETS, cid, cid)) for cid in (5, 6))
            await client.send_all(b"".join(requests))
            got = answers(await read_frames(client, 2))  # the first answer, then the close
        nursery.cancel_scope.cancel()
    assert got == [(5, 5)]


class SeenEvents:
    """An observer (as capture is one) that keeps the kinds of event it was handed."""

    snaplen = 0

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        pass

    def events(self, connection: str, events: Sequence[Event]) -> None:
        self.kinds.update(type(event).__name__ for event in events)

    def connection_closed(self, connection: str, reason: str) -> None:
        pass


@pytest.mark.parametrize("observed", [False, True], ids=["metrics", "metrics-and-capture"])
async def test_metrics_count_requests_answers_repairs_and_bytes(engine, observed):
    """Alone, metrics are counted by the machine itself; beside an observer (capture), from
    the Forwarded and Answered events it reads. The counts are the same either way."""
    metrics = ProxyMetrics()
    observer = SeenEvents() if observed else None
    broker = FakeBroker(lambda index, api_key: "lose" if index == 1 and api_key != 18 else "answer")
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        proxy = Proxy(
            ProxyConfig(
                Address("127.0.0.1", 0), Address("127.0.0.1", broker_port), repair=FAST_REPAIR, engine=engine
            ),
            metrics=metrics,
            observer=observer,
        )
        port = (await nursery.start(proxy.serve))[0].port
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            for cid in range(3):
                await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, cid, cid))
                await read_frames(stream, 1)
        text = generate_latest(metrics.registry).decode()
        nursery.cancel_scope.cancel()
    assert 'corrfix_requests_total{api="ListOffsets"} 3.0' in text
    assert 'corrfix_answers_total{api="ListOffsets"} 3.0' in text
    assert 'corrfix_repairs_total{kind="probe_found_loss"} 1.0' in text
    assert 'corrfix_request_latency_seconds_count{api="ListOffsets"} 3.0' in text
    assert "corrfix_connections_active 1.0" in text
    assert 'corrfix_bytes_total{direction="request",side="client"}' in text
    if observer is not None:  # the events the counts then come from
        assert observer.kinds["Forwarded"] == 3 and observer.kinds["Answered"] == 3


async def test_a_scrape_shows_the_requests_kept_for_re_sending_and_their_bytes(engine):
    metrics = ProxyMetrics()
    broker = FakeBroker(lambda index, api_key: "answer" if api_key == ApiKey.API_VERSIONS else "lose")
    requests = [padded_request(0, 1000), padded_request(1, 3000)]
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        config = ProxyConfig(
            Address("127.0.0.1", 0),
            Address("127.0.0.1", broker_port),
            repair=RepairConfig(probe_after=30.0),
            engine=engine,
        )
        proxy = Proxy(config, metrics=metrics)
        port = (await nursery.start(proxy.serve))[0].port
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"".join(requests))
            await wait_until(lambda: len(broker.requests) == 2)
            text = generate_latest(metrics.registry).decode()
        nursery.cancel_scope.cancel()
    assert "corrfix_outstanding_requests 2.0" in text
    assert "corrfix_outstanding_request_bytes 4000.0" in text


async def start_watched_proxy(
    nursery: trio.Nursery, broker_port: int, engine: bool, *, rewrite: bool = False
) -> tuple[Proxy, int, trio.Event]:
    """A proxy, its port, and an event set when its ``serve`` returns (after a drain)."""
    config = ProxyConfig(
        Address("127.0.0.1", 0), Address("127.0.0.1", broker_port), rewrite=rewrite, engine=engine
    )
    proxy = Proxy(config)
    served = trio.Event()

    async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
        await proxy.serve(task_status=task_status)
        served.set()

    return proxy, (await nursery.start(serve))[0].port, served


async def test_drain_stops_accepting_and_lets_outstanding_requests_finish(engine):
    release = trio.Event()
    received = trio.Event()

    async def slow_broker(stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        frames: list[bytearray] = []
        while not frames:
            frames = decoder.feed(await stream.receive_some(65536))
        received.set()
        await release.wait()
        await stream.send_all(echo_answer(frames[0], 15))
        await stream.receive_some(100)

    async with trio.open_nursery() as nursery:
        broker_listeners = await nursery.start(trio.serve_tcp, slow_broker, 0)
        broker_port = broker_listeners[0].socket.getsockname()[1]
        proxy, port, served = await start_watched_proxy(nursery, broker_port, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 41, 41))
            await received.wait()
            proxy.drain(timeout=10)
            try:
                await trio.open_tcp_stream("127.0.0.1", port)
                refused = False
            except OSError:
                refused = True
            release.set()
            got = answers(await read_frames(stream, 2))  # the answer, then end of stream
            await served.wait()  # serve() returns once the last connection is done
        nursery.cancel_scope.cancel()
    assert refused
    assert got == [(41, 41)]


def _tasks_under(name: str) -> int:
    """How many trio tasks of this run run under a task called ``name``."""
    count, tasks, under = 0, [trio.lowlevel.current_root_task()], []
    while tasks:
        task = tasks.pop()
        children = [child for nursery in task.child_nurseries for child in nursery.child_tasks]
        (under if task.name == name else tasks).extend(children)
    while under:
        task = under.pop()
        count += 1
        under.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return count


async def test_a_connection_in_the_engine_has_no_task_and_is_closed_when_the_proxy_stops():
    broker = FakeBroker()
    async with trio.open_nursery() as outer:
        broker_port = await outer.start(broker.serve)
        with trio.fail_after(10), capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                proxy, port = await start_proxy(nursery, broker_port)
                serving = _tasks_under("corrfix.proxy._server.Proxy.serve")
                streams = []
                for cid in range(20):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, cid, cid))
                    assert answers(await read_frames(stream, 1)) == [(cid, cid)]
                    streams.append(stream)
                assert proxy.stats.connections_active == 20
                # Each connection's task ended when the engine took the connection over.
                assert _tasks_under("corrfix.proxy._server.Proxy.serve") == serving
                nursery.cancel_scope.cancel()
            for stream in streams:
                assert await stream.receive_some(100) == b""
        outer.cancel_scope.cancel()
    assert proxy.stats.connections_active == 0
    closed = [entry for entry in logs if entry["event"] == "connection closed"]
    assert len(closed) == 20 and {entry["reason"] for entry in closed} == {"proxy stopping"}


async def test_a_drain_whose_time_is_up_closes_what_is_left(engine):
    """The broker never answers: at the drain's deadline the connection is closed and serve returns."""
    broker = FakeBroker(lambda index, api_key: "lose")
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        proxy, port, served = await start_watched_proxy(nursery, broker_port, engine)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 7, 7))
            await wait_until(lambda: broker.requests)
            with capture_logs() as logs:
                proxy.drain(timeout=0.2)
                await served.wait()
            assert await stream.receive_some(100) == b""
        nursery.cancel_scope.cancel()
    assert proxy.stats.connections_active == 0
    assert [(e["reason"], e["outstanding"]) for e in logs if e["event"] == "connection closed"] == [
        ("proxy stopping", 1)
    ]


class _ObserverFailingAtClose:
    snaplen = 0

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        pass

    def events(self, connection: str, events: object) -> None:
        pass

    def connection_closed(self, connection: str, reason: str) -> None:
        raise RuntimeError("observer bug at close")


async def test_a_bug_at_a_connections_close_is_logged_and_the_proxy_serves_on(engine):
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        observer = _ObserverFailingAtClose()
        proxy, port = await start_proxy(nursery, broker_port, engine=engine, observer=observer)
        with trio.fail_after(10), capture_logs() as logs:
            for cid in range(2):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, cid, cid))
                assert answers(await read_frames(stream, 1)) == [(cid, cid)]
                await stream.send_eof()
                assert await stream.receive_some(100) == b""
                await wait_until(lambda: not proxy.stats.connections_active)
        nursery.cancel_scope.cancel()
    errors = [e for e in logs if e["event"] == "internal error, connection closed"]
    assert [e["connection"] for e in errors] == ["c1", "c2"]


class _ObserverFailingAtOpen(_ObserverFailingAtClose):
    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        raise RuntimeError("observer bug at open")


async def test_a_bug_as_a_connection_opens_closes_the_brokers_socket_at_once(engine):
    """The broker's socket is closed by the proxy, not left to the garbage collector (which
    warns of an unclosed socket): the log keeps the error's traceback, and with it the frame."""
    broker = FakeBroker()
    gc.collect()  # sockets an earlier test left to the collector are not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        async with trio.open_nursery() as nursery:
            broker_port = await nursery.start(broker.serve)
            observer = _ObserverFailingAtOpen()
            proxy, port = await start_proxy(nursery, broker_port, engine=engine, observer=observer)
            with trio.fail_after(10), capture_logs() as logs:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                assert await read_frames(stream, 1) == []  # closed
                await wait_until(lambda: broker.ended == 1)
                await wait_until(lambda: not proxy.stats.connections_active)
            nursery.cancel_scope.cancel()
        gc.collect()
    assert [e["connection"] for e in logs if e["event"] == "internal error, connection closed"] == ["c1"]
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


async def test_an_engine_that_cannot_start_fails_one_connection_and_the_next_is_relayed(monkeypatch):
    """The engine's first start runs out of descriptors: that connection is closed on both
    sides and reported closed, and the next connection starts the engine and is relayed."""
    eventfd = os.eventfd
    calls: list[int] = []

    def out_of_descriptors_once(*args: int) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return eventfd(*args)

    monkeypatch.setattr(os, "eventfd", out_of_descriptors_once)
    broker = FakeBroker()
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            proxy, port = await start_pair(nursery, broker, engine=True)
            with trio.fail_after(10):
                first = await trio.open_tcp_stream("127.0.0.1", port)
                await first.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                assert await read_frames(first, 1) == []  # closed (reset: its request was unread)
                second = await trio.open_tcp_stream("127.0.0.1", port)
                await second.send_all(request_frame(ApiKey.LIST_OFFSETS, 2, 2))
                assert answers(await read_frames(second, 1)) == [(2, 2)]
                await wait_until(lambda: broker.ended)
            nursery.cancel_scope.cancel()
    events = [(e["event"], e.get("connection")) for e in logs]
    assert ("internal error, connection closed", "c1") in events
    assert ("connection closed", "c1") in events
    assert proxy.stats.connections_active == 0


async def test_a_broker_listener_met_after_the_proxy_stopped_listening_is_not_started():
    """A Metadata answer relayed during a drain can name a broker not seen before: its
    listener is bound from the engine's thread, but nothing accepts on it any more."""
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        proxy, _, served = await start_watched_proxy(nursery, broker_port, engine=True, rewrite=True)
        with trio.fail_after(10), capture_logs() as logs:
            proxy.drain(timeout=5)
            await served.wait()  # no connection: every accept loop, and serve, has ended
            port = await trio.to_thread.run_sync(proxy._bind_broker_listener, 7, 0)
            await wait_until(lambda: any(e["event"].startswith("broker listener not started") for e in logs))
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
        nursery.cancel_scope.cancel()


class _ListenerOutOfSockets(trio.abc.Listener[trio.SocketStream]):
    """Fails its first accept as a process out of file descriptors does, then accepts one client."""

    def __init__(self, client: trio.SocketStream) -> None:
        self.client, self.accepts = client, 0

    async def accept(self) -> trio.SocketStream:
        self.accepts += 1
        if self.accepts == 1:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        if self.accepts == 2:
            return self.client
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        pass


async def test_accept_waits_out_a_process_out_of_sockets_and_goes_on(autojump_clock):
    proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", 1)))
    client = object()
    handled: list[tuple[object, float]] = []

    async def handler(stream: object) -> None:
        handled.append((stream, trio.current_time()))

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            proxy._connections = nursery
            nursery.start_soon(proxy._accept, _ListenerOutOfSockets(client), handler)  # type: ignore[arg-type]
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    assert handled == [(client, ACCEPT_RETRY)]
    assert [e["errno"] for e in logs if e["event"] == "cannot accept, retrying"] == ["EMFILE"]


async def test_idle_connections_are_closed(mock_clock, engine):
    """The default idle timeout (600 s), on trio's MockClock: real time flows so ``fail_after``
    bounds the test, and ``jump`` carries the connection past its idle deadline."""
    mock_clock.rate = 1.0
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        config = ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", broker_port), engine=engine)
        port = (await nursery.start(Proxy(config).serve))[0].port
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
            assert answers(await read_frames(stream, 1)) == [(1, 1)]
            with trio.move_on_after(0.3):  # nothing outstanding, but not yet idle: still open
                await stream.receive_some(100)
                raise AssertionError("closed before its idle timeout")
        mock_clock.jump(config.idle_timeout)  # outside fail_after, whose deadline would jump too
        with trio.fail_after(10):
            assert await stream.receive_some(100) == b""  # closed once idle
        nursery.cancel_scope.cancel()


async def test_connections_beyond_the_maximum_are_refused_with_a_log_line(engine):
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        config = ProxyConfig(
            Address("127.0.0.1", 0), Address("127.0.0.1", broker_port), max_connections=1, engine=engine
        )
        port = (await nursery.start(Proxy(config).serve))[0].port
        with trio.fail_after(10), capture_logs() as logs:
            first = await trio.open_tcp_stream("127.0.0.1", port)
            await first.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
            assert answers(await read_frames(first, 1)) == [(1, 1)]
            second = await trio.open_tcp_stream("127.0.0.1", port)
            assert await second.receive_some(100) == b""
        nursery.cancel_scope.cancel()
    assert any(e["event"] == "refusing connection" and e["reason"] == "max connections reached" for e in logs)


async def test_upstream_connect_is_retried_a_bounded_number_of_times():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    dead_port = listener.getsockname()[1]
    listener.close()
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", dead_port), connect_retries=2)
        port = (await nursery.start(Proxy(config).serve))[0].port
        with trio.fail_after(10), capture_logs() as logs:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            assert await stream.receive_some(100) == b""
        nursery.cancel_scope.cancel()
    events = [e["event"] for e in logs]
    assert events.count("upstream connect failed, retrying") == 2
    assert [e["attempts"] for e in logs if e["event"] == "upstream unreachable, closing client"] == [3]


async def test_a_client_that_stalls_mid_frame_is_closed_while_others_carry_on(mock_clock, engine):
    """The default frame timeout (30 s), on trio's MockClock at real rate, carried past by ``jump``."""
    mock_clock.rate = 1.0
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        config = ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", broker_port), engine=engine)
        port = (await nursery.start(Proxy(config).serve))[0].port
        with capture_logs() as logs:
            with trio.fail_after(10):
                stalled = await trio.open_tcp_stream("127.0.0.1", port)
                frame = request_frame(ApiKey.LIST_OFFSETS, 1, 1)
                await stalled.send_all(frame[:7])  # half a frame, then nothing
                good = await trio.open_tcp_stream("127.0.0.1", port)
                await good.send_all(request_frame(ApiKey.LIST_OFFSETS, 2, 2))
                assert answers(await read_frames(good, 1)) == [(2, 2)]
            mock_clock.jump(config.frame_timeout)
            with trio.fail_after(10):
                assert await stalled.receive_some(100) == b""
                await good.send_all(request_frame(ApiKey.LIST_OFFSETS, 3, 3))
                assert answers(await read_frames(good, 1)) == [(3, 3)]
        nursery.cancel_scope.cancel()
    assert any("incomplete" in (e.get("reason") or "") for e in logs if e["event"] == "closing connection")


def big_request(correlation_id: int, body: bytes) -> bytes:
    """A ListOffsets v0 frame (header v1, client id "c") with ``body`` after the header."""
    payload = ApiKey.LIST_OFFSETS.to_bytes(2, "big") + (0).to_bytes(2, "big")
    payload += correlation_id.to_bytes(4, "big") + b"\x00\x01c" + body
    return len(payload).to_bytes(4, "big") + payload


async def test_concurrent_big_frames_never_mix_between_connections(engine):
    """The readers share one receive buffer: what each client gets back must be its own bytes."""
    broker = FakeBroker()
    async with trio.open_nursery() as nursery:
        _, port = await start_pair(nursery, broker, engine)

        async def client(number: int) -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            bodies = [bytes([number, index]) * 150_000 for index in range(4)]
            async with trio.open_nursery() as sending:
                sending.start_soon(stream.send_all, b"".join(big_request(i, b) for i, b in enumerate(bodies)))
                got = await read_frames(stream, len(bodies))
            assert [(int.from_bytes(f[4:8], "big"), bytes(f[8:])) for f in got] == list(enumerate(bodies))
            await stream.aclose()

        with trio.fail_after(60):
            async with trio.open_nursery() as clients:
                for number in range(8):
                    clients.start_soon(client, number)
        nursery.cancel_scope.cancel()
