"""Clean TCP connections imported whole: one walk per direction instead of one step per segment.

Most connections of a capture are clean: they start with the handshake, each direction's
segments come in order and back to back (the next one starts where the last ended), none
is retransmitted, cut by the snap length or acknowledged before it was captured, and each
direction ends on a frame boundary. For such a connection the per-segment path
(:class:`._import.WireConnection`) can do nothing but frame each direction from its first
byte on, so here the direction is framed in one pass; frame times and row order come from
where each frame starts and ends among the packets. When each packet holds one whole frame
(checked for all at once), the frames are read where they lie in the mapped file and copied
once, into the batch written (:class:`FrameSource`); otherwise the direction's payloads
are joined and framed in one walk.

Every condition is checked for all the connection's packets at once (numpy), and a
connection that misses one goes through the per-segment path, which stays the reference:
the rows made here are the rows it would make, in its order (checked by the tests).

Any other connection (it started before the capture, lost or repeated packets, ...) is
read by the per-segment path until that path is at rest: in sync in both directions,
between frames, nothing held. From there on the per-segment path would frame clean
traffic as it frames a clean connection, so the rest, when it is clean (the same
conditions, from the sequence numbers reached), or else its longest clean run that ends
at rest again, is made here (:func:`rest_of_connection`), answers matched to the requests
that path still waits for too, and its state is moved past the run; after a run, the
per-segment path reads on.
"""

from __future__ import annotations

import collections
import mmap
import struct
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from corrfix.capture.pcap import _arrays as arrays
from corrfix.capture.pcap._packet_table import PacketColumns, big_endian
from corrfix.capture.pcap._packets import TH_ACK, TH_FIN, TH_RST, TH_SYN, format_address
from protocol import MIN_REQUEST_SIZE, SIZE_PREFIX

_Ints = npt.NDArray[np.int64]
_SEQ_MOD = 1 << 32
_HALF = 1 << 31
_MAX_STREAM = 1 << 30  # bytes per direction: offsets stay far from sequence number wrap-around
_MAX_MAPPED = (1 << 31) - 1  # frames read in place from files up to this size (Arrow's int32 offsets)
MIN_PACKETS = 32
"""Connections with fewer packets go through the per-segment path: cheaper than the set-up here."""
_SIZE = struct.Struct(">i")
_MIN_RESPONSE_SIZE = 4  # correlation id

# Row kinds, directions and reasons of the rows made here, as codes into these tuples.
KINDS = ("open", "frame", "close")
DIRECTIONS = ("request", "response")
REASONS = ("syn", "fin", "capture_end", "unmatched", "latency_unknown")
OPEN, FRAME, CLOSE = range(3)
SYN_REASON, FIN_REASON, END_REASON, UNMATCHED, LATENCY_UNKNOWN = range(5)
NO_REASON = -1


@dataclass(slots=True)
class Direction:
    """One direction of a clean connection, framed: where its frames start in the stream (each
    ends where the next starts) and where their bytes are (``at`` in ``buffer``: the mapped
    file when each packet holds one frame, else the joined payloads)."""

    starts: _Ints
    size: int  # the stream's bytes
    buffer: mmap.mmap | bytes
    at: _Ints

    @property
    def lengths(self) -> _Ints:
        return np.diff(np.append(self.starts, self.size))


@dataclass(slots=True)
class CleanConnection:
    """The rows of one clean connection, in its own row order (``seq``), as columns.

    ``frame_source[i]``: for frame rows, which direction (0: requests, 1: responses) and
    ``frame_number[i]`` which frame of it; -1 for the open and close rows.
    """

    connection_id: str
    client_address: str
    upstream_address: str
    packet: _Ints  # file index of the packet that completed the row (the order across connections)
    rank: _Ints  # order among the rows completed by the same packet
    at_end: bool  # the close row comes at the end of the capture (capture_end)
    opened_at: int  # file index of the first packet: orders the connections closed at the end
    kind: _Ints
    ts_ns: _Ints
    direction: _Ints  # index into DIRECTIONS, -1 for open and close rows
    api_key: _Ints
    api_version: _Ints
    known: npt.NDArray[np.bool_]  # api key and version known (requests, matched answers)
    correlation_id: _Ints
    frame_length: _Ints
    reason: _Ints  # index into REASONS or NO_REASON
    frame_number: _Ints
    directions: tuple[Direction, Direction]
    requests: int = 0
    responses: int = 0
    unmatched: int = 0
    latency_unknown: int = 0
    waiting: Waiting = field(default_factory=list)  # the rest of a connection: requests unanswered at its end
    first_seq: int = 0  # ``seq`` of its first row here
    whole: bool = True  # False: the frame rows of a connection's rest, no open nor close row
    closed_at: int | None = None  # the rest of a connection: the packet (of the rows) that closed it
    last_ts_ns: int = 0  # ... and the time of its last packet
    highest_request_id: int | None = None
    stream_bytes: tuple[int, int] = (0, 0)  # ... and the bytes of each direction (requests first)
    packets: int = 0  # ... and how many of its packets these rows took

    def frames_only(self) -> CleanConnection:
        """This connection less its open and close rows."""
        for name in _ROW_FIELDS:
            setattr(self, name, getattr(self, name)[1:-1])
        self.whole = False
        requests, responses = self.directions
        self.stream_bytes = (requests.size, responses.size)
        ids = self.correlation_id[self.direction == 0]
        self.highest_request_id = int(ids.max()) if len(ids) else None
        return self


