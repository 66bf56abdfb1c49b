"""Damage a real capture the way real tcpdumps are damaged, and check an import against the truth.

The damages work on the TCP segments of a capture (``corrfix.capture.pcap.read_segments``):
start mid-stream at any byte offset, drop one segment, duplicate and reorder, apply a snap
length, merge two brokers. The truth is the clean capture's import (it starts with the
handshake, and tshark agrees with it): every frame of every connection and direction.

:func:`check` compares a damaged import with the truth and lists what is wrong:

* a **phantom**: an imported frame that is no real frame (its bytes, its length, in order);
* **unaccounted** bytes: real frames between two imported ones whose bytes do not add up
  to what the later frame reports as ``gap_before`` + ``skipped_before`` (and the same for
  the bytes after the last frame, reported on the close row).

It also counts real frames lost after the first imported one, for the tests that demand none.
"""

from __future__ import annotations

import collections
import io
import random
import socket
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import dpkt

from corrfix.capture.pcap import TcpSegment, WireImporter

SEQ_MOD = 1 << 32
SYN = dpkt.tcp.TH_SYN
_HEADERS = 14 + 20 + 20  # Ethernet, IPv4, TCP as written by write_pcap

Row = dict
Key = tuple[int, str]  # (client port, direction)


def client_port(seg: TcpSegment, kafka_ports: Collection[int]) -> int:
    return seg.sport if seg.dport in kafka_ports else seg.dport


def from_client(seg: TcpSegment, kafka_ports: Collection[int]) -> bool:
    return seg.dport in kafka_ports


def by_connection(
    segments: Iterable[TcpSegment], kafka_ports: Collection[int]
) -> dict[int, list[TcpSegment]]:
    """Segments per client port, in capture order.

    The helpers here name a connection by its client port alone, so a capture must not
    reuse one: two connections on one port would read as one stream with two starts. That
    is refused here rather than found later as bytes missing from the stream.
    """
    out: dict[int, list[TcpSegment]] = collections.defaultdict(list)
    servers: dict[int, tuple[str, int]] = {}
    client_isns: dict[int, int] = {}
    for seg in segments:
        port, toward_server = client_port(seg, kafka_ports), from_client(seg, kafka_ports)
        server = (seg.dst, seg.dport) if toward_server else (seg.src, seg.sport)
        reused = servers.setdefault(port, server) != server
        if seg.syn and toward_server:  # a retransmitted SYN repeats its sequence number
            reused |= client_isns.setdefault(port, seg.seq) != seg.seq
        if reused:
            raise ValueError(f"two connections use client port {port}; merge captures with merge()")
        out[port].append(seg)
    return dict(out)


def merge(captures: Iterable[list[TcpSegment]], kafka_ports: Collection[int]) -> list[TcpSegment]:
    """Captures merged into one, in time order, as tcpdumps of several brokers are merged.

    Captures taken apart can share a client port: Linux picks ephemeral ports per
    destination, so a client can use one port to two brokers. A connection whose port an
    earlier capture used gets an unused one, so a client port still names one connection.
    """
    merged: list[TcpSegment] = []
    taken: set[int] = set()
    for capture in captures:
        ports = set(by_connection(capture, kafka_ports))
        spare = (port for port in range(1024, 65536) if port not in taken and port not in ports)
        moved = {port: next(spare) for port in sorted(ports & taken)}
        taken |= ports | set(moved.values())
        for seg in capture:
            port = client_port(seg, kafka_ports)
            merged += renumber([seg], kafka_ports, moved[port]) if port in moved else [seg]
    return sorted(merged, key=lambda seg: seg.ts_ns)


def import_segments(segments: Iterable[TcpSegment], kafka_ports: Collection[int]) -> list[Row]:
    """Rows of an import of these segments, through the importer's sans-IO core."""
    importer = WireImporter(kafka_ports)
    rows: list[Row] = []
    for seg in segments:
        rows += importer.segment(seg)
    return rows + importer.finish()


