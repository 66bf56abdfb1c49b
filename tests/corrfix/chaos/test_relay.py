"""The chaos relay end to end on loopback: client -> relay -> in-test echo broker.

Synchronisation is by frames and events only: a run of damaged requests is followed by
an undamaged marker request, and its response proves that everything before it has been
handled. Delays use trio's MockClock (running at real speed, so ``fail_after`` still
bounds the test) with a delay far longer than the test, released by ``clock.jump``.
"""

from __future__ import annotations

import argparse
import functools

import pytest
import trio
import trio.testing
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from structlog.testing import capture_logs

import protocol
from corrfix.chaos import (
    ChaosConfig,
    ChaosRelay,
    ChaosRules,
    add_chaos_arguments,
    chaos_config_from_args,
    run_chaos,
    serve_chaos,
)
from corrfix.chaos._policy import UNKNOWN_API
from corrfix.core import parse_host_port
from protocol import ApiKey
from protocol.testing import encode_request, encode_response

LOOPBACK = "127.0.0.1"
TIMEOUT = 10
LONG_DELAY = 1000.0


def produce_request(correlation_id: int, acks: int = 1) -> bytes:
    produce = protocol.request_class(ApiKey.PRODUCE)[9]
    request = produce(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[])
    return encode_request(request, correlation_id)


def api_versions_request(correlation_id: int) -> bytes:
    return encode_request(ApiVersionsRequest[0](), correlation_id)


def metadata_request(correlation_id: int) -> bytes:
    return encode_request(protocol.request_class(ApiKey.METADATA)[1](topics=None), correlation_id)


class EchoBroker:
    """Answers each request frame with a response carrying its correlation id.

    ``reply_to_acks0`` mimics Tansu's stray replies; ``answer_on_eof`` holds every answer
    until the client half-closes, to prove the half-close reached the broker while the
    response direction stayed open.
    """

    def __init__(self, *, reply_to_acks0: bool = False, answer_on_eof: bool = False) -> None:
        self.reply_to_acks0 = reply_to_acks0
        self.answer_on_eof = answer_on_eof
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self.closed_event = trio.Event()
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        decoder = protocol.FrameDecoder()
        held: list[bytes] = []
        try:
            async with stream:
                while True:
                    try:
                        data = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        return
                    if not data:
                        if held:
                            await stream.send_all(b"".join(held))
                        return
                    answers = []
                    for frame in decoder.feed(data):
                        self.requests.append(bytes(frame))
                        header = protocol.parse_request_header(frame)
                        if protocol.expects_response(frame, header) or self.reply_to_acks0:
                            body = ApiVersionsResponse[0](error_code=0, api_keys=[])
                            answers.append(encode_response(body, header.correlation_id))
                    if self.answer_on_eof:
                        held += answers
                    elif answers:
                        await stream.send_all(b"".join(answers))
        finally:
            self.closed += 1
            self.closed_event.set()
            self.closed_event = trio.Event()


