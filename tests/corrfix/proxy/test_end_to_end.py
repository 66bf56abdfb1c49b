"""corrfix on the real Tansu broker with real clients: messages produced are consumed, counted."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import trio

from corrfix._netutil import free_port
from corrfix.chaos import ChaosConfig, ChaosRelay, ChaosRules, serve_chaos
from corrfix.core import Address, Event, Received, RepairConfig
from corrfix.lab import workload as clients
from corrfix.proxy import Proxy, ProxyConfig
from protocol import api_name, parse_request_header

pytestmark = pytest.mark.broker


@dataclass
class Stack:
    proxy: Proxy
    bootstrap: str
    relay: ChaosRelay | None = None


async def start_proxy_for(
    nursery: trio.Nursery,
    tansu_factory,
    engine: bool,
    chaos: ChaosRules | None = None,
    repair: RepairConfig | None = None,
) -> Stack:
    """client -> corrfix [-> chaos relay] -> Tansu, with Tansu advertising corrfix's port so
    clients stay on the proxy after bootstrap."""
    port = free_port()
    broker = tansu_factory(advertised_port=port)
    upstream = broker.port
    relay = None
    if chaos is not None:
        relay = await nursery.start(
            serve_chaos, ChaosConfig("127.0.0.1", 0, "127.0.0.1", broker.port, rules=chaos)
        )
        upstream = relay.port
    config = ProxyConfig(
        Address("127.0.0.1", port),
        Address("127.0.0.1", upstream),
        repair=repair or RepairConfig(),
        engine=engine,
    )
    proxy = Proxy(config)
    await nursery.start(proxy.serve)
    return Stack(proxy, f"127.0.0.1:{port}", relay)


async def in_thread(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def test_kafka_python_acks0_loses_nothing_through_corrfix(tansu_factory, engine):
    n = 10_000
    async with trio.open_nursery() as nursery:
        stack = await start_proxy_for(nursery, tansu_factory, engine)
        await in_thread(clients.create_topic, stack.bootstrap, "acks0")
        result = await in_thread(clients.produce_kafka_python, stack.bootstrap, "acks0", n, acks=0)
        values = await in_thread(clients.consume_all, stack.bootstrap, "acks0", n, timeout=60)
        nursery.cancel_scope.cancel()
    assert result.correlation_errors == 0
    assert sorted(values) == clients.expected_values(n)
    assert stack.proxy.stats.repairs["stale_drop"] > 0  # Tansu did answer acks=0; corrfix hid it


async def test_sync_producer_through_lossy_link_gets_every_message_exactly_once(tansu_factory, engine):
    n = 600
    async with trio.open_nursery() as nursery:
        stack = await start_proxy_for(
            nursery, tansu_factory, engine, ChaosRules(drop_every=25, apis=frozenset({0}))
        )
        await in_thread(clients.create_topic, stack.bootstrap, "sync")
        result = await in_thread(
            clients.produce_kafka_python, stack.bootstrap, "sync", n, acks="all", sync=True, idempotent=True
        )
        values = await in_thread(clients.consume_all, stack.bootstrap, "sync", n, timeout=60)
        nursery.cancel_scope.cancel()
    assert result.ok and not result.errors and result.correlation_errors == 0
    assert sorted(values) == clients.expected_values(n)
    dropped = stack.relay.policy.totals().dropped
    assert dropped == 24
    assert stack.proxy.stats.repairs["requeue"] == dropped


async def test_idempotent_confluent_producer_with_every_kind_of_answer_dropped(tansu_factory, engine):
    n = 20_000
    async with trio.open_nursery() as nursery:
        stack = await start_proxy_for(nursery, tansu_factory, engine, ChaosRules(drop_every=50))
        await in_thread(clients.create_topic, stack.bootstrap, "idem", partitions=3)
        # Small batches, so that the 20,000 messages take hundreds of Produce requests.
        result = await in_thread(
            clients.produce_confluent,
            stack.bootstrap,
            "idem",
            n,
            idempotent=True,
            timeout=120,
            config={"batch.num.messages": 50, "linger.ms": 1},
        )
        values = await in_thread(clients.consume_all, stack.bootstrap, "idem", n, timeout=120)
        nursery.cancel_scope.cancel()
    assert result.ok and not result.errors
    assert clients.duplicates(values) == {}
    assert sorted(values) == clients.expected_values(n)
    produce_drops = stack.relay.policy.counts[0].dropped
    assert produce_drops >= 5
    assert stack.proxy.stats.repairs["requeue"] >= produce_drops


async def test_clients_stay_on_corrfix_when_tansu_advertises_itself(tansu, engine):
    """Rewriting, not the broker's configuration, keeps clients on the proxy."""
    n = 2_000
    async with trio.open_nursery() as nursery:
        proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", tansu.port), engine=engine))
        bound = await nursery.start(proxy.serve)
        bootstrap = f"127.0.0.1:{bound[0].port}"
        await in_thread(clients.create_topic, bootstrap, "rewritten", partitions=2)
        produced = await in_thread(clients.produce_confluent, bootstrap, "rewritten", n, idempotent=True)
        values = await in_thread(clients.consume_all, bootstrap, "rewritten", n, client="kafka-python")
        nursery.cancel_scope.cancel()
    assert produced.ok
    assert sorted(values) == clients.expected_values(n)
    router = proxy.router
    assert router is not None
    assert router.brokers == {111: Address("127.0.0.1", tansu.port)}
    assert set(router.listener_ports) == {111}
    # Bootstrap connections plus the ones made to the broker listener after rewriting.
    assert proxy.stats.connections_opened > 2