_ROW_FIELDS = (
    "packet",
    "rank",
    "kind",
    "ts_ns",
    "direction",
    "api_key",
    "api_version",
    "known",
    "correlation_id",
    "frame_length",
    "reason",
    "frame_number",
)


Waiting = list[tuple[int, list[tuple[int, int, int]]]]
"""Unanswered requests by correlation id, in the per-segment path's order (oldest first):
(api key, version, the response stream's position when the request was read)."""


@dataclass(slots=True)
class RestStart:
    """Where the per-segment path stands, at rest, when it hands a connection over."""

    seqs: tuple[int, int]  # the sequence number each direction's stream is at (client's first)
    answers_at: int  # the response stream's position
    hole_end: (
        int  # where its latest unframed stretch ended (answers to requests read before: latency unknown)
    )
    waiting: Waiting


@dataclass(slots=True)
class Candidate:
    """A connection that is not clean (it started before the capture, lost packets, ...): the
    packets between its endpoints (positions in the columns, file order), which of them the
    client sent, and its endpoints (client, server)."""

    rows: _Ints
    from_client: npt.NDArray[np.bool_]
    endpoints: tuple[tuple[str, int], tuple[str, int]]


@dataclass(slots=True)
class CleanImport:
    """What the clean path made, the connections it did not take (for
    :func:`rest_of_connection`), and the packets (positions in the columns) left for the
    per-segment path."""

    connections: list[CleanConnection] = field(default_factory=list)
    midstream: list[Candidate] = field(default_factory=list)
    rest: _Ints = field(default_factory=lambda: np.zeros(0, np.int64))
    kafka_segments: int = 0


def import_clean(columns: PacketColumns, kafka_ports: Collection[int], max_frame_size: int) -> CleanImport:
    """The clean connections among ``columns``, each made into rows; every other packet in ``rest``."""
    ports = np.array(sorted(kafka_ports), np.int64)
    to_kafka = np.isin(columns.dport, ports)
    from_kafka = np.isin(columns.sport, ports)
    oriented = np.flatnonzero(to_kafka ^ from_kafka)
    result = CleanImport()
    if not len(oriented):
        result.rest = np.arange(len(columns.index), dtype=np.int64)
        return result
    up = to_kafka[oriented]
    client = np.where(
        up,
        columns.src[oriented] << 16 | columns.sport[oriented],
        columns.dst[oriented] << 16 | columns.dport[oriented],
    )
    server = np.where(
        up,
        columns.dst[oriented] << 16 | columns.dport[oriented],
        columns.src[oriented] << 16 | columns.sport[oriented],
    )
    # One number per connection (client and server), then one stable sort: its packets in file order.
    servers, server_number = np.unique(server, return_inverse=True)
    width = len(servers)
    if width >= 1 << 15:  # client endpoints take 48 bits: number them too, so the product fits
        clients, client_number = np.unique(client, return_inverse=True)
    else:
        clients, client_number = None, client
    key = client_number.reshape(-1) * width + server_number.reshape(-1)
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    mixed = _keys_with_other_packets(columns, kafka_ports)
    rest = [np.flatnonzero(~(to_kafka ^ from_kafka))]
    for members in np.split(order, bounds):
        rows = oriented[members]
        pair = int(key[members[0]])
        packed_client = pair // width if clients is None else int(clients[pair // width])
        endpoints = (_endpoint(columns, packed_client), _endpoint(columns, int(servers[pair % width])))
        clean = None
        candidate = len(rows) >= MIN_PACKETS and endpoints not in mixed
        if candidate:
            clean = _connection(columns, rows, up[members], endpoints, max_frame_size)
        if clean is None and candidate:
            result.midstream.append(Candidate(rows, up[members], endpoints))
        elif clean is None:
            rest.append(rows)
        else:
            result.connections.append(clean)
            result.kafka_segments += len(rows)
    result.rest = np.sort(np.concatenate(rest))
    return result


