"""The relay engine: every plaintext connection of a trio run in one epoll set, serviced by one loop.

trio does what it is good at: accept, upstream connect, TLS handshakes, signals, drain and
cancellation. Once both sides of a plaintext connection are up, the connection is adopted
here. Its two sockets join a private ``select.epoll`` set, and one loop services every
ready socket: it receives into one shared buffer, feeds the connection's
:class:`~corrfix.core.ConnectionCore` with ``now`` (read once per pass), and sends what the
core returned straight away. No task switch sits between a receive and the send it causes.

The loop runs in a thread of its own, blocked in ``epoll.poll`` (the GIL released) with the
nearest deadline as its timeout. A wake-up then costs one system call: a trio task waiting
on the set's descriptor (``trio.lowlevel.wait_readable``) paid trio's scheduler and its own
``epoll_wait`` on top, twice per request at one request in flight (bench/README.md, "Relay
engine"). Under trio's ``MockClock`` the same loop is a trio task instead, so that tests move
its time: a thread cannot follow a clock that only trio advances. The trio side (adopt,
drain, forget) and the thread take one lock, so a connection is changed by one of them at a
time; the thread hands a finished connection back to trio through the run's token, where
its ``on_end`` closes it: no task waits for a connection in the engine.

- A socket is registered for EPOLLOUT only while it holds bytes it could not send yet;
  EPOLLIN follows the core's decisions (stop reading, backpressure, discarding a closing
  client's input). A socket nobody waits on leaves the set.
- Every connection's next deadline sits in one heap, with lazy deletion; the nearest is the
  engine task's trio deadline. An entry holds the connection through a slot emptied when the
  connection ends, so entries left in the heap keep nothing of it alive.
- Fairness: at most ``fair_reads`` receives per socket and pass. The set is level-triggered,
  so whatever is left is reported again on the next pass, after every other ready socket.
- Nothing here blocks: every socket is non-blocking, and an error, a bad peer or a bug costs
  its own connection only.

The core's decisions are carried out as the per-connection tasks (proxy/_connection.py,
still used for TLS) carry them out: the same half-close with ``shutdown(SHUT_WR)``, the same
close grace and linger, the same discarding of a client's input after the proxy's end of
stream, the same log lines and close reasons. Sockets are closed in trio's thread, by the
connection's ``on_end``, and only once the core says so.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import mmap
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable

import structlog
import trio

from corrfix.core import CLOSE_GRACE, DISCARD_LIMIT, ConnectionCore
from corrfix.proxy._handoff import HandoffLock
from corrfix.proxy._observer import SerializedObserver
from corrfix.proxy._sinks import ConnectionSinks
from corrfix.proxy._spares import FrameSpares
from corrfix.proxy._streams import FAIR_READS, PLAIN_RECEIVE_SIZE, Chunk, receive_buffer, send_frames, unsent
from protocol import BIG_FRAME, FrameDecoder

_log = structlog.get_logger("corrfix.proxy")
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_READABLE = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
MAX_EVENTS = 1024
"""Ready sockets taken per pass; any more are reported on the next one."""
BURST = 4
"""Passes the engine may run back to back, while sockets keep being ready, before trio runs
its other tasks: fewer trio wake-ups under load, and accept and timers still wait little."""

# The client side's way out once everything owed to it was sent (docs/repair.md, "Closing"):
# _DONE waits for the broker's side to settle (the core's ``upstream_settled``).
_OPEN, _GRACE, _DISCARDING, _DONE = 0, 1, 2, 3


class _Side:
    """One socket of a relayed connection: what is waiting to be sent, and what epoll watches."""

    __slots__ = (
        "backlog",
        "broken",
        "client",
        "decoder",
        "dropping",
        "ended",
        "error",
        "fd",
        "finishing",
        "mask",
        "owner",
        "sock",
        "unsent",
    )

    def __init__(self, owner: Relayed, stream: trio.SocketStream, client: bool) -> None:
        self.owner = owner
        self.sock = stream.socket
        self.fd = stream.socket.fileno()
        if os.get_blocking(self.fd):
            os.set_blocking(self.fd, False)  # never the case with trio's sockets; the engine must not block
        self.client = client
        core = owner.core
        self.decoder = core.client_decoder if client else core.upstream_decoder
        """The core's framing of what this socket receives: a big frame is received into its own buffer."""
        self.backlog: list[Chunk] = []
        """Frames, or their tails, the socket did not take yet: the core's own, not copied. The
        core patches a request frame again only to re-send it, which it does only once the
        broker answered something sent after it, so never while any of it waits here."""
        self.unsent = 0
        """Bytes in the backlog."""
        self.mask = 0
        """What the epoll set watches on this socket (0: not in the set)."""
        self.finishing = False
        """End the stream once the backlog is sent (end_upstream, end_client)."""
        self.ended = False
        self.dropping = False
        """The client is gone: drop what is queued and everything from now on."""
        self.error: OSError | None = None
        """A send failed; reported to the core once the current batch is carried out."""
        self.broken = False
        """Sending failed: nothing more is sent, and this side never completes."""


