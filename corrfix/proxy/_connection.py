"""One client connection and its broker connection: connect, then relay through the engine or tasks.

trio accepts, runs the TLS handshakes and connects upstream here. A plaintext connection is
then handed to the process's relay engine (proxy/_engine.py), and its task ends: the engine
calls :meth:`ProxyConnection.abandon` when it is done. A TLS one (or every one, with
``engine`` off in the config) is relayed by five tasks of its own. Both carry out the same
core's decisions and report to the same sinks (proxy/_sinks.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import structlog
import trio

from corrfix.core import (
    CLOSE_GRACE,
    DISCARD_LIMIT,
    Address,
    ClusterRouter,
    ConnectionCore,
    RepairMachine,
)
from corrfix.proxy._bootstrap import BootstrapOrder
from corrfix.proxy._config import ProxyConfig
from corrfix.proxy._engine import Relayed, current_engine
from corrfix.proxy._metrics import ProxyMetrics
from corrfix.proxy._observer import ConnectionObserver
from corrfix.proxy._sinks import ConnectionSinks, ProxyStats
from corrfix.proxy._streams import RECEIVE_SIZE, Outbox, Receiver, peer_name
from corrfix.proxy._tls import accept_client, connect_upstream

CONNECT_BACKOFF = 0.1
"""First pause between upstream connect attempts; it doubles each time."""
log = structlog.get_logger("corrfix.proxy")


class ProxyConnection:
    """One client connection and its upstream connection, driven by a :class:`ConnectionCore`.

    The engine or the tasks move bytes and wait for time; every decision (what to send,
    when to stop reading, when to end each stream, when to close) is the core's.
    """

    __slots__ = (
        "_bootstrap",
        "_candidates",
        "_client_peer",
        "_client_reader_done",
        "_client_reader_scope",
        "_decided",
        "_drain_requested",
        "_on_closed",
        "_relay_scope",
        "_relayed",
        "_socket",
        "_state_changed",
        "_timer_scope",
        "_upstream_reader_scope",
        "_upstream_stream",
        "client",
        "config",
        "conn_id",
        "core",
        "log",
        "machine",
        "metrics",
        "observer",
        "sinks",
        "stats",
        "to_client",
        "to_upstream",
        "upstream",
    )
    # Set once the connection gets tasks of its own (:meth:`_relay_in_tasks`).
    to_client: Outbox
    to_upstream: Outbox
    _state_changed: trio.lowlevel.ParkingLot
    _timer_scope: trio.CancelScope
    _relay_scope: trio.CancelScope
    _client_reader_scope: trio.CancelScope
    _upstream_reader_scope: trio.CancelScope
    _client_reader_done: trio.Event

    def __init__(
        self,
        client: trio.SocketStream,
        config: ProxyConfig,
        stats: ProxyStats,
        conn_id: str,
        observer: ConnectionObserver | None = None,
        *,
        upstream: tuple[Address, ...] = (),
        router: ClusterRouter | None = None,
        bootstrap: BootstrapOrder | None = None,
        metrics: ProxyMetrics | None = None,
        on_closed: Callable[[ProxyConnection, Exception | None], None],
    ) -> None:
        self._socket = client
        # Told when a connection the engine took is closed (run() has returned by then).
        self._on_closed = on_closed
        self._upstream_stream: trio.SocketStream | None = None
        self.client: trio.abc.Stream = client  # the TLS stream over it, once accepted
        # Where to connect, in turn: the bootstrap brokers, or a broker's own address.
        self._candidates = upstream or config.bootstrap
        self._bootstrap = bootstrap
        self.upstream = self._candidates[0]  # the one connected to, once connected
        self.conn_id = conn_id
        self.observer = observer
        self.config = config
        self.stats = stats
        self.metrics = metrics
        self.machine = RepairMachine(
            config.repair,
            transform=router.transform if router else None,
            local_answer=router.local_answer if router else None,
            # Capture reads a Forwarded per request; metrics alone count in the machine (the sinks
            # say where), which costs less than an event per request and answer.
            flow_events=observer is not None,
            answer_events=observer is not None and metrics is not None,  # capture times its own rows
        )
        self.core: ConnectionCore | None = None  # once both sides are connected
        self._relayed: Relayed | None = None  # in the engine
        # The connection's own tasks' outboxes, scopes and events are made only when it gets
        # tasks (TLS, --no-engine): a connection in the engine costs none of them.
        self._drain_requested = False
        self._decided = 0  # the core's decisions carried out so far
        peer = peer_name(client)
        self.log = log.bind(connection=conn_id, client=peer)
        self._client_peer = peer
        self.sinks = ConnectionSinks(conn_id, self.log, stats, self.upstream, metrics, observer, self.machine)

    @property
    def repairs(self) -> Counter[str]:
        return self.sinks.repairs

    async def run(self) -> bool:
        """Accept, connect and relay. Returns True once the engine has the connection: it is
        then over when ``on_closed`` is called, not when this returns."""
        # The client's TLS handshake comes first: a client that fails it costs no upstream connection.
        client = await accept_client(self._socket, self.config.tls, self.config.connect_timeout, self.log)
        if client is None:
            await trio.aclose_forcefully(self._socket)
            return False
        self.client = client
        upstream = await self._connect_upstream()
        if upstream is None:
            await self.client.aclose()
            return False
        try:
            core = self._open(upstream)
        except BaseException:  # a bug (an observer's): the broker's socket is closed now, not by the GC
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(upstream)
            raise
        if (
            self.config.engine
            and isinstance(self.client, trio.SocketStream)
            and isinstance(upstream, trio.SocketStream)
        ):
            # Plaintext both ways: the process's engine relays, and no task waits for it.
            self._upstream_stream = upstream
            linger = self.config.close_linger
            try:
                self._relayed = current_engine().adopt(
                    core, self.client, upstream, self.sinks, close_linger=linger, on_end=self.abandon
                )
            except BaseException:  # the client is closed by the caller, which reports the error
                upstream.socket.close()
                self._report_closed()
                raise
            if self._drain_requested:
                self.drain()
            return True
        try:
            await self._relay_in_tasks(upstream)
        finally:
            # Also when the proxy itself is stopping and this connection is cancelled.
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(upstream)
                await trio.aclose_forcefully(self.client)
            self._report_closed()
        return False

    def _open(self, upstream: trio.abc.Stream) -> ConnectionCore:
        """Both sides are up: log it, tell the observer, and make the connection's core."""
        self.log.info("connection opened", upstream=str(self.upstream))
        if self.observer is not None:
            self.observer.connection_opened(self.conn_id, self._client_peer, peer_name(upstream))
        core = self.core = ConnectionCore(
            self.config.connection,
            self.machine,
            trio.current_time(),
            client_peer=self._client_peer,
            upstream_peer=str(self.upstream),
            client_tls=isinstance(self.client, trio.SSLStream),
            upstream_tls=isinstance(upstream, trio.SSLStream),
            upstream_known_plaintext=self._upstream_known_plaintext,  # a bound method: no closure kept
            record_frames=self.observer is not None,
        )
        return core

    def abandon(self) -> None:
        """Close a connection the engine relays, in trio's thread: when the engine is done with
        it, or when the proxy stops (the engine forgets it first). Once; never raises."""
        relayed, upstream = self._relayed, self._upstream_stream
        if relayed is None or upstream is None:
            return
        self._upstream_stream = None
        relayed.on_end = None
        error: Exception | None = None
        try:
            relayed.forget()
            error = relayed.error  # after forget: the engine's thread may have failed it just now
            upstream.socket.close()
            self._socket.socket.close()
            self._report_closed()
        except Exception as exc:  # a bug here must cost this connection only
            error = error or exc
        try:
            self._on_closed(self, error)
        except Exception:  # in a trio callback, where an exception would end the run
            log.exception("internal error after a connection closed", connection=self.conn_id)

    def _report_closed(self) -> None:
        assert self.core is not None
        reason = self.core.closed().reason
        if self.observer is not None:
            self.observer.connection_closed(self.conn_id, reason)
        outstanding = self.machine.outstanding
        self.log.info("connection closed", reason=reason, outstanding=outstanding, **dict(self.repairs))

    def _upstream_known_plaintext(self) -> bool:
        return self.upstream in self.stats.answering_upstreams

    async def _relay_in_tasks(self, upstream: trio.abc.Stream) -> None:
        """TLS on a side (or the engine switched off): five tasks of the connection's own."""
        self.to_client = Outbox()
        self.to_upstream = Outbox()
        self._state_changed = trio.lowlevel.ParkingLot()
        self._timer_scope = trio.CancelScope()
        self._relay_scope = trio.CancelScope()  # the connection's tasks: cancelled to close it
        self._client_reader_scope = trio.CancelScope()
        self._upstream_reader_scope = trio.CancelScope()
        self._client_reader_done = trio.Event()
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
            self.to_client.detach()
            self.to_upstream.detach()

    async def _connect_upstream(self) -> trio.abc.Stream | None:
        """Each candidate in turn, then again after a backoff, ``connect_retries`` times.

        A failed TLS handshake is logged and that broker not tried again by this connection
        (it would fail the same way); the next candidate is. Only a broker that took the
        connection, handshake included, is the one the next connections start at."""
        candidates = list(self._candidates)
        attempts = self.config.connect_retries + 1
        for attempt in range(1, attempts + 1):
            for target in list(candidates):
                last = target == candidates[-1]
                try:
                    with trio.fail_after(self.config.connect_timeout):
                        stream = await trio.open_tcp_stream(target.host, target.port)
                except (OSError, trio.TooSlowError) as exc:
                    error = str(exc) or "timeout"
                    if attempt == attempts and last:
                        self.log.error(
                            "upstream unreachable, closing client",
                            upstream=",".join(map(str, self._candidates)),
                            attempts=attempts,
                            error=error,
                        )
                        return None
                    then = "retrying" if last else "trying the next"
                    self.log.info(f"upstream connect failed, {then}", upstream=str(target), error=error)
                    continue
                self.upstream = self.sinks.upstream = target
                connected = await connect_upstream(
                    stream, self.config.tls, target.host, self.config.connect_timeout, self.log
                )
                if connected is not None:
                    if self._bootstrap is not None:
                        self._bootstrap.accepted(target)
                    return connected
                candidates.remove(target)
                if not candidates:
                    return None
            if attempt < attempts:
                await trio.sleep(CONNECT_BACKOFF * 2 ** (attempt - 1))
        return None

    # -- the tasks: a reader and a writer per side, and the core's timer ----------------

    async def _read_client(self) -> None:
        core = self.core
        assert core is not None
        receiver = Receiver(self.client)
        sinks = self.sinks
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
                    if data:
                        sinks.received_from_client(len(data))
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
        receiver = Receiver(upstream)
        sinks = self.sinks
        limit = self.config.max_send_buffer
        with self._upstream_reader_scope:
            try:
                while not core.stop_upstream:
                    if not core.upstream_read_allowed(self.to_client.pending):
                        await self.to_client.wait_below(limit)
                    data = await receiver.receive()
                    if data:
                        sinks.received_from_upstream(len(data))
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
            # As a failed receive: what is ready is delivered, unanswered Produces are flagged.
            core.upstream_lost(f"lost while sending: {exc or type(exc).__name__}", trio.current_time())
        self._sync()

    async def _write_client(self) -> None:
        core = self.core
        assert core is not None
        client = self.client
        try:
            await self.to_client.run(client)
            if core.discard_client_input:
                await self._client_reader_done.wait()
                await self._discard_client_input(client)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            core.client_lost(
                f"client connection lost while sending: {exc or type(exc).__name__}", trio.current_time()
            )
            self._sync()
            return
        # Everything owed to the client was sent: the connection is done once the broker's
        # side is settled too (a close the proxy decided ends it as any close does).
        while not core.upstream_settled:
            await self._state_changed.park()
        self._relay_scope.cancel()

    async def _discard_client_input(self, client: trio.abc.Stream) -> None:
        """End the client's stream and read until it ends its own, bounded in time and bytes.

        The end of stream waits CLOSE_GRACE after the last answers. Closing a socket that
        holds unread bytes makes the kernel send a RST, and a RST can destroy answers the
        client has not read yet. A client that is gone meanwhile is owed nothing more.
        """
        await trio.sleep(CLOSE_GRACE)
        discarded = 0
        try:
            with trio.move_on_after(self.config.close_linger):
                transport, discarded = await _end_stream(client)
                while discarded <= DISCARD_LIMIT:
                    data = await transport.receive_some(RECEIVE_SIZE)
                    if not data:
                        return
                    discarded += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if discarded:
            self.log.info("client kept sending after the proxy's end of stream", discarded=discarded)
        else:
            self.log.info(
                "client did not close after the proxy's end of stream", linger=self.config.close_linger
            )

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
        to_upstream, to_client, events = core.take()
        if to_upstream or to_client or events:
            if to_upstream:
                self.to_upstream.write(to_upstream)
            if to_client:
                self.to_client.write(to_client)
            self.sinks.output(to_upstream, to_client, events)
        if core.decided != self._decided:
            self._decided = core.decided
            self._carry_out_decisions(core)
        deadline = core.next_deadline()
        if deadline != self._timer_scope.deadline:  # re-arming a trio deadline is not free
            self._timer_scope.deadline = deadline
        if self._state_changed:
            self._state_changed.unpark_all()

    def _carry_out_decisions(self, core: ConnectionCore) -> None:
        if core.upstream_spoke:
            self.sinks.upstream_answered()
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

    def drain(self) -> None:
        """Stop reading requests; close once every outstanding request is answered."""
        self._drain_requested = True
        core = self.core
        if core is None:
            return  # still connecting: run() drains as soon as it starts
        if self._relayed is not None:
            self._relayed.apply(core.drain)  # with the engine's loop kept off the connection
        else:
            core.drain(trio.current_time())
            self._sync()


async def _end_stream(stream: trio.abc.Stream) -> tuple[trio.abc.HalfCloseableStream, int]:
    """End our side of ``stream`` and return the TCP stream left to read, with the bytes the
    ending already took from it.

    TCP gets a FIN. TLS cannot half-close, so it gets close_notify first (most clients close
    on it; one that answers with its own close_notify is done at once), then, CLOSE_GRACE
    later at most, the FIN under it. Whatever the client sends after that is read raw and
    dropped: it cannot be answered.
    """
    if not isinstance(stream, trio.SSLStream):
        assert isinstance(stream, trio.abc.HalfCloseableStream)
        await stream.send_eof()
        return stream, 0
    transport = stream.transport_stream
    taken = 0
    try:
        with trio.move_on_after(CLOSE_GRACE):  # the FIN does not wait for a client that does nothing
            transport, trailing = await stream.unwrap()
            taken = len(trailing)
    except trio.BrokenResourceError:
        pass  # the client sent more after our close_notify, or closed: the rest is read raw
    assert isinstance(transport, trio.abc.HalfCloseableStream)
    await transport.send_eof()
    return transport, taken