def rest_of_connection(
    columns: PacketColumns, candidate: Candidate, after: int, start: RestStart, max_frame_size: int
) -> CleanConnection | None:
    """The frame rows of ``candidate``'s packets after the first ``after``, from where the
    per-segment path stands (``start``): of all of them when they are clean from there on,
    else of the longest clean run of them that ends at rest (between frames in both
    directions; ``packets`` says how many); None when there is none worth it. The
    per-segment path read the packets before, and must have been at rest then (in sync,
    between frames, nothing held), so that from there on it would make exactly these rows,
    and be at rest again after a run, with the requests in ``waiting`` unanswered."""
    rows, from_client = candidate.rows[after:], candidate.from_client[after:]
    run, to_the_end = _run_at_rest(columns, rows, from_client, start, max_frame_size)
    if to_the_end:
        made = _connection(columns, rows, from_client, candidate.endpoints, max_frame_size, start)
        if made is not None:
            made.packets = len(rows)
            return made
    if run < MIN_PACKETS:
        return None
    made = _connection(columns, rows[:run], from_client[:run], candidate.endpoints, max_frame_size, start)
    if made is None:
        return None
    made.packets = run
    return made


def _run_at_rest(
    columns: PacketColumns,
    rows: _Ints,
    from_client: npt.NDArray[np.bool_],
    start: RestStart,
    largest: int,
) -> tuple[int, bool]:
    """How many of these packets make the longest run, from the start, that is clean (no SYN,
    RST nor FIN, no cut, back to back, no acknowledgement ahead) and ends at rest (each
    direction between frames), 0 for none; and whether nothing but a FIN ends the clean
    stretch (the rest may be clean to its close)."""
    flags = columns.flags[rows]
    length = columns.length[rows]
    seq, ack = columns.seq[rows], columns.ack[rows]
    has_ack = (flags & TH_ACK) != 0
    bad = ((flags & (TH_SYN | TH_RST | TH_FIN)) != 0) | ((columns.stop[rows] - columns.start[rows]) != length)
    sent_before = {}
    for client, isn in ((True, start.seqs[0]), (False, start.seqs[1])):
        mine = from_client == client
        sent = np.where(mine, length, 0)
        before = sent_before[client] = np.cumsum(sent) - sent
        bad |= mine & ((seq - isn) % _SEQ_MOD != before)
        bad |= before + sent >= _MAX_STREAM
        ahead = ((ack - isn) % _SEQ_MOD - before) % _SEQ_MOD
        bad |= ~mine & has_ack & (ahead > 1) & (ahead < _HALF)
    broken = np.flatnonzero(bad)
    run = int(broken[0]) if len(broken) else len(rows)
    to_the_end = run == len(rows) or int(flags[run]) & (TH_FIN | TH_SYN | TH_RST) == TH_FIN
    # After how many packets each direction is between frames.
    at_rest = np.ones(run + 1, bool)  # after 0..run packets
    for client in (True, False):
        data_at = np.flatnonzero((from_client[:run] == client) & (length[:run] > 0))
        sizes = length[data_at]
        ends = _frame_ends(columns, rows[data_at], sizes, client, largest)
        sent = np.zeros(run + 1, np.int64)
        np.cumsum(np.where(from_client[:run] == client, length[:run], 0), out=sent[1:])
        between = np.append(0, ends)  # sorted, as ``sent`` is
        at_rest &= between[np.minimum(np.searchsorted(between, sent), len(between) - 1)] == sent
    good = np.flatnonzero(at_rest)
    return (int(good[-1]) if len(good) else 0), to_the_end


def _frame_ends(columns: PacketColumns, rows: _Ints, lengths: _Ints, requests: bool, largest: int) -> _Ints:
    """Where the whole frames of these payloads end in their stream, from its start, up to the
    first that is not whole or has an impossible size."""
    smallest = MIN_REQUEST_SIZE if requests else _MIN_RESPONSE_SIZE
    if _one_frame_per_packet(columns.data, columns.start[rows], lengths, smallest, largest) is not None:
        return np.cumsum(lengths)
    data = b"".join(
        map(columns.data.__getitem__, map(slice, columns.start[rows].tolist(), columns.stop[rows].tolist()))
    )
    ends = []
    pos, end = 0, len(data)
    unpack = _SIZE.unpack_from
    while pos + SIZE_PREFIX <= end:
        size = unpack(data, pos)[0]
        if not smallest <= size <= largest or pos + SIZE_PREFIX + size > end:
            break
        pos += SIZE_PREFIX + size
        ends.append(pos)
    return np.array(ends, np.int64)


def _endpoint(columns: PacketColumns, packed: int) -> tuple[str, int]:
    return columns.addresses[packed >> 16], packed & 0xFFFF


def _keys_with_other_packets(
    columns: PacketColumns, kafka_ports: Collection[int]
) -> set[tuple[tuple[str, int], tuple[str, int]]]:
    """Connections (client, server) some of whose packets only the per-packet parser read."""
    mixed = set()
    for seg in columns.others:
        src, dst = (seg.src, seg.sport), (seg.dst, seg.dport)
        if seg.dport in kafka_ports:
            mixed.add((src, dst))
        if seg.sport in kafka_ports:
            mixed.add((dst, src))
    return mixed


