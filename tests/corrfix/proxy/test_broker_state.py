"""``--broker-state``: brokers learned before a restart listen again, so clients that cached
them reconnect (corrfix.proxy._broker_state)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Collection

import kafka
import pytest
import trio
from structlog.testing import capture_logs

from corrfix._netutil import free_port
from corrfix.core import Address, BrokerPorts, ClusterRouter
from corrfix.proxy import Proxy, ProxyConfig
from corrfix.proxy._broker_state import BrokerState, BrokerStateError, read_broker_state
from tests.support.changes import Changes
from tests.support.fake_cluster import LOOPBACK, FakeCluster

LEARNED = {1: (Address("b1", 9092), 40_101), 2: (None, 40_102)}


class Listeners:
    def __call__(self, node_id: int, port: int) -> int:
        return port or 40_000 + node_id


def router() -> ClusterRouter:
    return ClusterRouter("proxy.example", BrokerPorts(), Listeners(), set)


def test_what_is_written_is_read_back(tmp_path):
    r = router()
    r.restore(LEARNED)
    BrokerState(tmp_path / "brokers.json", r).save()
    assert read_broker_state(tmp_path / "brokers.json") == LEARNED
    assert [p.name for p in tmp_path.iterdir()] == ["brokers.json"]  # no partial file left


def test_no_file_is_a_first_start(tmp_path):
    assert read_broker_state(tmp_path / "brokers.json") == {}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"version": 2, "brokers": []}',
        '{"version": 1}',
        '{"version": 1, "brokers": [{"node_id": 1, "upstream": "b1:9092", "listener_port": 70000}]}',
        '{"version": 1, "brokers": [{"node_id": 1, "upstream": "b1", "listener_port": 40101}]}',
        "[]",
    ],
)
def test_a_file_this_proxy_did_not_write_is_refused_and_the_proxy_starts_without(tmp_path, text):
    path = tmp_path / "brokers.json"
    path.write_text(text)
    with pytest.raises(BrokerStateError):
        read_broker_state(path)
    r = router()
    state = BrokerState(path, r)
    with capture_logs() as logs:
        state.restore()
    assert r.learned() == {}
    assert [e["event"] for e in logs] == ["broker state not restored"]
    assert r.on_change == state.save  # what is learned from now on replaces the file


def test_a_file_that_cannot_be_written_is_logged_once_and_the_proxy_goes_on(tmp_path):
    r = router()
    state = BrokerState(tmp_path / "missing" / "brokers.json", r)
    r.restore(LEARNED)
    with capture_logs() as logs:
        state.save()
        state.save()
    assert [e["event"] for e in logs] == ["broker state not written"]
    (tmp_path / "missing").mkdir()
    with capture_logs() as logs:
        state.save()
    assert [e["event"] for e in logs] == ["broker state written again"]
    assert read_broker_state(tmp_path / "missing" / "brokers.json") == LEARNED


def produce_across_a_restart(
    bootstrap: str, first_sent: threading.Event, restarted: threading.Event
) -> float:
    """Seconds the second send took, after the proxy restarted; raises if it failed."""
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        enable_idempotence=False,
        request_timeout_ms=3000,
        max_block_ms=8000,
        retries=100,
        reconnect_backoff_max_ms=300,
    )
    try:
        producer.send("t", b"one", partition=0).get(timeout=10)
        first_sent.set()
        restarted.wait(30)
        start = time.monotonic()
        producer.send("t", b"two", partition=0).get(timeout=8)
        return time.monotonic() - start
    finally:
        producer.close(timeout=2)


def free_port_base(node_ids: Collection[int], avoid: Collection[int]) -> int:
    """A ``--broker-port-base`` whose port for every node id was free a moment ago.

    The kernel hands out ports for ``bind(0)`` and for ``connect()`` from the same range
    (on Linux, odd ones to binds, even ones to connects), so a port next to a free one can
    be a client's. Every port is bound at once to check it.
    """
    for _ in range(100):
        base = free_port() - min(node_ids)
        ports = [base + node_id for node_id in node_ids]
        if set(ports) & set(avoid):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in ports:
                    stack.enter_context(socket.socket()).bind((LOOPBACK, port))
            except OSError:
                continue
        return base
    raise AssertionError(f"no free ports for node ids {sorted(node_ids)} in 100 tries")


@pytest.mark.parametrize("fixed_ports", [True, False], ids=["fixed ports", "ports the kernel picked"])
async def test_a_client_that_cached_the_listeners_produces_again_after_a_restart(tmp_path, fixed_ports):
    """kafka-python never goes back to its bootstrap servers: after a restart it reconnects
    to the leader's listener it learned, which must be listening and relay to the leader."""
    listen = free_port()
    state = tmp_path / "brokers.json"
    first_sent, restarted = threading.Event(), threading.Event()
    async with trio.open_nursery() as nursery:
        cluster = FakeCluster(topics={"t": 3}, changes=Changes())
        await cluster.start(nursery)
        config = ProxyConfig(
            Address(LOOPBACK, listen),
            Address(LOOPBACK, cluster.brokers[1].port),
            broker_ports=BrokerPorts(base=free_port_base(cluster.brokers, {listen}))
            if fixed_ports
            else BrokerPorts(),
            broker_state=state,
        )
        outcome: list[float | BaseException] = []

        def client() -> None:
            try:
                outcome.append(produce_across_a_restart(f"{LOOPBACK}:{listen}", first_sent, restarted))
            except BaseException as exc:  # the assertion below says which
                outcome.append(exc)

        thread = threading.Thread(target=client)
        thread.start()
        try:
            async with trio.open_nursery() as first:
                proxy = await first.start(Proxy(config).serve)
                await trio.to_thread.run_sync(first_sent.wait, 30)
                first.cancel_scope.cancel()
            with capture_logs() as logs:
                async with trio.open_nursery() as second:
                    restarted_proxy = Proxy(config)
                    await second.start(restarted_proxy.serve)
                    restarted.set()
                    await trio.to_thread.run_sync(thread.join, 30)
                    second.cancel_scope.cancel()
        finally:
            restarted.set()
            first_sent.set()
            await trio.to_thread.run_sync(thread.join, 30)
        nursery.cancel_scope.cancel()
    assert proxy  # the first proxy listened
    assert any(e["event"] == "brokers restored" for e in logs)
    assert len(outcome) == 1 and isinstance(outcome[0], float), outcome
    assert restarted_proxy.router is not None
    assert set(restarted_proxy.router.learned()) == set(cluster.brokers)
