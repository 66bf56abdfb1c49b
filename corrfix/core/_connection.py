"""Everything decided per connection, fed bytes and ``now``: the sans-IO core a shell drives.

It holds both frame decoders, the repair machine, the connection's deadlines (idle, stalled
request frame, the broker's close after the proxy's end of stream, the flush of a closing
connection), drain, half-close and the backpressure thresholds. A shell (the trio relay, or
an engine servicing many sockets) feeds it what the sockets did and carries out what it
asks: bytes for each side, which sides to keep reading, which streams to end, and when to
call :meth:`ConnectionCore.tick` again. It does no I/O and reads no clock.

The closing rules are docs/repair.md's "Closing": a client's end of stream asks to finish,
not to abort. Every request read reaches the broker, the broker's side is half-closed after
the last one, and the broker is read until it closes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from corrfix.core._events import HEADER_COPY, Closed, Event, Notice, PeerSide, Received, Sent
from corrfix.core._repair import Actions, RepairConfig, RepairMachine
from corrfix.core._routing import RoutingError
from corrfix.core._tls_hints import SILENT_UPSTREAM_HINT, tls_on_plaintext
from protocol import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, FrameSizeError, ProtocolError

FLUSH_TIMEOUT = 10.0
"""How long a connection the proxy ends itself may spend closing: delivering what it still
owes the client, and ending the broker's stream (every request read sent, the half-close,
the broker's own close or ``close_linger``), so a broker that stopped reading cannot hold
the sockets for the request deadline."""
CLOSE_GRACE = 0.25
"""Pause between the last answers and the end of stream of a connection the proxy ends
itself. kafka-python 3 drops answers that arrive in the same read as an end of stream (its
transport aborts the connection before it parses what it read), and then re-sends those
requests: the pause lets it read them first."""
DISCARD_LIMIT = 1024 * 1024
"""Bytes a closing connection reads and discards from a client after its own end of stream,
so that closing the socket sends a FIN, not a RST that could destroy answers in flight."""


def _received(side: PeerSide, frames: list[bytearray]) -> Received:
    # A frame no longer than the head is copied whole, without a memoryview: 80 against 200 ns.
    heads = [bytes(f) if len(f) <= HEADER_COPY else bytes(memoryview(f)[:HEADER_COPY]) for f in frames]
    return Received(side, heads, frames)


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """The per-connection part of the proxy's configuration."""

    repair: RepairConfig = field(default_factory=RepairConfig)
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    frame_timeout: float = 30.0
    """Close a client whose request frame stays incomplete this long (slowloris, a stall)."""
    close_linger: float = 5.0
    """After the proxy's end of stream to the broker, how long it waits for the broker's."""
    idle_timeout: float = 600.0
    """Close a connection with nothing outstanding and no bytes either way for this long."""
    max_send_buffer: int = 4 * 1024 * 1024
    """Bytes waiting to be sent to one side before the other side's reads pause."""


