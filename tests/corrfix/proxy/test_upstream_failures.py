"""The broker side fails: a crash and restart under load, and a broker name that never resolves.

The crash uses the scripted cluster, whose broker can die and come back on the same port
with its log intact (Tansu keeps everything in memory, so a restarted Tansu has lost the
topic, which would hide a loss instead of proving there was none).
"""

from __future__ import annotations

import threading

import confluent_kafka
import kafka
import pytest
import trio
from kafka.protocol.metadata import ApiVersionsRequest
from structlog.testing import capture_logs

from corrfix.core import Address
from corrfix.proxy import Proxy, ProxyConfig
from protocol import FrameDecoder
from protocol.testing import encode_request
from tests.support.cluster_harness import in_thread, start_stack

TOPIC = "crash"
PARTITIONS = 2
MESSAGES = 3_000
CHUNK = 100
OUTAGE = 0.5
"""How long the broker stays down: long enough for every client connection to notice."""
TEST_TIMEOUT = 90


def values() -> list[bytes]:
    return [b"v-%05d" % i for i in range(MESSAGES)]


def produce_kafka_python(bootstrap: str, crash_point: threading.Event) -> int:
    """Send in chunks, each flushed, so the crash lands mid-run; returns the deliveries."""
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=2, retry_backoff_ms=50
    )
    delivered = 0
    try:
        for start in range(0, MESSAGES, CHUNK):
            futures = [producer.send(TOPIC, v) for v in values()[start : start + CHUNK]]
            producer.flush(timeout=60)
            delivered += sum(1 for f in futures if f.succeeded())
            if delivered >= MESSAGES // 3:
                crash_point.set()
    finally:
        producer.close(timeout=5)
    return delivered


def produce_confluent(bootstrap: str, crash_point: threading.Event) -> int:
    delivered = 0

    def on_delivery(err: confluent_kafka.KafkaError | None, _msg: confluent_kafka.Message) -> None:
        nonlocal delivered
        delivered += err is None

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2, "message.timeout.ms": 60_000}
    )
    for start in range(0, MESSAGES, CHUNK):
        for v in values()[start : start + CHUNK]:
            producer.produce(TOPIC, v, on_delivery=on_delivery)
        producer.flush(60)
        if delivered >= MESSAGES // 3:
            crash_point.set()
    return delivered


@pytest.mark.parametrize(
    "produce", [produce_kafka_python, produce_confluent], ids=["kafka-python", "confluent"]
)
async def test_broker_crash_and_restart_under_load_loses_nothing(produce, engine):
    crash_point = threading.Event()
    with trio.fail_after(TEST_TIMEOUT), capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery, node_ids=(1,), topics={TOPIC: PARTITIONS}, engine=engine)
            broker = stack.cluster.brokers[1]
            producing = trio.Event()
            delivered: list[int] = []

            async def run_producer() -> None:
                delivered.append(await in_thread(produce, stack.bootstrap, crash_point))
                producing.set()

            nursery.start_soon(run_producer)
            assert await trio.to_thread.run_sync(crash_point.wait, TEST_TIMEOUT)
            accepted_before = broker.accepted
            broker.crash()
            await trio.sleep(OUTAGE)
            await broker.restart(nursery)
            await producing.wait()
            nursery.cancel_scope.cancel()
    assert delivered == [MESSAGES]
    stored = broker.produced_values()
    assert set(stored) == set(values()), "acknowledged records are missing after the restart"
    assert broker.accepted > accepted_before, "the client never came back through corrfix"
    closes = [e for e in logs if e["event"] == "connection closed"]
    assert any("upstream closed" in str(e.get("reason")) for e in closes)


async def ask_once(port: int) -> bytes:
    """Send one ApiVersions request and return whatever comes back before the close (or reset)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(encode_request(ApiVersionsRequest(version=0), correlation_id=1))
        received = bytearray()
        try:
            while chunk := await stream.receive_some(65536):
                received += chunk
        except trio.BrokenResourceError:
            pass  # closed with the request unread: a reset, still a close
    return bytes(received)


async def test_a_broker_name_that_does_not_resolve_closes_the_client_with_a_clear_log_line():
    """``.invalid`` never resolves (RFC 6761). A refused connect is covered in test_relay.py."""
    upstream = Address("broker.invalid", 9092)
    config = ProxyConfig(Address("127.0.0.1", 0), upstream, connect_timeout=5, connect_retries=1)
    with trio.fail_after(TEST_TIMEOUT), capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = (await nursery.start(Proxy(config).serve))[0].port
            answer = await ask_once(port)
            nursery.cancel_scope.cancel()
    assert answer == b""  # closed, never a made-up answer
    assert FrameDecoder().feed(answer) == []
    failures = [e for e in logs if e["event"] == "upstream unreachable, closing client"]
    assert len(failures) == 1
    assert failures[0]["upstream"] == str(upstream)
    assert failures[0]["attempts"] == 2
    assert failures[0]["error"]
