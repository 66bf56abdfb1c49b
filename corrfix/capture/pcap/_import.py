"""``corrfix capture import-pcap``: a tcpdump capture taken without corrfix, as a corrfix capture.

Each TCP connection to a Kafka port becomes one ``connection_id``. Both directions are
reassembled (:mod:`._tcp_stream`), split into frames (:mod:`._wire_frames`), and responses
are matched to requests by correlation id. On the wire there is only the client's id
space, so it goes into ``client_correlation_id`` and ``upstream_correlation_id`` stays
null. Every frame row has ``side="client"``: the wire between a client and its broker;
open and close rows have no side, as in proxy captures.

Timestamps are the packet's capture time, in ``wall_ns`` and (the capture has no other
clock) in ``mono_ns`` alike. A frame's time is that of the packet that carried its first
byte. Rows are written in the order the frames were completed; ``seq`` counts per
connection from the open row (0).

What the capture lacks is said in ``reason`` (comma-separated ``key`` or ``key=value``):
on frame rows ``gap_before``, ``skipped_before``, ``missing``, ``incomplete``,
``unmatched`` and ``latency_unknown``; on open rows ``syn`` or ``midstream``; on close rows ``fin``, ``rst``,
``new_syn`` (the same addresses and ports opened a new connection) or ``capture_end``, then
the bytes after the last frame of each direction that could not be framed
(``request_gap``, ``request_skipped``, ``response_gap``, ``response_skipped``).
docs/capture-format.md has the details.
"""

from __future__ import annotations

import collections
import math
import struct
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from corrfix.capture import SUMMARY_SUFFIX, CaptureFiles, write_summary
from corrfix.capture.format import RowKind, Source, schema_for
from corrfix.capture.pcap import _arrays as arrays
from corrfix.capture.pcap import _clean_streams
from corrfix.capture.pcap._clean_streams import (
    AT_END,
    Candidate,
    CleanConnection,
    FrameSource,
    RestStart,
    clean_columns,
    import_clean,
    rest_of_connection,
)
from corrfix.capture.pcap._packet_table import PacketColumns, packet_columns, read_segments
from corrfix.capture.pcap._packets import TH_ACK, PacketStats, TcpSegment, format_address
from corrfix.capture.pcap._provenance import (
    WireCaptureSummary,
    check_prior,
    default_capture_id,
    file_sha256,
    file_stem,
)
from corrfix.capture.pcap._tcp_stream import HeldBudget, Piece, StreamReassembler, sequence_after
from corrfix.capture.pcap._wire_frames import (
    RESPONSE_LOOKBACK,
    FrameSplitter,
    RequestBoundary,
    ResponseBoundary,
    WireFrame,
)
from protocol import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, request_header_end

DEFAULT_KAFKA_PORT = 9092
_FRAME, _CLIENT, _OPEN = RowKind.FRAME.value, "client", RowKind.OPEN.value
_CLEAN_PATH_MAX_BYTES = 2 * 1024**3  # larger pcaps stream segment by segment (the clean path holds all rows)
_FRAME_KEYS = (
    "connection_id",
    "seq",
    "kind",
    "side",
    "direction",
    "wall_ns",
    "mono_ns",
    "api_key",
    "api_version",
    "client_correlation_id",
    "frame_length",
    "frame",
    "reason",
)
MAX_PENDING_REQUESTS = 10_000  # unanswered requests remembered per connection (acks=0 never are)
MAX_HELD_ANSWERS = 256  # answers held while the requests are searched for
MAX_WAITING_SEGMENTS = 8  # segments of a connection held while an acknowledgement runs ahead of the data
_BATCH_ROWS = 1024
_ROTATE_BYTES = 256 * 1024 * 1024

Row = dict[str, Any]
_REQUEST_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_RESPONSE_ID = struct.Struct(">i")
Endpoint = tuple[str, int]


@dataclass(slots=True)
class ImportStats:
    """What an import found; printed by the command, returned by :func:`import_pcap`."""

    files: list[str] = field(default_factory=list)
    capture_id: str = ""
    packets: int = 0
    tcp_segments: int = 0
    kafka_segments: int = 0
    connections: int = 0
    requests: int = 0
    responses: int = 0
    unmatched_responses: int = 0
    latency_unknown: int = 0
    truncated_frames: int = 0
    gap_bytes: int = 0
    skipped_bytes: int = 0
    unsupported_link_types: dict[int, int] = field(default_factory=dict)
    ip_fragments: int = 0
    truncated_file: bool = False
    kafka_like_ports: dict[int, int] = field(default_factory=dict)  # other ports: segments opening a request
    pcap_sha256: str = ""
    already_imported: str | None = None  # the summary of an earlier import of the same pcap


