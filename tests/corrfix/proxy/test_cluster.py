"""The cluster router on its own: which listener stands in for which broker, and when it refuses."""

from __future__ import annotations

import pytest

from corrfix.core import Address, BrokerPorts, ClusterRouter, RoutingError
from protocol import ApiKey, ProtocolError, cap_api_versions, response_class
from protocol.testing import encode_response

PROXY = Address("127.0.0.1", 9092)


class Listeners:
    """Stands in for the shell's binding: hands out ports and remembers what was asked."""

    def __init__(self, fail: bool = False) -> None:
        self.asked: list[tuple[int, int]] = []
        self.fail = fail

    def __call__(self, node_id: int, port: int) -> int:
        self.asked.append((node_id, port))
        if self.fail:
            raise OSError(98, "Address already in use")
        return port or 40_000 + node_id


def router(ports: BrokerPorts | None = None, listeners: Listeners | None = None, **kw: int) -> ClusterRouter:
    ports, listeners = ports or BrokerPorts(), listeners or Listeners()
    return ClusterRouter("proxy.example", ports, listeners, lambda: {PROXY}, **kw)


def test_each_broker_gets_one_listener_and_is_learned():
    listeners = Listeners()
    r = router(listeners=listeners)
    assert r.map_address(1, "b1", 9092) == ("proxy.example", 40_001)
    assert r.map_address(1, "b1-moved", 9093) == ("proxy.example", 40_001)
    assert listeners.asked == [(1, 0)]
    assert r.brokers == {1: Address("b1-moved", 9093)}
    assert r.upstream_for(1) == Address("b1-moved", 9093)
    assert r.upstream_for(2) is None  # not learned (or advertising the proxy): the bootstrap serves


def test_error_placeholders_and_the_proxy_itself_are_not_brokers():
    r = router()
    assert r.map_address(-1, "", -1) == ("", -1)
    assert r.map_address(3, "127.0.0.1", 9092) == ("proxy.example", 40_003)
    assert r.brokers == {}  # node 3 relays to the bootstrap upstream, not to the proxy


def test_a_broker_that_comes_to_advertise_the_proxy_is_relayed_to_the_bootstrap_again():
    """Its old address is no longer what the cluster advertises (its listener there may be
    gone): connections to its listener go where a broker advertising the proxy's go."""
    r = router()
    r.map_address(1, "b1", 9092)
    assert r.map_address(1, PROXY.host, PROXY.port) == ("proxy.example", 40_001)
    assert r.upstream_for(1) is None
    r.map_address(1, "b1-again", 9092)
    assert r.upstream_for(1) == Address("b1-again", 9092)


def test_fixed_ports_from_a_map_or_a_base():
    listeners = Listeners()
    r = router(BrokerPorts(explicit={1: 19_001}, base=20_000), listeners)
    r.map_address(1, "b1", 9092)
    r.map_address(2, "b2", 9092)
    assert listeners.asked == [(1, 19_001), (2, 20_002)]


@pytest.mark.parametrize(
    ("ports", "listeners", "node_id", "message"),
    [
        (BrokerPorts(base=60_000), Listeners(), 9_000, "not a valid port"),
        (BrokerPorts(), Listeners(fail=True), 1, "Address already in use"),
    ],
    ids=["port-out-of-range", "bind-failed"],
)
def test_a_broker_without_a_listener_is_a_protocol_error(ports, listeners, node_id, message):
    """Handing out the real address would let the client bypass the proxy."""
    with pytest.raises(RoutingError, match=message) as caught:
        router(ports, listeners).map_address(node_id, "b", 9092)
    assert isinstance(caught.value, ProtocolError)  # the relay closes that one connection


