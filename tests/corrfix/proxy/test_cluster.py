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


def test_a_cluster_cannot_make_the_proxy_open_unbounded_listeners():
    r = router(max_brokers=3)
    for node_id in range(3):
        r.map_address(node_id, f"b{node_id}", 9092)
    assert r.map_address(2, "b2", 9092) == ("proxy.example", 40_002)  # known brokers still map
    with pytest.raises(RoutingError, match="broker number 4"):
        r.map_address(99, "b99", 9092)
    assert set(r.listener_ports) == {0, 1, 2}


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::"])
def test_a_wildcard_is_never_advertised(host):
    with pytest.raises(ValueError, match="--advertised-host"):
        ClusterRouter(host, BrokerPorts(), Listeners(), set)


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
