"""``corrfix capture pcapng``: a capture as a pcapng file that Wireshark dissects as Kafka.

Each proxied connection becomes two synthesized TCP connections, one per side: the client
side (client -> proxy) and the upstream side (proxy -> broker). Both servers listen on
``broker_port``, so ``tshark -d tcp.port==PORT,kafka`` decodes both. Addresses are made
up but stable: the n-th connection of the capture (in order of first appearance) gets
client 127.1.x.y and proxy 127.2.x.y, talking to the proxy at 127.0.0.2 and the broker at
127.0.0.3. Timestamps are the rows' ``wall_ns``, exact to the nanosecond.

Repair events become packet comments, on the frame they are about: the re-send for a
``requeue``, otherwise the latest upstream frame with the event's upstream correlation id
(the request whose answer was lost, the stray answer dropped, the probe), else the latest
upstream frame of that connection. Opening and closing reasons are comments on the SYN
and the FIN. A frame cut short by the capture's snap length is padded with zero bytes to
its original length, so that the TCP stream stays whole, and says so in a comment.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corrfix.capture import iter_batches
from corrfix.capture.format import CAPTURE_ID_KEY, RowKind, whole_frames
from corrfix.capture.pcap._pcapng_blocks import PcapngWriter
from corrfix.capture.pcap._synthetic_tcp import Endpoint, TcpConnection
from protocol import api_name

DEFAULT_BROKER_PORT = 9092
_PROXY_IP = bytes([127, 0, 0, 2])
_BROKER_IP = bytes([127, 0, 0, 3])
_PLAN_COLUMNS = [
    "connection_id",
    "kind",
    "side",
    "upstream_correlation_id",
    "new_upstream_correlation_id",
    "client_correlation_id",
    "api_key",
    "event",
    "reason",
    "attempt",
]

ConnectionKey = tuple[str, str]  # (capture id, connection id)


@dataclass
class ExportStats:
    packets: int = 0
    frames: int = 0
    connections: int = 0
    comments: int = 0
    truncated_frames: int = 0


def _rows(path: Path, columns: list[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(capture id, row) of every row, in file order."""
    for batch in iter_batches(path):
        capture_id = (batch.schema.metadata or {}).get(CAPTURE_ID_KEY, b"").decode()
        # Every frame whole: a row sharing another's bytes is in the same batch.
        chosen = batch.select(columns) if columns is not None else whole_frames(batch)
        for row in chosen.to_pylist():
            yield capture_id, row


def describe_event(row: dict[str, Any]) -> str:
    """One line for a repair row, as a packet comment."""
    parts = [f"corrfix {row['event']}"]
    if row["api_key"] is not None:
        parts.append(f"api={api_name(row['api_key'])}")
    if row["client_correlation_id"] is not None:
        parts.append(f"client_correlation_id={row['client_correlation_id']}")
    if row["upstream_correlation_id"] is not None:
        parts.append(f"upstream_correlation_id={row['upstream_correlation_id']}")
    if row["new_upstream_correlation_id"] is not None:
        parts.append(f"new_upstream_correlation_id={row['new_upstream_correlation_id']}")
    if row["attempt"] is not None:
        parts.append(f"attempt={row['attempt']}")
    if row["reason"]:
        parts.append(f"reason={row['reason']}")
    return " ".join(parts)


@dataclass
class _Anchors:
    """Per connection, the rows a repair comment can be attached to."""

    by_upstream_id: dict[int, int] = field(default_factory=dict)
    last_upstream: int | None = None
    last_packet: int | None = None
    pending: list[str] = field(default_factory=list)


def plan_comments(path: Path) -> dict[int, list[str]]:
    """First pass: which row (by index in file order) carries which repair comments."""
    comments: dict[int, list[str]] = defaultdict(list)
    anchors: dict[ConnectionKey, _Anchors] = {}
    for index, (capture_id, row) in enumerate(_rows(path, _PLAN_COLUMNS)):
        key = (capture_id, row["connection_id"])
        anchor = anchors.setdefault(key, _Anchors())
        kind = row["kind"]
        if kind == RowKind.REPAIR:
            target = None
            for cid in (row["new_upstream_correlation_id"], row["upstream_correlation_id"]):
                if cid is not None and target is None:
                    target = anchor.by_upstream_id.get(cid)
            if target is None:
                target = anchor.last_upstream if anchor.last_upstream is not None else anchor.last_packet
            if target is None:
                anchor.pending.append(describe_event(row))
            else:
                comments[target].append(describe_event(row))
            continue
        anchor.last_packet = index
        if anchor.pending:
            comments[index].extend(anchor.pending)
            anchor.pending.clear()
        if kind == RowKind.FRAME and row["side"] != "client":
            anchor.last_upstream = index
            if row["upstream_correlation_id"] is not None:
                anchor.by_upstream_id[row["upstream_correlation_id"]] = index
        elif kind == RowKind.CLOSE:
            del anchors[key]
    return comments


