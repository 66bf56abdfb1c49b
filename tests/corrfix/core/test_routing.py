"""Clients stay on corrfix in a three-broker cluster whose brokers advertise their real addresses.

A scripted cluster (``tests/fake_cluster.py``: nodes 1, 2 and 3, partitions led by different
brokers, group coordinator on node 2) sits behind one corrfix with rewriting on and broker 1
as its only upstream. Real clients bootstrap through corrfix and must then reach every
partition leader and the coordinator through corrfix's per-broker listeners, never directly.
The proof is counted at both ends: each fake broker records every connection it accepted,
and corrfix's observer hook records every upstream connection corrfix opened and every
address an answer gave a client.
"""

from __future__ import annotations

import gc

import confluent_kafka
import confluent_kafka.admin
import kafka
import pytest
import trio
from kafka.record import MemoryRecordsBuilder

from corrfix._netutil import free_ports
from corrfix.core import BrokerPorts
from protocol import ApiKey, decodable_max_versions, request_class
from tests.support.client_view import SeenAddress, addresses_in
from tests.support.cluster_harness import RawClient, Stack, assert_only_listeners, in_thread
from tests.support.cluster_harness import start_stack as start_cluster_stack
from tests.support.fake_cluster import (
    COORDINATOR_NOT_AVAILABLE,
    LOOPBACK,
    NOT_LEADER_OR_FOLLOWER,
    UNAVAILABLE_KEY,
    topic_id,
)

TOPIC = "routed"
PARTITIONS = 6  # partition p is led by node (p mod 3) + 1
NODES = {1, 2, 3}
TEST_TIMEOUT = 60
CLIENT_TIMEOUT_MS = 10_000


async def start_stack(nursery: trio.Nursery) -> Stack:
    return await start_cluster_stack(nursery, topics={TOPIC: PARTITIONS})


def expected_values(client: str) -> dict[int, list[bytes]]:
    return {p: [b"%s-p%d-%d" % (client.encode(), p, i) for i in range(3)] for p in range(PARTITIONS)}


# -- real clients ---------------------------------------------------------------------------


def produce_kafka_python(bootstrap: str, values: dict[int, list[bytes]]) -> None:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="routing-kafka-python",
        acks=1,
        enable_idempotence=False,
        linger_ms=5,
        request_timeout_ms=CLIENT_TIMEOUT_MS,
        max_block_ms=CLIENT_TIMEOUT_MS,
        bootstrap_timeout_ms=CLIENT_TIMEOUT_MS,
    )
    try:
        futures = [producer.send(TOPIC, v, partition=p) for p, vs in values.items() for v in vs]
        for future in futures:
            future.get(timeout=CLIENT_TIMEOUT_MS / 1000)
    finally:
        producer.close(timeout=5)


def produce_confluent(bootstrap: str, values: dict[int, list[bytes]]) -> list[str]:
    errors: list[str] = []
    delivered: list[int] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(f"{msg.partition()}: {err}")
        else:
            delivered.append(msg.partition())

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "routing-confluent",
            "acks": "1",
            "enable.idempotence": False,
            "linger.ms": 5,
            "message.timeout.ms": CLIENT_TIMEOUT_MS,
            "socket.timeout.ms": CLIENT_TIMEOUT_MS,
        }
    )
    for p, vs in values.items():
        for v in vs:
            producer.produce(TOPIC, v, partition=p, on_delivery=on_delivery)
    remaining = producer.flush(CLIENT_TIMEOUT_MS / 1000)
    producer.close()  # destroys the handle: every connection is closed when this returns
    if remaining:
        errors.append(f"{remaining} messages still queued")
    if len(delivered) != sum(map(len, values.values())):
        errors.append(f"delivered {len(delivered)}")
    return errors


def assert_leaders_got_exactly(stack: Stack, values: dict[int, list[bytes]]) -> None:
    for node_id, broker in stack.cluster.brokers.items():
        assert broker.misdirected == []
        led = {p for p in range(PARTITIONS) if stack.cluster.leader(TOPIC, p) == node_id}
        assert {p for (_, p) in broker.logs} == led, node_id  # produce requests reached every broker
        for p in led:
            assert broker.logs[(TOPIC, p)] == values[p]
        assert broker.api_counts()[ApiKey.PRODUCE] >= 1


