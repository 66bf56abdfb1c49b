"""Listeners and accept: one :class:`ProxyConnection` per client, per-broker listeners, drain."""

from __future__ import annotations

import errno
import functools
import itertools
import os
import socket
import threading
from collections.abc import Awaitable, Callable

import structlog
import trio

from corrfix.core import LOOPBACK, Address, ClusterRouter
from corrfix.proxy._bootstrap import BootstrapOrder
from corrfix.proxy._broker_state import BrokerState
from corrfix.proxy._config import ProxyConfig
from corrfix.proxy._connection import ProxyConnection, ProxyStats
from corrfix.proxy._metrics import ProxyMetrics
from corrfix.proxy._observer import ConnectionObserver, SerializedObserver
from corrfix.proxy._streams import peer_name
from corrfix.proxy._throttle import HELD_REPORT_INTERVAL
from corrfix.proxy._tls import TlsContextStore, tls_store

LISTEN_BACKLOG = 1024
PORT_ATTEMPTS = 8
"""Kernel-picked ports tried for a broker listener on several addresses: the port picked on
the first may be taken on another."""
ACCEPT_RETRY = 0.1
"""Seconds to wait before accepting again when the process or machine is out of sockets or memory."""
_OUT_OF_CAPACITY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
log = structlog.get_logger("corrfix.proxy")


class ListenError(OSError):
    """A listen address cannot be bound (in use, not local, not permitted)."""


