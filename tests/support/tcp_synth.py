"""Synthetic TCP captures of known Kafka frames, built with dpkt, for the pcap import tests.

A :class:`TcpSession` hands out segments of one connection with correct sequence and
acknowledgement numbers; the tests then damage the list (duplicate, reorder, overlap,
drop) and write it as pcap or pcapng with one of several link layers.
"""

from __future__ import annotations

import io
import socket
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import dpkt

from corrfix.capture.pcap import (
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
)

SYN, ACK, FIN, RST, PSH = dpkt.tcp.TH_SYN, dpkt.tcp.TH_ACK, dpkt.tcp.TH_FIN, dpkt.tcp.TH_RST, dpkt.tcp.TH_PUSH


@dataclass(frozen=True)
class Segment:
    from_client: bool
    seq: int
    ack: int
    flags: int
    payload: bytes
    ts_ns: int = 0


class TcpSession:
    """Segments of one TCP connection; ``send`` cuts data into ``mss``-sized segments."""

    def __init__(
        self,
        client: tuple[str, int] = ("10.0.0.1", 40001),
        server: tuple[str, int] = ("10.0.0.2", 9092),
        client_isn: int = 1000,
        server_isn: int = 5_000_000,
        mss: int = 1000,
    ) -> None:
        self.client, self.server, self.mss = client, server, mss
        self.next = {True: client_isn, False: server_isn}  # next sequence number per sender
        self.acked = {True: 0, False: 0}  # what each side acknowledges

    def handshake(self) -> list[Segment]:
        c_isn, s_isn = self.next[True], self.next[False]
        self.next = {True: c_isn + 1, False: s_isn + 1}
        self.acked = {True: s_isn + 1, False: c_isn + 1}
        return [
            Segment(True, c_isn, 0, SYN, b""),
            Segment(False, s_isn, c_isn + 1, SYN | ACK, b""),
            Segment(True, c_isn + 1, s_isn + 1, ACK, b""),
        ]

    def send(self, from_client: bool, data: bytes, with_ack: bool = False) -> list[Segment]:
        """Data segments; the ACK flag is set only when asked (acks can force gaps)."""
        out = []
        for start in range(0, len(data), self.mss):
            chunk = data[start : start + self.mss]
            flags = PSH | (ACK if with_ack else 0)
            out.append(Segment(from_client, self.next[from_client], self.acked[from_client], flags, chunk))
            self.next[from_client] = (self.next[from_client] + len(chunk)) % (1 << 32)
        self.acked[not from_client] = self.next[from_client]
        return out

    def ack(self, from_client: bool) -> Segment:
        """A pure ACK of everything the peer sent so far."""
        return Segment(from_client, self.next[from_client], self.acked[from_client], ACK, b"")

    def fin(self, from_client: bool) -> Segment:
        seg = Segment(from_client, self.next[from_client], self.acked[from_client], FIN | ACK, b"")
        self.next[from_client] += 1
        self.acked[not from_client] = self.next[from_client]
        return seg

    def rst(self, from_client: bool) -> Segment:
        return Segment(from_client, self.next[from_client], 0, RST, b"")


def timed(
    segments: list[Segment], start_ns: int = 1_700_000_000_000_000_000, step_ns: int = 1000
) -> list[Segment]:
    """The same segments, stamped ``step_ns`` apart in list order."""
    return [replace(seg, ts_ns=start_ns + i * step_ns) for i, seg in enumerate(segments)]


def split(seg: Segment, at: int) -> tuple[Segment, Segment]:
    """One segment as two, the second starting ``at`` bytes in."""
    first = replace(seg, payload=seg.payload[:at])
    second = replace(seg, seq=(seg.seq + at) % (1 << 32), payload=seg.payload[at:])
    return first, second