async def test_kafka_python_producer_reaches_every_leader_only_through_corrfix():
    values = expected_values("kp")
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            await in_thread(produce_kafka_python, stack.bootstrap, values)
            await stack.assert_clients_stayed_on_proxy()
            nursery.cancel_scope.cancel()
    assert_leaders_got_exactly(stack, values)
    # Bootstrap, then one connection per leader listener at least.
    assert stack.proxy.stats.connections_opened >= 4
    assert {a.api_key for a in stack.view.addresses} >= {ApiKey.METADATA}


async def test_confluent_producer_reaches_every_leader_only_through_corrfix():
    values = expected_values("ck")
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            errors = await in_thread(produce_confluent, stack.bootstrap, values)
            await stack.assert_clients_stayed_on_proxy()
            nursery.cancel_scope.cancel()
    assert errors == []
    assert_leaders_got_exactly(stack, values)


def kafka_python_admin(bootstrap: str) -> tuple[dict, dict]:
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="routing-admin",
        request_timeout_ms=CLIENT_TIMEOUT_MS,
        bootstrap_timeout_ms=CLIENT_TIMEOUT_MS,
    )
    try:
        described = admin.describe_cluster()
        # FindCoordinator (batched, v4+), then OffsetFetch sent to the coordinator.
        offsets = admin.list_group_offsets(["routing-group", "other-group"])
    finally:
        admin.close()
    return described, offsets


async def test_kafka_python_admin_describe_cluster_and_coordinator_through_corrfix():
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            described, offsets = await in_thread(kafka_python_admin, stack.bootstrap)
            await stack.assert_clients_stayed_on_proxy()
            nursery.cancel_scope.cancel()
    ports = stack.router.listener_ports
    assert {(b["broker_id"], b["host"], b["port"]) for b in described["brokers"]} == {
        (n, LOOPBACK, ports[n]) for n in NODES
    }
    assert offsets == {"routing-group": {}, "other-group": {}}
    seen = {(a.api_key, a.node_id) for a in stack.view.addresses}
    assert {(ApiKey.DESCRIBE_CLUSTER, n) for n in NODES} <= seen
    assert (ApiKey.FIND_COORDINATOR, 2) in seen
    coordinator = stack.cluster.brokers[2]
    assert coordinator.api_counts()[ApiKey.OFFSET_FETCH] >= 1
    assert all(b.api_counts()[ApiKey.OFFSET_FETCH] == 0 for n, b in stack.cluster.brokers.items() if n != 2)
    batched = [
        r.api_version
        for b in stack.cluster.brokers.values()
        for r in b.requests
        if r.api_key == ApiKey.FIND_COORDINATOR
    ]
    assert batched and min(batched) >= 4


def confluent_admin(bootstrap: str) -> tuple[list[tuple[int, str, int]], list]:
    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": bootstrap, "client.id": "routing-confluent-admin"}
    )
    timeout = CLIENT_TIMEOUT_MS / 1000
    cluster = admin.describe_cluster(request_timeout=timeout).result(timeout=timeout)
    nodes = [(node.id, node.host, node.port) for node in cluster.nodes]
    request = [confluent_kafka.ConsumerGroupTopicPartitions("routing-group")]
    futures = admin.list_consumer_group_offsets(request, request_timeout=timeout)
    groups = [future.result(timeout=timeout) for future in futures.values()]
    del admin
    gc.collect()  # destroy the handle, closing its connections
    return nodes, [(g.group_id, g.topic_partitions) for g in groups]


