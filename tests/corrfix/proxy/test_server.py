"""The proxy's listeners: each broker's binds every address the bootstrap's listen host named."""

from __future__ import annotations

import socket

import pytest
import trio
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from corrfix._netutil import free_port
from corrfix.core import Address
from corrfix.proxy import Proxy, ProxyConfig
from protocol import FrameDecoder
from protocol.testing import encode_request
from tests.support.fake_cluster import LOOPBACK, FakeCluster

DUAL_STACK = "dual-stack.test"
"""A name that resolves to both loopbacks, as localhost does on most distributions (this
machine's resolves to 127.0.0.1 alone)."""


class BothLoopbacks(trio.abc.HostnameResolver):
    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        if host != DUAL_STACK.encode() and host != DUAL_STACK:
            return await trio.to_thread.run_sync(socket.getaddrinfo, host, port, family, type, proto, flags)
        port = int(port or 0)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (LOOPBACK, port)),
        ]

    async def getnameinfo(self, sockaddr, flags):
        raise NotImplementedError


async def one_frame(stream: trio.SocketStream) -> bytearray:
    decoder = FrameDecoder()
    while True:
        data = await stream.receive_some(65536)
        assert data, "the proxy closed the connection"
        frames = decoder.feed(data)
        if frames:
            return frames[0]


@pytest.mark.parametrize("reuse_port", [False, True], ids=["one process", "--workers"])
async def test_each_broker_listener_binds_every_address_the_listen_host_names(reuse_port):
    """A client that resolves the advertised host to ::1 first (librdkafka, in getaddrinfo's
    order) reached the bootstrap there, and then found each broker's listener bound to
    127.0.0.1 alone: refused, an error logged, and the next address tried. With ``--workers``
    (SO_REUSEPORT) the bootstrap itself was bound to one of them."""
    previous = trio.socket.set_custom_hostname_resolver(BothLoopbacks())
    try:
        async with trio.open_nursery() as nursery:
            cluster = FakeCluster(topics={"t": 3})
            await cluster.start(nursery)
            upstream = Address(LOOPBACK, cluster.brokers[1].port)
            config = ProxyConfig(Address(DUAL_STACK, free_port()), upstream, reuse_port=reuse_port)
            proxy = Proxy(config)
            bound = await nursery.start(proxy.serve)
            assert sorted(address.host for address in bound) == sorted(["::1", LOOPBACK])
            with trio.fail_after(10):
                client = await trio.open_tcp_stream("::1", bound[0].port)
                await client.send_all(encode_request(MetadataRequest[1](topics=None), 1))
                await one_frame(client)
                assert proxy.router is not None
                learned = proxy.router.learned()
                assert set(learned) == set(cluster.brokers)
                for node_id, (_, port) in learned.items():
                    for host in ("::1", LOOPBACK):
                        accepted = cluster.brokers[node_id].accepted
                        stream = await trio.open_tcp_stream(host, port)
                        await stream.send_all(encode_request(ApiVersionsRequest[0](), 7))
                        answer = await one_frame(stream)
                        assert int.from_bytes(answer[4:8], "big") == 7
                        assert cluster.brokers[node_id].accepted == accepted + 1  # relayed to that broker
                        await stream.aclose()
            nursery.cancel_scope.cancel()
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