class ConnectionCore:
    """One client connection and its broker connection, as decisions over bytes and time."""

    __slots__ = (
        "_busy_until",
        "_client_decoder",
        "_client_spoke",
        "_client_tls",
        "_flush_deadline",
        "_last_activity",
        "_now",
        "_out",
        "_partial_since",
        "_paused_mid_frame",
        "_record",
        "_upstream_bound",
        "_upstream_deadline",
        "_upstream_decoder",
        "_upstream_eof_sent",
        "_upstream_known_plaintext",
        "_upstream_tls",
        "_watch_at",
        "_watching",
        "abandon_client",
        "aborted",
        "client_eof",
        "client_gone",
        "close_reason",
        "config",
        "decided",
        "draining",
        "end_client",
        "end_upstream",
        "machine",
        "stop_client",
        "stop_upstream",
        "upstream_spoke",
    )

    def __init__(
        self,
        config: ConnectionConfig,
        machine: RepairMachine,
        now: float,
        *,
        client_peer: str = "client",
        upstream_peer: str = "upstream",
        client_tls: bool = False,
        upstream_tls: bool = False,
        upstream_known_plaintext: Callable[[], bool] = lambda: False,
        record_frames: bool = False,
    ) -> None:
        self.config = config
        self.machine = machine
        self._client_decoder = FrameDecoder(config.max_frame_size, peer=client_peer)
        self._upstream_decoder = FrameDecoder(config.max_frame_size, peer=upstream_peer)
        self._client_tls = client_tls
        self._upstream_tls = upstream_tls
        self._upstream_known_plaintext = upstream_known_plaintext
        # Frame events (Received, Sent) for an observer, such as a capture.
        self._record = record_frames
        # Frames for each side and events, in order: every call into the machine adds to
        # these lists, and the shell takes them (take()).
        self._out = Actions()
        self.close_reason: str | None = None
        # What the shell must carry out; each only ever turns on, and ``decided`` counts the
        # changes, so a shell need not read them all after every call.
        self.decided = 0
        self.stop_client = False
        """Read no more from the client."""
        self.abandon_client = False
        """The client is gone: drop what is queued for it and everything from now on."""
        self.end_upstream = False
        """End the broker's stream once everything queued for it is sent."""
        self.end_client = False
        """Deliver what is queued for the client, then end the connection."""
        self.stop_upstream = False
        """Read no more from the broker."""
        self.aborted = False
        """Close both sides now."""
        self.client_eof = False
        self.client_gone = False
        self.draining = False
        self.upstream_spoke = False
        self._client_spoke = False
        self._upstream_eof_sent = False
        self._now = now
        self._last_activity = now
        self._paused_mid_frame = False
        self._busy_until = 0.0  # a long request (a Fetch long-poll) is not idleness
        self._partial_since: float | None = None
        self._watching = True  # the idle and frame deadlines apply until the connection closes
        # When to check them next. It moves only when a check finds nothing due, or when a
        # request frame starts to stall, not on every receive: re-arming a timer is not free.
        self._watch_at = now + config.idle_timeout
        self._upstream_deadline = math.inf
        self._upstream_bound = math.inf  # the latest the broker's side may settle (finish())
        self._flush_deadline = math.inf

    # -- what the shell takes after each call ------------------------------------------

    def take(self) -> tuple[list[bytearray], list[bytearray], list[Event]]:
        """Frames for the broker, frames for the client, and events, each in order; send or
        copy the frames before the next call. One call, for the shell's hot path."""
        pending = self._out
        out = pending.to_upstream, pending.to_client, pending.events
        if out[0]:
            pending.to_upstream = []
        if out[1]:
            pending.to_client = []
        if out[2]:
            pending.events = []
        return out

    def take_upstream(self) -> list[bytearray]:
        """Frames to send to the broker, in order; send or copy them before the next call."""
        pending = self._out
        out, pending.to_upstream = pending.to_upstream, []
        return out

    def take_client(self) -> list[bytearray]:
        pending = self._out
        out, pending.to_client = pending.to_client, []
        return out

    def take_events(self) -> list[Event]:
        pending = self._out
        out, pending.events = pending.events, []
        return out

    @property
    def has_output(self) -> bool:
        pending = self._out
        return bool(pending.to_upstream or pending.to_client or pending.events)

    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (``math.inf``: nothing pending)."""
        due = self._flush_deadline
        if not self.stop_upstream and self._upstream_deadline < due:
            due = self._upstream_deadline
        machine_due = self.machine.next_deadline()
        if machine_due is not None and machine_due < due:
            due = machine_due
        if self._watching and self._watch_at < due:
            due = self._watch_at
        return due

    @property
    def client_decoder(self) -> FrameDecoder:
        """The client side's framing, for a shell that receives a big frame straight into the
        frame's own buffer (:meth:`FrameDecoder.receive_target`); the bytes are still
        reported through :meth:`receive_client`, with ``filled``."""
        return self._client_decoder

    @property
    def upstream_decoder(self) -> FrameDecoder:
        """The broker side's framing (see :attr:`client_decoder`)."""
        return self._upstream_decoder

    def client_read_allowed(self, upstream_backlog: int) -> bool:
        """Backpressure: False while the machine is at its bounds or the broker's queue is full."""
        return self.machine.accepting_requests and upstream_backlog < self.config.max_send_buffer

    def upstream_read_allowed(self, client_backlog: int) -> bool:
        return client_backlog < self.config.max_send_buffer

    @property
    def upstream_settled(self) -> bool:
        """Whether the broker's side needs nothing more: it closed, was lost or unusable, its
        linger passed, or (TLS, which cannot half-close) everything was sent. A shell closes
        the sockets only once this holds and the client's side is done (or on ``aborted``):
        closing the broker's socket earlier drops requests not sent yet, and a RST may make
        the broker discard those it has not processed."""
        return self.stop_upstream or (self._upstream_tls and self._upstream_eof_sent)

    @property
    def discard_client_input(self) -> bool:
        """After the last answers, end the client's stream and read it until it ends its own,
        rather than close a socket that may hold unread bytes (a RST can destroy answers)."""
        return not self.client_eof and not self.client_gone

    # -- the client side ---------------------------------------------------------------

    def receive_client(self, data: bytes | bytearray | memoryview, now: float, filled: int = 0) -> None:
        """Bytes from the client; empty means its end of stream. ``filled`` bytes came first,
        received into the client decoder's :meth:`~FrameDecoder.receive_target`."""
        self._now = self._last_activity = now
        if not data and not filled:
            self._on_client_eof()
            return
        decoder = self._client_decoder
        try:
            frames = decoder.feed(data, filled)
        except ProtocolError as exc:
            # Whole requests before a bad size prefix are requests read: they reach the broker.
            if isinstance(exc, FrameSizeError) and exc.frames and not self._requests(exc.frames, now):
                return
            hello = (
                tls_on_plaintext(exc, "client") if not self._client_spoke and not self._client_tls else None
            )
            self.client_lost(hello or f"bad request from client: {exc}", now, warning=True)
            return
        if not decoder.buffered:
            self._partial_since = None
        elif not self.stop_client and (self._partial_since is None or frames):
            self._partial_since = now  # a frame began in this chunk
            self._watch_at = min(self._watch_at, now + self.config.frame_timeout)
        if frames:
            self._requests(frames, now)

    def _requests(self, frames: list[bytearray], now: float) -> bool:
        """Whole requests to the machine; False if one was malformed (the client is then lost,
        and the requests before it still reach the broker, as every request read does)."""
        if not self._client_spoke:
            self._client_spoke = True  # a size error now is no ClientHello
        marks = None
        if self._record:
            self._out.events.append(_received("client", frames))
            marks = self._marks()
        try:
            self.machine.client_frames(frames, now, self._out)
        except ProtocolError as exc:
            # First: the close is this request's doing, whatever the requests before it settle.
            self.client_lost(f"bad request from client: {exc}", now, warning=True)
            self._settle(marks)
            return False
        self._settle(marks)
        return True

    def pause_client(self) -> None:
        """The shell stopped reading for backpressure: that is the proxy's doing, so a request
        frame left incomplete does not age meanwhile."""
        self._paused_mid_frame = self._partial_since is not None
        self._partial_since = None

    def resume_client(self, now: float) -> None:
        if self._paused_mid_frame:
            self._partial_since = now
            self._watch_at = min(self._watch_at, now + self.config.frame_timeout)
        self._paused_mid_frame = False

    def _stop_reading_client(self) -> None:
        """Nothing more is read from the client: a request frame it left incomplete can no
        longer complete, and no longer counts as its stall (a drain must not blame the client,
        and drop the answers it waits to deliver, for the frame the proxy stopped reading)."""
        self.stop_client = True
        self._partial_since = None
        self._paused_mid_frame = False
        self.decided += 1

    def _on_client_eof(self) -> None:
        if self._client_decoder.buffered:
            self._note("client closed mid-frame", "warning", buffered=self._client_decoder.buffered)
        self.client_eof = True
        self._stop_reading_client()
        if self.machine.outstanding == 0:
            self._close_upstream("client closed")

    def client_lost(self, reason: str, now: float, *, warning: bool = False) -> None:
        """The client is gone or unusable: nothing more is read from it or delivered to it,
        but every request already read still reaches the broker before its side closes."""
        self._now = now
        if self.client_gone:
            return
        self.client_gone = True
        if self.close_reason is None:
            self.close_reason = reason
        if warning:
            self._note("closing connection", "warning", reason=reason)
        self.abandon_client = True
        self._stop_reading_client()
        self._out.to_client.clear()
        self.machine.client_gone()
        self._close_upstream(reason)
        if self.end_client and self.upstream_settled and not self.aborted:
            # The proxy was delivering its last answers and the broker's side is settled: with
            # the client gone nothing is left to do (as finish() decides for a client already
            # gone), rather than holding both sockets until the flush deadline. A broker side
            # still ending does so first (_upstream_closed then ends the connection).
            self.aborted = True
            self.decided += 1

    # -- the broker side ---------------------------------------------------------------

    def receive_upstream(self, data: bytes | bytearray | memoryview, now: float, filled: int = 0) -> None:
        """Bytes from the broker; empty means its end of stream. ``filled`` bytes came first,
        received into the upstream decoder's :meth:`~FrameDecoder.receive_target`."""
        self._now = self._last_activity = now
        if not data and not filled:
            if self._upstream_decoder.buffered:
                self._note("upstream closed mid-frame", "warning", buffered=self._upstream_decoder.buffered)
            self._hint_silent_upstream()
            self.stop_upstream = True
            self.decided += 1
            self._upstream_closed()
            return
        try:
            frames = self._upstream_decoder.feed(data, filled)
        except ProtocolError as exc:
            # Whole answers before a bad size prefix are answers read: they are delivered.
            if isinstance(exc, FrameSizeError) and exc.frames and not self._answers(exc.frames, now):
                return
            self._upstream_unusable(exc)
            return
        if frames:
            self._answers(frames, now)

    def _answers(self, frames: list[bytearray], now: float) -> bool:
        """Whole answers to the machine; False if one was malformed (the broker is then
        unusable, and the answers before it are still delivered)."""
        if not self.upstream_spoke:
            self.upstream_spoke = True
            self.decided += 1  # news for the shell: plaintext works with this broker
        marks = None
        if self._record:
            self._out.events.append(_received("upstream", frames))
            marks = self._marks()
        try:
            self.machine.upstream_frames(frames, now, self._out)
        except ProtocolError as exc:
            self._upstream_unusable(exc, marks)
            return False
        self._settle(marks)
        return True

    def _upstream_unusable(self, exc: ProtocolError, marks: tuple[int, int, int] | None = None) -> None:
        """The broker sent something unusable: read nothing more from it, as if it had closed.
        What it still owes the client cannot come (Produces left unanswered are flagged), and
        the client gets what is ready, then the connection closes. ``marks``: where the
        output of the call that failed begins, for a recording core."""
        if marks is None and self._record:
            marks = self._marks()
        plaintext = not self.upstream_spoke and not self._upstream_tls
        answer = tls_on_plaintext(exc, "upstream") if plaintext else None
        if answer is not None:
            reason = answer
        elif isinstance(exc, RoutingError):  # the proxy's settings, not the broker, are at fault
            reason = f"no proxy listener for a broker the answer names: {exc}"
        else:
            reason = f"bad response from upstream: {exc}"
        if self.close_reason is None:
            self.close_reason = reason
        self._note("closing connection", "warning", reason=reason)
        self.stop_upstream = True
        self.decided += 1
        self._upstream_closed(marks)

    def upstream_lost(self, error: str, now: float) -> None:
        """Reading from the broker failed (a reset): whatever is still owed cannot arrive."""
        self._now = now
        self._hint_silent_upstream()
        self.stop_upstream = True
        self.decided += 1
        self._upstream_closed()
        self._note("upstream connection lost", error=error)

    def upstream_flushed(self, now: float) -> None:
        """Everything queued for the broker is sent, its end of stream included (plaintext)
        or not possible (TLS cannot half-close: close_notify ends both directions)."""
        self._now = now
        if self._upstream_eof_sent:
            return
        self._upstream_eof_sent = True
        if self._upstream_tls:  # nothing to wait for: the broker's side is settled
            self._upstream_deadline = math.inf
            self.decided += 1
            self.finish(self.close_reason or "client closed", now)
            return
        self._upstream_deadline = min(now + self.config.close_linger, self._upstream_bound)

    def _hint_silent_upstream(self) -> None:
        """A broker that closes before answering anything may be a TLS listener (OpenSSL
        closes silently), unless a connection to it was ever answered in plaintext."""
        if self.upstream_spoke or not self.machine.outstanding:
            return
        if self._upstream_tls or self._upstream_known_plaintext():
            self._note("upstream closed before answering anything on this connection", "warning")
        else:
            self._note("upstream closed before answering anything", "warning", hint=SILENT_UPSTREAM_HINT)

    # -- time and the proxy's own decisions --------------------------------------------

    def tick(self, now: float) -> None:
        """Time passed: act on every deadline that is due."""
        self._now = now
        # The broker's deadline first: after finish() it is never later than the flush's.
        if now >= self._upstream_deadline and not self.stop_upstream:
            if self._upstream_eof_sent:
                self._note("broker kept its side open after the proxy's end of stream")
            elif now >= self._upstream_bound:
                self._note("broker did not take every request before the close's time limit", "warning")
            else:
                self._note("broker did not take every request before the request deadline", "warning")
            self.stop_upstream = True
            self.decided += 1
            self._upstream_closed()
            self.finish("broker did not close", now)
        if now >= self._flush_deadline:
            self._flush_deadline = math.inf
            self.abort(self.close_reason or "could not deliver to the client in time")
            return
        if self._watching and now >= self._watch_at:
            self._watch(now)
        marks = self._marks() if self._record else None
        self.machine.tick(now, self._out)
        self._settle(marks)

    def _watch(self, now: float) -> None:
        """Close idle connections, and clients that leave a request frame incomplete."""
        partial = self._partial_since
        frame_timeout = self.config.frame_timeout
        if partial is not None and now >= partial + frame_timeout:
            self._watching = False
            self.client_lost(f"request frame incomplete for {frame_timeout:g}s", now, warning=True)
            return
        idle = self.config.idle_timeout
        if now >= max(self._last_activity + idle, self._busy_until):
            if self.machine.outstanding == 0:
                self._watching = False
                self.finish(f"idle for {idle:g}s", now)
                return
            self._busy_until = now + idle
        self._watch_at = max(self._last_activity + idle, self._busy_until)
        if self._partial_since is not None:
            self._watch_at = min(self._watch_at, self._partial_since + frame_timeout)

    def drain(self, now: float) -> None:
        """Stop reading requests; close once every outstanding request is answered."""
        self._now = now
        self.draining = True
        self._stop_reading_client()
        if self.machine.outstanding == 0:
            self._close_upstream("proxy draining")

    def finish(self, reason: str, now: float) -> None:
        """Deliver what is queued for the client and end the broker's stream as every close
        does (:meth:`_close_upstream`), both within FLUSH_TIMEOUT; the connection is over once
        both are done (:attr:`upstream_settled`)."""
        self._now = now
        if self.close_reason is None:
            self.close_reason = reason
        self._stop_reading_client()
        if not self.upstream_settled:
            bound = now + FLUSH_TIMEOUT
            self._close_upstream(reason)
            if bound < self._upstream_bound:
                self._upstream_bound = bound
                self._upstream_deadline = min(self._upstream_deadline, bound)
        if self.client_gone:
            if self.upstream_settled:
                self.aborted = True
                self.decided += 1
            return
        self.end_client = True
        self.decided += 1
        self._flush_deadline = min(self._flush_deadline, now + FLUSH_TIMEOUT)

    def abort(self, reason: str, *, warning: bool = False) -> None:
        """Close both sides now: the peer is gone or sent something unusable."""
        if self.close_reason is None:
            self.close_reason = reason
        if warning:
            self._note("closing connection", "warning", reason=reason)
        self.aborted = True
        self.decided += 1

    def closed(self) -> Closed:
        """The connection's last event, for the shell to report once its sockets are closed."""
        return Closed(self.close_reason or "proxy stopping")

    # -- internals ---------------------------------------------------------------------

    def _upstream_closed(self, marks: tuple[int, int, int] | None = None) -> None:
        """The machine told that the broker is gone; ``marks``, if the output it adds is
        reported from an earlier point (a recording core's)."""
        if marks is None and self._record:
            marks = self._marks()
        self.machine.upstream_closed(self._out)
        self._settle(marks)
        if self.client_gone and not self.aborted:
            # Nobody is left to deliver to: the broker's side was all that kept it open (the
            # machine had given up before, so its close did not finish() the connection).
            self.aborted = True
            self.decided += 1

    def _marks(self) -> tuple[int, int, int]:
        """Where the next call's output will begin in each list, for a recording core."""
        out = self._out
        return len(out.to_upstream), len(out.to_client), len(out.events)

    def _settle(self, marks: tuple[int, int, int] | None) -> None:
        """Carry out what the machine just added to the output. ``marks`` (a recording core's)
        says where its additions begin: the frames it sent are reported there, before its own
        events, as they happened first."""
        out = self._out
        if self.abandon_client and out.to_client:
            out.to_client.clear()  # the client is gone: nothing is delivered to it
        if marks is not None:
            upstream_at, client_at, events_at = marks
            sent: list[Event] = []
            if len(out.to_upstream) > upstream_at:
                sent.append(Sent("upstream", out.to_upstream[upstream_at:]))
            if len(out.to_client) > client_at:
                sent.append(Sent("client", out.to_client[client_at:]))
            if sent:
                out.events[events_at:events_at] = sent
        if out.close is not None:
            reason, out.close = out.close, None
            self.finish(reason, self._now)
        elif (self.client_eof or self.draining) and self.machine.outstanding == 0:
            self._close_upstream("client closed" if self.client_eof else "proxy draining")

    def _close_upstream(self, reason: str) -> None:
        """Send the broker every request read, then end its stream; the connection ends when
        the broker closes its side, or ``close_linger`` after the end of stream. A broker that
        does not take the requests gets as long as any request gets an answer.

        Until then the broker keeps being read, so answers still owed are delivered and
        stray ones dropped, and its socket is never closed with unread bytes: that would send
        a RST, and a broker may discard the requests it has not processed yet.
        """
        if self.end_upstream:
            return
        self.end_upstream = True
        self.decided += 1
        if self.close_reason is None:
            self.close_reason = reason
        self._upstream_deadline = min(self._now + self.config.repair.request_deadline, self._upstream_bound)

    def _note(self, message: str, level: str = "info", **details: object) -> None:
        self._out.events.append(
            Notice(message, "warning" if level == "warning" else "info", tuple(details.items()))
        )
