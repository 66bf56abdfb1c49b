"""``corrfix capture import-pcap``: a tcpdump capture taken without corrfix, as a corrfix capture.

Each TCP connection to a Kafka port becomes one ``connection_id``. Both directions are
reassembled (:mod:`._tcp_stream`), split into frames (:mod:`._wire_frames`), and responses
are matched to requests by correlation id. On the wire there is only the client's id
space, so it goes into ``client_correlation_id`` and ``upstream_correlation_id`` stays
null. Every frame row has ``side="client"``: the wire between a client and its broker;
open and close rows have no side, as in proxy captures.

Timestamps are the packet's capture time, in ``wall_ns`` and (the capture has no other
clock) in ``mono_ns`` alike. A frame's time is that of the packet that completed it.
Rows are written in the order the frames were completed; ``seq`` counts per connection
from the open row (0).

What the capture lacks is said in ``reason`` (comma-separated ``key`` or ``key=value``):
on frame rows ``gap_before``, ``skipped_before``, ``missing``, ``incomplete`` and
``unmatched``; on open rows ``syn`` or ``midstream``; on close rows ``fin``, ``rst``,
``new_syn`` (the same addresses and ports opened a new connection) or ``capture_end``, then
the bytes after the last frame of each direction that could not be framed
(``request_gap``, ``request_skipped``, ``response_gap``, ``response_skipped``).
docs/capture-format.md has the details.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from corrfix.capture import SUMMARY_SUFFIX, CaptureFiles, CaptureSummary, capture_stem, write_summary
from corrfix.capture.format import RowKind, Source, schema_for
from corrfix.capture.pcap._packets import PacketStats, TcpSegment, format_address, read_segments
from corrfix.capture.pcap._tcp_stream import Piece, StreamReassembler
from corrfix.capture.pcap._wire_frames import FrameSplitter, RequestBoundary, ResponseBoundary, WireFrame
from protocol import DEFAULT_MAX_FRAME_SIZE, ProtocolError, parse_request_header

DEFAULT_KAFKA_PORT = 9092
MAX_PENDING_REQUESTS = 10_000  # unanswered requests remembered per connection (acks=0 never are)
_BATCH_ROWS = 1024
_ROTATE_BYTES = 256 * 1024 * 1024

Row = dict[str, Any]
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
    truncated_frames: int = 0
    gap_bytes: int = 0
    skipped_bytes: int = 0
    unsupported_link_types: dict[int, int] = field(default_factory=dict)
    ip_fragments: int = 0
    truncated_file: bool = False


class CaptureRowWriter:
    """Rows (dicts) to a capture directory, through the proxy capture's file layer.

    Files are named like a proxy capture's, after the first row's time, so captures of
    both sources sort together; a JSON summary (source ``wire``) sits next to them.
    """

    def __init__(self, directory: Path, capture_id: str, batch_rows: int = _BATCH_ROWS) -> None:
        self.directory = directory
        self.capture_id = capture_id
        self.schema = schema_for(capture_id, Source.WIRE)
        self.batch_rows = batch_rows
        self.rows = 0
        self._pending: list[Row] = []
        self._files: CaptureFiles | None = None
        self._summary: CaptureSummary | None = None

    @property
    def files(self) -> list[Path]:
        return list(self._files.files) if self._files is not None else []

    def write(self, row: Row) -> None:
        row["capture_id"] = self.capture_id
        row["source"] = Source.WIRE.value
        self._pending.append(row)
        self.rows += 1
        if len(self._pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        if self._files is None:
            started = self._pending[0]["wall_ns"]
            stem = capture_stem(self.capture_id, started)
            self._files = CaptureFiles(
                self.directory, stem, self.schema, rotate_bytes=_ROTATE_BYTES, rotate_seconds=math.inf
            )
            self._summary = CaptureSummary(self.capture_id, Source.WIRE.value, started)
        self._files.write(pa.RecordBatch.from_pylist(self._pending, schema=self.schema))
        self._pending = []

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
    ) -> None:
        self.connection_id = connection_id
        self.client = client
        self.server = server
        self.last_ts_ns = ts_ns
        self.fins: set[bool] = set()  # True: the client's FIN
        self._seq = 0
        self._pending: collections.OrderedDict[int, collections.deque[tuple[int, int]]] = (
            collections.OrderedDict()
        )
        self._pending_count = 0
        self.to_server = StreamReassembler()
        self.to_client = StreamReassembler()
        self.requests = FrameSplitter(RequestBoundary(max_frame_size=max_frame_size), synced=False)
        self.responses = FrameSplitter(
            ResponseBoundary(self._is_pending, self._pending_ids, max_frame_size=max_frame_size), synced=False
        )
        self.opened = self._row(RowKind.OPEN, ts_ns, reason="syn" if syn else "midstream")
        self.opened.update(self._addresses())
        self.stats = collections.Counter[str]()

    # -- segments --------------------------------------------------------------------------

    def segment(self, seg: TcpSegment, from_client: bool) -> list[Row]:
        """Rows completed by one segment."""
        self.last_ts_ns = seg.ts_ns
        upstream, downstream = (self.to_server, self.requests), (self.to_client, self.responses)
        (sending, splitter), (other, other_splitter) = (
            (upstream, downstream) if from_client else (downstream, upstream)
        )
        rows: list[Row] = []
        if seg.has_ack:  # first: what the peer acknowledged precedes what this segment carries
            rows += self._frames(other.acknowledged(seg.ack, seg.ts_ns), other_splitter, not from_client)
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
        return rows

    def close(self, ts_ns: int, reason: str) -> list[Row]:
        """Deliver what the streams still hold, then the close row."""
        rows: list[Row] = []
        tokens = [reason]
        for stream, splitter, is_request, name in (
            (self.to_server, self.requests, True, "request"),
            (self.to_client, self.responses, False, "response"),
        ):
            rows += self._frames(stream.finish(ts_ns), splitter, is_request)
            frames, gap, skipped = splitter.finish(ts_ns)
            rows += [self._frame_row(frame, is_request) for frame in frames]
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

    # -- frames ----------------------------------------------------------------------------

    def _frames(self, pieces: list[Piece], splitter: FrameSplitter, is_request: bool) -> list[Row]:
        rows = []
        for piece in pieces:
            rows += [self._frame_row(frame, is_request) for frame in splitter.feed(piece)]
        return rows

    def _frame_row(self, frame: WireFrame, is_request: bool) -> Row:
        tokens = []
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
            correlation_id = _int(frame.data, 4, 8)
            if correlation_id is not None and (match := self._answer(correlation_id)) is not None:
                api_key, api_version = match
            else:
                tokens.append("unmatched")
                self.stats["unmatched_responses"] += 1
            direction = "response"
            self.stats["responses"] += 1
        row = self._row(RowKind.FRAME, frame.ts_ns, reason=",".join(tokens) or None)
        row.update(
            direction=direction,
            api_key=api_key,
            api_version=api_version,
            client_correlation_id=correlation_id,
            frame_length=frame.length,
            frame=frame.data,
        )
        return row

    def _request_ids(self, data: bytes) -> tuple[int | None, int | None, int | None]:
        """(api key, version, correlation id) of a request; remembered until its answer."""
        if len(data) < 12:
            return None, None, None
        try:
            header = parse_request_header(data)
            api_key, api_version, correlation_id = header.api_key, header.api_version, header.correlation_id
        except ProtocolError:  # the header itself was cut; its fixed fields are still there
            api_key, api_version, correlation_id = _int(data, 4, 6), _int(data, 6, 8), _int(data, 8, 12)
        self._pending.setdefault(correlation_id, collections.deque()).append((api_key, api_version))
        self._pending.move_to_end(correlation_id)
        self._pending_count += 1
        while self._pending_count > MAX_PENDING_REQUESTS:
            oldest = next(iter(self._pending))
            self._take(oldest)
        return api_key, api_version, correlation_id

    def _answer(self, correlation_id: int) -> tuple[int, int] | None:
        return self._take(correlation_id) if correlation_id in self._pending else None

    def _take(self, correlation_id: int) -> tuple[int, int]:
        waiting = self._pending[correlation_id]
        match = waiting.popleft()
        if not waiting:
            del self._pending[correlation_id]
        self._pending_count -= 1
        return match

    def _is_pending(self, correlation_id: int) -> bool:
        return correlation_id in self._pending

    def _pending_ids(self) -> Iterator[int]:
        return iter(list(self._pending))

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


def _int(data: bytes, start: int, stop: int) -> int:
    return int.from_bytes(data[start:stop], "big", signed=True)


class WireImporter:
    """Routes segments to connections by 4-tuple; a SYN on a closed tuple starts a new one."""

    def __init__(self, kafka_ports: Collection[int], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.kafka_ports = frozenset(kafka_ports)
        self.max_frame_size = max_frame_size
        self.stats = ImportStats()
        self._open: dict[tuple[Endpoint, Endpoint], WireConnection] = {}
        self._closed: set[tuple[Endpoint, Endpoint]] = set()
        self._uses: collections.Counter[tuple[Endpoint, Endpoint]] = collections.Counter()
        self._totals = collections.Counter[str]()

    def segment(self, seg: TcpSegment) -> list[Row]:
        """Rows completed by this segment (none for other ports)."""
        oriented = self._orient(seg)
        if oriented is None:
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
        conn = WireConnection(connection_id, client, server, seg.ts_ns, seg.syn, self.max_frame_size)
        self._open[key] = conn
        self.stats.connections += 1
        return conn

    def _close(self, key: tuple[Endpoint, Endpoint], ts_ns: int, reason: str) -> list[Row]:
        conn = self._open.pop(key)
        self._closed.add(key)
        rows = conn.close(ts_ns, reason)
        for name in (
            "requests",
            "responses",
            "unmatched_responses",
            "truncated_frames",
            "gap_bytes",
            "skipped_bytes",
        ):
            setattr(self.stats, name, getattr(self.stats, name) + conn.stats[name])
        return rows


def import_pcap(
    source: Path,
    out_dir: Path,
    kafka_ports: Collection[int] = (DEFAULT_KAFKA_PORT,),
    *,
    capture_id: str | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> ImportStats:
    """Convert a pcap/pcapng file into a capture in ``out_dir`` (created if needed)."""
    capture_id = capture_id or uuid.uuid4().hex
    importer = WireImporter(kafka_ports, max_frame_size)
    packet_stats = PacketStats()
    writer = CaptureRowWriter(out_dir, capture_id)
    try:
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
    stats.packets = packet_stats.packets
    stats.tcp_segments = packet_stats.tcp
    stats.unsupported_link_types = dict(packet_stats.unsupported_link)
    stats.ip_fragments = packet_stats.fragments
    stats.truncated_file = packet_stats.truncated_file
    return stats


# -- command line ----------------------------------------------------------------------------


def add_import_command(capture_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``corrfix capture import-pcap``."""
    p = capture_subparsers.add_parser(
        "import-pcap",
        help="convert a tcpdump capture (pcap or pcapng) of Kafka traffic into a corrfix capture",
        description="Reassemble every TCP connection to the Kafka port(s), split it into Kafka frames, "
        "match responses to requests by correlation id, and write one capture file (source=wire) "
        "that `corrfix replay` and the capture tools read.",
    )
    p.add_argument("pcap", type=Path, help="pcap or pcapng file (Ethernet, Linux cooked, raw IP, loopback)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="capture directory")
    p.add_argument(
        "--kafka-port",
        type=int,
        action="append",
        metavar="PORT",
        help=f"the brokers' port; repeat for several (default {DEFAULT_KAFKA_PORT})",
    )
    p.add_argument("--capture-id", help="capture id (default: random)")
    p.add_argument("--max-frame-size", type=int, default=DEFAULT_MAX_FRAME_SIZE, metavar="BYTES")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run_import)
    return p