class Client:
    """A test client whose reader task hands over response correlation ids (None at EOF)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.received: list[int] = []
        self._send, self._receive = trio.open_memory_channel[int | None](1000)

    @classmethod
    async def connect(cls, nursery: trio.Nursery, port: int) -> Client:
        client = cls(await trio.open_tcp_stream(LOOPBACK, port))
        nursery.start_soon(client._read)
        return client

    async def _read(self) -> None:
        decoder = protocol.FrameDecoder()
        while True:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                await self._send.send(None)
                return
            for frame in decoder.feed(data):
                correlation_id = protocol.response_correlation_id(frame)
                self.received.append(correlation_id)
                await self._send.send(correlation_id)

    async def send(self, *frames: bytes) -> None:
        await self.stream.send_all(b"".join(frames))

    async def next(self) -> int | None:
        return await self._receive.receive()

    async def until(self, correlation_id: int) -> list[int]:
        """Every correlation id received up to and including ``correlation_id``."""
        got = []
        while True:
            received = await self.next()
            assert received is not None, f"EOF before {correlation_id}; got {got}"
            got.append(received)
            if received == correlation_id:
                return got

    async def until_eof(self) -> list[int]:
        got = []
        while (received := await self.next()) is not None:
            got.append(received)
        return got


async def start_broker(nursery: trio.Nursery, **options: bool) -> EchoBroker:
    broker = EchoBroker(**options)
    listeners = await nursery.start(functools.partial(trio.serve_tcp, broker.handle, 0, host=LOOPBACK))
    broker.port = listeners[0].socket.getsockname()[1]
    return broker


async def start_relay(
    nursery: trio.Nursery, upstream_port: int, *, delay_in_order: bool = False, **rules: object
) -> ChaosRelay:
    config = ChaosConfig(
        LOOPBACK, 0, LOOPBACK, upstream_port, rules=ChaosRules(**rules), delay_in_order=delay_in_order
    )
    return await nursery.start(serve_chaos, config)


async def test_relays_requests_unchanged_and_reports_port(nursery):
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port)
        assert relay.ports and all(port > 0 for port in relay.ports)
        client = await Client.connect(nursery, relay.port)
        sent = [produce_request(1), api_versions_request(2), metadata_request(3), produce_request(4)]
        await client.send(*sent)
        assert await client.until(4) == [1, 2, 3, 4]
        assert broker.requests == sent
        assert relay.policy.total_responses == 4


async def test_drop_every_nth_matching_response(nursery):
    with trio.fail_after(TIMEOUT), capture_logs() as logs:
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port, drop_every=3, apis={ApiKey.PRODUCE})
        client = await Client.connect(nursery, relay.port)
        await client.send(*(produce_request(i) for i in range(1, 11)), api_versions_request(100))
        assert await client.until(100) == [1, 2, 4, 5, 7, 8, 10, 100]
        assert len(broker.requests) == 11  # requests are never touched
        assert relay.policy.counts[ApiKey.PRODUCE].dropped == 3
        assert relay.policy.counts[ApiKey.API_VERSIONS].forwarded == 1
    drops = [entry for entry in logs if entry["event"] == "chaos.drop"]
    assert [entry["correlation_id"] for entry in drops] == [3, 6, 9]
    assert all(entry["api"] == "Produce" and entry["connection"] for entry in drops)


async def test_drop_count_is_shared_across_connections(nursery):
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port, drop_every=2, apis={ApiKey.API_VERSIONS})
        first = await Client.connect(nursery, relay.port)
        second = await Client.connect(nursery, relay.port)
        for i in range(1, 7):  # alternate connections; a Metadata marker closes each round
            client = first if i % 2 else second
            await client.send(api_versions_request(i), metadata_request(100 + i))
            await client.until(100 + i)
        # The 2nd, 4th and 6th ApiVersions responses of the whole relay were dropped: with
        # per-connection counting, the first connection would have lost its 2nd (id 3).
        assert first.received == [1, 101, 3, 103, 5, 105]
        assert second.received == [102, 104, 106]
        assert relay.policy.counts[ApiKey.API_VERSIONS].dropped == 3


async def test_duplicate_every_nth(nursery):
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port, duplicate_every=2, apis={ApiKey.PRODUCE})
        client = await Client.connect(nursery, relay.port)
        await client.send(*(produce_request(i) for i in range(1, 6)), api_versions_request(100))
        assert await client.until(100) == [1, 2, 2, 3, 4, 4, 5, 100]
        assert relay.policy.counts[ApiKey.PRODUCE].duplicated == 2


async def test_delay_lets_later_responses_overtake(nursery, mock_clock):
    mock_clock.rate = 1.0  # real time flows, so fail_after works; jump() releases the delay
    with capture_logs() as logs:
        with trio.fail_after(TIMEOUT):
            broker = await start_broker(nursery)
            relay = await start_relay(
                nursery, broker.port, delay_every=1, delay_seconds=LONG_DELAY, apis={ApiKey.METADATA}
            )
            client = await Client.connect(nursery, relay.port)
            await client.send(metadata_request(1), api_versions_request(2), api_versions_request(3))
            assert await client.until(3) == [2, 3]  # 1 is held, 2 and 3 overtake it
        mock_clock.jump(LONG_DELAY)  # outside fail_after, whose deadline would jump too
        with trio.fail_after(TIMEOUT):
            assert await client.next() == 1
        assert relay.policy.counts[ApiKey.METADATA].delayed == 1
    [delay] = [entry for entry in logs if entry["event"] == "chaos.delay"]
    assert (delay["correlation_id"], delay["delay_seconds"], delay["api"]) == (1, LONG_DELAY, "Metadata")


async def test_delay_in_order_holds_the_responses_behind(nursery, mock_clock):
    mock_clock.rate = 1.0
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery)
        relay = await start_relay(
            nursery,
            broker.port,
            delay_in_order=True,
            delay_every=1,
            delay_seconds=LONG_DELAY,
            apis={ApiKey.METADATA},
        )
        client = await Client.connect(nursery, relay.port)
        await client.send(metadata_request(1), api_versions_request(2), api_versions_request(3))
        while relay.policy.total_responses < 3:  # the relay has decided all three ...
            await trio.testing.wait_all_tasks_blocked()
        await trio.testing.wait_all_tasks_blocked()
        assert client.received == []  # ... yet nothing overtook the delayed one
    mock_clock.jump(LONG_DELAY)
    with trio.fail_after(TIMEOUT):
        assert await client.until(3) == [1, 2, 3]


async def test_kill_every_closes_both_sides_after_the_nth_response(nursery):
    with trio.fail_after(TIMEOUT), capture_logs() as logs:
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port, kill_every=3)
        client = await Client.connect(nursery, relay.port)
        await client.send(api_versions_request(1), api_versions_request(2))
        assert await client.until(2) == [1, 2]
        closed = broker.closed_event
        await client.send(api_versions_request(3), api_versions_request(4))
        assert await client.until_eof() == [3]  # the 3rd is delivered, then the connection dies
        await closed.wait()
        assert broker.closed == 1
        # Only that connection: a new one works, and the count goes on (6th response kills).
        again = await Client.connect(nursery, relay.port)
        await again.send(api_versions_request(5))
        assert await again.until(5) == [5]
        assert relay.policy.counts[ApiKey.API_VERSIONS].kills == 1
    assert [entry["correlation_id"] for entry in logs if entry["event"] == "chaos.kill"] == [3]


async def test_responses_behind_a_kill_are_neither_counted_nor_killed_again(nursery):
    """Four answers reach the relay at once; the 2nd kills the connection, so the 3rd and
    4th never reach the client: they count as nothing, and the one kill counts once."""
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port, kill_every=2)
        client = await Client.connect(nursery, relay.port)
        await client.send(*(api_versions_request(i) for i in range(1, 5)))
        assert await client.until_eof() == [1, 2]
        counts = relay.policy.counts[ApiKey.API_VERSIONS]
        assert (counts.responses, counts.forwarded, counts.kills) == (2, 2, 1)
        assert relay.policy.total_responses == 2


async def test_acks0_stray_reply_counts_as_unknown(nursery):
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery, reply_to_acks0=True)
        relay = await start_relay(nursery, broker.port, drop_every=1, apis={ApiKey.PRODUCE})
        client = await Client.connect(nursery, relay.port)
        await client.send(produce_request(1, acks=0), produce_request(2, acks=1), api_versions_request(3))
        assert await client.until(3) == [1, 3]  # the stray is not a Produce response; 2 is
        assert relay.policy.counts[UNKNOWN_API].forwarded == 1
        assert relay.policy.counts[ApiKey.PRODUCE].dropped == 1


async def test_half_close_propagates_both_ways(nursery):
    with trio.fail_after(TIMEOUT):
        broker = await start_broker(nursery, answer_on_eof=True)
        relay = await start_relay(nursery, broker.port)
        client = await Client.connect(nursery, relay.port)
        await client.send(api_versions_request(1), api_versions_request(2))
        await client.stream.send_eof()  # the broker answers only once it sees this
        assert await client.until_eof() == [1, 2]


async def test_upstream_unreachable_closes_the_client(nursery):
    listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
    dead_port = listeners[0].socket.getsockname()[1]
    for listener in listeners:
        await listener.aclose()
    with trio.fail_after(TIMEOUT), capture_logs() as logs:
        relay = await start_relay(nursery, dead_port)
        client = await Client.connect(nursery, relay.port)
        assert await client.until_eof() == []
    [entry] = [entry for entry in logs if entry["event"] == "chaos.upstream_unreachable"]
    assert entry["upstream"] == f"{LOOPBACK}:{dead_port}"
    assert entry["log_level"] == "error"


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xff\xff\xff", (200 * 1024 * 1024).to_bytes(4, "big"), b"\x00\x00\x00\x04\xff\xff\x00\x00"],
    ids=["negative-size", "oversized", "bad-header"],
)
async def test_garbage_closes_only_that_connection(nursery, garbage):
    with trio.fail_after(TIMEOUT), capture_logs() as logs:
        broker = await start_broker(nursery)
        relay = await start_relay(nursery, broker.port)
        good = await Client.connect(nursery, relay.port)
        await good.send(api_versions_request(1))
        assert await good.until(1) == [1]
        bad = await Client.connect(nursery, relay.port)
        await bad.send(garbage)
        assert await bad.until_eof() == []
        await good.send(api_versions_request(2))
        assert await good.until(2) == [2]
    assert any(entry["event"] == "chaos.protocol_error" for entry in logs)


async def test_summary_on_stop(nursery, capsys):
    broker = await start_broker(nursery)
    config = ChaosConfig(LOOPBACK, 0, LOOPBACK, broker.port, rules=ChaosRules(drop_every=1, seed=5))
    with trio.fail_after(TIMEOUT), capture_logs() as logs:
        async with trio.open_nursery() as inner:
            inner.start_soon(run_chaos, config)
            await trio.testing.wait_all_tasks_blocked()
            inner.cancel_scope.cancel()
    out = capsys.readouterr().out
    assert "chaos summary (seed 5)" in out
    assert any(entry["event"] == "chaos.summary" and entry["seed"] == 5 for entry in logs)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corrfix chaos")
    add_chaos_arguments(parser)
    return parser


def test_cli_options_build_the_config():
    args = make_parser().parse_args(
        [
            "--listen",
            "127.0.0.1:19092",
            "--upstream",
            "broker:9092",
            "--api",
            "Produce,fetch",
            "--api",
            "18",
            "--api",
            "unknown",
            "--drop-every",
            "25",
            "--duplicate-probability",
            "0.1",
            "--delay-every",
            "7",
            "--delay-seconds",
            "0.5",
            "--delay-in-order",
            "--kill-every",
            "100",
            "--seed",
            "42",
        ]
    )
    config = chaos_config_from_args(args)
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 19092)
    assert (config.upstream_host, config.upstream_port) == ("broker", 9092)
    assert config.delay_in_order
    rules = config.rules
    assert rules.apis == {0, 1, 18, UNKNOWN_API}
    assert (rules.drop_every, rules.duplicate_probability, rules.delay_every) == (25, 0.1, 7)
    assert (rules.delay_seconds, rules.kill_every, rules.seed) == (0.5, 100, 42)


def test_cli_defaults():
    config = chaos_config_from_args(make_parser().parse_args(["--listen", ":9093", "--upstream", ":9092"]))
    assert config.listen_host == "127.0.0.1"  # a bare :PORT listens on loopback, as corrfix proxy does
    assert config.upstream_host == "127.0.0.1"
    assert config.rules == ChaosRules()
    assert not config.rules.active


@pytest.mark.parametrize(
    "argv",
    [
        ["--listen", "nope", "--upstream", ":1"],
        ["--listen", ":1", "--upstream", ":1", "--api", "Produse"],
        ["--listen", ":1", "--upstream", ":1", "--drop-probability", "2"],
        ["--listen", ":1", "--upstream", ":1", "--drop-every", "-1"],
        ["--listen", ":1", "--upstream", ":1", "--connect-timeout", "0"],  # closed every client
        ["--listen", ":1", "--upstream", ":1", "--max-frame-size", "0"],
    ],
)
def test_cli_rejects_bad_options(argv, capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_parse_host_port():
    assert parse_host_port("[::1]:9092") == ("::1", 9092)
    assert parse_host_port("localhost:1") == ("localhost", 1)
    assert parse_host_port(":9092", default_host="0.0.0.0") == ("0.0.0.0", 9092)
    for bad in ("9092", "host:", "host:99999", "::1:9092"):
        with pytest.raises(ValueError):
            parse_host_port(bad)