def stream_bytes(segments: list[TcpSegment], client: bool, kafka_ports: Collection[int]) -> int:
    """Bytes one direction of a whole connection carried (from its SYN)."""
    isn = _isn(segments, client, kafka_ports)
    return max(
        (
            (s.seq - isn) % SEQ_MOD + s.length
            for s in segments
            if from_client(s, kafka_ports) == client and s.length
        ),
        default=0,
    )


def _isn(segments: list[TcpSegment], client: bool, kafka_ports: Collection[int]) -> int:
    for seg in segments:
        if seg.syn and from_client(seg, kafka_ports) == client:
            return (seg.seq + 1) % SEQ_MOD
    raise ValueError("no SYN in this direction")


def cut(
    segments: list[TcpSegment],
    client: bool,
    offset: int,
    kafka_ports: Collection[int],
    *,
    one_direction: bool = False,
) -> list[TcpSegment]:
    """The capture as if it had started at byte ``offset`` of one direction of the connection.

    Every packet before the one carrying that byte is gone, in both directions (with
    ``one_direction``, only in that direction: every request stays waiting for an answer,
    the hardest case for finding responses), and that packet keeps only its bytes from
    ``offset`` on.
    """
    isn = _isn(segments, client, kafka_ports)
    for index, seg in enumerate(segments):
        if from_client(seg, kafka_ports) != client or not seg.payload:
            continue
        start = (seg.seq - isn) % SEQ_MOD
        if start <= offset < start + len(seg.payload):
            skip = offset - start
            tail = seg._replace(
                seq=(seg.seq + skip) % SEQ_MOD,
                payload=seg.payload[skip:],
                length=seg.length - skip,
                flags=seg.flags & ~SYN,
            )
            if one_direction:
                kept = [s for s in segments[:index] if from_client(s, kafka_ports) != client and not s.syn]
                return [*kept, tail, *segments[index + 1 :]]
            return [tail, *segments[index + 1 :]]
    raise ValueError(f"no captured byte at offset {offset}")


def renumber(segments: list[TcpSegment], kafka_ports: Collection[int], port: int) -> list[TcpSegment]:
    """The same connection with another client port (to put damaged copies side by side)."""
    return [
        seg._replace(sport=port) if from_client(seg, kafka_ports) else seg._replace(dport=port)
        for seg in segments
    ]


def drop(segments: list[TcpSegment], index: int) -> list[TcpSegment]:
    return segments[:index] + segments[index + 1 :]


def resegment(segments: list[TcpSegment], rnd: random.Random, most: int = 64) -> list[TcpSegment]:
    """Split data segments into random smaller ones (at most ``most`` bytes), as a smaller MSS would."""
    out = []
    for seg in segments:
        if len(seg.payload) <= 1 or len(seg.payload) != seg.length:
            out.append(seg)
            continue
        pos = 0
        while pos < len(seg.payload):
            size = rnd.randint(1, most)
            piece = seg.payload[pos : pos + size]
            last = pos + size >= len(seg.payload)
            flags = seg.flags if last else seg.flags & ~dpkt.tcp.TH_FIN
            out.append(
                seg._replace(seq=(seg.seq + pos) % SEQ_MOD, payload=piece, length=len(piece), flags=flags)
            )
            pos += size
    return out


def shuffle(segments: list[TcpSegment], rnd: random.Random, kafka_ports: Collection[int]) -> list[TcpSegment]:
    """Duplicate some data segments and reorder each run of one direction's segments.

    A segment never moves past a packet of the other direction, which may acknowledge it:
    on a real wire an acknowledgement is captured after the data it acknowledges.
    """
    out: list[TcpSegment] = []
    run: list[TcpSegment] = []
    for seg in segments:
        if run and (from_client(seg, kafka_ports) != from_client(run[0], kafka_ports) or not seg.payload):
            rnd.shuffle(run)
            out += run
            run = []
        if not seg.payload:
            out.append(seg)
            continue
        run.append(seg)
        if rnd.random() < 0.2:
            run.append(seg)  # a retransmission
    rnd.shuffle(run)
    return out + run