class Relayed:
    """A connection the engine relays. When it is over, the engine calls its ``on_end`` in
    trio's thread."""

    __slots__ = (
        "_engine",
        "admitted",
        "client",
        "close_linger",
        "core",
        "decided",
        "dirty",
        "discarded",
        "error",
        "local_deadline",
        "on_end",
        "over",
        "paused",
        "phase",
        "released",
        "scheduled",
        "sinks",
        "slot",
        "upstream",
    )

    def __init__(
        self,
        engine: RelayEngine,
        core: ConnectionCore,
        client: trio.SocketStream,
        upstream: trio.SocketStream,
        sinks: ConnectionSinks,
        close_linger: float,
        on_end: Callable[[], None],
    ) -> None:
        self._engine = engine
        # Called once, in trio's thread, when the connection is over, to close its sockets. No
        # task waits for the connection: a task and its frames cost an idle one 2.7 KiB.
        self.on_end: Callable[[], None] | None = on_end
        self.core = core
        self.sinks = sinks
        self.close_linger = close_linger
        self.client = _Side(self, client, True)
        self.upstream = _Side(self, upstream, False)
        self.decided = -1  # the core's decisions carried out so far
        self.paused = False  # client reads paused for backpressure (the core is told)
        self.phase = _OPEN
        self.local_deadline = math.inf  # the close grace, then the linger of the discarding
        self.discarded = 0
        self.scheduled = math.inf  # time of this connection's live entry in the heap
        # What its heap entries hold instead of the connection itself: emptied when it is
        # released, so that entries left in the heap (up to the idle timeout ahead) do not keep
        # an ended connection, its requests kept for re-sending and its buffers alive.
        self.slot: list[Relayed | None] = [self]
        self.dirty = False  # its deadline is to be read at the end of the current pass
        self.error: Exception | None = None
        self.over = False
        self.released = False
        self.admitted = False  # in the engine's set (an adopted one may wait for the thread's next pass)

    def forget(self) -> None:
        """Take the connection out of the engine (it may be over already), before its sockets close."""
        self._engine.forget(self)

    def apply(self, change: Callable[[float], None]) -> None:
        """Change the core from outside the engine (a drain: ``core.drain``, given ``now``) and
        carry out what it decided, while the engine's loop leaves the connection alone."""
        self._engine.apply(self, change)

    def interest(self) -> tuple[int, int]:
        """What the epoll set watches on the client and on the broker socket (EPOLLIN, EPOLLOUT)."""
        return self.client.mask, self.upstream.mask