async def test_confluent_admin_describe_cluster_and_coordinator_through_corrfix():
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            nodes, groups = await in_thread(confluent_admin, stack.bootstrap)
            await stack.assert_clients_stayed_on_proxy()
            nursery.cancel_scope.cancel()
    ports = stack.router.listener_ports
    assert sorted(nodes) == [(n, LOOPBACK, ports[n]) for n in sorted(NODES)]
    assert groups == [("routing-group", [])]
    assert stack.cluster.brokers[2].api_counts()[ApiKey.OFFSET_FETCH] >= 1


# -- raw requests ---------------------------------------------------------------------------


def records(*values: bytes) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    for value in values:
        builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def metadata_request(version: int):
    cls = request_class(ApiKey.METADATA)
    return cls(
        version=version, topics=[cls.MetadataRequestTopic(name=TOPIC)], allow_auto_topic_creation=False
    )


def find_coordinator_requests(version: int) -> list:
    cls = request_class(ApiKey.FIND_COORDINATOR)
    if version == 0:
        return [cls(version=0, key="g"), cls(version=0, key=UNAVAILABLE_KEY)]
    if version <= 3:
        return [
            cls(version=version, key="g", key_type=0),
            cls(version=version, key="txn", key_type=1),  # a transaction coordinator
            cls(version=version, key=UNAVAILABLE_KEY, key_type=0),
        ]
    return [cls(version=version, key_type=0, coordinator_keys=["g1", "g2", UNAVAILABLE_KEY])]


def describe_cluster_request(version: int):
    cls = request_class(ApiKey.DESCRIBE_CLUSTER)
    return cls(
        version=version,
        include_cluster_authorized_operations=False,
        endpoint_type=1,
        include_fenced_brokers=True,
    )


def misdirected_produce(version: int, partition: int):
    """A Produce for ``partition`` (led by broker 2), sent where broker 1 answers it."""
    cls = request_class(ApiKey.PRODUCE)
    topic = cls.TopicProduceData(
        name=TOPIC,
        topic_id=topic_id(TOPIC),
        partition_data=[
            cls.TopicProduceData.PartitionProduceData(index=partition, records=records(b"stray"))
        ],
    )
    return cls(version=version, transactional_id=None, acks=1, timeout_ms=1000, topic_data=[topic])


async def test_raw_answers_of_every_version_name_only_corrfix_listeners():
    """Metadata, FindCoordinator and DescribeCluster at every version kafka-python knows, and the
    KIP-951 ``node_endpoints`` of Produce v10+: no answer names a fake broker's real port."""
    caps = decodable_max_versions()
    seen: list[SeenAddress] = []
    placeholders = 0
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            client = await RawClient.connect(stack.port)
            for version in range(caps[ApiKey.METADATA] + 1):
                answer = await client.call(metadata_request(version))
                assert [t.name for t in answer.topics] == [TOPIC]
                leaders = {p.partition_index: p.leader_id for p in answer.topics[0].partitions}
                assert leaders == {p: p % 3 + 1 for p in range(PARTITIONS)}
                found = addresses_in(ApiKey.METADATA, version, answer)
                assert {a.node_id for a in found} == NODES
                seen += found
            for version in range(caps[ApiKey.FIND_COORDINATOR] + 1):
                for request in find_coordinator_requests(version):
                    answer = await client.call(request)
                    for address in addresses_in(ApiKey.FIND_COORDINATOR, version, answer):
                        if address.node_id == -1:
                            placeholders += 1
                        else:
                            assert address.node_id == 2
                        seen.append(address)
                    if version >= 4:
                        errors = {c.key: c.error_code for c in answer.coordinators}
                        assert errors == {"g1": 0, "g2": 0, UNAVAILABLE_KEY: COORDINATOR_NOT_AVAILABLE}
            for version in range(caps[ApiKey.DESCRIBE_CLUSTER] + 1):
                found = addresses_in(
                    ApiKey.DESCRIBE_CLUSTER, version, await client.call(describe_cluster_request(version))
                )
                assert {a.node_id for a in found} == NODES
                seen += found
            for version in range(3, caps[ApiKey.PRODUCE] + 1):
                answer = await client.call(misdirected_produce(version, partition=1))
                (partition,) = answer.responses[0].partition_responses
                assert partition.error_code == NOT_LEADER_OR_FOLLOWER
                found = addresses_in(ApiKey.PRODUCE, version, answer)
                if version >= 10:
                    assert partition.current_leader.leader_id == 2
                    assert [a.node_id for a in found] == [2]
                seen += found
            await client.aclose()
            await stack.settled()
            nursery.cancel_scope.cancel()
    ports = stack.router.listener_ports
    assert set(ports) == NODES
    assert_only_listeners(seen, ports)
    assert not {a.port for a in seen} & stack.cluster.ports
    assert placeholders == 1 + 3 + 3  # v0, v1-v3 and one batch per v4-v6
    assert {a.api_key for a in seen} == {
        ApiKey.METADATA,
        ApiKey.FIND_COORDINATOR,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.PRODUCE,
    }
    # One client connection, one upstream connection, to the bootstrap broker only.
    assert stack.proxy.stats.connections_opened == 1
    assert [b.accepted for b in stack.cluster.brokers.values()] == [1, 0, 0]
    assert stack.cluster.brokers[1].misdirected == [(TOPIC, 1)] * (caps[ApiKey.PRODUCE] - 2)
    assert stack.cluster.unhandled == []