def _connection(
    columns: PacketColumns,
    rows: _Ints,
    from_client: npt.NDArray[np.bool_],
    endpoints: tuple[tuple[str, int], tuple[str, int]],
    max_frame_size: int,
    start: RestStart | None = None,
) -> CleanConnection | None:
    """The rows of the connection made of these packets (file order), or None if it is not clean.

    With ``start`` (where the per-segment path stands), the packets are the rest of a
    connection whose start that path read: no SYN among them, and the rows made are its
    frame rows only (see :func:`rest_of_connection`).
    """
    flags = columns.flags[rows]
    if (flags & TH_RST).any():
        return None
    syn = (flags & TH_SYN) != 0
    has_ack = (flags & TH_ACK) != 0
    length = columns.length[rows]
    if start is not None:
        if syn.any():
            return None
    elif not _handshake(syn, has_ack, from_client, length):
        return None
    fin = (flags & TH_FIN) != 0
    client_fins = np.flatnonzero(fin & from_client)
    server_fins = np.flatnonzero(fin & ~from_client)
    closed_at = max(client_fins[0], server_fins[0]) if len(client_fins) and len(server_fins) else None
    live = len(rows) if closed_at is None else int(closed_at) + 1
    rows, length = rows[:live], length[:live]
    from_client, has_ack, fin = from_client[:live], has_ack[:live], fin[:live]
    if ((columns.stop[rows] - columns.start[rows]) != length).any():
        return None  # the snap length cut a packet
    seq = columns.seq[rows]
    if start is None:
        isn = {True: (int(seq[0]) + 1) % _SEQ_MOD, False: (int(seq[1]) + 1) % _SEQ_MOD}
    else:
        isn = {True: start.seqs[0], False: start.seqs[1]}
    # Bytes each direction sent before each packet, and whether every packet is where they end.
    before = {}
    for client in (True, False):
        mine = from_client == client
        sent = np.where(mine, length, 0)
        before[client] = np.cumsum(sent) - sent
        if before[client][-1] + sent[-1] >= _MAX_STREAM:
            return None
        position = np.flatnonzero(mine)[0 if start else 1 :]  # after the SYN
        own_fins = np.flatnonzero(fin[position])
        if len(own_fins) > 1:
            return None
        through = own_fins[0] + 1 if len(own_fins) else len(position)
        relative = (seq[position] - isn[client]) % _SEQ_MOD
        if (relative[:through] != before[client][position[:through]]).any() or length[
            position[through:]
        ].any():
            return None
    # No acknowledgement beyond what the peer sent before it, plus its FIN: the per-segment
    # path would declare the bytes in between a gap.
    ack = columns.ack[rows]
    for client in (True, False):
        mine = np.flatnonzero((from_client == client) & has_ack)
        ahead = ((ack[mine] - isn[not client]) % _SEQ_MOD - before[not client][mine]) % _SEQ_MOD
        if ((ahead > 1) & (ahead < _HALF)).any():
            return None
    ts = columns.ts_ns[rows]
    directions = []
    framed = []
    for client in (True, False):
        data_at = np.flatnonzero((from_client == client) & (length > 0))
        found = _frames(columns, rows[data_at], client, max_frame_size)
        if found is None:
            return None
        direction, ends = found
        if not len(ends):
            directions.append(direction)
            framed.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
            continue
        packet_ends = np.cumsum(length[data_at])
        first = np.searchsorted(packet_ends, direction.starts, side="right")
        last = np.searchsorted(packet_ends, ends - 1, side="right")
        directions.append(direction)
        framed.append((ts[data_at[first]], data_at[last]))
    answers_from = None
    if start is not None:  # the response stream's position as each request is read
        answers_from = start.answers_at + before[False][framed[0][1]]
    made = _rows(columns, rows, ts, endpoints, closed_at is not None, directions, framed, start, answers_from)
    if start is not None:
        made.closed_at = None if closed_at is None else int(closed_at)
        made.last_ts_ns = int(ts[-1])
        return made.frames_only()
    return made


def _handshake(
    syn: npt.NDArray[np.bool_],
    has_ack: npt.NDArray[np.bool_],
    from_client: npt.NDArray[np.bool_],
    length: _Ints,
) -> bool:
    """The client's SYN, then the server's SYN-ACK, and no other SYN; no data in either."""
    if not (from_client[0] and syn[0] and not has_ack[0]) or from_client[1] or not (syn[1] and has_ack[1]):
        return False
    return not (syn[2:].any() or length[0] or length[1])


def _frames(
    columns: PacketColumns, rows: _Ints, requests: bool, max_frame_size: int
) -> tuple[Direction, _Ints] | None:
    """The direction framed (and its frame ends in the stream), or None when a size is
    impossible or the last frame is not whole."""
    smallest = MIN_REQUEST_SIZE if requests else _MIN_RESPONSE_SIZE
    lengths = columns.length[rows]
    size = int(lengths.sum())
    starts = _one_frame_per_packet(columns.data, columns.start[rows], lengths, smallest, max_frame_size)
    if starts is not None and len(columns.data) <= _MAX_MAPPED:
        direction = Direction(starts, size, columns.data, columns.start[rows])
    else:
        data = b"".join(
            map(
                columns.data.__getitem__,
                map(slice, columns.start[rows].tolist(), columns.stop[rows].tolist()),
            )
        )
        starts = _walk(data, smallest, max_frame_size)
        if starts is None:
            return None
        direction = Direction(starts, size, data, starts)
    ends = np.append(starts[1:], size) if len(starts) else starts
    return direction, ends