def run_import(args: argparse.Namespace) -> int:
    if not args.pcap.is_file():
        print(f"corrfix: no such capture file: {args.pcap}", file=sys.stderr)
        return 2
    try:
        stats = import_pcap(
            args.pcap,
            args.output,
            args.kafka_port or [DEFAULT_KAFKA_PORT],
            capture_id=args.capture_id,
            max_frame_size=args.max_frame_size,
        )
    except (ValueError, OSError) as exc:  # dpkt raises ValueError for a file that is no capture
        print(f"corrfix: cannot import {args.pcap}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(stats), indent=2))
    else:
        print(_summary(stats))
    return 0


def _summary(stats: ImportStats) -> str:
    lines = [
        f"capture {stats.capture_id}: {', '.join(stats.files) or 'no rows, no file written'}",
        f"  packets {stats.packets:,}, TCP {stats.tcp_segments:,}, on Kafka ports {stats.kafka_segments:,}",
        f"  connections {stats.connections:,}, requests {stats.requests:,}, responses {stats.responses:,} "
        f"({stats.unmatched_responses:,} unmatched)",
    ]
    if stats.gap_bytes or stats.skipped_bytes or stats.truncated_frames:
        lines.append(
            f"  not captured: {stats.gap_bytes:,} bytes; not framable: {stats.skipped_bytes:,} bytes; "
            f"truncated frames: {stats.truncated_frames:,}"
        )
    if stats.unsupported_link_types:
        lines.append(f"  skipped packets of unsupported link types: {stats.unsupported_link_types}")
    if stats.ip_fragments:
        lines.append(f"  skipped IP fragments: {stats.ip_fragments:,}")
    if stats.truncated_file:
        lines.append("  the file ends in the middle of a packet (capture still running, or killed?)")
    return "\n".join(lines)