def snap(segments: list[TcpSegment], snaplen: int) -> list[TcpSegment]:
    """What ``tcpdump -s SNAPLEN`` keeps of each packet (Ethernet, IPv4, TCP without options)."""
    keep = max(snaplen - _HEADERS, 0)
    return [seg._replace(payload=seg.payload[:keep]) for seg in segments]


LINKS = ("ipv4", "ipv4-options", "ipv6", "ipv6-offload", "vlan", "qinq-ipv6", "null", "null-ipv6")
"""How :func:`write_pcap` can wrap TCP: Ethernet with IPv4 (plain or with options) or IPv6
(its payload length given, or 0 as with segmentation offload), behind one VLAN tag or two,
or BSD loopback's 4-byte family (macOS ``lo0``)."""
_V6_ADDRESSES = {"10.0.0.1": "fd00::1", "10.0.0.2": "fd00::2"}


def _network(seg: TcpSegment, tcp: bytes, link: str) -> bytes:
    """The IP packet of a segment, as ``link`` says."""
    if "ipv6" in link:
        src, dst = (
            socket.inet_pton(socket.AF_INET6, _V6_ADDRESSES.get(a, "fd00::9")) for a in (seg.src, seg.dst)
        )
        length = 0 if link == "ipv6-offload" else len(tcp)
        return struct.pack(">IHBB", 6 << 28, length, dpkt.ip.IP_PROTO_TCP, 64) + src + dst + tcp
    options = b"\x01\x01\x01\x00" if link == "ipv4-options" else b""
    header = 20 + len(options)
    fixed = struct.pack(
        ">BBHHHBBH", 0x40 | header // 4, 0, header + len(tcp), 0, 0, 64, dpkt.ip.IP_PROTO_TCP, 0
    )
    return fixed + socket.inet_aton(seg.src) + socket.inet_aton(seg.dst) + options + tcp


def _link(network: bytes, link: str) -> bytes:
    ethertype = 0x86DD if "ipv6" in link else 0x0800
    if link.startswith("null"):
        return struct.pack("<I", 30 if "ipv6" in link else 2) + network  # AF_INET6 is 30 on macOS
    tags = {"vlan": 1, "qinq-ipv6": 2}.get(link, 0)
    head = b"\x04" * 6 + b"\x02" * 6
    head += b"".join(struct.pack(">HH", 0x88A8 if n < tags - 1 else 0x8100, 100 + n) for n in range(tags))
    return head + struct.pack(">H", ethertype) + network


def write_pcap(
    path: Path, segments: Iterable[TcpSegment], snaplen: int | None = None, link: str = "ipv4"
) -> Path:
    """Write segments as a pcap with nanosecond stamps (Ethernet, or loopback for ``null``
    links; see :data:`LINKS`); snapped payloads stay snapped."""
    buf = io.BytesIO()
    linktype = dpkt.pcap.DLT_NULL if link.startswith("null") else dpkt.pcap.DLT_EN10MB
    writer = dpkt.pcap.Writer(buf, snaplen=snaplen or 262144, linktype=linktype, nano=True)
    for seg in segments:
        payload = seg.payload + bytes(seg.length - len(seg.payload))  # the IP length tells the truth
        tcp = dpkt.tcp.TCP(
            sport=seg.sport, dport=seg.dport, seq=seg.seq, ack=seg.ack, flags=seg.flags, data=payload
        )
        frame = _link(_network(seg, bytes(tcp), link), link)
        frame = frame[: len(frame) - len(payload) + len(seg.payload)]
        writer.writepkt(frame, ts=seg.ts_ns / 1e9)
    path.write_bytes(buf.getvalue())
    return path


# -- the truth and the check -----------------------------------------------------------------


def true_frames(rows: Iterable[Row], kafka_ports: Collection[int]) -> dict[Key, list[bytes]]:
    """Every frame of a clean import, per (client port, direction), in order."""
    out: dict[Key, list[bytes]] = collections.defaultdict(list)
    for row in rows:
        if row["kind"] == "frame":
            assert row["frame_length"] == len(row["frame"]) and row["reason"] is None, row
            out[(row_port(row), row["direction"])].append(row["frame"])
    return dict(out)