def _one_frame_per_packet(
    data: mmap.mmap, at: _Ints, lengths: _Ints, smallest: int, largest: int
) -> _Ints | None:
    """The frames' starts in the stream, when each packet (payload at ``at`` in ``data``)
    holds exactly one whole frame (small requests and answers usually do): checked for all
    at once. None when not."""
    if not len(at) or (lengths < SIZE_PREFIX).any():
        return None
    sizes = big_endian(data, at, SIZE_PREFIX, signed=True)
    if ((sizes + SIZE_PREFIX) != lengths).any() or (sizes < smallest).any() or (sizes > largest).any():
        return None
    return np.cumsum(lengths) - lengths


def _walk(data: bytes, smallest: int, largest: int) -> _Ints | None:
    """Frame starts, from each frame's size; None when a size is impossible or the last frame
    is not whole."""
    starts = []
    pos, end = 0, len(data)
    unpack = _SIZE.unpack_from
    while pos < end:
        if pos + SIZE_PREFIX > end:
            return None
        size = unpack(data, pos)[0]
        if not smallest <= size <= largest:
            return None
        starts.append(pos)
        pos += SIZE_PREFIX + size
    if pos != end:
        return None
    return np.array(starts, np.int64)


def _rows(
    columns: PacketColumns,
    rows: _Ints,
    ts: _Ints,
    endpoints: tuple[tuple[str, int], tuple[str, int]],
    closed: bool,
    directions: list[Direction],
    framed: list[tuple[_Ints, _Ints]],
    start: RestStart | None = None,
    answers_from: _Ints | None = None,
) -> CleanConnection:
    """Rows in the per-segment path's order: the open row, frames by the packet that completed
    them (in stream order within one), answers matched to requests (and to the requests
    waiting at ``start``; requests read when the response stream was at ``answers_from``),
    the close row."""
    requests, responses = directions
    (request_ts, request_done), (response_ts, response_done) = framed
    n_requests, n_responses = len(requests.starts), len(responses.starts)
    is_request = np.concatenate([np.ones(n_requests, bool), np.zeros(n_responses, bool)])
    done = np.concatenate([request_done, response_done])
    number = np.concatenate([np.arange(n_requests), np.arange(n_responses)])
    order = np.lexsort((number, done))
    is_request, done, number = is_request[order], done[order], number[order]
    frame_ts = np.concatenate([request_ts, response_ts])[order]

    at = requests.at + SIZE_PREFIX
    keys = big_endian(requests.buffer, at, 2, signed=True)
    versions = big_endian(requests.buffer, at + 2, 2, signed=True)
    request_ids = big_endian(requests.buffer, at + 4, 4, signed=True)
    response_ids = big_endian(responses.buffer, responses.at + SIZE_PREFIX, 4, signed=True)
    lengths = np.concatenate([requests.lengths, responses.lengths])[order]
    ids = np.concatenate([request_ids, response_ids])[order]
    since = np.zeros(n_requests, np.int64) if answers_from is None else answers_from
    at_once = _match_at_once(is_request, ids, keys, versions, number, since, start)
    if at_once is not None:
        found, late, waiting = at_once
    else:
        seed, hole_end = ([], -1) if start is None else (start.waiting, start.hole_end)
        found, late, waiting = _match(
            is_request.tolist(),
            ids.tolist(),
            keys.tolist(),
            versions.tolist(),
            number.tolist(),
            since.tolist(),
            seed,
            hole_end,
        )
    api_key, api_version, known, unmatched = found

    n = len(order)
    first_packet = int(columns.index[rows[0]])
    close_packet = int(columns.index[rows[-1]])
    packet = np.concatenate([[first_packet], columns.index[rows[done]], [close_packet]])
    rank = np.zeros(n + 2, np.int64)
    if n:
        same = np.concatenate([[False], done[1:] == done[:-1]])
        run_start = np.maximum.accumulate(np.where(same, 0, np.arange(n)))
        rank[1:-1] = np.arange(n) - run_start + 1
    rank[-1] = n + 1
    client, server = endpoints
    kind = np.full(n + 2, FRAME, np.int64)
    kind[0], kind[-1] = OPEN, CLOSE
    reason = np.where(unmatched, UNMATCHED, np.where(late, LATENCY_UNKNOWN, NO_REASON))
    return CleanConnection(
        connection_id=f"{format_address(*client)}-{format_address(*server)}",
        client_address=format_address(*client),
        upstream_address=format_address(*server),
        packet=packet.astype(np.int64),
        rank=rank,
        at_end=not closed,
        opened_at=first_packet,
        kind=kind,
        ts_ns=np.concatenate([[ts[0]], frame_ts, [ts[-1]]]).astype(np.int64),
        direction=np.concatenate([[-1], np.where(is_request, 0, 1), [-1]]).astype(np.int64),
        api_key=np.concatenate([[0], api_key, [0]]).astype(np.int64),
        api_version=np.concatenate([[0], api_version, [0]]).astype(np.int64),
        known=np.concatenate([[False], known, [False]]),
        correlation_id=np.concatenate([[0], ids, [0]]).astype(np.int64),
        frame_length=np.concatenate([[0], lengths, [0]]).astype(np.int64),
        reason=np.concatenate([[SYN_REASON], reason, [FIN_REASON if closed else END_REASON]]).astype(
            np.int64
        ),
        frame_number=np.concatenate([[-1], np.where(is_request, number, number + n_requests), [-1]]).astype(
            np.int64
        ),
        directions=(requests, responses),
        requests=n_requests,
        responses=n_responses,
        unmatched=int(np.count_nonzero(unmatched)),
        latency_unknown=int(np.count_nonzero(late)),
        waiting=waiting,
    )