class RelayEngine:
    """One epoll set and one trio task for every plaintext connection of a trio run."""

    def __init__(
        self, *, receive_size: int | None = None, fair_reads: int = FAIR_READS, threaded: bool = False
    ) -> None:
        if receive_size is not None:
            self._buffer: mmap.mmap | bytearray = bytearray(receive_size)
        elif threaded:
            # Its own: trio's thread shares its buffer among the readers of the trio run, which
            # receive while the engine's thread does (a connection with TLS on one side only).
            self._buffer = mmap.mmap(-1, PLAIN_RECEIVE_SIZE)
        else:
            self._buffer = receive_buffer()  # the loop is a trio task: trio's thread, one reader at a time
        self._buffers = [self._buffer]
        self._view = memoryview(self._buffer)  # sliced per receive: one object, not two
        self._size = len(self._buffer)
        self._spares = FrameSpares()  # big frames written, reused as buffers for the next ones
        self._fair_reads = fair_reads
        self._epoll: select.epoll | None = None
        self._sides: dict[int, _Side] = {}
        self._live: set[Relayed] = set()
        self._heap: list[tuple[float, int, list[Relayed | None]]] = []
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None
        self._dirty: list[Relayed] | None = None  # during a pass: connections to schedule at its end
        self._observers: dict[SerializedObserver, int] = {}
        """Observers that gather a pass's reports, with how many live connections report to each."""
        self._running = False
        self._threaded = threaded
        self._arrivals: list[Relayed] = []
        """Connections adopted while the thread runs, for it to take in at its next pass: trio's
        thread does not wait for the pass the thread is in (under load, a pass over a few hundred
        sockets takes milliseconds, and 400 clients connecting at once waited for one each)."""
        self._arrivals_lock = threading.Lock()  # held for a list operation at a time, by either side
        self._admitting = False  # the thread runs and takes arrivals in (under _arrivals_lock)
        self._lock = HandoffLock()
        """Held by the thread while it serves (through ``raw``, handing it over between passes to
        a waiting trio side), and by the trio side while it changes a connection."""
        self._clock: trio.abc.Clock | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._thread_id = -1
        self._wake_fd = -1
        """An eventfd in the set: the trio side wakes the thread when a deadline moves earlier."""
        self._waiting_until = -math.inf
        """The deadline the thread's poll waits for (-inf while it serves: no wake needed)."""
        self._stopping = False
        self._guarded = False  # the system task that stops the thread with the run is running
        self.passes = 0
        """Times the loop found sockets ready (a count for tests, profiles and ``/metrics``)."""
        self._pass_began: float | None = None
        """When the pass in progress began (the run's clock), None between passes: a pass that
        never ends stops every plaintext connection while trio's loop runs on (``/livez``)."""
        self._native_id: int | None = None  # the thread's id in /proc, while it runs
        self._retired_cpu = 0.0  # CPU seconds of engine threads that have ended
        self._cpu_lock = threading.Lock()  # a thread's end against a scrape: the count never goes back

    @property
    def running_thread(self) -> bool:
        """Whether the engine's thread runs (it starts with the first connection adopted)."""
        return self._native_id is not None

    def pass_seconds(self) -> float:
        """How long the pass in progress has run; 0.0 between passes. Any thread may ask."""
        began, clock = self._pass_began, self._clock
        if began is None or clock is None:
            return 0.0
        return max(clock.current_time() - began, 0.0)

    def cpu_seconds(self) -> float:
        """CPU time the engine's threads have used (0.0 under a MockClock, where the loop is a
        trio task). Any thread may ask."""
        with self._cpu_lock:  # an ending thread waits here, alive, until /proc is read
            used = self._retired_cpu
            if self._native_id is not None:
                used += thread_cpu_seconds(self._native_id)
        return used

    @property
    def connections(self) -> int:
        return len(self._live)

    def adopt(
        self,
        core: ConnectionCore,
        client: trio.SocketStream,
        upstream: trio.SocketStream,
        sinks: ConnectionSinks,
        *,
        close_linger: float,
        on_end: Callable[[], None],
    ) -> Relayed:
        """Relay this connection from now on. When it is over, ``on_end`` is called in trio's
        thread, once, to close its sockets."""
        relayed = Relayed(self, core, client, upstream, sinks, close_linger, on_end)
        if self._clock is None:
            self._clock = trio.lowlevel.current_clock()
            self._token = trio.lowlevel.current_trio_token()
        with self._arrivals_lock:
            if self._admitting:  # the thread takes it in at its next pass, woken if idle
                self._arrivals.append(relayed)
                os.eventfd_write(self._wake_fd, 1)
                return relayed
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
            self._enter(relayed)
            if not self._running:
                try:
                    if self._threaded:
                        self._start_thread()
                    else:
                        trio.lowlevel.spawn_system_task(self._run, name="corrfix relay engine")
                except BaseException:
                    # Out of descriptors or threads: this connection fails, and the next one
                    # tries again, rather than joining an engine that never runs.
                    self._release(relayed)
                    raise
                self._running = True
                if self._threaded:
                    with self._arrivals_lock:
                        self._admitting = True
            self._apply(relayed, None)
        return relayed

    def _enter(self, relayed: Relayed) -> None:
        """Put an adopted connection's sockets in the engine's tables (under the lock)."""
        self._live.add(relayed)
        observer = relayed.sinks.observer
        if isinstance(observer, SerializedObserver) and observer.gathers_passes:
            self._observers[observer] = self._observers.get(observer, 0) + 1
        self._sides[relayed.client.fd] = relayed.client
        self._sides[relayed.upstream.fd] = relayed.upstream
        relayed.admitted = True

    def _admit(self) -> None:
        """The thread, between passes: take in the connections adopted meanwhile."""
        with self._arrivals_lock:
            arrivals, self._arrivals = self._arrivals, []
        for relayed in arrivals:
            if not relayed.over:  # forgotten before its turn: nothing to take in
                self._take_in(relayed)

    def _take_in(self, relayed: Relayed) -> None:
        """Enter a queued connection and carry out what its core decided so far (under the lock)."""
        try:
            self._enter(relayed)
        except Exception as exc:  # a bug costs this connection, not those queued after it
            self._fail(relayed, exc)
            return
        self._apply(relayed, None)

    def _take_in_now(self, relayed: Relayed) -> None:
        """A change from trio's thread to a connection still waiting to be taken in: take it in
        first (under the lock), so the change finds it in the set."""
        if relayed.admitted or relayed.over:
            return
        with self._arrivals_lock:
            if relayed not in self._arrivals:
                return
            self._arrivals.remove(relayed)
        self._take_in(relayed)

    def apply(self, relayed: Relayed, change: Callable[[float], None]) -> None:
        with self._lock:
            self._take_in_now(relayed)
            self._apply(relayed, change)

    def _apply(self, relayed: Relayed, change: Callable[[float], None] | None) -> None:
        if relayed.over:
            return
        try:
            now = self._now()
            if change is not None:
                change(now)
            self._sync(relayed, now)
        except Exception as exc:
            self._fail(relayed, exc)

    def forget(self, relayed: Relayed) -> None:
        """Take the connection's sockets out of the set (before they are closed). One the engine
        ended itself, the usual close, is out already: trio's thread does not wait for the lock."""
        if relayed.released:
            relayed.over = True
        else:
            with self._lock:
                self._release(relayed)
                relayed.over = True
        if not self._live and self._scope is not None:
            self._scope.cancel()  # nothing left to wait for: the task ends

    def _now(self) -> float:
        clock = self._clock
        assert clock is not None
        return clock.current_time()

    # -- the thread ----------------------------------------------------------------------

    def _start_thread(self) -> None:
        epoll = self._epoll
        assert epoll is not None
        if not self._guarded:
            # Before the thread: should trio refuse the task (a run that is ending), no thread
            # is left running that nothing stops, and the next connection cannot start a
            # second one on the same set.
            trio.lowlevel.spawn_system_task(self._stop_with_the_run, name="corrfix relay engine's end")
            self._guarded = True
        wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._waiting_until = -math.inf
        thread = threading.Thread(
            target=self._serve_forever, args=(epoll, wake_fd), name="corrfix relay engine", daemon=True
        )
        try:
            epoll.register(wake_fd, select.EPOLLIN)
            thread.start()
        except BaseException:
            with contextlib.suppress(OSError):
                epoll.unregister(wake_fd)
            os.close(wake_fd)
            raise
        self._wake_fd = wake_fd
        self._thread = thread

    async def _stop_with_the_run(self) -> None:
        """The thread lives as long as the trio run (idle, it waits in ``epoll.poll``)."""
        try:
            await trio.sleep_forever()
        finally:
            with self._lock:
                self._stopping = True
                thread = self._thread
                if thread is not None:
                    os.eventfd_write(self._wake_fd, 1)
            if thread is not None:
                thread.join()

    def _serve_forever(self, epoll: select.epoll, wake_fd: int) -> None:
        """The thread: serve until the run ends. Should the loop itself fail (not a connection:
        a pass's errors cost its connections only), its connections fail with it and the next
        adopted connection starts a new thread and set, rather than joining a dead one."""
        self._thread_id = threading.get_ident()
        self._native_id = threading.get_native_id()
        failure: Exception = RuntimeError("the relay engine stopped with the trio run")
        try:
            self._poll_and_serve(epoll)
        except BaseException as exc:
            _log.error("relay engine thread failed", error=repr(exc))
            failure = exc if isinstance(exc, Exception) else RuntimeError(f"relay engine stopped: {exc!r}")
        finally:
            with self._lock:
                with self._arrivals_lock:
                    self._admitting = False
                    waiting, self._arrivals = self._arrivals, []
                for relayed in [*self._live, *waiting]:
                    try:
                        self._fail(relayed, failure)
                    except Exception:  # the engine must still let go of the dead thread and its set
                        _log.exception("relay engine failed to close a connection as it stopped")
                self._thread = None
                self._thread_id = -1
                with self._cpu_lock:
                    self._retired_cpu += time.thread_time()
                    self._native_id = None
                self._running = False
                self._epoll = None
                self._wake_fd = -1
                epoll.close()
                os.close(wake_fd)

    def _poll_and_serve(self, epoll: select.epoll) -> None:
        handoff = self._lock
        lock = handoff.raw
        while True:
            with lock:
                if self._stopping:
                    return
                heap = self._heap
                if self._arrivals:
                    # Queued after the pass last looked: its wake-up may have been read along
                    # with an earlier one's, so the poll must not wait for another.
                    timeout = 0.0
                elif heap:
                    self._waiting_until = heap[0][0]
                    timeout = max(heap[0][0] - self._now(), 0.0)
                else:
                    self._waiting_until = math.inf
                    timeout = -1.0
            ready = epoll.poll(timeout, MAX_EVENTS)
            with lock:
                # The trio side's turn first, if it waits (it takes the lock between passes).
                handoff.yield_to_waiters()
                self._waiting_until = -math.inf
                if self._stopping:
                    return
                try:
                    if self._arrivals:
                        self._admit()
                    # Under load more sockets are ready by the end of a pass: look again first.
                    for _ in range(BURST):
                        if self._serve(ready) < 2:
                            break
                        handoff.yield_to_waiters()
                        if self._arrivals:
                            self._admit()
                        ready = epoll.poll(0, MAX_EVENTS)
                except Exception as exc:  # a bug here must cost the connections, never the process
                    for relayed in list(self._live):
                        self._fail(relayed, exc)

    def _wake_thread(self, due: float) -> None:
        """A deadline earlier than the thread's poll waits for, set from the trio side."""
        if due < self._waiting_until and threading.get_ident() != self._thread_id:
            os.eventfd_write(self._wake_fd, 1)

    # -- the task ------------------------------------------------------------------------

    async def _run(self) -> None:
        epoll = self._epoll
        assert epoll is not None
        fd = epoll.fileno()
        try:
            while self._live:
                with trio.CancelScope() as scope:
                    self._scope = scope
                    scope.deadline = self._heap[0][0] if self._heap else math.inf
                    while self._live:
                        await trio.lowlevel.wait_readable(fd)
                        # Under load (several sockets were ready), more are by the end of a
                        # pass: look again before going back to trio, a few times.
                        for _ in range(BURST):
                            if self._pass() < 2:
                                break
                self._scope = None
                self._timers(self._now())
        except Exception as exc:  # a bug here must cost the connections, never the trio run
            for relayed in list(self._live):
                self._fail(relayed, exc)
        finally:
            self._scope = None
            self._running = False
            if not self._live:
                self._epoll = None
                epoll.close()

    def _pass(self) -> int:
        """Service every ready socket once; returns how many were ready."""
        assert self._epoll is not None
        ready = self._epoll.poll(0, MAX_EVENTS)
        if not ready:
            return 0
        return self._serve(ready)

    def _serve(self, ready: list[tuple[int, int]]) -> int:
        """Service these ready sockets once, then what is due; returns how many were ready.
        Observers that gather a pass's reports (capture) are told where it begins and ends."""
        if not self._observers:
            return self._serve_ready(ready)
        observers = list(self._observers)
        for observer in observers:
            try:
                observer.begin_pass()
            except Exception:  # an observer's bug costs its reports, never the connections
                _log.exception("observer failed at the start of a relay pass")
        try:
            return self._serve_ready(ready)
        finally:
            for observer in observers:
                try:
                    observer.end_pass()
                except Exception:  # an observer's bug costs its reports, never the connections
                    _log.exception("observer failed at the end of a relay pass")

    def _serve_ready(self, ready: list[tuple[int, int]]) -> int:
        if ready:
            self.passes += 1
        now = self._now()
        self._pass_began = now
        try:
            sides = self._sides
            dirty: list[Relayed] = []
            self._dirty = dirty
            try:
                for fd, flags in ready:
                    side = sides.get(fd)
                    if side is None:
                        if fd == self._wake_fd:
                            with contextlib.suppress(BlockingIOError):
                                os.eventfd_read(fd)
                        continue  # or its connection ended earlier in this pass
                    relayed = side.owner
                    try:
                        if flags & _OUT or (side.backlog and flags & _READABLE):
                            self._flush(side, now)
                        if flags & _READABLE and side.mask & _IN and not relayed.over:
                            if side.client and relayed.phase == _DISCARDING:
                                self._discard(side)
                            else:
                                self._receive(side, now)
                    except Exception as exc:
                        self._fail(relayed, exc)
                if self._heap and self._heap[0][0] <= now:
                    self._timers(now)
            finally:
                # Even after a bug: a connection changed outside a pass is scheduled at once, not
                # put on a list no pass will read.
                self._dirty = None
            for relayed in dirty:  # each connection's deadline read once per pass, however often it was fed
                relayed.dirty = False
                if not relayed.over:
                    try:
                        self._schedule(relayed)
                    except Exception as exc:
                        self._fail(relayed, exc)
            scope = self._scope
            if scope is not None:
                heap = self._heap
                due = heap[0][0] if heap else math.inf
                if scope.deadline != due:
                    scope.deadline = due
            return len(ready)
        finally:
            self._pass_began = None

    # -- sockets -------------------------------------------------------------------------

    def _receive(self, side: _Side, now: float) -> None:
        relayed = side.owner
        core = relayed.core
        sinks = relayed.sinks
        fd, buffers, size, decoder = side.fd, self._buffers, self._size, side.decoder
        for _ in range(self._fair_reads):
            target = decoder.receive_target(self._spares.take) if decoder.big else None
            try:
                # A big frame's rest straight into its own buffer, anything after it into the shared one.
                received = os.readv(fd, buffers) if target is None else os.readv(fd, [target, self._buffer])
            except BlockingIOError:
                if target is not None:
                    self._unused_target(decoder)
                return
            except OSError as exc:
                broken = f"socket connection broken: {exc}"
                if side.client:
                    core.client_lost(f"client connection lost: {broken}", now)
                else:
                    core.upstream_lost(broken, now)
                self._sync(relayed, now)
                return
            capacity = size
            filled = 0
            if target is not None:
                capacity += len(target)
                filled = min(received, len(target))
            # No await until the core is done with it: the buffer is shared by every socket.
            data = self._view[: received - filled]
            if side.client:
                if received and sinks.metrics is not None:
                    sinks.received_from_client(received)
                core.receive_client(data, now, filled)
            else:
                if received and sinks.metrics is not None:
                    sinks.received_from_upstream(received)
                core.receive_upstream(data, now, filled)
            self._sync(relayed, now)
            # A short read emptied the socket; epoll reports anything newer on the next pass.
            if received < capacity or not side.mask & _IN or relayed.over:
                return

    def _unused_target(self, decoder: FrameDecoder) -> None:
        """A guessed buffer the socket had nothing for goes back to the spares: an idle
        connection holds none, and the next connection's guess may take it."""
        spare = decoder.release_target()
        if spare is not None:
            self._spares.keep([spare])

    def _discard(self, side: _Side) -> None:
        """Read and drop a client's bytes after the proxy's end of stream, until it ends its own."""
        relayed = side.owner
        for _ in range(self._fair_reads):
            try:
                received = os.readv(side.fd, self._buffers)
            except BlockingIOError:
                return
            except OSError:
                self._client_done(relayed)  # the client is gone, and nothing more is owed to it
                return
            if not received:
                self._client_done(relayed)
                return
            relayed.discarded += received
            if relayed.discarded > DISCARD_LIMIT:
                self._kept_sending(relayed)
                return
            if received < self._size:
                return

    def _write(self, side: _Side, frames: list[bytearray]) -> None:
        if side.dropping or side.broken or side.ended:
            return
        if side.backlog:
            side.backlog += frames
            side.unsent += sum(map(len, frames))
            return
        try:
            sent = send_frames(side.fd, frames)
        except OSError as exc:
            side.error = exc
            return
        total = sum(map(len, frames))
        if total >= BIG_FRAME:
            self._spares.keep(frames)
        if sent < total:
            side.backlog = unsent(frames, sent)
            side.unsent = total - sent

    def _flush(self, side: _Side, now: float) -> None:
        backlog = side.backlog
        if not backlog or side.broken:
            return
        try:
            sent = send_frames(side.fd, backlog)
        except OSError as exc:
            side.error = exc
        else:
            if not sent:
                return
            side.backlog = unsent(backlog, sent)
            side.unsent -= sent
        self._sync(side.owner, now)

    def _register(self, side: _Side, mask: int) -> None:
        current = side.mask
        if mask == current:
            return
        epoll = self._epoll
        assert epoll is not None
        if not current:
            epoll.register(side.fd, mask)
        elif not mask:
            epoll.unregister(side.fd)
        else:
            epoll.modify(side.fd, mask)
        side.mask = mask

    # -- carrying out what the core decided ----------------------------------------------

    def _sync(self, relayed: Relayed, now: float) -> None:
        core = relayed.core
        client, upstream = relayed.client, relayed.upstream
        while True:
            to_upstream, to_client, events = core.take()
            # Counted and recorded before it is sent: whoever sees the bytes arrive (another
            # thread than the engine's) finds them in the metrics and the log, and in the
            # capture once the pass ends (CaptureWriter.flush waits for that).
            if events or (relayed.sinks.metrics is not None and (to_upstream or to_client)):
                relayed.sinks.output(to_upstream, to_client, events)
            if to_upstream:
                self._write(upstream, to_upstream)
            if to_client:
                self._write(client, to_client)
            if core.decided != relayed.decided:
                relayed.decided = core.decided
                if core.upstream_spoke:
                    relayed.sinks.upstream_answered()
                if core.abandon_client and not client.dropping:
                    client.dropping = True
                    client.backlog, client.unsent = [], 0
                if core.end_upstream:
                    upstream.finishing = True
                if core.end_client:
                    client.finishing = True
                if core.aborted or (relayed.phase == _DONE and core.upstream_settled):
                    self._end(relayed)
                    return
            # A failed send is reported as the writer tasks report it. The broker is gone as
            # surely as when a receive fails: what is ready is delivered, and Produces left
            # unanswered are flagged (docs/repair.md, rule 9), whichever side noticed first.
            if upstream.error is not None:
                error, upstream.error = upstream.error, None
                upstream.broken = True
                upstream.backlog, upstream.unsent = [], 0
                core.upstream_lost(f"lost while sending: socket connection broken: {error}", now)
                continue
            if client.error is not None:
                error, client.error = client.error, None
                client.broken = True
                client.backlog, client.unsent = [], 0
                broken = f"socket connection broken: {error}"
                core.client_lost(f"client connection lost while sending: {broken}", now)
                continue
            if upstream.finishing and not upstream.backlog and not upstream.ended and not upstream.broken:
                # The broker sees its end of stream after the last request, takes every request
                # before it, and closes its side: the core then ends the connection.
                upstream.ended = True
                try:
                    upstream.sock.shutdown(socket.SHUT_WR)
                except OSError as exc:
                    upstream.error = exc
                    continue
                core.upstream_flushed(now)
                continue
            if client.finishing and not client.backlog and not client.broken and relayed.phase == _OPEN:
                # Everything owed to the client was sent: the connection is done, once a client
                # that may still send has had its end of stream (CLOSE_GRACE after the last answers).
                if not core.discard_client_input:
                    if self._client_done(relayed):
                        return
                    continue
                relayed.phase = _GRACE
                relayed.local_deadline = now + CLOSE_GRACE
            break
        self._watch(relayed, now)
        dirty = self._dirty
        if dirty is None:
            self._schedule(relayed)
        elif not relayed.dirty:
            relayed.dirty = True
            dirty.append(relayed)

    def _watch(self, relayed: Relayed, now: float) -> None:
        """What epoll watches on both sockets, from the core's flags and the backlogs."""
        core = relayed.core
        client, upstream = relayed.client, relayed.upstream
        if relayed.phase == _DISCARDING:
            reading = True
        elif core.stop_client:
            reading = False
        elif core.client_read_allowed(upstream.unsent):
            reading = True
            if relayed.paused:
                relayed.paused = False
                core.resume_client(now)
        else:
            reading = False
            if not relayed.paused:
                relayed.paused = True
                core.pause_client()  # the proxy's own stall: an incomplete frame does not age
        mask = (_IN if reading else 0) | (_OUT if client.backlog else 0)
        if mask != client.mask:
            self._register(client, mask)
        reading = not core.stop_upstream and core.upstream_read_allowed(client.unsent)
        mask = (_IN if reading else 0) | (_OUT if upstream.backlog else 0)
        if mask != upstream.mask:
            self._register(upstream, mask)

    # -- time ----------------------------------------------------------------------------

    def _schedule(self, relayed: Relayed) -> None:
        """Make sure the heap holds an entry no later than the connection's next deadline.

        An entry is pushed only when the deadline moves earlier; one that moves later (the
        usual case, as answers arrive) keeps its entry, which then fires early, finds nothing
        due and is pushed again at the new time. Superseded entries are skipped when popped.
        """
        due = relayed.core.next_deadline()
        if relayed.local_deadline < due:
            due = relayed.local_deadline
        if due >= relayed.scheduled:
            return
        relayed.scheduled = due
        heap = self._heap
        heapq.heappush(heap, (due, next(self._order), relayed.slot))
        if len(heap) > 2 * len(self._live) + 64:
            # Mostly superseded entries: keep one per connection.
            heap = [(r.scheduled, next(self._order), r.slot) for r in self._live if r.scheduled < math.inf]
            heapq.heapify(heap)
            self._heap = heap
        scope = self._scope
        if scope is not None and due < scope.deadline:
            scope.deadline = due
        elif self._thread is not None:
            self._wake_thread(due)

    def _timers(self, now: float) -> None:
        heap = self._heap
        due: list[Relayed] = []
        while heap and heap[0][0] <= now:
            when, _, slot = heapq.heappop(heap)
            relayed = slot[0]
            if relayed is not None and when == relayed.scheduled and not relayed.over:
                relayed.scheduled = math.inf
                due.append(relayed)
        for relayed in due:
            try:
                if relayed.core.next_deadline() <= now:
                    relayed.core.tick(now)
                    self._sync(relayed, now)
                if relayed.local_deadline <= now and not relayed.over:
                    self._local_deadline(relayed, now)
                if not relayed.over:
                    self._schedule(relayed)
            except Exception as exc:
                self._fail(relayed, exc)

    def _local_deadline(self, relayed: Relayed, now: float) -> None:
        if relayed.phase == _GRACE:
            relayed.phase = _DISCARDING
            relayed.local_deadline = now + relayed.close_linger
            try:
                relayed.client.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._client_done(relayed)  # the client is gone, and nothing more is owed to it
                return
            self._watch(relayed, now)
        elif relayed.phase == _DISCARDING:
            self._kept_sending(relayed)

    def _kept_sending(self, relayed: Relayed) -> None:
        discarded = relayed.discarded
        if discarded:
            relayed.sinks.log.info("client kept sending after the proxy's end of stream", discarded=discarded)
        else:
            relayed.sinks.log.info(
                "client did not close after the proxy's end of stream", linger=relayed.close_linger
            )
        self._client_done(relayed)

    # -- the end of a connection ---------------------------------------------------------

    def _client_done(self, relayed: Relayed) -> bool:
        """The client's side is done. The connection is over once the broker's side is settled
        too (returns True when that ended it now); until then the broker keeps being served,
        and the client is no longer read."""
        relayed.phase = _DONE
        relayed.local_deadline = math.inf
        if relayed.core.upstream_settled:
            self._end(relayed)
            return True
        self._watch(relayed, self._now())
        return False

    def _end(self, relayed: Relayed) -> None:
        """The connection is over: its ``on_end`` closes both sockets, in trio's thread, soon: not
        now, as the engine may be inside a pass over the ready sockets, or hold its lock."""
        if relayed.over:
            return
        relayed.over = True
        self._release(relayed)
        on_end, relayed.on_end = relayed.on_end, None
        if on_end is not None:
            assert self._token is not None
            with contextlib.suppress(trio.RunFinishedError):  # the process is ending anyway
                self._token.run_sync_soon(on_end)

    def _fail(self, relayed: Relayed, exc: Exception) -> None:
        """A bug met on one connection: it is closed, and the error reported with its end."""
        relayed.error = exc
        self._end(relayed)

    def _release(self, relayed: Relayed) -> None:
        if relayed.released:
            return
        try:
            relayed.slot[0] = None  # its heap entries no longer hold it
            self._live.discard(relayed)
            if not self._live:
                self._spares.clear()  # an idle engine keeps no big buffers
            observer = relayed.sinks.observer
            if relayed.admitted and isinstance(observer, SerializedObserver) and observer.gathers_passes:
                # counted when it was taken in
                left = self._observers[observer] - 1
                if left:
                    self._observers[observer] = left
                else:
                    del self._observers[observer]
            for side in (relayed.client, relayed.upstream):
                if self._sides.get(side.fd) is side:
                    del self._sides[side.fd]
                if side.mask and self._epoll is not None:
                    with contextlib.suppress(OSError):
                        self._epoll.unregister(side.fd)
                    side.mask = 0
        finally:
            # Last: trio's thread reads it without the lock, then closes the sockets, whose
            # numbers a new connection may take at once.
            relayed.released = True


def thread_cpu_seconds(native_id: int) -> float:
    """User and system CPU time of one of this process's threads, from /proc (0.0 once it
    has ended)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return 0.0
    # After the name: state is field 3 of stat(5), utime and stime are 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

_ENGINE: trio.lowlevel.RunVar[RelayEngine] = trio.lowlevel.RunVar("corrfix_relay_engine")


def current_engine() -> RelayEngine:
    """The engine of this trio run (one per process, and per worker), made on first use."""
    try:
        return _ENGINE.get()
    except LookupError:
        engine = RelayEngine(threaded=_follows_real_time())
        _ENGINE.set(engine)
        return engine


def _follows_real_time() -> bool:
    """Whether the run's clock is real time (a thread can wait for it), not trio's MockClock."""
    testing = sys.modules.get("trio.testing")  # no MockClock can exist unless it was imported
    return testing is None or not isinstance(trio.lowlevel.current_clock(), testing.MockClock)