class CaptureRowWriter:
    """Rows (dicts) to a capture directory, through the proxy capture's file layer.

    Files are named like a proxy capture's, after the first row's time, so captures of
    both sources sort together, but with the whole capture id; a JSON summary (source
    ``wire``, with the pcap's name and hash) sits next to them.
    """

    def __init__(
        self,
        directory: Path,
        capture_id: str,
        batch_rows: int = _BATCH_ROWS,
        *,
        pcap_name: str | None = None,
        pcap_sha256: str | None = None,
    ) -> None:
        self.directory = directory
        self.capture_id = capture_id
        self.pcap_name = pcap_name
        self.pcap_sha256 = pcap_sha256
        self.schema = schema_for(capture_id, Source.WIRE)
        self._fields = [(f.name, f) for f in self.schema]
        self._keys = set(_FRAME_KEYS)  # the columns the pending rows set
        self.batch_rows = batch_rows
        self.rows = 0
        self._pending: list[Row] = []
        self._files: CaptureFiles | None = None
        self._summary: WireCaptureSummary | None = None

    @property
    def files(self) -> list[Path]:
        return list(self._files.files) if self._files is not None else []

    def write(self, row: Row) -> None:
        if row["kind"] != _FRAME:
            self._keys |= row.keys()  # frame rows always have the same keys
        self._pending.append(row)
        self.rows += 1
        if len(self._pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        files = self._open(self._pending[0]["wall_ns"])
        pending, schema = self._pending, self.schema
        # Column by column: RecordBatch.from_pylist costs three times as much (and imports pandas).
        constant = {"capture_id": self.capture_id, "source": Source.WIRE.value}
        columns = [
            pa.array([constant[name]] * len(pending), f.type)
            if name in constant
            else pa.array([row.get(name) for row in pending], f.type)
            if name in self._keys
            else pa.nulls(len(pending), f.type)
            for name, f in self._fields
        ]
        self._keys = set(_FRAME_KEYS)
        files.write(pa.RecordBatch.from_arrays(columns, schema=schema))
        self._pending = []

    def write_columns(
        self,
        columns: dict[str, pa.Array],
        frames: FrameSource,
        order: npt.NDArray[np.int64],
        started: int,
    ) -> None:
        """Rows given as columns (those rows set; the capture id and source are added; the
        ``frame`` column from ``frames``), taken in ``order``: in batches of ``batch_rows``,
        as if written one by one. ``started``: the time of the first row in that order."""
        self.flush()
        if not len(order):
            return
        files = self._open(int(started))
        total = len(columns["wall_ns"])
        constant = {"capture_id": self.capture_id, "source": Source.WIRE.value}
        rows = pa.RecordBatch.from_arrays(
            [
                columns[name]
                if name in columns
                else arrays.strings([constant[name]], np.zeros(total, np.int64))
                if name in constant
                else pa.nulls(total, f.type)
                for name, f in self._fields
            ],
            schema=self.schema,
        )
        frame_at = self.schema.get_field_index("frame")
        # Taken batch by batch: a slice would write its parent's buffers, so other bytes.
        for first in range(0, len(order), self.batch_rows):
            batch = order[first : first + self.batch_rows]
            taken = rows.take(arrays.indices(batch))
            taken = taken.set_column(frame_at, self.schema.field(frame_at), frames.take(batch))
            files.write(taken)
            self.rows += taken.num_rows

    def _open(self, started: int) -> CaptureFiles:
        """The capture's files, named after the time of its first row."""
        if self._files is None:
            stem = file_stem(self.capture_id, started)
            self._files = CaptureFiles(
                self.directory, stem, self.schema, rotate_bytes=_ROTATE_BYTES, rotate_seconds=math.inf
            )
            self._summary = WireCaptureSummary(
                self.capture_id,
                Source.WIRE.value,
                started,
                pcap_name=self.pcap_name,
                pcap_sha256=self.pcap_sha256,
            )
        return self._files

    def close(self) -> None:
        self.flush()
        if self._files is None or self._summary is None:
            return
        self._files.finish_file()
        summary = self._summary
        summary.finished = True
        summary.rows_written = self.rows
        summary.files = [path.name for path in self._files.files]
        summary.updated_wall_ns = time.time_ns()
        write_summary(self.directory / f"{self._files.stem}{SUMMARY_SUFFIX}", summary)


class WireConnection:
    """One TCP connection between a Kafka client and a broker: segments in, rows out."""

    def __init__(
        self,
        connection_id: str,
        client: Endpoint,
        server: Endpoint,
        ts_ns: int,
        syn: bool,
        max_frame_size: int,
        budget: HeldBudget | None = None,
    ) -> None:
        self.connection_id = connection_id
        self.client = client
        self.server = server
        self.last_ts_ns = ts_ns
        self.fins: set[bool] = set()  # True: the client's FIN
        self._seq = 0
        # Unanswered requests by correlation id: (api key, version, responses delivered by then).
        self._pending: collections.OrderedDict[int, collections.deque[tuple[int, int, int]]] = (
            collections.OrderedDict()
        )
        self._pending_count = 0
        self._highest_id: int | None = None
        self.to_server = StreamReassembler(budget=budget)
        self.to_client = StreamReassembler(budget=budget)
        self.requests = FrameSplitter(RequestBoundary(max_frame_size=max_frame_size), synced=False)
        self.responses = FrameSplitter(
            ResponseBoundary(self._lookup, self._pending_ids, self._highest, max_frame_size=max_frame_size),
            synced=False,
            lookback=RESPONSE_LOOKBACK,
        )
        # Answers that matched nothing while the requests were out of sync: their request may
        # yet be proven (after its own answer arrived), so they wait for it.
        self._held_answers: list[WireFrame] = []
        # Segments waiting for the bytes an acknowledgement among them covers (see :meth:`segment`).
        self._waiting: collections.deque[tuple[TcpSegment, bool]] = collections.deque()
        self._new_ids: list[int] = []
        self.opened = self._row(RowKind.OPEN, ts_ns, reason="syn" if syn else "midstream")
        self.opened.update(self._addresses())
        self.stats = collections.Counter[str]()

    # -- segments --------------------------------------------------------------------------

    def segment(self, seg: TcpSegment, from_client: bool) -> list[Row]:
        """Rows completed by one segment.

        A capture can hold a segment after its acknowledgement (packets taken on different
        CPUs or interfaces are written in the order they reached the capture); read in that
        order, the acknowledgement would declare the bytes lost. So a segment acknowledging
        bytes no captured segment carried waits, and the connection's segments after it with
        it, until those bytes turn up: a segment of the other direction that acknowledges
        nothing unseen itself is read ahead of the waiting ones. After
        :data:`MAX_WAITING_SEGMENTS` the first waiting segment is read anyway.
        """
        self.last_ts_ns = seg.ts_ns
        waiting = self._waiting
        if waiting:
            waiting.append((seg, from_client))
            return self._catch_up(force=len(waiting) > MAX_WAITING_SEGMENTS)
        acked: list[Piece] | None = []
        if seg.flags & TH_ACK:
            acked = (self.to_client if from_client else self.to_server).acknowledged_if_seen(
                seg.ack, seg.ts_ns
            )
            if acked is None:
                waiting.append((seg, from_client))
                return []
        return self._segment(seg, from_client, acked)

    def _runs_ahead(self, seg: TcpSegment, from_client: bool) -> bool:
        """Whether ``seg`` acknowledges bytes of the other direction that no segment read carried."""
        return seg.has_ack and (self.to_client if from_client else self.to_server).acknowledges_unseen(
            seg.ack
        )

    def _catch_up(self, force: bool) -> list[Row]:
        """Read the waiting segments that can be read now, in order but for the other
        direction's first one, which may carry the bytes the first waiting segment
        acknowledges; with ``force``, the first waiting segment in any case."""
        rows: list[Row] = []
        waiting = self._waiting
        while waiting:
            seg, from_client = waiting[0]
            if force or not self._runs_ahead(seg, from_client):
                waiting.popleft()
                force = False
                rows += self._segment(seg, from_client)
                continue
            other = next((n for n, (_, client) in enumerate(waiting) if client != from_client), None)
            if other is None:
                break
            ahead, _ = waiting[other]
            if self._runs_ahead(ahead, not from_client):
                break
            # A sender's segments reach the capture in the order it sent them: once one sent
            # after the bytes the waiting segment acknowledges is seen, those bytes were lost.
            if ahead.has_ack and any(
                client == from_client and w.length and sequence_after(ahead.ack, w.seq)
                for w, client in waiting
            ):  # sent after a waiting segment reached its peer: it cannot be read before it
                if sequence_after(seg.ack, ahead.seq):
                    break  # it may carry some of those bytes again (a retransmission): wait
                force = True
                continue
            del waiting[other]
            rows += self._segment(ahead, not from_client)
            force = not sequence_after(seg.ack, ahead.seq + ahead.length)
        return rows

    def _segment(self, seg: TcpSegment, from_client: bool, acked: list[Piece] | None = None) -> list[Row]:
        """Rows completed by one segment, read now; ``acked``: what its acknowledgement
        delivered, when that was done already."""
        upstream, downstream = (self.to_server, self.requests), (self.to_client, self.responses)
        (sending, splitter), (other, other_splitter) = (
            (upstream, downstream) if from_client else (downstream, upstream)
        )
        rows: list[Row] = []
        if acked is None and seg.has_ack:
            acked = other.acknowledged(seg.ack, seg.ts_ns)
        if acked:  # first: what the peer acknowledged precedes what this segment carries
            rows += self._frames(acked, other_splitter, not from_client)
        seq = seg.seq
        if seg.syn:
            if not sending.started:
                sending.syn(seg.seq)
                splitter.synced = True
            seq += 1  # data in a SYN (TCP Fast Open) starts after it
        pieces = sending.segment(seq, seg.payload, seg.length, seg.ts_ns, fin=seg.fin)
        rows += self._frames(pieces, splitter, from_client)
        if seg.fin:
            self.fins.add(from_client)
        return rows + self._late_answers()

    def close(self, ts_ns: int, reason: str) -> list[Row]:
        """Deliver what the deferred segments and the streams still hold, then the close row."""
        rows: list[Row] = []
        while self._waiting:
            rows += self._catch_up(force=True)
        tokens = [reason]
        for stream, splitter, is_request, name in (
            (self.to_server, self.requests, True, "request"),
            (self.to_client, self.responses, False, "response"),
        ):
            rows += self._frames(stream.finish(ts_ns), splitter, is_request)
            frames, gap, skipped = splitter.finish(ts_ns)
            rows += [row for frame in frames if (row := self._frame_row(frame, is_request)) is not None]
            rows += self._late_answers(final=True)
            if gap:
                tokens.append(f"{name}_gap={gap}")
            if skipped:
                tokens.append(f"{name}_skipped={skipped}")
        closed = self._row(RowKind.CLOSE, ts_ns, reason=",".join(tokens))
        closed.update(self._addresses())
        rows.append(closed)
        self.stats["gap_bytes"] += self.requests.gap_bytes + self.responses.gap_bytes
        self.stats["skipped_bytes"] += self.requests.skipped_bytes + self.responses.skipped_bytes
        return rows

    def at_rest(self) -> bool:
        """Both directions in sync between frames, nothing held, no FIN:
        from here, clean traffic makes the rows a clean connection makes (see
        :func:`._clean_streams.rest_of_connection`)."""
        return (
            not self._waiting
            and not self._held_answers
            and not self._new_ids
            and not self.fins
            and self.to_server.at_rest
            and self.to_client.at_rest
            and self.requests.at_rest
            and self.responses.at_rest
        )

    def rest_start(self) -> RestStart:
        """Where this connection stands, for :func:`._clean_streams.rest_of_connection`."""
        waiting = [(cid, list(entries)) for cid, entries in self._pending.items()]
        seqs = (self.to_server.next_seq, self.to_client.next_seq)
        return RestStart(seqs, self.to_client.position, self.responses.hole_end, waiting)

    def advance(self, rest: CleanConnection) -> None:
        """The state reading ``rest`` (made from :meth:`rest_start`) segment by segment would
        have left."""
        self.to_server.advance(rest.stream_bytes[0])
        self.to_client.advance(rest.stream_bytes[1])
        rest.first_seq = self._seq
        rest.connection_id = self.connection_id
        self._seq += len(rest.kind)
        if rest.highest_request_id is not None and (
            self._highest_id is None or rest.highest_request_id > self._highest_id
        ):
            self._highest_id = rest.highest_request_id
        self.last_ts_ns = rest.last_ts_ns
        self._pending = collections.OrderedDict(
            (cid, collections.deque(entries)) for cid, entries in rest.waiting
        )
        self._pending_count = sum(len(entries) for _, entries in rest.waiting)

    # -- frames ----------------------------------------------------------------------------

    def _frames(self, pieces: list[Piece], splitter: FrameSplitter, is_request: bool) -> list[Row]:
        rows = []
        for piece in pieces:
            rows += [
                row
                for frame in splitter.feed(piece)
                if (row := self._frame_row(frame, is_request)) is not None
            ]
        return rows

    def _late_answers(self, final: bool = False) -> list[Row]:
        """Answers to requests proven since: found among searched bytes, or released from hold."""
        rows: list[Row] = []
        if self._new_ids:
            ids, self._new_ids = self._new_ids, []
            for frame in self.responses.reconsider(
                lambda buf, stop: ResponseBoundary.offsets_of(ids, buf, 0, stop)
            ):
                rows.append(self._response_row(frame))
        if self._held_answers and (
            final or not self.requests.searching or len(self._held_answers) > MAX_HELD_ANSWERS
        ):
            held, self._held_answers = self._held_answers, []
            rows += [self._response_row(frame) for frame in held]
        return rows

    def _frame_row(self, frame: WireFrame, is_request: bool) -> Row | None:
        """The frame's row; None for an answer held until the requests are in sync again."""
        if is_request:
            return self._request_row(frame)
        data = frame.data
        correlation_id = _RESPONSE_ID.unpack_from(data, SIZE_PREFIX)[0] if len(data) >= 8 else None
        if self.requests.searching and correlation_id not in self._pending:
            self._held_answers.append(frame)
            return None
        if self._held_answers:  # keep the answers in their order
            self._held_answers.append(frame)
            return None
        return self._response_row(frame)

    def _request_row(self, frame: WireFrame) -> Row:
        return self._row_of(frame, True)

    def _response_row(self, frame: WireFrame) -> Row:
        return self._row_of(frame, False)

    def _row_of(self, frame: WireFrame, is_request: bool) -> Row:
        tokens = []
        if frame.gap_before or frame.skipped_before or frame.missing or not frame.complete:
            if frame.gap_before:
                tokens.append(f"gap_before={frame.gap_before}")
            if frame.skipped_before:
                tokens.append(f"skipped_before={frame.skipped_before}")
            if frame.missing:
                tokens.append(f"missing={frame.missing}")
            if not frame.complete:
                tokens.append("incomplete")
        if len(frame.data) < frame.length:
            self.stats["truncated_frames"] += 1
        if is_request:
            api_key, api_version, correlation_id = self._request_ids(frame.data)
            direction = "request"
            self.stats["requests"] += 1
        else:
            api_key = api_version = None
            data = frame.data
            correlation_id = _RESPONSE_ID.unpack_from(data, SIZE_PREFIX)[0] if len(data) >= 8 else None
            if correlation_id is not None and (match := self._answer(correlation_id)) is not None:
                api_key, api_version, answers_from = match
                if frame.hole_end > answers_from:
                    tokens.append("latency_unknown")  # its first answer may be among the lost bytes
                    self.stats["latency_unknown"] += 1
            else:
                tokens.append("unmatched")
                self.stats["unmatched_responses"] += 1
            direction = "response"
            self.stats["responses"] += 1
        seq = self._seq
        self._seq += 1
        return {
            "connection_id": self.connection_id,
            "seq": seq,
            "kind": _FRAME,
            "side": _CLIENT,
            "direction": direction,
            "wall_ns": frame.ts_ns,
            "mono_ns": frame.ts_ns,
            "api_key": api_key,
            "api_version": api_version,
            "client_correlation_id": correlation_id,
            "frame_length": frame.length,
            "frame": frame.data,
            "reason": ",".join(tokens) or None,
        }

    def _request_ids(self, data: bytes) -> tuple[int | None, int | None, int | None]:
        """(api key, version, correlation id) of a request; remembered until its answer.

        Every request header starts with these three at fixed offsets, whatever its version.
        """
        if len(data) < 12:
            return None, None, None
        api_key, api_version, correlation_id = _REQUEST_HEAD.unpack_from(data, SIZE_PREFIX)
        waiting = (api_key, api_version, self.to_client.position)
        self._pending.setdefault(correlation_id, collections.deque()).append(waiting)
        self._pending.move_to_end(correlation_id)
        self._pending_count += 1
        if self._highest_id is None or correlation_id > self._highest_id:
            self._highest_id = correlation_id
        if self.responses.searching:
            self._new_ids.append(correlation_id)
        while self._pending_count > MAX_PENDING_REQUESTS:
            oldest = next(iter(self._pending))
            self._take(oldest)
        return api_key, api_version, correlation_id

    def _answer(self, correlation_id: int) -> tuple[int, int, int] | None:
        return self._take(correlation_id) if correlation_id in self._pending else None

    def _take(self, correlation_id: int) -> tuple[int, int, int]:
        waiting = self._pending[correlation_id]
        match = waiting.popleft()
        if not waiting:
            del self._pending[correlation_id]
        self._pending_count -= 1
        return match

    def _lookup(self, correlation_id: int) -> tuple[int, int] | None:
        """Api key and version of the oldest unanswered request with this id."""
        waiting = self._pending.get(correlation_id)
        return waiting[0][:2] if waiting else None

    def _pending_ids(self) -> Iterator[int]:
        return iter(list(self._pending))

    def _highest(self) -> int | None:
        return self._highest_id

    # -- rows ------------------------------------------------------------------------------

    def _row(self, kind: RowKind, ts_ns: int, **values: Any) -> Row:
        row: Row = {
            "connection_id": self.connection_id,
            "seq": self._seq,
            "kind": kind.value,
            "side": "client" if kind is RowKind.FRAME else None,  # open/close: as in proxy captures
            "wall_ns": ts_ns,
            "mono_ns": ts_ns,
        }
        row.update(values)
        self._seq += 1
        return row

    def _addresses(self) -> Row:
        return {
            "client_address": format_address(*self.client),
            "upstream_address": format_address(*self.server),
        }


_CONNECTION_COUNTS = (  # the stats a connection counts, added to the import's when it closes
    "requests",
    "responses",
    "unmatched_responses",
    "latency_unknown",
    "truncated_frames",
    "gap_bytes",
    "skipped_bytes",
)


class WireImporter:
    """Routes segments to connections by 4-tuple; a SYN on a closed tuple starts a new one."""

    def __init__(self, kafka_ports: Collection[int], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.kafka_ports = frozenset(kafka_ports)
        self.max_frame_size = max_frame_size
        self.stats = ImportStats()
        self.held = HeldBudget()
        """Bytes held behind holes by every connection's streams: bounded as a whole."""
        self._open: dict[tuple[Endpoint, Endpoint], WireConnection] = {}
        self._closed: set[tuple[Endpoint, Endpoint]] = set()
        self._uses: collections.Counter[tuple[Endpoint, Endpoint]] = collections.Counter()
        self._totals = collections.Counter[str]()

    def segment(self, seg: TcpSegment) -> list[Row]:
        """Rows completed by this segment (none for other ports)."""
        oriented = self._orient(seg)
        if oriented is None:
            if seg.payload and request_header_end(seg.payload, self.max_frame_size) > 0:
                ports = self.stats.kafka_like_ports
                ports[seg.dport] = ports.get(seg.dport, 0) + 1
            return []
        self.stats.kafka_segments += 1
        key, from_client = oriented
        rows: list[Row] = []
        conn = self._open.get(key)
        starts = seg.syn and not seg.has_ack
        if conn is not None and starts and conn.to_server.is_new_syn(seg.seq):
            rows += self._close(key, conn.last_ts_ns, "new_syn")  # its end was not captured
            conn = None
        if conn is None:
            if key in self._closed and not starts:
                return rows  # the last ACKs and retransmissions after FIN or RST
            self._closed.discard(key)
            conn = self._start(key, seg)
            rows.append(conn.opened)
        rows += conn.segment(seg, from_client)
        if seg.rst:
            rows += self._close(key, seg.ts_ns, "rst")
        elif len(conn.fins) == 2:
            rows += self._close(key, seg.ts_ns, "fin")
        return rows

    def finish(self) -> list[Row]:
        """End of capture: close what is still open."""
        rows: list[Row] = []
        for key, conn in list(self._open.items()):
            rows += self._close(key, conn.last_ts_ns, "capture_end")
        return rows

    def _orient(self, seg: TcpSegment) -> tuple[tuple[Endpoint, Endpoint], bool] | None:
        src, dst = (seg.src, seg.sport), (seg.dst, seg.dport)
        to_kafka = seg.dport in self.kafka_ports
        from_kafka = seg.sport in self.kafka_ports
        if to_kafka and from_kafka:  # both ends on Kafka ports: a known tuple, else SYN or dport
            if (dst, src) in self._open:
                return (dst, src), False
            if (src, dst) in self._open or not (seg.syn and seg.has_ack):
                return (src, dst), True
            return (dst, src), False
        if to_kafka:
            return (src, dst), True
        if from_kafka:
            return (dst, src), False
        return None

    def _start(self, key: tuple[Endpoint, Endpoint], seg: TcpSegment) -> WireConnection:
        client, server = key
        use = self._uses[key]
        self._uses[key] += 1
        connection_id = f"{format_address(*client)}-{format_address(*server)}"
        if use:
            connection_id += f"#{use + 1}"
        conn = WireConnection(
            connection_id, client, server, seg.ts_ns, seg.syn, self.max_frame_size, self.held
        )
        self._open[key] = conn
        self.stats.connections += 1
        return conn

    def connection(self, key: tuple[Endpoint, Endpoint]) -> WireConnection | None:
        """The open connection between these endpoints (client, server), if any."""
        return self._open.get(key)

    def close_connection(self, key: tuple[Endpoint, Endpoint], ts_ns: int, reason: str) -> list[Row]:
        """Close an open connection whose closing segment was read elsewhere (the clean path)."""
        return self._close(key, ts_ns, reason)

    def _close(self, key: tuple[Endpoint, Endpoint], ts_ns: int, reason: str) -> list[Row]:
        conn = self._open.pop(key)
        self._closed.add(key)
        rows = conn.close(ts_ns, reason)
        for name in _CONNECTION_COUNTS:
            setattr(self.stats, name, getattr(self.stats, name) + conn.stats[name])
        return rows


def import_pcap(
    source: Path,
    out_dir: Path,
    kafka_ports: Collection[int] = (DEFAULT_KAFKA_PORT,),
    *,
    capture_id: str | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    clean_path: bool = True,
) -> ImportStats:
    """Convert a pcap/pcapng file into a capture in ``out_dir`` (created if needed).

    Clean connections, and the clean stretches of the others, are imported whole
    (:mod:`._clean_streams`) unless ``clean_path`` is False; the rest segment by segment. The
    rows are the same either way.

    The default capture id is derived from the file's content. A pcap whose content was
    already imported into ``out_dir`` is not imported again: the stats say so in
    ``already_imported``. A ``capture_id`` already used there for other content raises
    :class:`~corrfix.capture.pcap._provenance.CaptureIdTakenError`.
    """
    sha256 = file_sha256(source)
    capture_id = capture_id or default_capture_id(sha256)
    prior = check_prior(out_dir, capture_id, sha256)
    if prior is not None:
        already = str(prior.summary)
        return ImportStats(capture_id=prior.capture_id, pcap_sha256=sha256, already_imported=already)
    importer = WireImporter(kafka_ports, max_frame_size)
    packet_stats = PacketStats()
    writer = CaptureRowWriter(out_dir, capture_id, pcap_name=source.name, pcap_sha256=sha256)
    try:
        done = False
        if clean_path and source.stat().st_size <= _CLEAN_PATH_MAX_BYTES:
            with packet_columns(source, packet_stats) as table:
                if table is not None:
                    _import_columns(table, importer, writer, max_frame_size)
                    done = True
        if not done:
            for segment in read_segments(source, packet_stats):
                for row in importer.segment(segment):
                    writer.write(row)
            for row in importer.finish():
                writer.write(row)
    finally:
        writer.close()
    stats = importer.stats
    stats.files = [str(path) for path in writer.files]
    stats.capture_id = capture_id
    stats.pcap_sha256 = sha256
    stats.packets = packet_stats.packets
    stats.tcp_segments = packet_stats.tcp
    stats.unsupported_link_types = dict(packet_stats.unsupported_link)
    stats.ip_fragments = packet_stats.fragments
    stats.truncated_file = packet_stats.truncated_file
    return stats


def _import_columns(
    table: PacketColumns, importer: WireImporter, writer: CaptureRowWriter, max_frame_size: int
) -> None:
    """Clean connections whole, the rest of connections that started before the capture
    whole once they are at rest, the other segments through ``importer``; rows merged into
    the order the importer alone would have written them (see
    :class:`._clean_streams.RowColumns`)."""
    clean = import_clean(table, importer.kafka_ports, max_frame_size)
    rest = table.select(clean.rest)
    rest.others = table.others
    out = _SegmentRows()
    for segment in rest.segments():
        out.add(importer.segment(segment), segment.index)
    out.finish(importer)
    stats = importer.stats
    rests = [
        run
        for c in clean.midstream
        for run in _import_candidate(table, c, importer.kafka_ports, stats, out, max_frame_size)
    ]
    rows, packet, opened, rank = out.rows, out.packet, out.opened, out.rank
    stats.kafka_segments += clean.kafka_segments
    stats.connections += len(clean.connections)
    stats.requests += sum(c.requests for c in clean.connections)
    stats.responses += sum(c.responses for c in clean.connections)
    stats.unmatched_responses += sum(c.unmatched for c in clean.connections)
    fast = clean_columns(clean.connections + rests)
    columns = fast.columns
    if rows:
        columns = {
            f.name: pa.concat_arrays(
                [columns[f.name], arrays.values([row.get(f.name) for row in rows], f.type)]
            )
            for f in writer.schema
            if f.name in columns
        }
        fast.frames.extend(arrays.values([row.get("frame") for row in rows], pa.binary()))
    order = np.lexsort(
        (
            np.concatenate([fast.rank, np.array(rank, np.int64)]),
            np.concatenate([fast.opened, np.array(opened, np.int64)]),
            np.concatenate([fast.packet, np.array(packet, np.int64)]),
        )
    )
    if len(order):
        first = int(order[0])
        started = fast.ts_ns[first] if first < len(fast.ts_ns) else rows[first - len(fast.ts_ns)]["wall_ns"]
        writer.write_columns(columns, fast.frames, order, started)


class _SegmentRows:
    """Rows the per-segment path made, with their write-order keys (see
    :class:`._clean_streams.RowColumns`)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.packet: list[int] = []
        self.opened: list[int] = []
        self.rank: list[int] = []
        self.opened_at: dict[str, int] = {}

    def add(self, rows: list[Row], index: int, first_rank: int = 0) -> None:
        """Rows completed by the packet at ``index``."""
        for n, row in enumerate(rows, first_rank):
            if row["kind"] == _OPEN:
                self.opened_at[row["connection_id"]] = index
            self.rows.append(row)
            self.packet.append(index)
            self.rank.append(n)
            self.opened.append(0)

    def finish(self, importer: WireImporter) -> None:
        """The rows made at the end of the capture."""
        for n, row in enumerate(importer.finish()):
            self.rows.append(row)
            self.packet.append(AT_END)
            self.opened.append(self.opened_at[row["connection_id"]])
            self.rank.append(n)


_CANDIDATE_TRIES = 4  # times in a row a connection at rest is checked for a clean run
_CANDIDATE_BUDGET = 64  # ... and in all (each check reads all the packets left)
_FOLDED = ("kafka_segments", "connections", *_CONNECTION_COUNTS)  # what an importer of its own counted


def _import_candidate(
    table: PacketColumns,
    candidate: Candidate,
    kafka_ports: Collection[int],
    stats: ImportStats,
    out: _SegmentRows,
    max_frame_size: int,
) -> list[CleanConnection]:
    """A connection the clean path did not take: segment by segment (its own importer;
    connections share no state) until it is at rest, then its clean runs from there made
    whole and returned, segment by segment again between them; its per-segment rows go to
    ``out``, its counts to ``stats``."""
    importer = WireImporter(kafka_ports, max_frame_size)
    rows = candidate.rows
    runs: list[CleanConnection] = []
    tries = 0
    budget = _CANDIDATE_BUDGET
    done = 0
    least = _clean_streams.MIN_PACKETS  # a shorter rest is cheaper segment by segment
    step = least
    while done < len(rows):
        for segment in table.select(rows[done : done + step]).segments():
            out.add(importer.segment(segment), segment.index)
            done += 1
            conn = importer.connection(candidate.endpoints)
            if tries >= _CANDIDATE_TRIES or len(rows) - done < least or conn is None or not conn.at_rest():
                continue
            tries += 1
            budget -= 1
            if not budget:
                tries = _CANDIDATE_TRIES
            run = rest_of_connection(table, candidate, done, conn.rest_start(), max_frame_size)
            if run is None:
                continue
            conn.advance(run)
            runs.append(run)
            stats.kafka_segments += run.packets
            stats.requests += run.requests
            stats.responses += run.responses
            stats.unmatched_responses += run.unmatched
            stats.latency_unknown += run.latency_unknown
            if run.closed_at is not None:
                closed = rows[done + run.closed_at]
                closing = importer.close_connection(candidate.endpoints, run.last_ts_ns, "fin")
                out.add(closing, int(table.index[closed]), first_rank=_AFTER_FRAMES)
            done += run.packets
            tries = 0
            step = least
            break
        else:
            step *= 2
    out.finish(importer)
    for name in _FOLDED:
        setattr(stats, name, getattr(stats, name) + getattr(importer.stats, name))
    return runs


_AFTER_FRAMES = 1 << 40  # rank of a close row after the frames its packet completed