_Found = tuple[_Ints, _Ints, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]


def _match_at_once(
    is_request: npt.NDArray[np.bool_],
    ids: _Ints,
    keys: _Ints,
    versions: _Ints,
    number: _Ints,
    since: _Ints,
    start: RestStart | None,
) -> tuple[_Found, npt.NDArray[np.bool_], Waiting] | None:
    """:func:`_match` with numpy, when every correlation id is used once (the requests waiting
    at ``start`` taken as requests before the first); None otherwise."""
    seed = [] if start is None else start.waiting
    if any(len(entries) != 1 for _, entries in seed):
        return None
    first = len(seed)
    entry = np.array([entries[0] for _, entries in seed], np.int64).reshape(-1, 3)
    all_request = np.concatenate([np.ones(first, bool), is_request])
    all_ids = np.concatenate([np.array([cid for cid, _ in seed], np.int64), ids])
    all_number = np.concatenate([np.arange(first), np.where(is_request, number + first, number)])
    all_keys, all_versions = np.concatenate([entry[:, 0], keys]), np.concatenate([entry[:, 1], versions])
    all_since = np.concatenate([entry[:, 2], since])
    unique = _match_unique(all_request, all_ids, all_keys, all_versions, all_number)
    if unique is None:
        return None
    found, unanswered, answered_by = unique
    late = np.zeros(len(all_ids), bool)
    waiting: Waiting = []
    if start is not None:
        answers = np.flatnonzero(answered_by >= 0)
        late[answers] = start.hole_end > all_since[all_number[answered_by[answers]]]
        which = all_number[unanswered]  # waiting in the order they were read (their ids are unique)
        entries = zip(
            all_keys[which].tolist(), all_versions[which].tolist(), all_since[which].tolist(), strict=True
        )
        waiting = [(cid, [e]) for cid, e in zip(all_ids[unanswered].tolist(), entries, strict=True)]
    api_key, api_version, known, unmatched = found
    return (api_key[first:], api_version[first:], known[first:], unmatched[first:]), late[first:], waiting


def _match_unique(
    is_request: npt.NDArray[np.bool_], ids: _Ints, keys: _Ints, versions: _Ints, number: _Ints
) -> tuple[_Found, _Ints, _Ints] | None:
    """:func:`_match` at once, for the usual connection: no correlation id used twice by the
    requests nor by the answers, and fewer requests waiting than are remembered; with the
    rows of the requests left unanswered, and for each row the row of the request it
    answers (-1: none). None otherwise."""
    from corrfix.capture.pcap._import import MAX_PENDING_REQUESTS

    request_at = np.flatnonzero(is_request)
    response_at = np.flatnonzero(~is_request)
    request_ids, response_ids = ids[request_at], ids[response_at]
    by_id = np.argsort(request_ids, kind="stable")
    sorted_ids = request_ids[by_id]
    if (sorted_ids[1:] == sorted_ids[:-1]).any():
        return None
    answered = np.sort(response_ids)
    if (answered[1:] == answered[:-1]).any():
        return None
    slot = np.minimum(np.searchsorted(sorted_ids, response_ids), max(len(sorted_ids) - 1, 0))
    matched = np.zeros(len(response_at), bool)
    if len(sorted_ids):
        request = request_at[by_id[slot]]
        matched = (sorted_ids[slot] == response_ids) & (request < response_at)
    answering = np.zeros(len(ids), bool)
    answering[response_at[matched]] = True
    waiting_count: _Ints = np.cumsum(is_request) - np.cumsum(answering)
    if len(waiting_count) and waiting_count.max() > MAX_PENDING_REQUESTS:
        return None
    api_key = np.zeros(len(ids), np.int64)
    api_version = np.zeros(len(ids), np.int64)
    api_key[request_at] = keys[number[request_at]]
    api_version[request_at] = versions[number[request_at]]
    if len(sorted_ids):
        source = number[request_at[by_id[slot[matched]]]]
        api_key[response_at[matched]] = keys[source]
        api_version[response_at[matched]] = versions[source]
    known = is_request.copy()
    known[response_at[matched]] = True
    answered_by = np.full(len(ids), -1, np.int64)
    answered = np.zeros(len(ids), bool)
    if len(sorted_ids):
        answered_by[response_at[matched]] = request_at[by_id[slot[matched]]]
        answered[answered_by[response_at[matched]]] = True
    return (api_key, api_version, known, ~known), request_at[~answered[request_at]], answered_by


