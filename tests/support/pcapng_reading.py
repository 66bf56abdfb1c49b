"""Read pcapng back for tests, independently of the writer: blocks, packets, comments, TCP."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import dpkt


@dataclass
class Packet:
    timestamp_ns: int
    data: bytes
    comments: list[str]

    @property
    def ip(self) -> dpkt.ip.IP:
        return dpkt.ethernet.Ethernet(self.data).data

    @property
    def tcp(self) -> dpkt.tcp.TCP:
        return self.ip.data


@dataclass
class Pcapng:
    linktype: int
    tsresol: int | None
    packets: list[Packet]


def _options(data: bytes) -> list[tuple[int, bytes]]:
    options, pos = [], 0
    while pos + 4 <= len(data):
        code, length = struct.unpack_from("<HH", data, pos)
        if code == 0:
            break
        options.append((code, data[pos + 4 : pos + 4 + length]))
        pos += 4 + length + (-length % 4)
    return options


def read_pcapng(path: Path) -> Pcapng:
    data = path.read_bytes()
    pos, linktype, tsresol, packets = 0, None, None, []
    while pos < len(data):
        block_type, length = struct.unpack_from("<II", data, pos)
        assert struct.unpack_from("<I", data, pos + length - 4)[0] == length, "trailing block length"
        body = data[pos + 8 : pos + length - 4]
        if pos == 0:
            assert block_type == 0x0A0D0D0A and struct.unpack_from("<I", body)[0] == 0x1A2B3C4D
        elif block_type == 1:
            linktype = struct.unpack_from("<H", body)[0]
            tsresol = next((v[0] for c, v in _options(body[8:]) if c == 9), None)
        elif block_type == 6:
            _, high, low, caplen, origlen = struct.unpack_from("<IIIII", body)
            assert caplen == origlen
            packet = body[20 : 20 + caplen]
            options = _options(body[20 + caplen + (-caplen % 4) :])
            comments = [v.decode() for c, v in options if c == 1]
            packets.append(Packet((high << 32) | low, packet, comments))
        pos += length
    assert linktype is not None
    return Pcapng(linktype, tsresol, packets)


def checksums_valid(packet: Packet) -> bool:
    """Recompute the IP and TCP checksums with dpkt and compare."""
    ip = packet.ip
    ip_sum, tcp_sum = ip.sum, ip.data.sum
    ip.sum = 0
    ip.data.sum = 0
    again = dpkt.ip.IP(bytes(ip))
    return (again.sum, again.data.sum) == (ip_sum, tcp_sum)