async def test_each_broker_listener_relays_to_its_own_broker():
    api_versions = request_class(ApiKey.API_VERSIONS)
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            bootstrap = await RawClient.connect(stack.port)
            answer = await bootstrap.call(metadata_request(12))
            advertised = {b.node_id: (b.host, b.port) for b in answer.brokers}
            assert advertised == {n: (LOOPBACK, p) for n, p in stack.router.listener_ports.items()}
            for node_id, (host, port) in advertised.items():
                client = RawClient(await trio.open_tcp_stream(host, port))
                reply = await client.call(api_versions(version=0), client_id=f"to-node-{node_id}")
                assert reply.error_code == 0
                await client.aclose()
            await bootstrap.aclose()
            await stack.settled()
            nursery.cancel_scope.cancel()
    for node_id, broker in stack.cluster.brokers.items():
        ids = {r.client_id for r in broker.requests if r.client_id and r.client_id.startswith("to-node-")}
        assert ids == {f"to-node-{node_id}"}
        assert broker.accepted == (2 if node_id == 1 else 1)
    assert stack.proxy.stats.connections_opened == 4


@pytest.mark.parametrize("version", [4, 6])
async def test_batched_find_coordinator_names_the_listener_for_every_key(version):
    cls = request_class(ApiKey.FIND_COORDINATOR)
    keys = [f"group-{i}" for i in range(20)]
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_stack(nursery)
            client = await RawClient.connect(stack.port)
            answer = await client.call(cls(version=version, key_type=0, coordinator_keys=keys))
            await client.aclose()
            nursery.cancel_scope.cancel()
    listener = stack.router.listener_ports[2]
    assert [(c.key, c.node_id, c.host, c.port) for c in answer.coordinators] == [
        (key, 2, LOOPBACK, listener) for key in keys
    ]
    # Only the coordinator was learned: its listener exists before any client can use it.
    assert set(stack.router.listener_ports) == {2}


async def test_a_broker_port_on_a_shared_listen_port_is_refused_not_shared():
    """With ``--workers`` (SO_REUSEPORT) a broker listener bound on the bootstrap port succeeds,
    and the kernel then hands some of that broker's connections to the bootstrap listener,
    which relays them to another broker. The answer naming it must be refused instead."""
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await start_cluster_stack(nursery, topics={TOPIC: PARTITIONS}, reuse_port=True)
            one, three = free_ports(2)
            stack.router.ports = BrokerPorts(explicit={1: one, 3: three}, base=stack.port - 2)
            client = await RawClient.connect(stack.port)
            await client.send(metadata_request(12))
            assert await client.stream.receive_some(65536) == b""  # closed, nothing relayed
            await client.aclose()
            nursery.cancel_scope.cancel()
    assert 2 not in stack.router.listener_ports
    assert stack.router.listener_ports == {1: one}
