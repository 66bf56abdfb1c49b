"""Turn the connection core's events into capture rows, with both ids on every frame row.

The relay hands over each batch of a connection's events as the core made them: the frames
received and sent on each side, which client request went upstream under which id
(``Forwarded``), and the repairs, whose ``requeue`` and ``probe_sent`` name the ids of
re-sends and probes. Ids are followed by those events alone: nothing is matched by bytes,
and nothing depends on the order in which a shell reports. A received frame's row is its
head, copied by the core before the machine patched it, and the frame's own bytes after
the head; a frame sent on in the same call is the same object, so it is known to be
unchanged after its head without comparing bytes. The bytes are copied once, by the
columns. Outside an engine pass that happens before the call returns; within one
(:meth:`Recorder.begin_pass`), the rows of all the pass's calls are queued at its end, in
one step, and what a later call of the pass could still change is copied at once: the
first bytes of a request sent upstream, where a re-send patches its id. SASL v0
tokens, which have no header, are recognised by protocol's SASL v0 rule
(:mod:`._sasl_v0`); neither they nor SaslAuthenticate bodies are stored (credentials).
Sans-IO: rows go column by column to :class:`~corrfix.capture._columns.RowColumns`, clocks
are injected.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from corrfix.capture._columns import (
    CLIENT_REQUEST,
    CLIENT_RESPONSE,
    CLOSE,
    NULL,
    OPEN,
    RECORD_SIZE,
    REPAIR,
    STORED,
    STORED_AT,
    UPSTREAM_REQUEST,
    UPSTREAM_RESPONSE,
    WARNING_INTERVAL,
    Extra,
    RowColumns,
    pack_row,
)
from corrfix.capture._sasl_v0 import SaslTokens
from corrfix.capture.format import SHARED_HEAD, SHARED_MIN, RowKind
from corrfix.core import HEADER_COPY, Event, Forwarded, Received, RepairEvent, RepairKind, Sent
from protocol import (
    ApiKey,
    ProtocolError,
    RequestHeaderReader,
    is_sasl_v0_handshake,
    parse_request_header,
    produce_acks_at,
    response_body_offset,
)

log = structlog.get_logger("corrfix.capture")

# Bound once: reading a member off an Enum class costs about 0.25 µs, and these are read per frame.
_SASL_AUTHENTICATE, _SASL_HANDSHAKE, _API_VERSIONS, _PRODUCE = (
    ApiKey.SASL_AUTHENTICATE,
    ApiKey.SASL_HANDSHAKE,
    ApiKey.API_VERSIONS,
    ApiKey.PRODUCE,
)
_REQUEUE, _PROBE_SENT = RepairKind.REQUEUE, RepairKind.PROBE_SENT

if HEADER_COPY < SHARED_HEAD:
    raise ImportError("the core's head copies must hold a shared client row's head")

MAX_TRACKED_IDS = 4096
"""Ids remembered per connection and side; answers that never come (acks=0) age out."""
SASL_TOKEN = "sasl_v0_token"
"""The ``reason`` of a frame row that is a SASL v0 token: no header, only its size is kept."""
_REQUEST_FIXED_HEADER = 12  # size, api key, api version, correlation id
_RESPONSE_FIXED_HEADER = 8  # size, correlation id
_REQUEST_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id, after the size
_RESPONSE_ID = struct.Struct(">i")  # correlation id, after the size
_TOKEN: Extra = (None, None, None, SASL_TOKEN, None, None, None)  # the extra values of a SASL v0 token row
_NO_SEND = (NULL, NULL, NULL)
HELD_ROWS = 512
"""Rows a pass may gather before they are queued anyway (a pass serves at most a few dozen
receives, so this only bounds what an unusual one holds)."""
HELD_BYTES = 4 * 1024 * 1024
"""Bytes of frames over :data:`HEADER_COPY` a pass may keep alive by reference (a stored piece
of a frame keeps the whole frame) before its rows are queued anyway; smaller ones are bounded
by :data:`HELD_ROWS`."""


@dataclass(slots=True)
class _Connection:
    seq: int = 0
    # upstream id -> (client id, api key, api version) of sends not yet answered (NULL: unknown).
    sends: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    # client id -> (api key, api version, upstream id) of the client's request, until it is answered.
    asks: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    sasl: SaslTokens | None = None  # once a SaslHandshake v0 went by
    headers: RequestHeaderReader = field(default_factory=RequestHeaderReader)  # for _head_is_enough


def _remember(table: dict, key: int, value: object) -> None:
    table.pop(key, None)
    table[key] = value
    if len(table) > MAX_TRACKED_IDS:
        del table[next(iter(table))]


def _nullable(value: int | None) -> int:
    return NULL if value is None else value


class Recorder:
    """One capture's rows, into :class:`RowColumns`; implements the relay's ``ConnectionObserver`` calls.

    Each call packs its rows' records into one ``bytearray`` (one ``struct`` call per row),
    gathers the frame bytes to keep, and hands both to the columns at once, so the
    columns' lock and bound check are paid once per batch."""

    def __init__(
        self,
        columns: RowColumns,
        snaplen: int,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if snaplen < 0:
            raise ValueError(f"snaplen must be >= 0, got {snaplen}")
        self._columns = columns
        self.snaplen = snaplen
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._connections: dict[str, _Connection] = {}
        self._records = bytearray()
        self._frames: list[bytes | bytearray | memoryview] = []
        self._extras: list[tuple[int, Extra]] = []
        # Frames received in this call and sent on in it (the same object), by ``id``, whose
        # row the sent frame's row may carry the bytes of: (row index, first piece, pieces,
        # head) of client requests, (seq, bytes stored) of upstream responses. Only frames of
        # SHARED_MIN stored bytes or more.
        self._requests_in: dict[int, tuple[int, int, int, bytes]] = {}
        self._answers_in: dict[int, tuple[int, int]] = {}
        # The frames sent in this call, and their ids once a frame big enough to share asks.
        self._sent_lists: list[list[bytearray]] = []
        self._sent_ids: set[int] | None = None
        self._next_error = 0.0
        # Rows packed but not queued yet: which connection each run of them is of, and how
        # many rows and frame pieces the runs hold (the rest belong to the current call).
        self._runs: list[tuple[str, int]] = []
        self._run_rows = 0
        self._run_pieces = 0
        self._held_bytes = 0  # bytes of the big frames the gathered rows keep alive
        self._holding = False
        self.passes_ended = 0

    # -- engine passes -------------------------------------------------------------------

    @property
    def in_pass(self) -> bool:
        """Whether a pass is gathering rows (they are queued when it ends)."""
        return self._holding

    def begin_pass(self) -> None:
        """Gather rows until :meth:`end_pass`: one queue step for the whole pass."""
        self._holding = True

    def end_pass(self) -> None:
        """Queue what the pass gathered (before saying the pass is over: a flush waits for it).
        The pass is over even when queueing fails: else the calls after it would be gathered
        for a pass that never ends, and a flush would wait for that end."""
        try:
            if self._runs:
                self._queue_runs()
        finally:
            self._holding = False
            self.passes_ended += 1

    # -- ConnectionObserver ------------------------------------------------------------

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        conn = self._connections.get(connection)
        if conn is None:
            conn = self._connections[connection] = _Connection()
        self._other(conn, OPEN, (client, upstream, None, None, None, None, None))
        self._release(connection)

    def events(self, connection: str, events: Sequence[Event]) -> None:
        try:
            self._record(connection, events)
        except Exception:  # a bug costs these rows, never the connection the relay is serving
            self._abandon_call(events)

    def _record(self, connection: str, events: Sequence[Event]) -> None:
        conn = self._connections.get(connection)
        if conn is None:
            conn = self._connections[connection] = _Connection()
        wall, mono = self._wall_ns(), self._mono_ns()
        # The ids first: which client request went up under which id, re-sends and probes.
        # An event's class is compared once, through ``kind``, which mypy does not narrow by:
        # each branch names its event in a local of its class (no call, unlike cast()).
        forwarded: dict[int, list[int]] = {}
        sends = conn.sends
        sent_lists: list[list[bytearray]] = []
        for event in events:
            kind = type(event)
            if kind is Sent:
                sent: Sent = event  # type: ignore[assignment]  # kind is Sent
                sent_lists.append(sent.frames)
            elif kind is Forwarded:
                ahead: Forwarded = event  # type: ignore[assignment]  # kind is Forwarded
                client_cid, upstream_cid = ahead.client_correlation_id, ahead.upstream_correlation_id
                ids = forwarded.get(client_cid)
                if ids is None:
                    forwarded[client_cid] = [upstream_cid]
                else:
                    ids.append(upstream_cid)
                _remember(sends, upstream_cid, (client_cid, ahead.api_key, ahead.api_version))
            elif kind is RepairEvent:
                self._follow(conn, event)  # type: ignore[arg-type]  # kind is RepairEvent
        self._sent_lists, self._sent_ids = sent_lists, None
        for event in events:
            kind = type(event)
            if kind is Received:
                received: Received = event  # type: ignore[assignment]  # kind is Received
                if received.side == "client":
                    for head, frame in zip(received.heads, received.frames, strict=True):
                        self._client_request(conn, head, frame, forwarded, wall, mono)
                else:
                    for head, frame in zip(received.heads, received.frames, strict=True):
                        self._upstream_response(conn, head, frame, wall, mono)
            elif kind is Sent:
                sent = event  # type: ignore[assignment]  # kind is Sent
                if sent.side == "upstream":
                    for frame in sent.frames:
                        self._upstream_request(conn, frame, wall, mono)
                else:
                    for frame in sent.frames:
                        self._client_response(conn, frame, wall, mono)
            elif kind is RepairEvent:
                self._repair(conn, event)  # type: ignore[arg-type]  # kind is RepairEvent
        if self._requests_in:
            self._requests_in.clear()
        if self._answers_in:
            self._answers_in.clear()
        if sent_lists:  # the frames are not kept past the call
            self._sent_lists, self._sent_ids = [], None
        if self._records:
            self._release(connection)

    def connection_closed(self, connection: str, reason: str) -> None:
        conn = self._connections.pop(connection, None) or _Connection()
        self._other(conn, CLOSE, (None, None, None, reason, None, None, None))
        self._release(connection)

    def close_all(self, reason: str) -> None:
        """A close row for every connection still open: the capture ends before they do."""
        for connection in list(self._connections):
            self.connection_closed(connection, reason)

    def _follow(self, conn: _Connection, event: RepairEvent) -> None:
        """Ids a repair gives out: a re-send's new id, a probe's id."""
        new_id = event.new_upstream_correlation_id
        if event.kind is _REQUEUE and new_id is not None:
            old_id = event.upstream_correlation_id
            send = conn.sends.get(old_id) if old_id is not None else None
            client_cid = _nullable(event.client_correlation_id)
            if send is not None:
                api_key, api_version = send[1], send[2]
            else:
                api_key, api_version = _nullable(event.api_key), NULL
            _remember(conn.sends, new_id, (client_cid, api_key, api_version))
        elif event.kind is _PROBE_SENT and event.upstream_correlation_id is not None:
            _remember(conn.sends, event.upstream_correlation_id, (NULL, _API_VERSIONS, 0))

    def _repair(self, conn: _Connection, event: RepairEvent) -> None:
        old_id = event.upstream_correlation_id
        new_id = event.new_upstream_correlation_id
        send = conn.sends.get(old_id) if old_id is not None else None
        seq = conn.seq
        conn.seq = seq + 1
        self._extras.append(
            (
                len(self._records) // RECORD_SIZE,
                (None, None, event.kind.value, event.reason or None, event.attempt, new_id, None),
            )
        )
        self._records += pack_row(
            seq,
            self._wall_ns(),
            self._mono_ns(),
            _nullable(event.api_key),
            NULL if send is None else send[2],
            _nullable(event.client_correlation_id),
            _nullable(old_id),
            NULL,
            REPAIR,
            -1,
        )
        client_cid = event.client_correlation_id
        if event.kind is _REQUEUE and client_cid is not None:
            ask = conn.asks.get(client_cid)
            if ask is not None:
                conn.asks[client_cid] = (ask[0], ask[1], _nullable(new_id))

    # -- frames: each packs its row and keeps its frame's bytes ---------------------------

    def _client_request(
        self,
        conn: _Connection,
        head: bytes,
        frame: bytearray,
        forwarded: dict[int, list[int]],
        wall: int,
        mono: int,
    ) -> None:
        seq = conn.seq
        conn.seq = seq + 1
        length = len(frame)
        if conn.sasl is not None and conn.sasl.client_request():
            self._token(seq, CLIENT_REQUEST, wall, mono, head, length)
            return
        if length < _REQUEST_FIXED_HEADER:  # too short for a header: kept whole
            self._records += pack_row(seq, wall, mono, NULL, NULL, NULL, NULL, length, CLIENT_REQUEST, length)
            self._frames.append(head)
            return
        api_key, api_version, client_cid = _REQUEST_HEAD.unpack_from(head, 4)
        ids = forwarded.get(client_cid)
        upstream_cid = ids.pop(0) if ids else NULL  # NULL: the proxy answered it itself
        _remember(conn.asks, client_cid, (api_key, api_version, upstream_cid))
        limit = self.snaplen
        if not limit or api_key == _SASL_AUTHENTICATE:
            limit = _request_header_end(frame)  # the id the machine patched is not in the way
        piece = len(self._frames)
        if length <= limit and length == len(head):  # the head is all of it (small frames)
            self._frames.append(head)
            stored = length
        else:
            stored = self._received_bytes(head, frame, limit)
        records = self._records
        records += pack_row(
            seq, wall, mono, api_key, api_version, client_cid, upstream_cid, length, CLIENT_REQUEST, stored
        )
        if (
            stored >= SHARED_MIN
            and upstream_cid != NULL
            and self._was_sent(frame)
            and _head_is_enough(conn.headers, head, api_key)
        ):
            row = len(records) // RECORD_SIZE - 1
            self._requests_in[id(frame)] = (row, piece, len(self._frames) - piece, head)
        if api_key == _SASL_HANDSHAKE and is_sasl_v0_handshake(api_key, api_version):
            conn.sasl = conn.sasl or SaslTokens()
            conn.sasl.handshake_sent(frame)

    def _upstream_request(self, conn: _Connection, frame: bytearray, wall: int, mono: int) -> None:
        seq = conn.seq
        conn.seq = seq + 1
        length = len(frame)
        if conn.sasl is not None and conn.sasl.upstream_request():
            self._token(seq, UPSTREAM_REQUEST, wall, mono, frame, length)
            return
        if length < _REQUEST_FIXED_HEADER:
            self._records += pack_row(
                seq, wall, mono, NULL, NULL, NULL, NULL, length, UPSTREAM_REQUEST, length
            )
            self._frames.append(frame)
            return
        api_key, api_version, upstream_cid = _REQUEST_HEAD.unpack_from(frame, 4)
        send = conn.sends.get(upstream_cid)
        client_cid = NULL if send is None else send[0]
        limit = self.snaplen
        if not limit or api_key == _SASL_AUTHENTICATE:
            limit = _request_header_end(frame)
        stored = frame if length <= limit else memoryview(frame)[:limit]
        self._records += pack_row(
            seq,
            wall,
            mono,
            api_key,
            api_version,
            client_cid,
            upstream_cid,
            length,
            UPSTREAM_REQUEST,
            len(stored),
        )
        if self._holding:  # a re-send later in the pass patches the id in place: copy it now
            if len(stored) <= HEADER_COPY:
                self._frames.append(bytes(stored))
            else:
                fixed = _REQUEST_FIXED_HEADER
                self._frames += (bytes(stored[:fixed]), memoryview(stored)[fixed:])
                self._held_bytes += length
        else:
            self._frames.append(stored)
        if self._requests_in:
            received = self._requests_in.pop(id(frame), None)
            if received is not None:
                # The client's row keeps its head and names this row for the rest: the frame
                # sent is the one received, changed only in its head.
                at, piece, pieces, head = received
                STORED.pack_into(self._records, at * RECORD_SIZE + STORED_AT, SHARED_HEAD)
                self._frames[piece : piece + pieces] = [memoryview(head)[:SHARED_HEAD]] + [b""] * (pieces - 1)
                self._extras.append((at, (None, None, None, None, None, None, seq)))

    def _upstream_response(
        self, conn: _Connection, head: bytes, frame: bytearray, wall: int, mono: int
    ) -> None:
        seq = conn.seq
        conn.seq = seq + 1
        length = len(frame)
        if conn.sasl is not None and conn.sasl.upstream_response():
            self._token(seq, UPSTREAM_RESPONSE, wall, mono, head, length)
            return
        if length < _RESPONSE_FIXED_HEADER:
            upstream_cid, client_cid, api_key, api_version = NULL, NULL, NULL, NULL
        else:
            (upstream_cid,) = _RESPONSE_ID.unpack_from(head, 4)
            client_cid, api_key, api_version = conn.sends.pop(upstream_cid, _NO_SEND)
            sasl = conn.sasl
            if sasl is not None and api_key == _SASL_HANDSHAKE and is_sasl_v0_handshake(api_key, api_version):
                sasl.handshake_answered(frame)
        limit = self.snaplen
        if not limit or api_key == _SASL_AUTHENTICATE:
            limit = _response_header_end(frame, api_key, api_version)
        if length <= limit and length == len(head):  # the head is all of it (small frames)
            self._frames.append(head)
            stored = length
        else:
            stored = self._received_bytes(head, frame, limit)
        self._records += pack_row(
            seq, wall, mono, api_key, api_version, client_cid, upstream_cid, length, UPSTREAM_RESPONSE, stored
        )
        if stored >= SHARED_MIN and upstream_cid != NULL and self._was_sent(frame):
            self._answers_in[id(frame)] = (seq, stored)

    def _client_response(self, conn: _Connection, frame: bytearray, wall: int, mono: int) -> None:
        seq = conn.seq
        conn.seq = seq + 1
        length = len(frame)
        if conn.sasl is not None and conn.sasl.client_response():
            self._token(seq, CLIENT_RESPONSE, wall, mono, frame, length)
            return
        if length < _RESPONSE_FIXED_HEADER:
            client_cid, api_key, api_version, upstream_cid = NULL, NULL, NULL, NULL
        else:
            (client_cid,) = _RESPONSE_ID.unpack_from(frame, 4)
            api_key, api_version, upstream_cid = conn.asks.pop(client_cid, _NO_SEND)
        limit = self.snaplen
        if not limit or api_key == _SASL_AUTHENTICATE:
            limit = _response_header_end(frame, api_key, api_version)
        stored = frame if length <= limit else memoryview(frame)[:limit]
        received = self._answers_in.pop(id(frame), None) if self._answers_in else None
        if received is not None and received[1] == len(stored):
            # This row keeps its head and names the upstream response's row for the rest: the
            # frame sent is the one received, changed only in its head.
            self._extras.append(
                (len(self._records) // RECORD_SIZE, (None, None, None, None, None, None, received[0]))
            )
            stored = memoryview(frame)[:SHARED_HEAD]
        if length > HEADER_COPY:  # kept alive by reference until the rows are queued
            self._held_bytes += length
        self._records += pack_row(
            seq,
            wall,
            mono,
            api_key,
            api_version,
            client_cid,
            upstream_cid,
            length,
            CLIENT_RESPONSE,
            len(stored),
        )
        self._frames.append(stored)

    # -- helpers -----------------------------------------------------------------------

    def _was_sent(self, frame: bytearray) -> bool:
        """Whether this call also sends the frame on (the same object). The set of the call's
        sent frames is made for the first frame big enough to share, not for every call."""
        sent_ids = self._sent_ids
        if sent_ids is None:
            sent_ids = self._sent_ids = {id(sent) for frames in self._sent_lists for sent in frames}
        return id(frame) in sent_ids

    def _received_bytes(self, head: bytes, frame: bytearray, limit: int) -> int:
        """Queue a received frame's first ``limit`` bytes: its head as it arrived, then, if the
        head is not all of them, the frame's own bytes after it. Returns how many."""
        start = len(head)
        if len(frame) <= start or limit <= start:
            piece = head if limit >= start else head[:limit]
            self._frames.append(piece)
            return len(piece)
        rest = memoryview(frame)[start:limit]
        self._frames += (head, rest)
        self._held_bytes += len(frame)  # kept alive by reference until the rows are queued
        return start + len(rest)

    def _other(self, conn: _Connection, shape: int, extra: Extra) -> None:
        """An open or close row."""
        seq = conn.seq
        conn.seq = seq + 1
        self._extras.append((len(self._records) // RECORD_SIZE, extra))
        self._records += pack_row(
            seq, self._wall_ns(), self._mono_ns(), NULL, NULL, NULL, NULL, NULL, shape, -1
        )

    def _token(
        self, seq: int, shape: int, wall: int, mono: int, frame: bytes | bytearray, length: int
    ) -> None:
        """A SASL v0 token: credentials, so only its size prefix is kept."""
        kept = bytes(frame[:4])
        self._extras.append((len(self._records) // RECORD_SIZE, _TOKEN))
        self._records += pack_row(seq, wall, mono, NULL, NULL, NULL, NULL, length, shape, len(kept))
        self._frames.append(kept)

    def _abandon_call(self, events: Sequence[Event]) -> None:
        """Drop what a failed call gathered (the pass's earlier calls keep theirs), and count
        as lost every row its events would have made, packed yet or not; say so at most every
        10 s."""
        lost = _rows_of(events)
        kept = self._run_rows
        del self._records[kept * RECORD_SIZE :]
        del self._frames[self._run_pieces :]
        self._extras = [extra for extra in self._extras if extra[0] < kept]
        self._requests_in.clear()
        self._answers_in.clear()
        self._sent_lists, self._sent_ids = [], None
        if lost:
            self._columns.count_lost(lost)
        self._log_failure("capture rows could not be recorded, rows lost", sum(lost.values()))

    def _log_failure(self, message: str, rows: int) -> None:
        now = time.monotonic()
        if now >= self._next_error:
            self._next_error = now + WARNING_INTERVAL
            log.exception(message, rows=rows)

    def _release(self, connection: str) -> None:
        """The call's rows are a run of this connection's; queued now, or at the pass's end."""
        rows = len(self._records) // RECORD_SIZE
        if rows > self._run_rows:
            self._runs.append((connection, rows - self._run_rows))
            self._run_rows = rows
            self._run_pieces = len(self._frames)
        if not self._holding or rows >= HELD_ROWS or self._held_bytes >= HELD_BYTES:
            self._queue_runs()

    def _queue_runs(self) -> None:
        records, frames, extras, runs = self._records, self._frames, self._extras, self._runs
        self._records, self._frames, self._extras, self._runs = bytearray(), [], [], []
        self._run_rows = self._run_pieces = self._held_bytes = 0
        if not runs:
            return
        try:
            self._columns.extend(runs, records, frames, extras)
        except Exception:  # a bug costs rows, never the relay; extend counted those it did not queue
            self._log_failure(
                "capture rows could not be queued, any not queued are lost", len(records) // RECORD_SIZE
            )


def _rows_of(events: Sequence[Event]) -> Counter[str]:
    """Rows per kind that these events make: one per frame received or sent, one per repair."""
    rows: Counter[str] = Counter()
    for event in events:
        if isinstance(event, Received | Sent):
            rows[RowKind.FRAME.value] += len(event.frames)
        elif isinstance(event, RepairEvent):
            rows[RowKind.REPAIR.value] += 1
    return rows


def _head_is_enough(headers: RequestHeaderReader, head: bytes, api_key: int) -> bool:
    """Whether a request's first :data:`SHARED_HEAD` bytes hold what readers take from a
    client row's head: the whole header and, for Produce, the acks (a long client id or
    transactional id can push them past it; then the frame is not shared). The header is
    read with the connection's reader, which reads a header of a shape it has seen in one
    unpack: a full parse here was a sixth of the recorder's time for a frame it shares."""
    try:
        _, api_version, _, body_offset = headers.fields(head)
        if body_offset is None or body_offset > SHARED_HEAD:
            return False
        if api_key == _PRODUCE:
            produce_acks_at(memoryview(head)[:SHARED_HEAD], api_version, body_offset)
    except (ProtocolError, ValueError, struct.error):
        return False
    return True


def _request_header_end(frame: bytes | bytearray) -> int:
    """Where a request's body starts: its header is all a header-only capture keeps."""
    with contextlib.suppress(ProtocolError):
        return parse_request_header(frame).body_offset or _REQUEST_FIXED_HEADER
    return _REQUEST_FIXED_HEADER


def _response_header_end(frame: bytes | bytearray, api_key: int, api_version: int) -> int:
    if api_key != NULL and api_version != NULL:
        with contextlib.suppress(ProtocolError, ValueError):
            return response_body_offset(frame, api_key, api_version)
    return _RESPONSE_FIXED_HEADER
