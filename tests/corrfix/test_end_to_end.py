"""corrfix on the real Tansu broker with real clients: messages produced are consumed, counted."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import trio

from corrfix import workload as clients
from corrfix.netutil import free_port
from corrfix.relay import Address, Proxy, ProxyConfig
from corrfix.repair import RepairConfig

pytestmark = pytest.mark.broker


@dataclass
class Stack:
    proxy: Proxy
    bootstrap: str


async def start_proxy_for(nursery: trio.Nursery, tansu_factory, repair: RepairConfig | None = None) -> Stack:
    """Tansu advertising corrfix's port, so clients stay on the proxy after bootstrap."""
    port = free_port()
    broker = tansu_factory(advertised_port=port)
    proxy = Proxy(
        ProxyConfig(
            Address("127.0.0.1", port), Address("127.0.0.1", broker.port), repair=repair or RepairConfig()
        )
    )
    await nursery.start(proxy.serve)
    return Stack(proxy, f"127.0.0.1:{port}")


async def in_thread(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def test_kafka_python_acks0_loses_nothing_through_corrfix(tansu_factory):
    n = 10_000
    async with trio.open_nursery() as nursery:
        stack = await start_proxy_for(nursery, tansu_factory)
        await in_thread(clients.create_topic, stack.bootstrap, "acks0")
        result = await in_thread(clients.produce_kafka_python, stack.bootstrap, "acks0", n, acks=0)
        values = await in_thread(clients.consume_all, stack.bootstrap, "acks0", n, timeout=60)
        nursery.cancel_scope.cancel()
    assert result.correlation_errors == 0
    assert sorted(values) == clients.expected_values(n)
    assert stack.proxy.stats.repairs["stale_drop"] > 0  # Tansu did answer acks=0; corrfix hid it