def _match(
    is_request: list[bool],
    ids: list[int],
    keys: list[int],
    versions: list[int],
    number: list[int],
    since: list[int],
    seed: Waiting,
    hole_end: int,
) -> tuple[tuple[_Ints, _Ints, npt.NDArray[np.bool_], npt.NDArray[np.bool_]], npt.NDArray[np.bool_], Waiting]:
    """Api key and version of each frame: a request's own, an answer's from the oldest
    unanswered request with its id (as :class:`._import.WireConnection` matches them), the
    requests in ``seed`` waiting before the first; request ``n`` was read when the response
    stream was at ``since[n]``. Also which answers' latency is unknown (their request was read
    before ``hole_end``), and the requests still waiting at the end, in the same form."""
    from corrfix.capture.pcap._import import MAX_PENDING_REQUESTS

    pending = collections.OrderedDict((cid, collections.deque(entries)) for cid, entries in seed)
    count = sum(len(entries) for _, entries in seed)
    out_key = [0] * len(ids)
    out_version = [0] * len(ids)
    known = [True] * len(ids)
    unmatched = [False] * len(ids)
    late = [False] * len(ids)
    for i, (request, correlation_id) in enumerate(zip(is_request, ids, strict=True)):
        if request:
            n = number[i]
            key, version = keys[n], versions[n]
            out_key[i], out_version[i] = key, version
            waiting = pending.get(correlation_id)
            if waiting is None:
                waiting = pending[correlation_id] = collections.deque()
            waiting.append((key, version, since[n]))
            pending.move_to_end(correlation_id)
            count += 1
            while count > MAX_PENDING_REQUESTS:
                oldest = next(iter(pending))
                queue = pending[oldest]
                queue.popleft()
                if not queue:
                    del pending[oldest]
                count -= 1
        else:
            waiting = pending.get(correlation_id)
            if waiting:
                out_key[i], out_version[i], read_at = waiting.popleft()
                late[i] = hole_end > read_at
                if not waiting:
                    del pending[correlation_id]
                count -= 1
            else:
                known[i] = False
                unmatched[i] = True
    found = (
        np.array(out_key, np.int64),
        np.array(out_version, np.int64),
        np.array(known, bool),
        np.array(unmatched, bool),
    )
    return found, np.array(late, bool), [(cid, list(entries)) for cid, entries in pending.items()]


@dataclass(slots=True)
class RowColumns:
    """Rows as Arrow columns (the capture schema's, less ``capture_id`` and ``source``) and the
    keys that put them in the per-segment path's write order: by ``packet`` (the file index of
    the packet that completed the row; :data:`AT_END` for rows made at the end of the capture),
    then ``opened`` (at the end: the first packet of the row's connection), then ``rank``."""

    columns: dict[str, pa.Array]  # all but ``frame``
    frames: FrameSource  # the ``frame`` column
    packet: _Ints
    opened: _Ints
    rank: _Ints
    ts_ns: _Ints  # the rows' times (``wall_ns``)


AT_END = np.iinfo(np.int64).max