@pytest.mark.parametrize(
    ("ports", "node_ids"),
    [
        (BrokerPorts(base=PROXY.port - 2), [2]),  # node 2 would take the bootstrap port
        (BrokerPorts(explicit={1: 19_001, 2: 19_001}), [1, 2]),  # two brokers, one port
        (BrokerPorts(explicit={3: 19_002}, base=19_000), [3, 2]),  # node 2's base port is node 3's
    ],
    ids=["base-onto-listen", "explicit-twice", "base-onto-explicit"],
)
def test_a_fixed_port_the_proxy_already_listens_on_is_refused(ports, node_ids):
    """With ``--workers`` every listener is bound with SO_REUSEPORT, so binding it twice
    succeeds and the kernel splits a broker's connections between two handlers: some relay to
    another broker. The collision must be named, not bound."""
    bound: set[int] = {PROXY.port}

    def listen(node_id: int, port: int) -> int:
        bound.add(port)
        return port

    r = ClusterRouter("proxy.example", ports, listen, lambda: {Address(PROXY.host, p) for p in bound})
    *first, last = node_ids
    for node_id in first:
        r.map_address(node_id, f"b{node_id}", 9092)
    with pytest.raises(RoutingError, match=f"node id {last}.* already"):
        r.map_address(last, f"b{last}", 9092)
    assert last not in r.listener_ports


def test_a_cluster_cannot_make_the_proxy_open_unbounded_listeners():
    r = router(max_brokers=3)
    for node_id in range(3):
        r.map_address(node_id, f"b{node_id}", 9092)
    assert r.map_address(2, "b2", 9092) == ("proxy.example", 40_002)  # known brokers still map
    with pytest.raises(RoutingError, match="broker number 4"):
        r.map_address(99, "b99", 9092)
    assert set(r.listener_ports) == {0, 1, 2}


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "[::]"])
def test_a_wildcard_is_never_advertised(host):
    with pytest.raises(ValueError, match="--advertised-host"):
        ClusterRouter(host, BrokerPorts(), Listeners(), set)


@pytest.mark.parametrize(
    ("given", "told"),
    [("[::1]", "::1"), ("[2001:db8::7]", "2001:db8::7"), ("::1", "::1"), ("proxy.example", "proxy.example")],
)
def test_an_ipv6_advertised_host_is_told_without_brackets(given, told):
    """As a broker tells it (Kafka strips them from advertised.listeners): clients resolve the
    host as it comes, and ``[::1]`` resolves to nothing (kafka-python's getaddrinfo)."""
    assert router_at(given).map_address(1, "b1", 9092) == (told, 40_001)


@pytest.mark.parametrize("host", ["proxy.example:19092", "10.0.0.7:9092", "[proxy.example]", "[::1]:9092"])
def test_an_advertised_host_with_a_port_or_stray_brackets_is_refused(host):
    """Clients would be told a host that resolves to nothing."""
    with pytest.raises(ValueError, match="--advertised-host"):
        router_at(host)


def router_at(advertised_host: str) -> ClusterRouter:
    return ClusterRouter(advertised_host, BrokerPorts(), Listeners(), set)


def _metadata_answer(host: str) -> bytearray:
    cls = response_class(ApiKey.METADATA)
    broker = cls.MetadataResponseBroker(version=1, node_id=1, host=host, port=9092, rack=None)
    return bytearray(encode_response(cls(version=1, brokers=[broker], controller_id=1, topics=[]), 7))


def test_every_answer_that_can_carry_addresses_is_rewritten_each_time():
    """The router remembers which versions carry none; that must not spare one that does."""
    r = router()
    for _ in range(3):
        produce = bytearray(encode_response(response_class(ApiKey.PRODUCE)[7](), 7))
        assert r.transform(ApiKey.PRODUCE, 7, produce) is produce
        rewritten = r.transform(ApiKey.METADATA, 1, _metadata_answer("b1"))
        assert b"proxy.example" in rewritten and b"b1" not in rewritten
        assert r.brokers == {1: Address("b1", 9092)}
        versions = bytearray(encode_response(response_class(ApiKey.API_VERSIONS)[0](), 7))
        assert r.transform(ApiKey.API_VERSIONS, 0, versions) == cap_api_versions(versions, 0, r.caps)


def test_an_answer_that_teaches_the_router_something_new_is_reported_once():
    """The shell keeps what was learned for the next start; answers that repeat what is known
    (every Metadata refresh) must not make it write."""
    r = router()
    reports: list[dict] = []
    r.on_change = lambda: reports.append(r.learned())
    for host in ("b1", "b1", "b1-moved", PROXY.host, PROXY.host):
        r.transform(ApiKey.METADATA, 1, _metadata_answer(host))
    moved = Address("b1-moved", 9092)
    assert reports == [{1: (Address("b1", 9092), 40_001)}, {1: (moved, 40_001)}, {1: (None, 40_001)}]


