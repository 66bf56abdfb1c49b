"""The trio shell around :class:`~corrfix.repair.RepairMachine`: it only moves bytes and timers.

Per client connection there is one upstream connection and six small tasks: a reader and
a writer for each side, a timer that wakes the machine at its next deadline, and a watcher
of idle connections and stalled request frames. Readers feed whole frames to the machine;
its actions are appended to the writers' buffers, so many small frames leave in one send.
Backpressure is the readers pausing: the client reader while the machine is at its memory
bounds or the upstream buffer is full, the upstream reader while the client buffer is full.

A client leaving is a request to finish: every request read is sent, the broker's side is
half-closed after the last one, and the broker is read until it closes (docs/repair.md,
"Closing").
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

import structlog
import trio

from protocol import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, ProtocolError

from .cluster import BrokerPorts, ClusterRouter
from .metrics import ProxyMetrics
from .netutil import LOOPBACK, Address
from .observer import ConnectionObserver, Direction, Side
from .repair import Actions, RepairConfig, RepairEvent, RepairKind, RepairMachine
from .tls import (
    SILENT_UPSTREAM_HINT,
    TlsConfig,
    accept_client,
    connect_upstream,
    contexts,
    tls_on_plaintext,
)

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
FLUSH_TIMEOUT = 10.0
"""How long a closing connection may spend delivering what it still owes the client."""
CLOSE_GRACE = 0.25
"""Pause between the last answers and the end of stream of a connection the proxy ends
itself. kafka-python 3 drops answers that arrive in the same read as an end of stream (its
transport aborts the connection before it parses what it read), and then re-sends those
requests: the pause lets it read them first."""
DISCARD_LIMIT = 1024 * 1024
"""Bytes a closing connection reads and discards from a client after its own end of stream,
so that closing the socket sends a FIN, not a RST that could destroy answers in flight."""
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
    """One client connection, its upstream connection and its repair machine."""

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
            metrics=metrics,
        )
        self.to_client = _Outbox()
        self.to_upstream = _Outbox()
        self.repairs: Counter[str] = Counter()
        self._state_changed = trio.lowlevel.ParkingLot()
        self._timer_scope = trio.CancelScope()
        self._client_eof = False  # the client ended its stream: finish, then close
        self._client_gone = False  # the client cannot be written to (or must not be)
        self._draining = False
        self._upstream_closing = False  # everything read was queued for the broker, then its EOF
        self._upstream_reader_scope = trio.CancelScope()
        self._upstream_eof_sent = False
        self._client_reader_done = trio.Event()
        self._last_activity = 0.0
        self._partial_since: float | None = None
        self._partial_started = trio.Event()
        self._nursery: trio.Nursery | None = None  # None until both sides are connected
        self._relay_scope = trio.CancelScope()  # the connection's tasks: cancelled to close it
        self._client_reader_scope = trio.CancelScope()
        self._close_reason: str | None = None
        self._client_spoke = False  # after a whole request, a bad size is no TLS ClientHello
        self._upstream_spoke = False  # likewise for a TLS record from a broker
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
        self._last_activity = trio.current_time()
        self.to_client.attach(self.client)
        self.to_upstream.attach(upstream)
        try:
            with self._relay_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._read_client)
                    nursery.start_soon(self._read_upstream, upstream)
                    nursery.start_soon(self._write_upstream, upstream)
                    nursery.start_soon(self._write_client)
                    nursery.start_soon(self._run_timer)
                    nursery.start_soon(self._watch_idle)
                    if self._draining:
                        self.drain()
        finally:
            # Also when the proxy itself is stopping and this connection is cancelled.
            self.to_client.detach()
            self.to_upstream.detach()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(self.client)
            reason = self._close_reason or "proxy stopping"
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

    # -- the tasks: a reader and a writer per side, the machine's timer, the idle watcher --

    async def _read_client(self) -> None:
        decoder = FrameDecoder(self.config.max_frame_size, peer=self._client_peer)
        limit = self.config.max_send_buffer
        try:
            with self._client_reader_scope:
                await self._relay_requests(decoder, limit)
        except ProtocolError as exc:
            plaintext = not self._client_spoke and not isinstance(self.client, trio.SSLStream)
            tls_hello = tls_on_plaintext(exc, "client") if plaintext else None
            self._client_lost(tls_hello or f"bad request from client: {exc}", warning=True)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._client_lost(f"client connection lost: {exc or type(exc).__name__}")
        finally:
            self._client_reader_done.set()

    async def _relay_requests(self, decoder: FrameDecoder, limit: int) -> None:
        machine = self.machine
        receiver = _Receiver(self.client)
        while True:
            if not machine.accepting_requests or self.to_upstream.pending >= limit:
                # Backpressure is the proxy's doing, not the client's: a request frame left
                # incomplete does not age while the reader is paused.
                paused_mid_frame = self._partial_since is not None
                self._partial_since = None
                while not machine.accepting_requests:
                    if machine.closed is not None:
                        return
                    await self._state_changed.park()
                await self.to_upstream.wait_below(limit)
                if paused_mid_frame:
                    self._partial_since = trio.current_time()
                    self._partial_started.set()
            data = await receiver.receive()
            now = self._last_activity = trio.current_time()
            if not data:
                self._on_client_eof(decoder)
                return
            if self.metrics is not None:
                self.metrics.client_request_bytes.inc(len(data))
            frames = decoder.feed(data)
            if not decoder.buffered:
                self._partial_since = None
            elif self._partial_since is None:
                self._partial_since = self._last_activity
                self._partial_started.set()  # the watcher now has an earlier deadline
            elif frames:
                self._partial_since = self._last_activity  # a new frame began in this chunk
            if frames:
                self._client_spoke = True  # a size error now is no ClientHello
                if self.observer is not None:
                    self.observer.frames(self.conn_id, Side.CLIENT, Direction.REQUEST, frames)
                self._apply(machine.client_frames(frames, now))

    async def _read_upstream(self, upstream: trio.abc.Stream) -> None:
        scope = self._upstream_reader_scope
        with scope:
            await self._relay_answers(upstream)
        if scope.cancelled_caught:
            if self._upstream_eof_sent:
                self.log.info("broker kept its side open after the proxy's end of stream")
            else:
                self.log.warning(
                    "broker did not take every request before the request deadline",
                    unsent=self.to_upstream.pending,
                )
            self._apply(self.machine.upstream_closed())
            self._finish("broker did not close")

    async def _relay_answers(self, upstream: trio.abc.Stream) -> None:
        decoder = FrameDecoder(self.config.max_frame_size, peer=str(self.upstream))
        machine = self.machine
        limit = self.config.max_send_buffer
        receiver = _Receiver(upstream)
        try:
            while True:
                await self.to_client.wait_below(limit)
                data = await receiver.receive()
                now = self._last_activity = trio.current_time()
                if data and self.metrics is not None:
                    self.metrics.upstream_response_bytes.inc(len(data))
                if not data:
                    if decoder.buffered:
                        self.log.warning("upstream closed mid-frame", buffered=decoder.buffered)
                    self._hint_tls_upstream(upstream)
                    self._apply(machine.upstream_closed())
                    return
                frames = decoder.feed(data)
                if frames:
                    if not self._upstream_spoke:
                        self._upstream_spoke = True
                        self.stats.answering_upstreams.add(self.upstream)
                    if self.observer is not None:
                        self.observer.frames(self.conn_id, Side.UPSTREAM, Direction.RESPONSE, frames)
                    self._apply(machine.upstream_frames(frames, now))
        except ProtocolError as exc:
            plaintext = not self._upstream_spoke and not isinstance(upstream, trio.SSLStream)
            tls_answer = tls_on_plaintext(exc, "upstream") if plaintext else None
            self._abort(tls_answer or f"bad response from upstream: {exc}", warning=True)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._hint_tls_upstream(upstream)
            self._apply(machine.upstream_closed())
            self.log.info("upstream connection lost", error=str(exc) or type(exc).__name__)

    async def _write_upstream(self, upstream: trio.abc.Stream) -> None:
        try:
            await self.to_upstream.run(upstream)
            if isinstance(upstream, trio.SSLStream):
                # TLS cannot half-close (close_notify ends both directions): everything owed
                # has arrived, or nobody is left to deliver it to, so the connection is done.
                self._finish(self._close_reason or "client closed")
                return
            # The broker sees its end of stream after the last request, takes every request
            # before it, and closes its side: the upstream reader then ends the connection.
            assert isinstance(upstream, trio.abc.HalfCloseableStream)
            await upstream.send_eof()
            self._upstream_eof_sent = True
            self._upstream_reader_scope.deadline = trio.current_time() + self.config.close_linger
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._abort(f"upstream connection lost while sending: {exc or type(exc).__name__}")

    async def _write_client(self) -> None:
        client = self.client
        try:
            await self.to_client.run(client)
            if not self._client_eof and not self._client_gone and isinstance(client, trio.SocketStream):
                await self._client_reader_done.wait()
                await self._discard_client_input(client)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._client_lost(f"client connection lost while sending: {exc or type(exc).__name__}")
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
        while True:
            with self._timer_scope:
                self._timer_scope.deadline = self._next_deadline()
                await trio.sleep_forever()
            self._timer_scope = trio.CancelScope()
            self._apply(self.machine.tick(trio.current_time()))

    # -- helpers -----------------------------------------------------------------------

    def _hint_tls_upstream(self, upstream: trio.abc.Stream) -> None:
        """A broker closing before any answer may be a TLS listener (OpenSSL closes without an
        alert), but only if no connection to it was ever answered: one that rejects a request
        by closing is answering plaintext all the same."""
        if self._upstream_spoke or not self.machine.outstanding:
            return
        if isinstance(upstream, trio.SSLStream) or self.upstream in self.stats.answering_upstreams:
            self.log.warning("upstream closed before answering anything on this connection")
        else:
            self.log.warning("upstream closed before answering anything", hint=SILENT_UPSTREAM_HINT)

    def _next_deadline(self) -> float:
        deadline = self.machine.next_deadline()
        return math.inf if deadline is None else deadline

    def _apply(self, actions: Actions) -> None:
        if self.observer is not None:
            self._observe(actions)
        if self.metrics is not None:
            self._count_sent(actions)
        if actions.to_upstream:
            self.to_upstream.write(actions.to_upstream)
        if actions.to_client:
            self.to_client.write(actions.to_client)
        for event in actions.events:
            self._record(event)
        if actions.close is not None:
            self._finish(actions.close)
        elif self.machine.outstanding == 0 and (self._client_eof or self._draining):
            self._close_upstream("client closed" if self._client_eof else "proxy draining")
        deadline = self._next_deadline()
        if deadline != self._timer_scope.deadline:  # re-arming a trio deadline is not free
            self._timer_scope.deadline = deadline
        if self._state_changed:
            self._state_changed.unpark_all()

    def _count_sent(self, actions: Actions) -> None:
        assert self.metrics is not None
        if actions.to_upstream:
            sent = sum(len(frame) for frame in actions.to_upstream)
            self.metrics.upstream_request_bytes.inc(sent)
        if actions.to_client:
            sent = sum(len(frame) for frame in actions.to_client)
            self.metrics.client_response_bytes.inc(sent)

    def _observe(self, actions: Actions) -> None:
        observer = self.observer
        assert observer is not None
        if actions.to_upstream:
            observer.frames(self.conn_id, Side.UPSTREAM, Direction.REQUEST, actions.to_upstream)
        if actions.to_client:
            observer.frames(self.conn_id, Side.CLIENT, Direction.RESPONSE, actions.to_client)
        for event in actions.events:
            observer.repair(self.conn_id, event)

    def _record(self, event: RepairEvent) -> None:
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

    async def _watch_idle(self) -> None:
        """Close idle connections, and clients that leave a request frame incomplete."""
        idle = self.config.idle_timeout
        frame_timeout = self.config.frame_timeout
        busy_until = 0.0  # a long request (a Fetch long-poll) is not idleness
        while True:
            now = trio.current_time()
            partial = self._partial_since
            if partial is not None and now >= partial + frame_timeout:
                self._client_lost(f"request frame incomplete for {frame_timeout:g}s", warning=True)
                return
            idle_at = max(self._last_activity + idle, busy_until)
            if now >= idle_at:
                if self.machine.outstanding == 0:
                    self._finish(f"idle for {idle:g}s")
                    return
                busy_until = now + idle
                continue
            wake = idle_at if partial is None else min(idle_at, partial + frame_timeout)
            with trio.move_on_at(wake):
                await self._partial_started.wait()
            if self._partial_started.is_set():
                self._partial_started = trio.Event()

    def drain(self) -> None:
        """Stop reading requests; close once every outstanding request is answered."""
        self._draining = True
        if self._nursery is None:
            return  # still connecting: run() drains as soon as it starts
        self._client_reader_scope.cancel()
        if self.machine.outstanding == 0:
            self._close_upstream("proxy draining")

    def _on_client_eof(self, decoder: FrameDecoder) -> None:
        """The client's end of stream asks to finish, not to abort (see docs/repair.md)."""
        if decoder.buffered:
            self.log.warning("client closed mid-frame", buffered=decoder.buffered)
        self._client_eof = True
        if self.machine.outstanding == 0:
            self._close_upstream("client closed")

    def _client_lost(self, reason: str, *, warning: bool = False) -> None:
        """The client is gone or unusable: nothing more is read from it or delivered to it,
        but every request already read still reaches the broker before the broker side closes."""
        if self._client_gone:
            return
        self._client_gone = True
        if self._close_reason is None:
            self._close_reason = reason
        if warning:
            self.log.warning("closing connection", reason=reason)
        self._client_reader_scope.cancel()
        self.to_client.abandon()
        self._close_upstream(reason)

    def _close_upstream(self, reason: str) -> None:
        """Send the broker every request read, then end its stream; the connection ends when
        the broker closes its side, or ``close_linger`` after the end of stream. A broker that
        does not take the requests gets as long as any request gets an answer:
        ``request_deadline``.

        Until then the broker socket keeps being read, so answers still owed are delivered
        and stray ones dropped, and it is never closed with unread bytes: that would send a
        RST, and a broker may discard the requests it has not processed yet.
        """
        if self._upstream_closing:
            return
        self._upstream_closing = True
        if self._close_reason is None:
            self._close_reason = reason
        self.to_upstream.finish()
        self._upstream_reader_scope.deadline = trio.current_time() + self.config.repair.request_deadline

    def _finish(self, reason: str) -> None:
        """Deliver what is queued for the client, then close both sides."""
        if self._close_reason is None:
            self._close_reason = reason
        self._client_reader_scope.cancel()
        scope = self._relay_scope
        if self._client_gone:
            scope.cancel()
            return
        self.to_client.finish()
        scope.deadline = min(scope.deadline, trio.current_time() + FLUSH_TIMEOUT)

    def _abort(self, reason: str, *, warning: bool = False) -> None:
        """Close both sides now: the peer is gone or sent something unusable."""
        if self._close_reason is None:
            self._close_reason = reason
        if warning:
            self.log.warning("closing connection", reason=reason)
        self._relay_scope.cancel()


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