@dataclass(slots=True)
class FrameSource:
    """The ``frame`` column, for taking rows from without building it first: ``chunks`` hold
    every frame's bytes, ``rows[i]`` is where row ``i``'s frame is among them (-1: null).

    Frames read in place are one binary array over the whole mapped file, whose elements are
    those frames and the bytes between them (frame ``k`` in file order is element ``2k``), so
    taking rows copies each frame once, from the file. Frames of joined payloads have an
    array each.
    """

    chunks: list[pa.Array]
    index: _Ints  # the frames' positions among the chunks' elements, by frame number
    rows: _Ints = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def of(cls, directions: list[Direction]) -> FrameSource:
        """The frames of these directions, numbered in this order."""
        counts = [len(d.starts) for d in directions]
        index = np.zeros(sum(counts), np.int64)
        chunks: list[pa.Array] = []
        firsts = np.cumsum([0, *counts])
        mapped = [n for n, d in enumerate(directions) if isinstance(d.buffer, mmap.mmap) and len(d.starts)]
        if mapped:
            at = np.concatenate([directions[n].at for n in mapped])
            ends = at + np.concatenate([directions[n].lengths for n in mapped])
            number = np.concatenate([np.arange(firsts[n], firsts[n + 1]) for n in mapped])
            by_place = np.argsort(at, kind="stable")
            offsets = np.empty(2 * len(at), np.int32)
            offsets[0::2], offsets[1::2] = at[by_place], ends[by_place]
            buffer = pa.py_buffer(directions[mapped[0]].buffer)
            chunks.append(
                pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), buffer])
            )
            index[number[by_place]] = 2 * np.arange(len(at))
        base = len(chunks[0]) if chunks else 0
        for n, d in enumerate(directions):
            if isinstance(d.buffer, bytes) and len(d.starts):
                chunks.append(arrays.binary(d.buffer, d.starts))
                index[firsts[n] : firsts[n + 1]] = base + np.arange(len(d.starts))
                base += len(d.starts)
        return cls(chunks, index)

    def extend(self, frames: pa.Array) -> None:
        """Rows after these, each with its own frame (``frames``, null for none)."""
        base = sum(len(chunk) for chunk in self.chunks)
        self.chunks.append(frames)
        self.rows = np.concatenate([self.rows, base + np.arange(len(frames), dtype=np.int64)])

    def take(self, rows: _Ints) -> pa.Array:
        """The ``frame`` column of these rows."""
        where = self.rows[rows]
        if not self.chunks:
            return pa.nulls(len(rows), pa.binary())
        if len(self.chunks) == 1:
            return self.chunks[0].take(arrays.integers(np.maximum(where, 0), pa.int64(), null=where < 0))
        # From each chunk its frames, then all in order (a chunked array's take costs its length).
        firsts = np.cumsum([0] + [len(chunk) for chunk in self.chunks])
        chunk = np.searchsorted(firsts, where, side="right") - 1
        position = np.full(len(where), -1, np.int64)
        parts = [self.chunks[0].slice(0, 0)]
        taken = 0
        for n in np.unique(chunk[where >= 0]).tolist():
            mine = np.flatnonzero((chunk == n) & (where >= 0))
            parts.append(self.chunks[n].take(arrays.indices(where[mine] - firsts[n])))
            position[mine] = taken + np.arange(len(mine))
            taken += len(mine)
        joined = pa.concat_arrays(parts)
        return joined.take(arrays.integers(np.maximum(position, 0), pa.int64(), null=position < 0))


def clean_columns(connections: list[CleanConnection]) -> RowColumns:
    """The rows of the clean connections as columns, with their write-order keys."""
    sizes = [len(c.kind) for c in connections]
    owner = np.repeat(np.arange(len(connections)), sizes)

    def joined(name: str) -> _Ints:
        return (
            np.concatenate([getattr(c, name) for c in connections]) if connections else np.zeros(0, np.int64)
        )

    kind = joined("kind")
    frame = kind == FRAME
    not_frame = ~frame
    direction = joined("direction")
    reason = joined("reason")
    known = np.concatenate([c.known for c in connections]) if connections else np.zeros(0, bool)
    ts = joined("ts_ns")
    source = FrameSource.of([d for c in connections for d in c.directions])
    first_numbers = np.cumsum([0] + [len(d.starts) for c in connections for d in c.directions])[:-1:2]
    frame_number = joined("frame_number") + np.repeat(first_numbers.astype(np.int64), sizes)
    # Open and close rows name the addresses; after the per-connection ones, a None (null).
    addresses = np.where(frame, len(connections), owner)
    seq = np.arange(len(kind), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    seq += np.repeat(np.array([c.first_seq for c in connections], np.int64), sizes)
    columns = {
        "connection_id": arrays.strings([c.connection_id for c in connections], owner),
        "seq": arrays.integers(seq, pa.int64()),
        "kind": arrays.strings(KINDS, kind),
        "side": arrays.strings(["client", None], not_frame.astype(np.int64)),
        "direction": arrays.strings([*DIRECTIONS, None], np.where(direction < 0, len(DIRECTIONS), direction)),
        "wall_ns": arrays.integers(ts, pa.int64()),
        "mono_ns": arrays.integers(ts, pa.int64()),
        "api_key": arrays.integers(joined("api_key"), pa.int16(), null=~known),
        "api_version": arrays.integers(joined("api_version"), pa.int16(), null=~known),
        "client_correlation_id": arrays.integers(joined("correlation_id"), pa.int32(), null=not_frame),
        "frame_length": arrays.integers(joined("frame_length"), pa.int32(), null=not_frame),
        "client_address": arrays.strings([*(c.client_address for c in connections), None], addresses),
        "upstream_address": arrays.strings([*(c.upstream_address for c in connections), None], addresses),
        "reason": arrays.strings([*REASONS, None], np.where(reason < 0, len(REASONS), reason)),
    }
    at_end = np.repeat(np.array([c.at_end for c in connections], bool), sizes) & (kind == CLOSE)
    packet = np.where(at_end, AT_END, joined("packet"))
    opened = np.where(at_end, np.repeat(np.array([c.opened_at for c in connections], np.int64), sizes), 0)
    source.rows = np.full(len(kind), -1, np.int64)
    source.rows[frame] = source.index[frame_number[frame]]
    return RowColumns(columns, source, packet, opened, joined("rank"), ts)