class _Streams:
    """The two synthesized TCP connections of one proxied connection."""

    def __init__(self, number: int, broker_port: int) -> None:
        host = bytes([(number >> 8) & 0xFF, number & 0xFF])
        port = 32768 + (number >> 16) % 28000
        self.client = TcpConnection(
            Endpoint(b"\x7f\x01" + host, port), Endpoint(_PROXY_IP, broker_port), 0x10000000, 0x20000000
        )
        self.upstream = TcpConnection(
            Endpoint(b"\x7f\x02" + host, port), Endpoint(_BROKER_IP, broker_port), 0x30000000, 0x40000000
        )

    def side(self, side: str | None) -> TcpConnection:
        return self.client if side == "client" else self.upstream


def _payload(row: dict[str, Any]) -> tuple[bytes, str | None]:
    """The frame's bytes, zero-padded to its original length if it was cut short."""
    data: bytes = row["frame"] or b""
    length = row["frame_length"]
    if length is None or len(data) >= length:
        return data, None
    note = (
        f"corrfix: frame truncated in the capture; {len(data)} of {length} bytes captured, "
        "the rest zero-filled"
    )
    if len(data) < 4:  # keep the size prefix right, so the rest of the stream still parses
        data = (length - 4).to_bytes(4, "big", signed=True)
    return data + bytes(length - len(data)), note


def _describe_open(row: dict[str, Any]) -> str:
    return (
        f"corrfix open {row['connection_id']}: client {row['client_address']}, "
        f"upstream {row['upstream_address']}"
    )


def export_pcapng(path: Path, out: Path, broker_port: int = DEFAULT_BROKER_PORT) -> ExportStats:
    """Write the capture at ``path`` (directory or file) as pcapng to ``out``. It is written
    under another name and renamed when whole: a failed export leaves no file that reads as a
    short capture, and no earlier ``out`` is lost to it. A pipe or a device is written to
    directly."""
    if out.exists() and not out.is_file():
        return _export(path, out, broker_port)
    partial = out.with_name(f".{out.name}.partial")
    try:
        stats = _export(path, partial, broker_port)
        partial.replace(out)
    except BaseException as exc:
        partial.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename == str(partial):  # the user named ``out``
            raise OSError(exc.errno, exc.strerror, str(out)) from exc
        raise
    return stats


def _export(path: Path, out: Path, broker_port: int) -> ExportStats:
    comments = plan_comments(path)
    stats = ExportStats()
    streams: dict[ConnectionKey, _Streams] = {}
    with out.open("wb") as file:
        writer = PcapngWriter(file, description=f"corrfix capture {path}")

        def emit(timestamp: int, packets: list[bytes], notes: list[str]) -> None:
            for i, packet in enumerate(packets):
                writer.packet(timestamp, packet, notes if i == 0 else ())
            stats.packets += len(packets)
            stats.comments += len(notes) if packets else 0

        for index, (capture_id, row) in enumerate(_rows(path)):
            key = (capture_id, row["connection_id"])
            conn = streams.get(key)
            if conn is None:
                conn = streams[key] = _Streams(stats.connections, broker_port)
                stats.connections += 1
            notes = comments.pop(index, [])
            kind, timestamp = row["kind"], row["wall_ns"]
            if kind == RowKind.OPEN:
                notes.insert(0, _describe_open(row))
                for tcp in (conn.client, conn.upstream):
                    if not tcp.opened:
                        emit(timestamp, tcp.handshake(), notes if tcp is conn.client else [])
            elif kind == RowKind.FRAME:
                tcp = conn.side(row["side"])
                if not tcp.opened:
                    emit(timestamp, tcp.handshake(), [])
                payload, note = _payload(row)
                if note is not None:
                    notes.insert(0, note)
                    stats.truncated_frames += 1
                emit(timestamp, tcp.send(row["direction"] != "response", payload), notes)
                stats.frames += 1
            elif kind == RowKind.CLOSE:
                notes.insert(0, f"corrfix close {row['connection_id']}: {row['reason']}")
                for tcp in (conn.client, conn.upstream):
                    if tcp.opened and not tcp.closed:
                        emit(timestamp, tcp.close(), notes)
                        notes = []
                del streams[key]
    return stats


# -- command line ----------------------------------------------------------------------


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port, got {text!r}")
    return int(text)


def add_pcapng_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("capture", type=Path, metavar="DIR", help="capture directory (or one capture file)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="pcapng to write")
    parser.add_argument(
        "--broker-port",
        type=_port,
        default=DEFAULT_BROKER_PORT,
        metavar="PORT",
        help=f"server port of both synthesized sides; decode with -d tcp.port==PORT,kafka "
        f"(default {DEFAULT_BROKER_PORT})",
    )


def run_pcapng(args: argparse.Namespace) -> int:
    if not args.capture.exists():
        print(f"corrfix capture pcapng: {args.capture} does not exist")
        return 2
    stats = export_pcapng(args.capture, args.output, args.broker_port)
    print(
        f"wrote {args.output}: {stats.packets} packets, {stats.frames} Kafka frames on "
        f"{stats.connections} connections, {stats.comments} comments, "
        f"{stats.truncated_frames} truncated frames zero-filled"
    )
    return 0