class ApiKeysSeen:
    """An observer that counts the requests clients sent through the proxy, by api key."""

    snaplen = 0  # request headers are enough

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        pass

    def events(self, connection: str, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, Received) and event.side == "client":
                self.counts.update(api_name(parse_request_header(f).api_key) for f in event.heads)

    def connection_closed(self, connection: str, reason: str) -> None:
        pass


GROUP_APIS = {
    "FindCoordinator",
    "JoinGroup",
    "SyncGroup",
    "OffsetFetch",
    "OffsetCommit",
    "Fetch",
    "LeaveGroup",
}


@pytest.mark.parametrize(
    ("first", "second"),
    [("kafka-python", "kafka-python"), ("confluent", "confluent"), ("kafka-python", "confluent")],
)
async def test_consumer_group_commits_and_resumes_through_corrfix(tansu, first, second, engine):
    """A group member commits part of a topic and leaves; the next member resumes exactly there.

    Tansu advertises its own address, so only rewriting keeps the group traffic (coordinator,
    partition leader) on the proxy, which sees every group API.
    """
    total, first_share = 600, 250
    topic, group = f"resume-{first}-{second}", f"group-{first}-{second}"
    seen = ApiKeysSeen()
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", tansu.port), engine=engine)
        proxy = Proxy(config, observer=seen)
        bound = await nursery.start(proxy.serve)
        bootstrap = f"127.0.0.1:{bound[0].port}"
        await in_thread(clients.create_topic, bootstrap, topic, partitions=2)
        produced = await in_thread(clients.produce_confluent, bootstrap, topic, total, idempotent=True)
        before = await in_thread(clients.consume_group, bootstrap, topic, group, first_share, client=first)
        after = await in_thread(
            clients.consume_group, bootstrap, topic, group, total - first_share, client=second
        )
        nursery.cancel_scope.cancel()
    assert produced.ok
    assert len(before) == first_share
    assert set(before).isdisjoint(after), "the second member re-read committed records"
    assert sorted(before + after) == clients.expected_values(total)
    assert set(seen.counts) >= GROUP_APIS, f"group traffic bypassed corrfix: saw only {sorted(seen.counts)}"


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
async def test_a_join_group_held_past_the_request_deadline_is_waited_for(tansu, client, engine):
    """A coordinator holds each JoinGroup until the members have rejoined, for up to the
    rebalance timeout it carries (``max.poll.interval.ms``: 300 s by default, often raised);
    Tansu holds a group's first one for half the session timeout (3 s). With a request
    deadline shorter than that hold (1 s here, as 300 s is against a longer poll interval),
    the join must still be waited for, not cut off."""
    total = 50
    topic = group = f"held-join-{client}-{'engine' if engine else 'tasks'}"
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(
            Address("127.0.0.1", 0),
            Address("127.0.0.1", tansu.port),
            repair=RepairConfig(request_deadline=1.0),
            engine=engine,
        )
        proxy = Proxy(config)
        bound = await nursery.start(proxy.serve)
        bootstrap = f"127.0.0.1:{bound[0].port}"
        await in_thread(clients.create_topic, bootstrap, topic)
        produced = await in_thread(clients.produce_confluent, bootstrap, topic, total)
        values = await in_thread(
            clients.consume_group, bootstrap, topic, group, total, client=client, timeout=30
        )
        nursery.cancel_scope.cancel()
    assert produced.ok
    assert sorted(values) == clients.expected_values(total)
    assert proxy.stats.repairs["give_up"] == 0
