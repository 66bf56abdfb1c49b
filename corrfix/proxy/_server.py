"""Listeners and accept: one :class:`ProxyConnection` per client, per-broker listeners, drain."""

from __future__ import annotations

import functools
import itertools
import socket
import threading

import structlog
import trio

from corrfix.core import LOOPBACK, Address, ClusterRouter
from corrfix.proxy._config import ProxyConfig
from corrfix.proxy._connection import ProxyConnection, ProxyStats
from corrfix.proxy._metrics import ProxyMetrics
from corrfix.proxy._observer import ConnectionObserver, SerializedObserver
from corrfix.proxy._streams import peer_name
from corrfix.proxy._tls import contexts

LISTEN_BACKLOG = 1024
log = structlog.get_logger("corrfix.proxy")


class ListenError(OSError):
    """A listen address cannot be bound (in use, not local, not permitted)."""


class Proxy:
    """Accepts clients and runs one :class:`ProxyConnection` each.

    The bootstrap listener relays to the configured upstream. With rewriting on, every
    broker the cluster advertises gets a listener of its own, bound the moment its address
    is first rewritten, so it exists before any client can learn of it.
    """

    def __init__(
        self,
        config: ProxyConfig,
        observer: ConnectionObserver | None = None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.config = config
        # The relay engine's thread and trio's both report to it: one call at a time.
        self.observer = None if observer is None else SerializedObserver(observer)
        self.metrics = metrics
        self.stats = ProxyStats()
        if config.tls is not None:
            contexts(config.tls)  # a missing or bad TLS file stops the proxy here, not per connection
        self._live: set[ProxyConnection] = set()
        if metrics is not None:
            metrics.track_live(
                lambda: sum(c.machine.outstanding for c in list(self._live)),
                lambda: sum(c.machine.held_bytes for c in list(self._live)),
            )
        self._ids = itertools.count(1)
        self._ports: set[int] = set()
        self._listening = trio.CancelScope()
        self.router: ClusterRouter | None = None
        if config.rewrite:
            self.router = ClusterRouter(
                config.advertised_host or config.listen.host,
                config.broker_ports,
                self._bind_broker_listener,
                self._own_addresses,
            )

    async def serve(self, *, task_status: trio.TaskStatus[list[Address]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, or until :meth:`drain` has let every connection finish."""
        listen = self.config.listen
        try:
            if self.config.reuse_port:
                listeners = [self._bound_listener(listen.host, listen.port)]
            else:
                listeners = await trio.open_tcp_listeners(listen.port, host=listen.host)
        except OSError as exc:
            raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
        bound = [Address(*listener.socket.getsockname()[:2]) for listener in listeners]
        self._ports.update(address.port for address in bound)
        log.info("proxy listening", listen=[str(a) for a in bound], upstream=str(self.config.upstream))
        async with trio.open_nursery() as connections:
            self._connections = connections
            with self._listening:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self._token = trio.lowlevel.current_trio_token()
                    self._trio_thread = threading.get_ident()
                    serve = functools.partial(trio.serve_listeners, handler_nursery=connections)
                    await nursery.start(serve, self._handle, listeners)
                    task_status.started(bound)
        log.info("proxy drained" if self._listening.cancel_called else "proxy stopped serving")

    def drain(self, timeout: float) -> None:
        """Stop accepting; let each connection finish what it owes, for at most ``timeout``."""
        log.info("draining", connections=len(self._live), timeout=timeout)
        self._listening.cancel()
        for connection in list(self._live):
            connection.drain()
        scope = self._connections.cancel_scope
        scope.deadline = min(scope.deadline, trio.current_time() + timeout)

    def _own_addresses(self) -> set[Address]:
        hosts = {self.config.listen.host, LOOPBACK, "localhost"}
        if self.router is not None:
            hosts.add(self.router.advertised_host)
        return {Address(host, port) for host in hosts for port in self._ports}

    def _bound_listener(self, host: str, port: int) -> trio.SocketListener:
        """A listening socket; shared with the other workers (SO_REUSEPORT) when there are any."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.config.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    def _bind_broker_listener(self, node_id: int, port: int) -> int:
        """Bind the listener that stands in for broker ``node_id`` (port 0: any free port)."""
        host = self.config.listen.host
        listener = self._bound_listener(host, port)
        sock = listener.socket
        bound = int(sock.getsockname()[1])
        self._ports.add(bound)
        handler = functools.partial(self._handle, node_id=node_id)
        serve = functools.partial(trio.serve_listeners, handler_nursery=self._connections)
        start = functools.partial(self._nursery.start_soon, serve, handler, [listener])
        if threading.get_ident() == self._trio_thread:
            start()
        else:  # met in an answer the relay engine's thread relayed; the socket listens already
            self._token.run_sync_soon(start)
        log.info("broker listener", node_id=node_id, listen=str(Address(host, bound)))
        return bound

    async def _handle(self, client: trio.SocketStream, node_id: int | None = None) -> None:
        if self.stats.connections_active >= self.config.max_connections or self._listening.cancel_called:
            log.warning(
                "refusing connection",
                client=peer_name(client),
                reason="draining" if self._listening.cancel_called else "max connections reached",
                active=self.stats.connections_active,
            )
            await trio.aclose_forcefully(client)
            return
        self.stats.connections_opened += 1
        self.stats.connections_active += 1
        if self.metrics is not None:
            self.metrics.connections_opened.inc()
            self.metrics.connections_active.inc()
        conn_id = f"c{next(self._ids)}"
        connection: ProxyConnection | None = None
        upstream = self.config.upstream
        if node_id is not None and self.router is not None:
            upstream = self.router.upstream_for(node_id, upstream)
        try:
            connection = ProxyConnection(
                client,
                self.config,
                self.stats,
                conn_id,
                self.observer,
                upstream=upstream,
                router=self.router,
                metrics=self.metrics,
            )
            self._live.add(connection)
            await connection.run()
        except Exception:
            # A bug must cost one connection, never the proxy and everyone else on it.
            log.exception("internal error, connection closed", connection=conn_id)
            await trio.aclose_forcefully(client)
        finally:
            if connection is not None:
                self._live.discard(connection)
            self.stats.connections_active -= 1
            if self.metrics is not None:
                self.metrics.connections_active.dec()
