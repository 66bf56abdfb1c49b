"""A client's close is a request to finish: every request corrfix read reaches the broker.

A raw socket plays the disconnecting client: it sends acks=0 Produce requests back to back
and then half-closes (``shutdown(SHUT_WR)``) or closes outright. Tansu answers acks=0
Produce (wrongly), so the proxy's broker socket always has unread bytes when the client
leaves: exactly the case where closing early sends a RST and the broker drops what it has
not processed yet. The topic is then read directly from Tansu and every record counted.
"""

from __future__ import annotations

import functools
import socket
import time

import pytest
import trio
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from corrfix._netutil import free_port
from corrfix.core import Address
from corrfix.lab import workload as clients
from corrfix.proxy import Proxy, ProxyConfig
from protocol import FrameDecoder
from protocol.testing import encode_request

pytestmark = pytest.mark.broker

RECORDS_PER_REQUEST = 100
PRODUCE_VERSION = 7


def acks0_produce(topic: str, first: int, correlation_id: int) -> bytes:
    """An acks=0 Produce v7 of RECORDS_PER_REQUEST records with values make_value(first…)."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(first, first + RECORDS_PER_REQUEST):
        builder.append(timestamp=0, key=None, value=clients.make_value(i))
    builder.close()
    request = ProduceRequest[PRODUCE_VERSION](
        transactional_id=None,
        acks=0,
        timeout_ms=30_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=builder.buffer())
                ],
            )
        ],
    )
    return encode_request(request, correlation_id=correlation_id, client_id="half-closer")


def send_then_close(address: str, frames: list[bytes], *, half_close: bool, pause: float) -> None:
    """Send every frame in one go, then leave as a disconnecting client does."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"".join(frames))
        # The pause is the scenario (a client that lingers before leaving), not synchronisation.
        time.sleep(pause)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):  # until corrfix closes its side
                pass


async def in_thread(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def read_back(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """The topic's values, read straight from Tansu."""
    return await in_thread(clients.consume_confluent, bootstrap, topic, expected, timeout=15)


@pytest.mark.parametrize("requests", [1, 10, 100])
@pytest.mark.parametrize("pause", [0.0, 0.3], ids=["at-once", "paused"])
@pytest.mark.parametrize("half_close", [True, False], ids=["half-close", "close"])
async def test_every_request_read_reaches_the_broker_when_the_client_leaves(
    tansu_factory, requests: int, pause: float, half_close: bool, engine: bool
):
    port = free_port()
    broker = tansu_factory()  # advertises itself: the read-back goes straight to Tansu
    topic = f"close-{requests}-{int(pause * 10)}-{half_close}"
    await in_thread(clients.create_topic, broker.bootstrap, topic)
    frames = [acks0_produce(topic, i * RECORDS_PER_REQUEST, i) for i in range(requests)]
    expected = clients.expected_values(requests * RECORDS_PER_REQUEST)
    async with trio.open_nursery() as nursery:
        proxy = Proxy(
            ProxyConfig(Address("127.0.0.1", port), Address("127.0.0.1", broker.port), engine=engine)
        )
        await nursery.start(proxy.serve)
        await in_thread(send_then_close, f"127.0.0.1:{port}", frames, half_close=half_close, pause=pause)
        values = await in_thread(
            clients.consume_confluent, broker.bootstrap, topic, len(expected), timeout=15
        )
        nursery.cancel_scope.cancel()
    stored = set(values)
    assert len(values) == len(stored), "records stored twice"
    assert len(stored) == len(expected), f"{len(expected) - len(stored)} of {len(expected)} records lost"
    assert sorted(stored) == expected


def api_versions_request(correlation_id: int) -> bytes:
    return encode_request(ApiVersionsRequest[0](), correlation_id=correlation_id, client_id="half-closer")


async def test_drain_sends_every_request_read_and_ends_the_client_cleanly(tansu_factory, engine):
    """SIGTERM's drain: acks=0 requests already read reach the broker, and the client sees
    an end of stream, not a reset, although it keeps sending after the drain began."""
    broker = tansu_factory()
    topic = "drained"
    await in_thread(clients.create_topic, broker.bootstrap, topic)
    requests = 50
    expected = clients.expected_values(requests * RECORDS_PER_REQUEST)
    async with trio.open_nursery() as nursery:
        proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", broker.port), engine=engine))
        port = (await nursery.start(proxy.serve))[0].port
        with trio.fail_after(30):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            frames = [acks0_produce(topic, i * RECORDS_PER_REQUEST, i) for i in range(requests)]
            # The ApiVersions answer proves that corrfix has read every Produce before it.
            await stream.send_all(b"".join(frames) + api_versions_request(requests))
            decoder = FrameDecoder()
            answered: list[bytearray] = []
            while not answered:
                answered = decoder.feed(await stream.receive_some(65536))
            proxy.drain(timeout=10)
            await stream.send_all(api_versions_request(requests + 1))  # not read: the proxy is draining
            ending = await stream.receive_some(65536)  # a reset would raise BrokenResourceError
            assert ending == b""
            await stream.aclose()
        values = await in_thread(
            clients.consume_confluent, broker.bootstrap, topic, len(expected), timeout=15
        )
        nursery.cancel_scope.cancel()
    assert sorted(values) == expected
