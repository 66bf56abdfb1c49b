"""Turn observer calls into capture rows, with both correlation ids on every frame row.

The relay reports frames as they cross each side and repair events as they happen; this
module copies what a row needs at once (the repair machine patches frames in place later)
and follows the ids between the sides. It relies on the order in which the relay reports
(see ``ProxyConnection._apply``): a client request batch is followed at once by the same
requests sent upstream with their new ids (minus those the proxy answers itself, which are
recognised by their bytes); re-sends appear as upstream requests before the ``requeue``
events that name their client ids; probes are ApiVersions v0 sent as ``corrfix-probe``.
SASL v0 tokens, which have no header, are recognised as the repair machine recognises them
(:mod:`.sasl_v0`); neither they nor SaslAuthenticate bodies are stored (credentials).
Rows that still wait for an id are held back per connection, so each connection's rows
leave in ``seq`` order. Sans-IO: rows go to ``emit``, clocks are injected.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from corrfix.capture._sasl_v0 import SaslTokens
from corrfix.capture.format import CAPTURE_SCHEMA, Direction, RowKind, Side
from corrfix.core import PROBE_CLIENT_ID, RepairEvent, RepairKind
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
MAX_HELD_ROWS = 10_000
SASL_TOKEN = "sasl_v0_token"
"""The ``reason`` of a frame row that is a SASL v0 token: no header, only its size is kept."""
"""Rows held back for a missing id before they are released without it."""
_PROBE_CLIENT_ID = PROBE_CLIENT_ID.decode()
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
    held: list[Row] = field(default_factory=list)
    # Client request rows whose upstream id comes with the next upstream request batch.
    expected: deque[Row] = field(default_factory=deque)
    # Re-sent upstream request rows whose client id comes with their requeue event.
    unresolved: dict[int, Row] = field(default_factory=dict)
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
        self._boundary(conn)
        row = self._row(conn, connection, _OPEN, None, None, self._wall_ns(), self._mono_ns())
        row[CLIENT_ADDRESS] = client
        row[UPSTREAM_ADDRESS] = upstream
        conn.held.append(row)
        self._release(conn)

    def frames(self, connection: str, side: Side, direction: Direction, frames: list[bytearray]) -> None:
        conn = self._connections.get(connection)
        if conn is None:
            conn = self._connections[connection] = _Connection()
        wall, mono = self._wall_ns(), self._mono_ns()
        if direction == Direction.REQUEST:
            if side == Side.CLIENT:
                self._boundary(conn)
                for frame in frames:
                    self._client_request(conn, connection, frame, wall, mono)
            else:
                for frame in frames:
                    self._upstream_request(conn, connection, frame, wall, mono)
                conn.expected.clear()
        elif side == Side.UPSTREAM:
            self._boundary(conn)
            for frame in frames:
                self._upstream_response(conn, connection, frame, wall, mono)
        else:
            conn.expected.clear()  # whatever was not forwarded by now, the proxy answered itself
            for frame in frames:
                self._client_response(conn, connection, frame, wall, mono)
        self._release(conn)

    def repair(self, connection: str, event: RepairEvent) -> None:
        conn = self._connections.get(connection)
        if conn is None:
            conn = self._connections[connection] = _Connection()
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
        new_id = event.new_upstream_correlation_id
        if event.kind is RepairKind.REQUEUE and new_id is not None:
            self._resolve_resend(conn, event, new_id)
        conn.held.append(row)
        self._release(conn)

    def connection_closed(self, connection: str, reason: str) -> None:
        conn = self._connections.pop(connection, None) or _Connection()
        self._boundary(conn)
        row = self._row(conn, connection, _CLOSE, None, None, self._wall_ns(), self._mono_ns())
        row[REASON] = reason
        conn.held.append(row)
        self._release(conn)

    def close_all(self, reason: str) -> None:
        """A close row for every connection still open: the capture ends before they do."""
        for connection in list(self._connections):
            self.connection_closed(connection, reason)

    # -- frames ------------------------------------------------------------------------

    def _client_request(
        self, conn: _Connection, connection: str, frame: bytearray, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _CLIENT, _REQUEST, wall, mono)
        if conn.sasl is not None and conn.sasl.client_request():
            self._token(conn, row, frame)
            return
        self._request_fields(row, frame)
        client_cid = row[CLIENT_CID]
        if isinstance(client_cid, int):
            _remember(conn.asks, client_cid, _Ask(row[API_KEY], row[API_VERSION]))
        if is_sasl_v0_handshake(row[API_KEY], row[API_VERSION]):
            conn.sasl = conn.sasl or SaslTokens()
            conn.sasl.handshake_sent(frame)
        conn.expected.append(row)
        conn.held.append(row)

    def _upstream_request(
        self, conn: _Connection, connection: str, frame: bytearray, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _UPSTREAM, _REQUEST, wall, mono)
        if conn.sasl is not None and conn.sasl.upstream_request():
            self._token(conn, row, frame)
            return
        self._request_fields(row, frame)
        upstream_cid = row[CLIENT_CID]
        row[CLIENT_CID] = None
        row[UPSTREAM_CID] = upstream_cid
        api_key, api_version = row[API_KEY], row[API_VERSION]
        client_row = self._match_expected(conn.expected, frame, api_key, api_version)
        if client_row is not None:
            client_row[UPSTREAM_CID] = upstream_cid
            client_cid = client_row[CLIENT_CID]
            row[CLIENT_CID] = client_cid
            ask = conn.asks.get(client_cid) if isinstance(client_cid, int) else None
            if ask is not None:
                ask.upstream_cid = upstream_cid
        elif isinstance(upstream_cid, int) and not self._is_probe(api_key, api_version, frame):
            conn.unresolved[upstream_cid] = row
        if isinstance(upstream_cid, int):
            _remember(conn.sends, upstream_cid, (row[CLIENT_CID], api_key, api_version))
        conn.held.append(row)

    @staticmethod
    def _match_expected(
        expected: deque[Row], frame: bytearray, api_key: object, api_version: object
    ) -> Row | None:
        """The client request this upstream frame forwards. Requests the proxy answered itself
        were never forwarded: they are skipped (and forgotten) on the way."""
        while expected:
            row = expected.popleft()
            copy = row[FRAME]
            if (
                (row[API_KEY], row[API_VERSION]) == (api_key, api_version)
                and isinstance(copy, bytes)
                and memoryview(frame)[_REQUEST_FIXED_HEADER : len(copy)] == copy[_REQUEST_FIXED_HEADER:]
            ):
                return row
        return None

    def _upstream_response(
        self, conn: _Connection, connection: str, frame: bytearray, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _UPSTREAM, _RESPONSE, wall, mono)
        if conn.sasl is not None and conn.sasl.upstream_response():
            self._token(conn, row, frame)
            return
        upstream_cid = _int(frame, 4, 8)
        row[UPSTREAM_CID] = upstream_cid
        send = conn.sends.pop(upstream_cid, None) if upstream_cid is not None else None
        if send is not None:
            row[CLIENT_CID], row[API_KEY], row[API_VERSION] = send
            if conn.sasl is not None and is_sasl_v0_handshake(send[1], send[2]):
                conn.sasl.handshake_answered(frame)
        self._snap_response(row, frame)
        conn.held.append(row)

    def _client_response(
        self, conn: _Connection, connection: str, frame: bytearray, wall: int, mono: int
    ) -> None:
        row = self._row(conn, connection, _FRAME, _CLIENT, _RESPONSE, wall, mono)
        if conn.sasl is not None and conn.sasl.client_response():
            self._token(conn, row, frame)
            return
        client_cid = _int(frame, 4, 8)
        row[CLIENT_CID] = client_cid
        ask = conn.asks.pop(client_cid, None) if client_cid is not None else None
        if ask is not None:
            row[API_KEY], row[API_VERSION], row[UPSTREAM_CID] = ask.api_key, ask.api_version, ask.upstream_cid
        self._snap_response(row, frame)
        conn.held.append(row)

    def _resolve_resend(self, conn: _Connection, event: RepairEvent, new_id: int) -> None:
        row = conn.unresolved.pop(new_id, None)
        client_cid = event.client_correlation_id
        if row is not None:
            row[CLIENT_CID] = client_cid
            _remember(conn.sends, new_id, (client_cid, row[API_KEY], row[API_VERSION]))
        if client_cid is not None and (ask := conn.asks.get(client_cid)) is not None:
            ask.upstream_cid = new_id

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
        return [connection, seq, kind, side, direction, wall, mono, *_UNKNOWN]

    @staticmethod
    def _token(conn: _Connection, row: Row, frame: bytearray) -> None:
        """A SASL v0 token: credentials, so only its size prefix is kept."""
        row[FRAME_LENGTH] = len(frame)
        row[FRAME] = bytes(frame[:4])
        row[REASON] = SASL_TOKEN
        conn.held.append(row)

    def _request_fields(self, row: Row, frame: bytearray) -> None:
        """Api key, version and correlation id (as CLIENT_CID) from fixed offsets, and the copy."""
        if len(frame) >= _REQUEST_FIXED_HEADER:
            row[API_KEY], row[API_VERSION], row[CLIENT_CID] = _REQUEST_HEAD.unpack_from(frame, 4)
        row[FRAME_LENGTH] = len(frame)
        limit = self.snaplen
        if not limit or row[API_KEY] == _SASL_AUTHENTICATE:  # the header only (no credentials)
            limit = _REQUEST_FIXED_HEADER
            with contextlib.suppress(ProtocolError):
                limit = parse_request_header(frame).body_offset or limit
        row[FRAME] = bytes(memoryview(frame)[:limit])

    def _snap_response(self, row: Row, frame: bytearray) -> None:
        row[FRAME_LENGTH] = len(frame)
        limit = self.snaplen
        if not limit or row[API_KEY] == _SASL_AUTHENTICATE:  # the header only
            limit = _RESPONSE_FIXED_HEADER
            api_key, api_version = row[API_KEY], row[API_VERSION]
            if isinstance(api_key, int) and isinstance(api_version, int):
                with contextlib.suppress(ProtocolError, ValueError):
                    limit = response_body_offset(frame, api_key, api_version)
        row[FRAME] = bytes(memoryview(frame)[:limit])

    @staticmethod
    def _is_probe(api_key: object, api_version: object, frame: bytearray) -> bool:
        if api_key != _API_VERSIONS or api_version != 0:
            return False
        try:
            return parse_request_header(frame).client_id == _PROBE_CLIENT_ID
        except ProtocolError:
            return False

    def _boundary(self, conn: _Connection) -> None:
        """A new burst of relay calls began: ids still missing will not come any more."""
        conn.expected.clear()
        conn.unresolved.clear()

    def _release(self, conn: _Connection) -> None:
        held = conn.held
        if not held or ((conn.expected or conn.unresolved) and len(held) < MAX_HELD_ROWS):
            return
        conn.held = []
        self._emit(held)
