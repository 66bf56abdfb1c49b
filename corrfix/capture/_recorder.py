"""Turn the connection core's events into capture rows, with both ids on every frame row.

The relay hands over each batch of a connection's events as the core made them: the frames
received and sent on each side, which client request went upstream under which id
(``Forwarded``), and the repairs, whose ``requeue`` and ``probe_sent`` name the ids of
re-sends and probes. Ids are followed by those events alone: nothing is matched by bytes,
and nothing depends on the order in which a shell reports. This module copies what a row
needs at once (the repair machine patches frames in place later). SASL v0 tokens, which
have no header, are recognised by protocol's SASL v0 rule (:mod:`._sasl_v0`); neither they
nor SaslAuthenticate bodies are stored (credentials). Sans-IO: rows go to ``emit``, clocks
are injected.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from corrfix.capture._sasl_v0 import SaslTokens
from corrfix.capture.format import CAPTURE_SCHEMA, Direction, RowKind, Side
from corrfix.core import Event, Forwarded, Received, RepairEvent, RepairKind, Sent
from protocol import ApiKey, ProtocolError, is_sasl_v0_handshake, parse_request_header, response_body_offset

# Bound once: reading a member off an Enum class costs about 0.25 µs, and these are read per frame.
_SASL_AUTHENTICATE, _API_VERSIONS = ApiKey.SASL_AUTHENTICATE, ApiKey.API_VERSIONS

ROW_FIELDS: tuple[str, ...] = tuple(CAPTURE_SCHEMA.names[2:])
"""A row is a list of these values, in schema order after ``capture_id`` and ``source``,
which are the same for every row of a capture and added when rows become a batch."""
(
    CONNECTION_ID,
    SEQ,
    KIND,
    SIDE,
    DIRECTION,
    WALL_NS,
    MONO_NS,
    API_KEY,
    API_VERSION,
    CLIENT_CID,
    UPSTREAM_CID,
    FRAME_LENGTH,
    FRAME,
    CLIENT_ADDRESS,
    UPSTREAM_ADDRESS,
    EVENT,
    REASON,
    ATTEMPT,
    NEW_UPSTREAM_CID,
) = range(len(ROW_FIELDS))

Row = list[object]
_UNKNOWN = (None,) * (len(ROW_FIELDS) - 7)
if ROW_FIELDS[:7] != ("connection_id", "seq", "kind", "side", "direction", "wall_ns", "mono_ns"):
    raise ImportError("the capture schema changed: update Recorder._row")
Emit = Callable[[list[Row]], None]

MAX_TRACKED_IDS = 4096
"""Ids remembered per connection and side; answers that never come (acks=0) age out."""
SASL_TOKEN = "sasl_v0_token"
"""The ``reason`` of a frame row that is a SASL v0 token: no header, only its size is kept."""
_REQUEST_FIXED_HEADER = 12  # size, api key, api version, correlation id
_RESPONSE_FIXED_HEADER = 8  # size, correlation id
_REQUEST_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id, after the size
_OPEN, _CLOSE, _REPAIR, _FRAME = (
    k.value for k in (RowKind.OPEN, RowKind.CLOSE, RowKind.REPAIR, RowKind.FRAME)
)
_CLIENT, _UPSTREAM = Side.CLIENT.value, Side.UPSTREAM.value
_REQUEST, _RESPONSE = Direction.REQUEST.value, Direction.RESPONSE.value


@dataclass(slots=True)
class _Ask:
    """A client request the client has not yet been answered for."""

    api_key: int | None
    api_version: int | None
    upstream_cid: int | None = None


@dataclass(slots=True)
class _Connection:
    seq: int = 0
    rows: list[Row] = field(default_factory=list)
    # upstream id -> (client id, api key, api version) of sends not yet answered.
    sends: dict[int, tuple[int | None, int | None, int | None]] = field(default_factory=dict)
    # client id -> the client's request, until the client gets its answer.
    asks: dict[int, _Ask] = field(default_factory=dict)
    sasl: SaslTokens | None = None  # once a SaslHandshake v0 went by


def _remember(table: dict, key: int, value: object) -> None:
    table.pop(key, None)
    table[key] = value
    if len(table) > MAX_TRACKED_IDS:
        del table[next(iter(table))]


def _int(frame: bytearray, start: int, stop: int) -> int | None:
    if len(frame) < stop:
        return None
    return int.from_bytes(frame[start:stop], "big", signed=True)


class Recorder:
    """One capture's rows; implements the relay's ``ConnectionObserver`` calls."""

    def __init__(
        self,
        emit: Emit,
        snaplen: int,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if snaplen < 0:
            raise ValueError(f"snaplen must be >= 0, got {snaplen}")
        self._emit = emit
        self.snaplen = snaplen
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._connections: dict[str, _Connection] = {}

    # -- ConnectionObserver ------------------------------------------------------------

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        conn = self._connections.get(connection)
        if conn is None:
            conn = self._connections[connection] = _Connection()
        row = self._row(conn, connection, _OPEN, None, None, self._wall_ns(), self._mono_ns())
        row[CLIENT_ADDRESS] = client
        row[UPSTREAM_ADDRESS] = upstream
        self._release(conn)

    def events(self, connection: str, events: Sequence[Event]) -> None:
        conn = self._connections.get(connection)
        if conn is None:
            conn = self._connections[connection] = _Connection()
        wall, mono = self._wall_ns(), self._mono_ns()
        # The ids first: which client request went up under which id, re-sends and probes.
        forwarded: dict[int, deque[int]] = {}
        for event in events:
            if isinstance(event, Forwarded):
                client_cid, upstream_cid = event.client_correlation_id, event.upstream_correlation_id
                forwarded.setdefault(client_cid, deque()).append(upstream_cid)
                _remember(conn.sends, upstream_cid, (client_cid, event.api_key, event.api_version))
            elif isinstance(event, RepairEvent):
                self._follow(conn, event)
        for event in events:
            if isinstance(event, Received):
                if event.side == "client":
                    for frame, length in zip(event.frames, event.lengths, strict=True):
                        self._client_request(conn, connection, frame, length, forwarded, wall, mono)
                else:
                    for frame, length in zip(event.frames, event.lengths, strict=True):
                        self._upstream_response(conn, connection, frame, length, wall, mono)
            elif isinstance(event, Sent):
                if event.side == "upstream":
                    for frame in event.frames:
                        self._upstream_request(conn, connection, frame, wall, mono)
                else:
                    for frame in event.frames:
                        self._client_response(conn, connection, frame, wall, mono)
            elif isinstance(event, RepairEvent):
                self._repair(conn, connection, event)
        self._release(conn)

    def connection_closed(self, connection: str, reason: str) -> None:
        conn = self._connections.pop(connection, None) or _Connection()
        row = self._row(conn, connection, _CLOSE, None, None, self._wall_ns(), self._mono_ns())
        row[REASON] = reason
        self._release(conn)

    def close_all(self, reason: str) -> None:
        """A close row for every connection still open: the capture ends before they do."""
        for connection in list(self._connections):
            self.connection_closed(connection, reason)

    def _follow(self, conn: _Connection, event: RepairEvent) -> None:
        """Ids a repair gives out: a re-send's new id, a probe's id."""
        new_id = event.new_upstream_correlation_id
        if event.kind is RepairKind.REQUEUE and new_id is not None:
            old_id = event.upstream_correlation_id
            send = conn.sends.get(old_id) if old_id is not None else None
            client_cid = event.client_correlation_id
            api_key, api_version = (send[1], send[2]) if send is not None else (event.api_key, None)
            _remember(conn.sends, new_id, (client_cid, api_key, api_version))
        elif event.kind is RepairKind.PROBE_SENT and event.upstream_correlation_id is not None:
            _remember(conn.sends, event.upstream_correlation_id, (None, _API_VERSIONS, 0))

    def _repair(self, conn: _Connection, connection: str, event: RepairEvent) -> None:
        row = self._row(conn, connection, _REPAIR, None, None, self._wall_ns(), self._mono_ns())
        row[API_KEY] = event.api_key
        row[CLIENT_CID] = event.client_correlation_id
        row[UPSTREAM_CID] = event.upstream_correlation_id
        row[NEW_UPSTREAM_CID] = event.new_upstream_correlation_id
        row[EVENT] = event.kind.value
        row[REASON] = event.reason or None
        row[ATTEMPT] = event.attempt
        old_id = event.upstream_correlation_id
        send = conn.sends.get(old_id) if old_id is not None else None
        if send is not None:
            row[API_VERSION] = send[2]
        if event.kind is RepairKind.REQUEUE and event.client_correlation_id is not None:
            ask = conn.asks.get(event.client_correlation_id)
            if ask is not None:
                ask.upstream_cid = event.new_upstream_correlation_id

    # -- frames ------------------------------------------------------------------------

    def _client_request(
        self,
        conn: _Connection,
        connection: str,
        frame: bytes,
        length: int,
        forwarded: dict[int, deque[int]],
        wall: int,
        mono: int,
    ) -> None:
        row = self._row(conn, connection, _FRAME, _CLIENT, _REQUEST, wall, mono)
        if conn.sasl is not None and conn.sasl.client_request():
            self._token(row, frame, length)
            return
        self._request_fields(row, frame, length)
        client_cid, api_key, api_version = row[CLIENT_CID], row[API_KEY], row[API_VERSION]
        if not isinstance(client_cid, int):
            return
        ids = forwarded.get(client_cid)
        upstream_cid = ids.popleft() if ids else None  # None: the proxy answered it itself
        row[UPSTREAM_CID] = upstream_cid
        _remember(conn.asks, client_cid, _Ask(row[API_KEY], row[API_VERSION], upstream_cid))
        if (
            isinstance(api_key, int)
            and isinstance(api_version, int)
            and is_sasl_v0_handshake(api_key, api_version)
        ):
            conn.sasl = conn.sasl or SaslTokens()
            conn.sasl.handshake_sent(frame)

    def _upstream_request(
        self, conn: _Connection, connection: str, frame: bytearray, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _UPSTREAM, _REQUEST, wall, mono)
        if conn.sasl is not None and conn.sasl.upstream_request():
            self._token(row, frame, len(frame))
            return
        self._request_fields(row, frame, len(frame))
        upstream_cid = row[CLIENT_CID]
        row[CLIENT_CID] = None
        row[UPSTREAM_CID] = upstream_cid
        send = conn.sends.get(upstream_cid) if isinstance(upstream_cid, int) else None
        if send is not None:
            row[CLIENT_CID] = send[0]

    def _upstream_response(
        self, conn: _Connection, connection: str, frame: bytes, length: int, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _UPSTREAM, _RESPONSE, wall, mono)
        if conn.sasl is not None and conn.sasl.upstream_response():
            self._token(row, frame, length)
            return
        upstream_cid = _int(frame, 4, 8)
        row[UPSTREAM_CID] = upstream_cid
        send = conn.sends.pop(upstream_cid, None) if upstream_cid is not None else None
        if send is not None:
            row[CLIENT_CID], row[API_KEY], row[API_VERSION] = send
            if conn.sasl is not None and is_sasl_v0_handshake(send[1], send[2]):
                conn.sasl.handshake_answered(frame)
        self._snap_response(row, frame, length)

    def _client_response(
        self, conn: _Connection, connection: str, frame: bytearray, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _CLIENT, _RESPONSE, wall, mono)
        if conn.sasl is not None and conn.sasl.client_response():
            self._token(row, frame, len(frame))
            return
        client_cid = _int(frame, 4, 8)
        row[CLIENT_CID] = client_cid
        ask = conn.asks.pop(client_cid, None) if client_cid is not None else None
        if ask is not None:
            row[API_KEY], row[API_VERSION], row[UPSTREAM_CID] = ask.api_key, ask.api_version, ask.upstream_cid
        self._snap_response(row, frame, len(frame))

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _row(
        conn: _Connection,
        connection: str,
        kind: str,
        side: str | None,
        direction: str | None,
        wall: int,
        mono: int,
    ) -> Row:
        seq = conn.seq
        conn.seq = seq + 1
        # In ROW_FIELDS order: the ids, then api key ... new upstream correlation id, all unknown yet.
        row: Row = [connection, seq, kind, side, direction, wall, mono, *_UNKNOWN]
        conn.rows.append(row)
        return row

    @staticmethod
    def _token(row: Row, frame: bytes | bytearray, length: int) -> None:
        """A SASL v0 token: credentials, so only its size prefix is kept."""
        row[FRAME_LENGTH] = length
        row[FRAME] = bytes(frame[:4])
        row[REASON] = SASL_TOKEN

    def _request_fields(self, row: Row, frame: bytes | bytearray, length: int) -> None:
        """Api key, version and correlation id (as CLIENT_CID) from fixed offsets, and the copy."""
        if len(frame) >= _REQUEST_FIXED_HEADER:
            row[API_KEY], row[API_VERSION], row[CLIENT_CID] = _REQUEST_HEAD.unpack_from(frame, 4)
        row[FRAME_LENGTH] = length
        limit = self.snaplen
        if not limit or row[API_KEY] == _SASL_AUTHENTICATE:  # the header only (no credentials)
            limit = _REQUEST_FIXED_HEADER
            with contextlib.suppress(ProtocolError):
                limit = parse_request_header(frame).body_offset or limit
        row[FRAME] = bytes(memoryview(frame)[:limit])

    def _snap_response(self, row: Row, frame: bytes | bytearray, length: int) -> None:
        row[FRAME_LENGTH] = length
        limit = self.snaplen
        if not limit or row[API_KEY] == _SASL_AUTHENTICATE:  # the header only
            limit = _RESPONSE_FIXED_HEADER
            api_key, api_version = row[API_KEY], row[API_VERSION]
            if isinstance(api_key, int) and isinstance(api_version, int):
                with contextlib.suppress(ProtocolError, ValueError):
                    limit = response_body_offset(frame, api_key, api_version)
        row[FRAME] = bytes(memoryview(frame)[:limit])

    def _release(self, conn: _Connection) -> None:
        rows = conn.rows
        if rows:
            conn.rows = []
            self._emit(rows)