async def _addresses_of(host: str) -> tuple[str, ...]:
    """Every address ``host`` names for listening (``localhost``: ``::1`` and ``127.0.0.1`` on
    most distributions), as trio's own listeners take them."""
    infos = await trio.socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


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
        # A missing or bad TLS file stops the proxy here, not per connection.
        self._tls = None if config.tls is None else tls_store(config.tls)
        if self._tls is not None and metrics is not None:
            store = self._tls
            metrics.track_tls(lambda: (store.reloads, store.failures, store.failing))
        self._live: set[ProxyConnection] = set()
        self._in_engine: set[ProxyConnection] = set()  # relayed by the engine, with no task of their own
        self._live_changed = trio.lowlevel.ParkingLot()
        self._closed_all = False  # the engine's connections were closed as the proxy stopped
        if metrics is not None:
            metrics.track_live(
                lambda: sum(c.machine.outstanding for c in list(self._live)),
                lambda: sum(c.machine.outstanding_bytes for c in list(self._live)),
                lambda: sum(c.machine.held_bytes for c in list(self._live)),
            )
        self._ids = itertools.count(1)
        self._bootstrap = BootstrapOrder(config.bootstrap)
        self._ports: set[int] = set()
        # The addresses the --listen host gave the bootstrap listeners (both families for a
        # name such as localhost that resolves to both): each broker listener binds them all.
        self._listen_hosts: tuple[str, ...] = (config.listen.host,)
        self._listening = trio.CancelScope()
        self._connections: trio.Nursery | None = None
        self.router: ClusterRouter | None = None
        if config.rewrite:
            self.router = ClusterRouter(
                config.advertised_host or config.listen.host,
                config.broker_ports,
                self._bind_broker_listener,
                self._own_addresses,
            )
        self._broker_state = None
        if self.router is not None and config.broker_state is not None:
            self._broker_state = BrokerState(config.broker_state, self.router)

    async def serve(self, *, task_status: trio.TaskStatus[list[Address]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, or until :meth:`drain` has let every connection finish."""
        listen = self.config.listen
        if self._listening.cancel_called:  # drained while starting (a SIGTERM): never listen
            log.info("proxy drained before it listened")
            task_status.started([])
            return
        try:
            if self.config.reuse_port:  # bound here, as trio's listeners cannot share a port
                listeners = self._bound_listeners(await _addresses_of(listen.host), listen.port)
            else:
                listeners = await trio.open_tcp_listeners(listen.port, host=listen.host)
        except OSError as exc:
            raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
        bound = [Address(*listener.socket.getsockname()[:2]) for listener in listeners]
        self._ports.update(address.port for address in bound)
        self._listen_hosts = tuple(dict.fromkeys(address.host for address in bound))
        upstreams = [str(a) for a in self.config.bootstrap]
        log.info("proxy listening", listen=[str(a) for a in bound], upstream=",".join(upstreams))
        async with trio.open_nursery() as connections:
            self._connections = connections
            with self._listening:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self._token = trio.lowlevel.current_trio_token()
                    self._trio_thread = threading.get_ident()
                    if self._broker_state is not None:  # before anyone is accepted
                        self._broker_state.restore()
                        self._broker_state.save()  # an unwritable file is said at start
                    connections.start_soon(self._close_engine_connections_at_the_end)
                    for listener in listeners:
                        nursery.start_soon(self._accept, listener, self._handle)
                    if self._tls is not None and self.config.tls_reload_interval > 0:
                        nursery.start_soon(self._watch_tls, self._tls)
                    nursery.start_soon(self._report_held_warnings)
                    task_status.started(bound)
        log.info("proxy drained" if self._listening.cancel_called else "proxy stopped serving")

    async def _watch_tls(self, store: TlsContextStore) -> None:
        """Take up rotated certificates, keys and CAs without a restart (for new connections)."""
        interval = self.config.tls_reload_interval
        while True:
            await trio.sleep(interval)
            try:
                store.check(log, trio.current_time(), settle=interval)
            except Exception:  # a bug here must not stop the proxy: the files in use stay
                log.exception("internal error while checking the TLS files")

    async def _report_held_warnings(self) -> None:
        """Repair warning lines left out at the end of a storm, which no later line counts."""
        while True:
            await trio.sleep(HELD_REPORT_INTERVAL)
            for kind, held in self.stats.repair_warnings.take_held().items():
                log.warning("repair warnings left out", kind=kind, suppressed=held)

    def reload_tls(self) -> bool:
        """Build the TLS contexts from their files now (SIGHUP); False if there is no TLS, or
        the files could not be loaded (the contexts in use then stay)."""
        if self._tls is None:
            return False
        try:
            return self._tls.reload(log)
        except Exception:  # as in _watch_tls
            log.exception("internal error while loading the TLS files")
            return False

    def drain(self, timeout: float) -> None:
        """Stop accepting; let each connection finish what it owes, for at most ``timeout``."""
        log.info("draining", connections=len(self._live), timeout=timeout)
        self._listening.cancel()
        self._live_changed.unpark_all()
        for connection in list(self._live):
            connection.drain()
        if self._connections is None:  # serve() has not begun: it stops as it starts
            return
        scope = self._connections.cancel_scope
        scope.deadline = min(scope.deadline, trio.current_time() + timeout)

    def _own_addresses(self) -> set[Address]:
        hosts = {self.config.listen.host, LOOPBACK, "localhost", *self._listen_hosts}
        if self.router is not None:
            hosts.add(self.router.advertised_host)
        ports = tuple(self._ports)  # one step under the GIL: the engine's thread may add a port
        return {Address(host, port) for host in hosts for port in ports}

    def _bound_listener(self, host: str, port: int, *, v6_only: bool = False) -> trio.SocketListener:
        """A listening socket; shared with the other workers (SO_REUSEPORT) when there are any.
        ``v6_only``: an IPv6 wildcard beside an IPv4 one on the same port, as trio binds them."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if v6_only and family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
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
        """Bind the listener that stands in for broker ``node_id`` (port 0: any free port), on
        every address the bootstrap listens on, so that a client reaches each broker over the
        same addresses as the bootstrap: one that resolves the advertised host to ::1 first
        is not refused there."""
        hosts = self._listen_hosts
        listeners = self._bound_listeners(hosts, port)
        bound = int(listeners[0].socket.getsockname()[1])
        self._ports.add(bound)
        handler = functools.partial(self._handle, node_id=node_id)

        def start() -> None:
            try:
                for listener in listeners:
                    self._nursery.start_soon(self._accept, listener, handler)
            except RuntimeError:  # the proxy stopped listening (a drain) while the answer was relayed
                for listener in listeners:
                    listener.socket.close()
                log.info("broker listener not started: the proxy has stopped listening", node_id=node_id)

        if threading.get_ident() == self._trio_thread:
            start()
        else:  # met in an answer the relay engine's thread relayed; the sockets listen already
            self._token.run_sync_soon(start)
        listen = [str(Address(host, bound)) for host in hosts]
        log.info("broker listener", node_id=node_id, listen=listen[0] if len(listen) == 1 else listen)
        return bound

    def _bound_listeners(self, hosts: tuple[str, ...], port: int) -> list[trio.SocketListener]:
        """One listener per host, all on one port: ``port``, or one the kernel picks for the
        first host that is free on the others too."""
        v6_only = len(hosts) > 1
        attempts = PORT_ATTEMPTS
        while True:
            listeners: list[trio.SocketListener] = []
            try:
                for host in hosts:
                    chosen = int(listeners[0].socket.getsockname()[1]) if listeners else port
                    listeners.append(self._bound_listener(host, chosen, v6_only=v6_only))
            except OSError as exc:
                for listener in listeners:
                    listener.socket.close()
                attempts -= 1
                if port or exc.errno != errno.EADDRINUSE or not listeners or not attempts:
                    raise
            else:
                return listeners

    async def _accept(
        self, listener: trio.SocketListener, handler: Callable[[trio.SocketStream], Awaitable[None]]
    ) -> None:
        """Accept from one listener until the proxy stops listening; each client gets a task in
        the connections' nursery, which it leaves when the engine takes the connection over."""
        connections = self._connections
        assert connections is not None  # started by serve(), which set it
        async with listener:
            while True:
                try:
                    client = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _OUT_OF_CAPACITY:
                        raise
                    log.error(
                        "cannot accept, retrying",
                        error=os.strerror(exc.errno),
                        errno=errno.errorcode[exc.errno],
                        retry_in=ACCEPT_RETRY,
                    )
                    await trio.sleep(ACCEPT_RETRY)
                else:
                    connections.start_soon(handler, client)

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
        candidates = self._bootstrap.candidates()
        if node_id is not None and self.router is not None:
            broker = self.router.upstream_for(node_id)
            if broker is not None:
                candidates = (broker,)
        handed_over = False
        try:
            connection = ProxyConnection(
                client,
                self.config,
                self.stats,
                conn_id,
                self.observer,
                upstream=candidates,
                router=self.router,
                bootstrap=self._bootstrap,
                metrics=self.metrics,
                on_closed=self._closed_in_engine,
            )
            self._live.add(connection)
            handed_over = await connection.run()
            if handed_over:
                # Its close is reported soon, not now, so it is in the set by then.
                self._in_engine.add(connection)
                if self._closed_all:  # connected as the proxy stopped: nobody else will close it
                    connection.abandon()
        except Exception:
            # A bug must cost one connection, never the proxy and everyone else on it.
            log.exception("internal error, connection closed", connection=conn_id)
            await trio.aclose_forcefully(client)
        finally:
            if not handed_over:
                self._ended(connection)  # first: the close below raises if the proxy is stopping
                await trio.aclose_forcefully(client)

    def _closed_in_engine(self, connection: ProxyConnection, error: Exception | None) -> None:
        """A connection the engine relayed is closed (trio's thread)."""
        if error is not None:
            log.error("internal error, connection closed", connection=connection.conn_id, exc_info=error)
        self._in_engine.discard(connection)
        self._ended(connection)

    def _ended(self, connection: ProxyConnection | None) -> None:
        if connection is not None:
            self._live.discard(connection)
        self.stats.connections_active -= 1
        if self.metrics is not None:
            self.metrics.connections_active.dec()
        if self._listening.cancel_called:  # only a drain waits for the last connection
            self._live_changed.unpark_all()

    async def _close_engine_connections_at_the_end(self) -> None:
        """No task waits for a connection in the engine: when the proxy stops, or a drain's time
        is up, this one closes them. After a drain it waits until every connection is over."""
        try:
            while not (self._listening.cancel_called and not self._live):
                await self._live_changed.park()
        finally:
            self._closed_all = True
            for connection in list(self._in_engine):
                connection.abandon()
