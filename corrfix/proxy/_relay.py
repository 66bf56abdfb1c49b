"""The trio shell around :class:`~corrfix.core.ConnectionCore`: it only moves bytes and timers.

Per client connection there is one upstream connection and five small tasks: a reader and
a writer for each side, and a timer that wakes the core at its next deadline. Readers feed
received bytes to the core; what it returns is appended to the writers' buffers, so many
small frames leave in one send, and its events go to the metrics, the log and the
observer (capture). Backpressure is the readers pausing when the core says so.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

import structlog
import trio

from corrfix.core import (
    CLOSE_GRACE,
    DISCARD_LIMIT,
    LOOPBACK,
    Address,
    Answered,
    BrokerPorts,
    ClusterRouter,
    ConnectionConfig,
    ConnectionCore,
    Event,
    Forwarded,
    Notice,
    RepairConfig,
    Repaired,
    RepairKind,
    RepairMachine,
)
from corrfix.proxy._metrics import ProxyMetrics
from corrfix.proxy._observer import ConnectionObserver
from corrfix.proxy._tls import TlsConfig, accept_client, connect_upstream, contexts
from protocol import DEFAULT_MAX_FRAME_SIZE

RECEIVE_SIZE = 256 * 1024
"""Largest receive through trio's streams (TLS)."""
PLAIN_RECEIVE_SIZE = 1024 * 1024
"""Largest receive on a plaintext socket: one buffer per thread, so a big one costs nothing per
connection and a 1 MiB frame arrives in one system call."""
FAIR_READS = 4
"""Receives a reader may take back to back before it yields to the other connections."""
IOV_MAX = 1024
LISTEN_BACKLOG = 1024
CONNECT_BACKOFF = 0.1
"""First pause between upstream connect attempts; it doubles each time."""
log = structlog.get_logger("corrfix.proxy")

_LOUD_EVENTS = {
    RepairKind.SKIP_DETECTED,
    RepairKind.REQUEUE,
    RepairKind.PROBE_FOUND_LOSS,
    RepairKind.POSSIBLE_DUPLICATE,
    RepairKind.GIVE_UP,
}


class ListenError(OSError):
    """A listen address cannot be bound (in use, not local, not permitted)."""


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    listen: Address
    upstream: Address
    repair: RepairConfig = field(default_factory=RepairConfig)
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    connect_timeout: float = 10.0
    connect_retries: int = 2
    """Further upstream connect attempts after a refused or timed-out one, with backoff."""
    max_connections: int = 10_000
    """Client connections beyond this are closed at once, with a log line."""
    frame_timeout: float = 30.0
    """Close a client whose request frame stays incomplete this long (slowloris, a stall)."""
    close_linger: float = 5.0
    """After a client leaves, the proxy sends the broker everything it read and half-closes;
    this is how long it then waits for the broker to close its side before closing anyway."""
    idle_timeout: float = 600.0
    """Close a connection with nothing outstanding and no bytes either way for this long
    (Kafka brokers' connections.max.idle.ms is 10 minutes)."""
    max_send_buffer: int = 4 * 1024 * 1024
    """Bytes waiting to be sent to one side before the other side's reader pauses."""
    rewrite: bool = True
    """Rewrite broker addresses to per-broker proxy listeners and cap ApiVersions."""
    advertised_host: str | None = None
    """The host clients are told for every broker listener (default: the listen host)."""
    broker_ports: BrokerPorts = field(default_factory=BrokerPorts)
    reuse_port: bool = False
    """Share listen ports with sibling worker processes (SO_REUSEPORT)."""
    tls: TlsConfig | None = None
    """TLS with clients and/or brokers (None: plaintext both ways)."""

    @property
    def connection(self) -> ConnectionConfig:
        """What each connection's core needs to know."""
        return ConnectionConfig(
            repair=self.repair,
            max_frame_size=self.max_frame_size,
            frame_timeout=self.frame_timeout,
            close_linger=self.close_linger,
            idle_timeout=self.idle_timeout,
            max_send_buffer=self.max_send_buffer,
        )


@dataclass
class ProxyStats:
    """Process-wide counts; the metrics endpoint and the connection summaries read them."""

    connections_opened: int = 0
    connections_active: int = 0
    repairs: Counter[str] = field(default_factory=Counter)
    answering_upstreams: set[Address] = field(default_factory=set)
    """Brokers that answered on some connection: plaintext works there, so a close is no TLS hint."""


