"""Keep clients on the proxy: which proxy address stands in for which broker (sans-IO).

Every broker address a client learns (Metadata, FindCoordinator, DescribeCluster, KIP-951
endpoints in Produce and Fetch) is rewritten to a proxy listener that relays to that
broker. The router learns brokers from the responses it rewrites; the shell starts a
listener for each node id it has not seen before. It also caps ApiVersions to what the
proxy can decode, so a client never negotiates a version whose addresses the proxy could
not rewrite.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from corrfix.core._address import Address
from protocol import (
    ApiKey,
    ProtocolError,
    RequestHeader,
    cap_api_versions,
    decodable_max_versions,
    needs_rewrite,
    rewrite_response,
    unsupported_api_versions_response,
)

# Bound once: reading a member off an Enum class costs about 0.25 µs, and these are read per frame.
_API_VERSIONS = ApiKey.API_VERSIONS

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
MAX_BROKERS = 1024
"""Listeners the proxy opens for one cluster; a broker that invents node ids cannot exhaust ports."""
_MAX_PLAIN_VERSIONS = 4096
"""Api versions remembered as never carrying addresses; clients choose them, so bounded."""


class RoutingError(ProtocolError):
    """A broker address in an answer cannot be given a proxy listener.

    Passing the real address on would let the client bypass the proxy, so the answer is
    refused and the connection closed, like any other answer that cannot be relayed.
    """


def _advertisable(host: str) -> str:
    """The host clients are told, written as a broker writes it: an IPv6 literal without its
    brackets (Kafka strips them from advertised.listeners; clients resolve the host as it
    comes, and ``[::1]`` resolves to nothing), never a wildcard nor a ``HOST:PORT``."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare in WILDCARD_HOSTS:
        raise ValueError("a wildcard address cannot be advertised to clients; set --advertised-host")
    if bare != host or ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            raise ValueError(
                f"--advertised-host takes a host name or address, without a port: got {host!r}"
            ) from None
    return bare


@dataclass(frozen=True, slots=True)
class BrokerPorts:
    """How a broker's node id maps to the proxy port that stands in for it.

    An explicit map wins; else ``base + node_id``; else any free port. Explicit and base
    ports are the same in every worker process and across restarts, which clients that
    cache metadata need.
    """

    explicit: Mapping[int, int] = field(default_factory=dict)
    base: int | None = None

    def fixed_port(self, node_id: int) -> int | None:
        if node_id in self.explicit:
            return self.explicit[node_id]
        if self.base is not None:
            port = self.base + node_id
            if not 0 < port < 65536:
                raise RoutingError(f"--broker-port-base {self.base} + node id {node_id} is not a valid port")
            return port
        return None