def test_brokers_learned_before_a_restart_listen_and_relay_again():
    """Clients that cached the listeners (kafka-python; Java without rebootstrap) reconnect
    to them after a restart and never ask the bootstrap again."""
    listeners = Listeners()
    r = router(BrokerPorts({2: 19_002}), listeners)
    failed = r.restore(
        {1: (Address("b1", 9092), 40_101), 2: (Address("b2", 9092), 40_102), 3: (None, 40_103)}
    )
    assert failed == {}
    assert listeners.asked == [(1, 40_101), (2, 19_002), (3, 40_103)]  # a fixed port configured now wins
    assert r.learned() == {
        1: (Address("b1", 9092), 40_101),
        2: (Address("b2", 9092), 19_002),
        3: (None, 40_103),
    }
    assert r.map_address(1, "b1", 9092) == ("proxy.example", 40_101)
    assert listeners.asked[3:] == []


def test_a_broker_whose_port_is_taken_now_is_not_restored_and_says_why():
    r = router(listeners=Listeners(fail=True))
    failed = r.restore({1: (Address("b1", 9092), 40_101)})
    assert list(failed) == [1] and "Address already in use" in failed[1]
    assert r.learned() == {}


def _share_answer(api_key: int, host: bytes, correlation_id: int = 7) -> bytearray:
    """A ShareFetch or ShareAcknowledge v0 answer (flexible) whose ``NodeEndpoints`` names
    broker 2 at ``host``:9092, encoded by hand: kafka-python 3.0 has no schema for either."""
    body = (
        bytes(4)  # throttle_time_ms
        + bytes(2)  # error_code
        + b"\x00"  # error_message: null
        + (bytes(4) if api_key == ApiKey.SHARE_FETCH else b"")  # acquisition_lock_timeout_ms
        + b"\x01"  # responses: empty
        + b"\x02"  # node_endpoints: one
        + (2).to_bytes(4, "big")
        + bytes([len(host) + 1])
        + host
        + (9092).to_bytes(4, "big")
        + b"\x00\x00"  # rack: null; the endpoint's tagged fields
        + b"\x00"  # the body's tagged fields
    )
    payload = correlation_id.to_bytes(4, "big") + b"\x00" + body  # header v1
    return bytearray(len(payload).to_bytes(4, "big") + payload)


@pytest.mark.parametrize("api_key", [ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE])
def test_share_group_answers_that_name_a_broker_are_refused_not_relayed(api_key):
    """KIP-932 answers carry leader endpoints as KIP-951's do, and kafka-python cannot read
    them: passed on, they would send a share consumer to the broker itself."""
    r = router()
    for version in (0, 1, 5):
        with pytest.raises(ProtocolError, match=api_key.name.title().replace("_", "")):
            r.transform(api_key, version, _share_answer(api_key, b"b2.internal"))
    assert r.brokers == {}


def test_api_versions_answers_drop_the_share_group_apis_the_proxy_cannot_rewrite():
    """A share consumer is told the cluster has no ShareFetch, rather than reaching brokers
    around the proxy, and no ShareGroupHeartbeat, rather than joining a group it could not
    consume from; the admin's share apis stay listed."""
    cls = response_class(ApiKey.API_VERSIONS)
    listed = [
        ApiKey.FETCH,
        ApiKey.SHARE_GROUP_HEARTBEAT,
        ApiKey.SHARE_GROUP_DESCRIBE,
        ApiKey.SHARE_FETCH,
        ApiKey.SHARE_ACKNOWLEDGE,
    ]
    answer = cls(
        version=3,
        error_code=0,
        throttle_time_ms=0,
        api_keys=[cls.ApiVersion(version=3, api_key=key, min_version=0, max_version=1) for key in listed],
    )
    out = router().transform(ApiKey.API_VERSIONS, 3, bytearray(encode_response(answer, 7)))
    kept = cls.decode(bytes(out)[8:], version=3)
    assert [entry.api_key for entry in kept.api_keys] == [ApiKey.FETCH, ApiKey.SHARE_GROUP_DESCRIBE]