def ip_packet(session: TcpSession, seg: Segment, ipv6: bool = False, hop_by_hop: bool = False) -> bytes:
    src, dst = (session.client, session.server) if seg.from_client else (session.server, session.client)
    tcp = dpkt.tcp.TCP(
        sport=src[1], dport=dst[1], seq=seg.seq, ack=seg.ack, flags=seg.flags, data=seg.payload
    )
    if ipv6:
        tcp_bytes = bytes(tcp)
        packet = dpkt.ip6.IP6(
            src=socket.inet_pton(socket.AF_INET6, src[0]),
            dst=socket.inet_pton(socket.AF_INET6, dst[0]),
            nxt=dpkt.ip.IP_PROTO_TCP,
            hlim=64,
            plen=len(tcp_bytes),
            data=tcp,
        )
        tcp.sum = 0
        raw = bytes(packet)
        if hop_by_hop:  # an 8-byte hop-by-hop options header (PadN) before TCP
            header = bytearray(raw[:40])
            header[6] = 0
            header[4:6] = (len(tcp_bytes) + 8).to_bytes(2, "big")
            raw = bytes(header) + bytes([dpkt.ip.IP_PROTO_TCP, 0, 1, 4, 0, 0, 0, 0]) + raw[40:]
        return raw
    packet = dpkt.ip.IP(
        src=socket.inet_aton(src[0]), dst=socket.inet_aton(dst[0]), p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=tcp
    )
    return bytes(packet)


def link_frame(linktype: int, ip: bytes) -> bytes:
    ethertype = 0x86DD if ip[0] >> 4 == 6 else 0x0800
    if linktype == LINKTYPE_ETHERNET:
        return bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=ethertype, data=ip))
    if linktype == LINKTYPE_LINUX_SLL:
        return struct.pack(">HHH8sH", 0, 772, 6, b"\0" * 8, ethertype) + ip
    if linktype == LINKTYPE_LINUX_SLL2:
        return struct.pack(">HHiHBB8s", ethertype, 0, 1, 772, 0, 6, b"\0" * 8) + ip
    if linktype == LINKTYPE_NULL:
        return struct.pack("<I", 2 if ethertype == 0x0800 else 30) + ip
    if linktype == LINKTYPE_LOOP:
        return struct.pack(">I", 2 if ethertype == 0x0800 else 30) + ip
    if linktype == LINKTYPE_RAW:
        return ip
    raise ValueError(f"no builder for link type {linktype}")


def write_capture(
    path: Path,
    session: TcpSession,
    segments: list[Segment],
    *,
    linktype: int = LINKTYPE_ETHERNET,
    ipv6: bool = False,
    pcapng: bool = False,
    snaplen: int | None = None,
    hop_by_hop: bool = False,
) -> Path:
    """Write one connection's ``segments`` as a capture file; ``snaplen`` cuts packets as tcpdump -s would."""
    packets = [(session, seg) for seg in segments]
    return write_packets(
        path, packets, linktype=linktype, ipv6=ipv6, pcapng=pcapng, snaplen=snaplen, hop_by_hop=hop_by_hop
    )


def write_packets(
    path: Path,
    packets: list[tuple[TcpSession, Segment]],
    *,
    linktype: int = LINKTYPE_ETHERNET,
    ipv6: bool = False,
    pcapng: bool = False,
    snaplen: int | None = None,
    hop_by_hop: bool = False,
) -> Path:
    """Write segments of any connections, in list order, as a capture file."""
    buf = io.BytesIO()
    if pcapng:
        writer = dpkt.pcapng.Writer(buf, snaplen=snaplen or 262144, linktype=linktype)
    else:
        writer = dpkt.pcap.Writer(buf, snaplen=snaplen or 262144, linktype=linktype)
    for session, seg in packets:
        frame = link_frame(linktype, ip_packet(session, seg, ipv6, hop_by_hop))
        if snaplen is not None:
            frame = frame[:snaplen]
        writer.writepkt(frame, ts=seg.ts_ns / 1e9)  # microsecond files: exact for whole microseconds
    path.write_bytes(buf.getvalue())
    return path