class ClusterRouter:
    """Rewrites answers so every broker address points at the proxy, and learns the brokers."""

    def __init__(
        self,
        advertised_host: str,
        ports: BrokerPorts,
        allocate: Callable[[int, int], int],
        own_addresses: Callable[[], set[Address]],
        max_brokers: int = MAX_BROKERS,
    ) -> None:
        self.advertised_host = _advertisable(advertised_host)
        self.ports = ports
        self._allocate = allocate
        """``allocate(node_id, port)`` binds a listener (port 0: any) and returns its port."""
        self._own_addresses = own_addresses
        self.max_brokers = max_brokers
        self.brokers: dict[int, Address] = {}
        """The upstream address of each broker, as last advertised by the cluster."""
        self.listener_ports: dict[int, int] = {}
        self.on_change: Callable[[], None] | None = None
        """Called after an answer taught the router something new (a broker, a new address),
        so the shell can keep what :meth:`learned` says across a restart."""
        self._changed = False
        self._caps: dict[int, int] | None = None
        self._plain: set[tuple[int, int]] = set()
        """(api key, api version) whose answers carry no address: asked of every answer, and
        a set lookup costs half of asking :func:`~protocol.needs_rewrite` again."""

    @property
    def caps(self) -> dict[int, int]:
        """The newest version of each capped api a client may use. Made on first use (an
        ApiVersions exchange): it loads kafka-python's classes, which a start need not pay for."""
        if self._caps is None:
            self._caps = decodable_max_versions()
        return self._caps

    def upstream_for(self, node_id: int) -> Address | None:
        """Where a connection to the listener of ``node_id`` should go; None for the bootstrap
        brokers (a broker that advertises the proxy itself)."""
        return self.brokers.get(node_id)

    def learned(self) -> dict[int, tuple[Address | None, int]]:
        """Each broker given a listener: where it relays (None: the bootstrap brokers) and the
        listener's port, which clients have been told and may have cached."""
        ports, brokers = dict(self.listener_ports), dict(self.brokers)  # copies: both threads relay
        return {node_id: (brokers.get(node_id), port) for node_id, port in ports.items()}

    def restore(self, learned: Mapping[int, tuple[Address | None, int]]) -> dict[int, str]:
        """Open the listeners of brokers learned before a restart, on the ports clients were
        told (a fixed port configured now wins), relaying where they relayed.

        Clients that cached the listeners and never go back to their bootstrap servers (kafka-python;
        the Java client unless ``metadata.recovery.strategy=rebootstrap``) reconnect to them,
        and would find nothing listening until another client bootstrapped through the proxy.
        Returns why each broker that could not be restored was not (a port now taken)."""
        failed: dict[int, str] = {}
        for node_id, (upstream, port) in sorted(learned.items()):
            if node_id < 0 or node_id in self.listener_ports:
                continue
            try:
                self._listen_for(node_id, port)
            except RoutingError as exc:
                failed[node_id] = str(exc)
                continue
            if upstream is not None and upstream not in self._own_addresses():
                self.brokers[node_id] = upstream
        return failed

    def map_address(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """An :data:`~protocol.rewrite.AddressMapper`: learn the broker, hand out its listener."""
        if node_id < 0 or not host:
            return host, port  # an error placeholder, not a broker
        listener = self.listener_ports.get(node_id)
        if listener is None:
            listener = self._listen_for(node_id)
            self._changed = True
        address = Address(host, port)
        if address not in self._own_addresses():
            if self.brokers.get(node_id) != address:
                self.brokers[node_id] = address
                self._changed = True
        # A broker that advertises the proxy (a single-broker sidecar set-up) keeps relaying
        # to the bootstrap upstream instead of to the proxy itself, also once it has
        # advertised an address of its own before.
        elif self.brokers.pop(node_id, None) is not None:
            self._changed = True
        return self.advertised_host, listener

    def _listen_for(self, node_id: int, recorded: int = 0) -> int:
        """Bind the listener of ``node_id``: its fixed port, else ``recorded`` (a port it had
        before a restart), else any free port."""
        if len(self.listener_ports) >= self.max_brokers:
            raise RoutingError(f"broker node id {node_id} would be broker number {self.max_brokers + 1}")
        port = self.ports.fixed_port(node_id) or recorded
        if port and port in {address.port for address in self._own_addresses()}:
            # Bound with SO_REUSEPORT (--workers), a second listener on a port shares it: the
            # kernel would hand some of this broker's connections to another broker's relay.
            raise RoutingError(
                f"broker node id {node_id}'s port {port} is already a proxy listener "
                "(--listen, or another broker's): check --broker-port and --broker-port-base"
            )
        try:
            listener = self._allocate(node_id, port)
        except OSError as exc:
            raise RoutingError(f"no listener for broker node id {node_id}: {exc}") from exc
        self.listener_ports[node_id] = listener
        return listener

    def transform(self, api_key: int, api_version: int, frame: bytearray) -> bytes | bytearray:
        """A :data:`~corrfix.core._repair.ResponseTransform` for the repair machine."""
        if (api_key, api_version) in self._plain:
            return frame
        if api_key == _API_VERSIONS:
            return cap_api_versions(frame, api_version, self.caps)
        if needs_rewrite(api_key, api_version):
            try:
                return rewrite_response(frame, api_key, api_version, self.map_address) or frame
            finally:
                if self._changed:
                    self._changed = False
                    if self.on_change is not None:
                        self.on_change()
        if len(self._plain) < _MAX_PLAIN_VERSIONS:
            self._plain.add((api_key, api_version))
        return frame

    def local_answer(self, header: RequestHeader) -> bytes | None:
        """A :data:`~corrfix.core._repair.LocalAnswer`: refuse ApiVersions versions the proxy
        cannot decode, the way a broker does, so the client retries lower."""
        if header.api_key == _API_VERSIONS and header.api_version > self.caps[_API_VERSIONS]:
            return unsupported_api_versions_response(header.correlation_id)
        return None