def row_port(row: Row) -> int:
    """The client port of a row's connection (``CLIENT:PORT-SERVER:PORT``)."""
    client = row["connection_id"].split("#")[0].split("-")[0]
    return int(client.rsplit(":", 1)[1])


@dataclass
class Damage:
    """What :func:`check` found wrong, and how much was lost."""

    phantoms: list[tuple[Key, bytes]] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)
    imported: int = 0
    lost_after_first: int = 0  # real frames after the first imported one, not imported
    first: dict[Key, int] = field(default_factory=dict)  # truth index of the first imported frame

    @property
    def ok(self) -> bool:
        return not self.phantoms and not self.unaccounted


def check(
    rows: list[Row], truth: dict[Key, list[bytes]], kafka_ports: Collection[int], *, ends: bool
) -> Damage:
    """Compare a damaged import with the truth; ``ends``: the capture still holds the end of each stream."""
    damage = Damage()
    frames: dict[Key, list[Row]] = collections.defaultdict(list)
    closes: dict[int, Row] = {}
    for row in rows:
        if row["kind"] == "frame":
            frames[(row_port(row), row["direction"])].append(row)
        elif row["kind"] == "close":
            closes[row_port(row)] = row
    for key, got in frames.items():
        real = truth.get(key, [])
        last = -1
        for row in got:
            data, length = row["frame"], row["frame_length"]
            index = next(
                (
                    i
                    for i in range(last + 1, len(real))
                    if len(real[i]) == length and real[i][: len(data)] == data
                ),
                None,
            )
            if index is None:
                damage.phantoms.append((key, data[:32]))
                continue
            damage.imported += 1
            lost = _between(row["reason"])
            if last < 0:
                damage.first[key] = index
                before = sum(len(f) for f in real[:index])
                if lost > before:
                    damage.unaccounted.append(
                        f"{key}: {lost} bytes reported before the first frame, only {before}"
                    )
            else:
                skipped = sum(len(f) for f in real[last + 1 : index])
                damage.lost_after_first += index - last - 1
                if lost != skipped:
                    damage.unaccounted.append(
                        f"{key}: frames {last + 1}..{index - 1} hold {skipped} bytes, {lost} reported lost"
                    )
            last = index
        if ends and got and last >= 0:
            port, direction = key
            close = closes.get(port)
            if close is not None and close["reason"].startswith("fin"):
                after = sum(len(f) for f in real[last + 1 :])
                damage.lost_after_first += len(real) - last - 1
                reported = _tokens(close["reason"]).get(f"{direction}_gap", 0)
                reported += _tokens(close["reason"]).get(f"{direction}_skipped", 0)
                if reported != after:
                    damage.unaccounted.append(
                        f"{key}: {after} bytes after the last frame, {reported} reported"
                    )
    return damage


def reported_lost(rows: list[Row]) -> collections.Counter:
    """Bytes an import reports as not captured or not framable, per (client port, direction)."""
    lost: collections.Counter = collections.Counter()
    for row in rows:
        if row["kind"] == "frame":
            lost[(row_port(row), row["direction"])] += _between(row["reason"])
        elif row["kind"] == "close":
            tokens = _tokens(row["reason"])
            for direction in ("request", "response"):
                lost[(row_port(row), direction)] += tokens.get(f"{direction}_gap", 0)
                lost[(row_port(row), direction)] += tokens.get(f"{direction}_skipped", 0)
    return lost


def _tokens(reason: str | None) -> dict[str, int]:
    out = {}
    for token in (reason or "").split(","):
        name, _, value = token.partition("=")
        if value.isdigit():
            out[name] = int(value)
    return out


def _between(reason: str | None) -> int:
    tokens = _tokens(reason)
    return tokens.get("gap_before", 0) + tokens.get("skipped_before", 0)