def _plain_socket(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under a plaintext stream, for direct non-blocking I/O (None for TLS)."""
    return stream.socket if isinstance(stream, trio.SocketStream) else None


class _Outbox:
    """Bytes queued for one stream, sent in as few sends as possible.

    On a plaintext socket, :meth:`write` sends at once when nothing is queued, straight on
    the file descriptor: a relayed batch then costs one ``writev`` and no task switch. Only
    what the socket does not take is queued, for the writer task (:meth:`run`), which
    waits for the socket through trio. Ordering holds because a direct send happens only
    while nothing is queued or being sent.
    """

    __slots__ = ("_buffer", "_changed", "_dropping", "_error", "_fd", "_sending", "eof")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._sending = 0
        self._changed = trio.lowlevel.ParkingLot()
        self._fd = -1
        self._error: OSError | None = None
        self._dropping = False
        self.eof = False

    def attach(self, stream: trio.abc.Stream) -> None:
        """Send directly on ``stream``'s socket when it is plaintext."""
        sock = _plain_socket(stream)
        self._fd = sock.fileno() if sock is not None else -1

    def detach(self) -> None:
        """No more direct sends: the socket is about to close (its number may be reused)."""
        self._fd = -1

    @property
    def pending(self) -> int:
        return len(self._buffer) + self._sending

    def abandon(self) -> None:
        """The peer is gone: drop what is queued and everything written from now on."""
        self._dropping = True
        self._fd = -1
        self._buffer = bytearray()
        self._changed.unpark_all()

    def write(self, frames: list[bytearray]) -> None:
        if self._dropping:
            return
        rest: list[bytearray] | list[memoryview] = frames
        if self._fd >= 0 and not self._buffer and not self._sending and not self.eof and self._error is None:
            rest = self._send_now(frames)
            if not rest:
                return
        buffer = self._buffer
        for frame in rest:
            buffer += frame
        self._changed.unpark_all()

    def _send_now(self, frames: list[bytearray]) -> list[bytearray] | list[memoryview]:
        """Send what the socket takes without waiting; returns the rest, for the writer task."""
        try:
            if len(frames) == 1:
                sent = os.write(self._fd, frames[0])
            else:
                sent = os.writev(self._fd, frames[:IOV_MAX])
        except BlockingIOError:
            return frames
        except OSError as exc:
            self._error = exc  # the writer task reports it, as a failed send_all would
            return frames
        index = 0
        for frame in frames:
            size = len(frame)
            if sent < size:
                break
            sent -= size
            index += 1
        if index == len(frames):
            return []
        rest: list[memoryview] = [memoryview(frames[index])[sent:]]
        rest.extend(memoryview(frame) for frame in frames[index + 1 :])
        return rest

    def finish(self) -> None:
        """Send what is queued, then end the stream."""
        self.eof = True
        self._changed.unpark_all()

    async def wait_below(self, limit: int) -> None:
        while self.pending >= limit:
            await self._changed.park()

    async def run(self, stream: trio.abc.HalfCloseableStream | trio.abc.Stream) -> None:
        while True:
            if self._error is not None:
                raise trio.BrokenResourceError(f"socket connection broken: {self._error}") from self._error
            if not self._buffer:
                if self.eof:
                    return
                await self._changed.park()
                continue
            data = self._buffer
            self._buffer = bytearray()
            self._sending = len(data)
            await stream.send_all(data)
            self._sending = 0
            self._changed.unpark_all()


_receive_buffers = threading.local()


def _receive_buffer() -> bytearray:
    """One receive buffer per thread, shared by every reader of the trio run in it: a reader
    uses what it received before its next await, so idle connections cost no buffer."""
    buffer = getattr(_receive_buffers, "buffer", None)
    if buffer is None:
        buffer = _receive_buffers.buffer = bytearray(PLAIN_RECEIVE_SIZE)
    return buffer


class _Receiver:
    """Receives from one stream; a plaintext socket is read into the thread's receive buffer.

    trio is awaited only when the socket has nothing ready (and every few receives, so
    that one busy connection cannot starve the others). The returned view is valid only
    until the caller's next await.
    """

    __slots__ = ("_buffer", "_fd", "_sock", "_streak", "_stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._sock = _plain_socket(stream)
        self._fd = self._sock.fileno() if self._sock is not None else -1
        self._buffer = _receive_buffer() if self._sock is not None else bytearray()
        self._streak = 0

    async def receive(self) -> bytes | bytearray | memoryview:
        if self._sock is None:
            return await self._stream.receive_some(RECEIVE_SIZE)
        if self._streak >= FAIR_READS:
            self._streak = 0
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                received = os.readv(self._fd, [self._buffer])
            except BlockingIOError:
                self._streak = 0
                await trio.lowlevel.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            # No await from here on: the buffer is shared, and another reader may fill it next.
            self._streak += 1
            return memoryview(self._buffer)[:received]


class ProxyConnection:
    """One client connection and its upstream connection, driven by a :class:`ConnectionCore`.

    The tasks move bytes and wait for time; every decision (what to send, when to stop
    reading, when to end each stream, when to close) is the core's.
    """

    def __init__(
        self,
        client: trio.SocketStream,
        config: ProxyConfig,
        stats: ProxyStats,
        conn_id: str,
        observer: ConnectionObserver | None = None,
        *,
        upstream: Address | None = None,
        router: ClusterRouter | None = None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self._socket = client
        self.client: trio.abc.Stream = client  # the TLS stream over it, once accepted
        self.upstream = upstream or config.upstream
        self.conn_id = conn_id
        self.observer = observer
        self.config = config
        self.stats = stats
        self.metrics = metrics
        self.machine = RepairMachine(
            config.repair,
            transform=router.transform if router else None,
            local_answer=router.local_answer if router else None,
        )
        self.core: ConnectionCore | None = None  # once both sides are connected
        self.to_client = _Outbox()
        self.to_upstream = _Outbox()
        self.repairs: Counter[str] = Counter()
        self._state_changed = trio.lowlevel.ParkingLot()
        self._timer_scope = trio.CancelScope()
        self._relay_scope = trio.CancelScope()  # the connection's tasks: cancelled to close it
        self._client_reader_scope = trio.CancelScope()
        self._upstream_reader_scope = trio.CancelScope()
        self._client_reader_done = trio.Event()
        self._drain_requested = False
        self._upstream_marked = False  # recorded in stats.answering_upstreams
        peer = _peer_name(client)
        self.log = log.bind(connection=conn_id, client=peer)
        self._client_peer = peer

    async def run(self) -> None:
        # The client's TLS handshake comes first: a client that fails it costs no upstream connection.
        client = await accept_client(self._socket, self.config.tls, self.config.connect_timeout, self.log)
        if client is None:
            await trio.aclose_forcefully(self._socket)
            return
        self.client = client
        upstream = await self._connect_upstream()
        if upstream is None:
            await self.client.aclose()
            return
        self.log.info("connection opened", upstream=str(self.upstream))
        if self.observer is not None:
            self.observer.connection_opened(self.conn_id, self._client_peer, _peer_name(upstream))
        self.core = ConnectionCore(
            self.config.connection,
            self.machine,
            trio.current_time(),
            client_peer=self._client_peer,
            upstream_peer=str(self.upstream),
            client_tls=isinstance(self.client, trio.SSLStream),
            upstream_tls=isinstance(upstream, trio.SSLStream),
            upstream_known_plaintext=lambda: self.upstream in self.stats.answering_upstreams,
            record_frames=None if self.observer is None else self.observer.snaplen,
        )
        self.to_client.attach(self.client)
        self.to_upstream.attach(upstream)
        try:
            with self._relay_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_client)
                    nursery.start_soon(self._read_upstream, upstream)
                    nursery.start_soon(self._write_upstream, upstream)
                    nursery.start_soon(self._write_client)
                    nursery.start_soon(self._run_timer)
                    if self._drain_requested:
                        self.drain()
        finally:
            # Also when the proxy itself is stopping and this connection is cancelled.
            self.to_client.detach()
            self.to_upstream.detach()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(self.client)
            reason = self.core.closed().reason
            if self.observer is not None:
                self.observer.connection_closed(self.conn_id, reason)
            outstanding = self.machine.outstanding
            self.log.info("connection closed", reason=reason, outstanding=outstanding, **dict(self.repairs))

    async def _connect_upstream(self) -> trio.abc.Stream | None:
        target = self.upstream
        attempts = self.config.connect_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                with trio.fail_after(self.config.connect_timeout):
                    stream = await trio.open_tcp_stream(target.host, target.port)
                # A failed TLS handshake is logged and not retried: it would fail the same way.
                return await connect_upstream(
                    stream, self.config.tls, target.host, self.config.connect_timeout, self.log
                )
            except (OSError, trio.TooSlowError) as exc:
                error = str(exc) or "timeout"
                if attempt == attempts:
                    self.log.error(
                        "upstream unreachable, closing client",
                        upstream=str(target),
                        attempts=attempts,
                        error=error,
                    )
                    return None
                self.log.info("upstream connect failed, retrying", upstream=str(target), error=error)
                await trio.sleep(CONNECT_BACKOFF * 2 ** (attempt - 1))
        return None

    # -- the tasks: a reader and a writer per side, and the core's timer ----------------

    async def _read_client(self) -> None:
        core = self.core
        assert core is not None
        receiver = _Receiver(self.client)
        metrics = self.metrics
        try:
            with self._client_reader_scope:
                while not core.stop_client:
                    if not core.client_read_allowed(self.to_upstream.pending):
                        core.pause_client()
                        while not self.machine.accepting_requests:
                            if self.machine.closed is not None:
                                return
                            await self._state_changed.park()
                        await self.to_upstream.wait_below(self.config.max_send_buffer)
                        core.resume_client(trio.current_time())
                    data = await receiver.receive()
                    if data and metrics is not None:
                        metrics.client_request_bytes.inc(len(data))
                    core.receive_client(data, trio.current_time())
                    self._sync()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            core.client_lost(f"client connection lost: {exc or type(exc).__name__}", trio.current_time())
            self._sync()
        finally:
            self._client_reader_done.set()

    async def _read_upstream(self, upstream: trio.abc.Stream) -> None:
        core = self.core
        assert core is not None
        receiver = _Receiver(upstream)
        metrics = self.metrics
        limit = self.config.max_send_buffer
        with self._upstream_reader_scope:
            try:
                while not core.stop_upstream:
                    if not core.upstream_read_allowed(self.to_client.pending):
                        await self.to_client.wait_below(limit)
                    data = await receiver.receive()
                    if data and metrics is not None:
                        metrics.upstream_response_bytes.inc(len(data))
                    core.receive_upstream(data, trio.current_time())
                    self._sync()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                core.upstream_lost(str(exc) or type(exc).__name__, trio.current_time())
                self._sync()

    async def _write_upstream(self, upstream: trio.abc.Stream) -> None:
        core = self.core
        assert core is not None
        try:
            await self.to_upstream.run(upstream)
            if not isinstance(upstream, trio.SSLStream):
                # The broker sees its end of stream after the last request, takes every request
                # before it, and closes its side: the core then ends the connection.
                assert isinstance(upstream, trio.abc.HalfCloseableStream)
                await upstream.send_eof()
            core.upstream_flushed(trio.current_time())
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            core.abort(f"upstream connection lost while sending: {exc or type(exc).__name__}")
        self._sync()

    async def _write_client(self) -> None:
        core = self.core
        assert core is not None
        client = self.client
        try:
            await self.to_client.run(client)
            if core.discard_client_input and isinstance(client, trio.SocketStream):
                await self._client_reader_done.wait()
                await self._discard_client_input(client)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            core.client_lost(
                f"client connection lost while sending: {exc or type(exc).__name__}", trio.current_time()
            )
            self._sync()
            return
        # Everything owed to the client was sent: the connection is done.
        self._relay_scope.cancel()

    async def _discard_client_input(self, client: trio.SocketStream) -> None:
        """End the client's stream and read until it ends its own, bounded in time and bytes.

        The end of stream waits CLOSE_GRACE after the last answers. Closing a socket that
        holds unread bytes makes the kernel send a RST, and a RST can destroy answers the
        client has not read yet.
        """
        await trio.sleep(CLOSE_GRACE)
        await client.send_eof()
        discarded = 0
        with trio.move_on_after(self.config.close_linger):
            while discarded <= DISCARD_LIMIT:
                data = await client.receive_some(RECEIVE_SIZE)
                if not data:
                    return
                discarded += len(data)
        self.log.info("client kept sending after the proxy's end of stream", discarded=discarded)

    async def _run_timer(self) -> None:
        core = self.core
        assert core is not None
        while True:
            with self._timer_scope:
                self._timer_scope.deadline = core.next_deadline()
                await trio.sleep_forever()
            self._timer_scope = trio.CancelScope()
            core.tick(trio.current_time())
            self._sync()

    # -- carrying out what the core decided ----------------------------------------------

    def _sync(self) -> None:
        core = self.core
        assert core is not None
        if core.has_output:
            to_upstream = core.take_upstream()
            to_client = core.take_client()
            events = core.take_events()
            if self.observer is not None and events:
                self.observer.events(self.conn_id, events)
            if self.metrics is not None:
                self._count_sent(to_upstream, to_client)
            if to_upstream:
                self.to_upstream.write(to_upstream)
            if to_client:
                self.to_client.write(to_client)
            for event in events:
                self._consume(event)
        if not self._upstream_marked and core.upstream_spoke:
            self._upstream_marked = True
            self.stats.answering_upstreams.add(self.upstream)
        if core.stop_client:
            self._client_reader_scope.cancel()
        if core.abandon_client:
            self.to_client.abandon()
        if core.end_upstream:
            self.to_upstream.finish()
        if core.stop_upstream:
            self._upstream_reader_scope.cancel()
        if core.end_client:
            self.to_client.finish()
        if core.aborted:
            self._relay_scope.cancel()
        deadline = core.next_deadline()
        if deadline != self._timer_scope.deadline:  # re-arming a trio deadline is not free
            self._timer_scope.deadline = deadline
        if self._state_changed:
            self._state_changed.unpark_all()

    def _count_sent(self, to_upstream: list[bytearray], to_client: list[bytearray]) -> None:
        assert self.metrics is not None
        if to_upstream:
            self.metrics.upstream_request_bytes.inc(sum(len(frame) for frame in to_upstream))
        if to_client:
            self.metrics.client_response_bytes.inc(sum(len(frame) for frame in to_client))

    def _consume(self, event: Event) -> None:
        """Metrics and logs from the core's events."""
        metrics = self.metrics
        if isinstance(event, Forwarded):
            if metrics is not None:
                metrics.request(event.api_key)
        elif isinstance(event, Answered):
            if metrics is not None:
                metrics.answer(event.api_key, event.seconds)
        elif isinstance(event, Repaired):
            self._record(event)
        elif isinstance(event, Notice):
            if event.level == "warning":
                self.log.warning(event.message, **dict(event.details))
            else:
                self.log.info(event.message, **dict(event.details))

    def _record(self, event: Repaired) -> None:
        kind = event.kind.value
        self.repairs[kind] += 1
        self.stats.repairs[kind] += 1
        if self.metrics is not None:
            self.metrics.repairs.labels(kind).inc()
        fields = {
            "api": event.api,
            "client_correlation_id": event.client_correlation_id,
            "upstream_correlation_id": event.upstream_correlation_id,
            "new_upstream_correlation_id": event.new_upstream_correlation_id,
            "attempt": event.attempt,
            "reason": event.reason or None,
        }
        fields = {k: v for k, v in fields.items() if v is not None}
        if event.kind in _LOUD_EVENTS:
            self.log.warning(f"repair.{kind}", **fields)
        else:
            self.log.debug(f"repair.{kind}", **fields)

    def drain(self) -> None:
        """Stop reading requests; close once every outstanding request is answered."""
        self._drain_requested = True
        if self.core is None:
            return  # still connecting: run() drains as soon as it starts
        self.core.drain(trio.current_time())
        self._sync()


def _peer_name(stream: trio.abc.Stream) -> str:
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return "unknown"
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError):
        return "unknown"
    return f"{host}:{port}"


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
        self.observer = observer
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
        self._nursery.start_soon(serve, handler, [listener])
        log.info("broker listener", node_id=node_id, listen=str(Address(host, bound)))
        return bound

    async def _handle(self, client: trio.SocketStream, node_id: int | None = None) -> None:
        if self.stats.connections_active >= self.config.max_connections or self._listening.cancel_called:
            log.warning(
                "refusing connection",
                client=_peer_name(client),
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
