"""corrfix in front of a :class:`~tests.fake_cluster.FakeCluster`, run in-process with trio.

:func:`start_stack` starts the brokers and a :class:`~corrfix.proxy.Proxy` (rewriting on,
broker 1 as its only upstream) with a :class:`~tests.client_view.ClientView` observer.
:class:`Stack` then proves that clients stayed on the proxy, by counting at both ends.
:class:`RawClient` speaks the protocol on a bare socket, SASL v0 raw tokens included.
"""

from __future__ import annotations

import functools

import trio

from corrfix.core import Address, ClusterRouter, RepairConfig
from corrfix.proxy import Proxy, ProxyConfig
from protocol import FrameDecoder, frame, response_correlation_id
from protocol.testing import encode_request
from tests.support.changes import Changes
from tests.support.client_view import ClientView, SeenAddress, decode_answer
from tests.support.fake_cluster import LOOPBACK, FakeCluster


class Stack:
    """A fake cluster and corrfix in front of broker 1, with an observer on corrfix."""

    def __init__(
        self, cluster: FakeCluster, proxy: Proxy, view: ClientView, port: int, changes: Changes
    ) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.view = view
        self.port = port
        self.bootstrap = f"{LOOPBACK}:{port}"
        self.changes = changes

    @property
    def router(self) -> ClusterRouter:
        assert self.proxy.router is not None
        return self.proxy.router

    def connection_counts(self) -> dict[int, tuple[int, int]]:
        """Per node: (connections the broker accepted, connections corrfix opened to it)."""
        return {
            node_id: (broker.accepted, self.view.opened_to(broker.address))
            for node_id, broker in self.cluster.brokers.items()
        }

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait until every client connection has closed and each broker has accepted every
        connection corrfix made to it (the accept loop of a fake broker may run after
        corrfix's connect returned); fail after ``timeout``. Woken by the observer's opens
        and closes and the brokers' accepts and ends."""

        def done() -> bool:
            counts = self.connection_counts().values()
            return self.proxy.stats.connections_active == 0 and all(a == b for a, b in counts)

        await self.changes.until(done, timeout)

    async def assert_clients_stayed_on_proxy(self) -> None:
        """Every connection a broker accepted came from corrfix, corrfix stands in for every
        broker with a listener of its own, and every address a client was told is one."""
        await self.settled()
        cluster, proxy, view, router = self.cluster, self.proxy, self.view, self.router
        assert cluster.unhandled == []
        assert view.undecodable == []
        # A client that connected to a broker directly would be accepted there without a
        # matching upstream connection of corrfix's.
        assert proxy.stats.connections_active == 0
        counts = self.connection_counts()
        assert all(accepted == opened for accepted, opened in counts.values()), counts
        assert proxy.stats.connections_opened == len(view.upstreams)
        assert cluster.accepted == proxy.stats.connections_opened
        assert all(peer.startswith(f"{LOOPBACK}:") for b in cluster.brokers.values() for peer in b.peers)
        # corrfix learned every broker and stands in for each with its own listener.
        assert router.brokers == {n: Address(LOOPBACK, b.port) for n, b in cluster.brokers.items()}
        assert set(router.listener_ports) == set(cluster.brokers)
        listeners = set(router.listener_ports.values())
        assert len(listeners) == len(cluster.brokers)
        assert not listeners & cluster.ports
        assert view.addresses
        assert_only_listeners(view.addresses, router.listener_ports)


def assert_only_listeners(addresses: list[SeenAddress], listener_ports: dict[int, int]) -> None:
    """Each address is corrfix's listener for its node; error placeholders stay as they were."""
    for seen in addresses:
        if seen.node_id < 0:
            assert (seen.host, seen.port) == ("", -1), seen
            continue
        assert (seen.host, seen.port) == (LOOPBACK, listener_ports[seen.node_id]), seen


async def start_stack(
    nursery: trio.Nursery,
    *,
    repair: RepairConfig | None = None,
    engine: bool = True,
    reuse_port: bool = False,
    **cluster_options: object,
) -> Stack:
    changes = Changes()
    cluster = FakeCluster(**cluster_options, changes=changes)  # type: ignore[arg-type]
    await cluster.start(nursery)
    view = ClientView(changes=changes)
    config = ProxyConfig(
        Address(LOOPBACK, 0),
        Address(LOOPBACK, cluster.brokers[cluster.node_ids[0]].port),
        repair=repair or RepairConfig(),
        engine=engine,
        reuse_port=reuse_port,
    )
    proxy = Proxy(config, observer=view)
    bound = await nursery.start(proxy.serve)
    return Stack(cluster, proxy, view, bound[0].port, changes)


async def in_thread(fn, *args, **kwargs):
    """Run a blocking client function in a worker thread."""
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


class RawClient:
    """A client on a trio socket that numbers its own requests and decodes the answers."""

    def __init__(self, stream: trio.SocketStream, first_id: int = 9000) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.frames: list[bytearray] = []
        self.next_id = first_id

    @classmethod
    async def connect(cls, port: int, first_id: int = 9000) -> RawClient:
        return cls(await trio.open_tcp_stream(LOOPBACK, port), first_id)

    async def send(self, message, client_id: str | None = "raw-client") -> int:
        """Send a request with the next correlation id (ids step by 7); return that id."""
        correlation_id = self.next_id
        self.next_id += 7
        await self.stream.send_all(encode_request(message, correlation_id, client_id))
        return correlation_id

    async def receive_frame(self) -> bytearray:
        while not self.frames:
            data = await self.stream.receive_some(65536)
            assert data, "corrfix closed the connection"
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    async def receive_answer(self, message, correlation_id: int):
        answer = await self.receive_frame()
        assert response_correlation_id(answer) == correlation_id
        return decode_answer(answer, message.API_KEY, message.API_VERSION)

    async def call(self, message, client_id: str | None = "raw-client"):
        correlation_id = await self.send(message, client_id)
        return await self.receive_answer(message, correlation_id)

    async def exchange_token(self, token: bytes) -> bytes:
        """A SASL v0 round trip: the token as a bare frame out, the bare reply back."""
        await self.stream.send_all(frame(token))
        return bytes((await self.receive_frame())[4:])

    async def aclose(self) -> None:
        await self.stream.aclose()
