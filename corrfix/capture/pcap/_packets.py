"""TCP segments out of pcap and pcapng files, whatever the link layer.

The files are walked here rather than by ``dpkt.pcap.Reader`` and ``dpkt.pcapng.Reader``:
those turn timestamps into floats (nanosecond stamps must stay exact), pass a record cut
short by a killed tcpdump off as a whole packet, and, for pcapng, know only a file's first
interface (a capture of ``-i any`` or a merged file has several, of different link types).
dpkt still parses pcapng interface descriptions and IPv6 extension headers; packet blocks
and the fixed IPv4, IPv6 and TCP headers are read with ``struct``, as dpkt's parsers took
most of an import's time.

A pcapng block cut short or damaged (its lengths disagree, or it is longer than the file)
ends its section: reading goes on at the next section header block, as when files were
concatenated and the first was cut.

A segment's ``length`` comes from the IP header, not from what was captured: when the snap
length cut a packet short, the reassembler then knows how many bytes are missing.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import dpkt

PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_PCAP_MAGIC = {  # first four bytes -> (byte order, nanosecond stamps)
    b"\xd4\xc3\xb2\xa1": ("<", False),
    b"\xa1\xb2\xc3\xd4": (">", False),
    b"\x4d\x3c\xb2\xa1": ("<", True),
    b"\xa1\xb2\x3c\x4d": (">", True),
}
_PCAPNG_BYTE_ORDER_LE = b"\x4d\x3c\x2b\x1a"
_PCAPNG_BYTE_ORDERS = (_PCAPNG_BYTE_ORDER_LE, b"\x1a\x2b\x3c\x4d")
_PCAPNG_IDB = 1
_PCAPNG_PB = 2
_PCAPNG_SPB = 3
_PCAPNG_EPB = 6
_EPB = {order: struct.Struct(order + "IIII") for order in "<>"}  # interface, stamp, captured length
_PB = {order: struct.Struct(order + "HHIII") for order in "<>"}  # interface, drops, stamp, captured
_MIN_BLOCK = {0x0A0D0D0A: 28, 6: 32, 2: 32, 3: 16}  # section header, enhanced, obsolete, simple packet
_MAX_BLOCK = 64 * 1024 * 1024  # longer is damage: a block is read whole (tcpdump's snap length: 256 KiB)
_SEARCH_CHUNK = 1 << 20  # bytes read at a time when looking for the next section
_OPT_TSRESOL = 9
_PCAP_LINKTYPE_MASK = 0xFFFF  # of a pcap link type field; the upper 16 bits say whether frames end in an FCS
_OPT_TSOFFSET = 14
_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1  # the capture's times are 64-bit nanoseconds

# Link-layer types (LINKTYPE_* as stored in files; a few DLT_* aliases seen in the wild).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
_RAW_ALIASES = frozenset({LINKTYPE_RAW, 12, 14, LINKTYPE_IPV4, LINKTYPE_IPV6})
_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_ETHERTYPE_VLAN = frozenset({0x8100, 0x88A8, 0x9100})

_PROTO_TCP = 6
_TCP = struct.Struct(">HHIIBB")  # ports, sequence, acknowledgement, data offset, flags
# An IPv4 header without options (version and length, total length, fragment, protocol,
# addresses) and the TCP header's first fields, read in one go.
_IPV4_TCP = struct.Struct(">BxH2xHxB2x4s4sHHIIBB")

TH_FIN = dpkt.tcp.TH_FIN
TH_SYN = dpkt.tcp.TH_SYN
TH_RST = dpkt.tcp.TH_RST
TH_ACK = dpkt.tcp.TH_ACK


class TcpSegment(NamedTuple):
    """One captured TCP segment. ``payload`` is what was captured of its data; ``length``
    is the data's real length (longer when the snap length cut the packet).

    A named tuple, not a frozen dataclass: one is made per packet, and a tuple costs a
    third as much to make.
    """

    index: int  # type: ignore[assignment]  # the packet's number in the file; hides tuple.index
    ts_ns: int
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int
    payload: bytes
    length: int

    @property
    def syn(self) -> bool:
        return bool(self.flags & TH_SYN)

    @property
    def fin(self) -> bool:
        return bool(self.flags & TH_FIN)

    @property
    def rst(self) -> bool:
        return bool(self.flags & TH_RST)

    @property
    def has_ack(self) -> bool:
        return bool(self.flags & TH_ACK)


@dataclass(slots=True)
class PacketStats:
    """What the reader saw, for the import summary."""

    packets: int = 0
    tcp: int = 0
    not_tcp: int = 0
    unsupported_link: dict[int, int] = field(default_factory=dict)
    fragments: int = 0
    truncated_file: bool = False


def read_segments_per_packet(path: Path, stats: PacketStats | None = None) -> Iterator[TcpSegment]:
    """Every TCP segment of a pcap or pcapng file, in file order, read packet by packet.

    The reference reader, and the one for files :mod:`._packet_table` does not cover.
    """
    stats = stats if stats is not None else PacketStats()
    with path.open("rb") as f:
        for ts_ns, linktype, data in _frames(f, stats):
            stats.packets += 1
            segment = _parse(stats.packets - 1, ts_ns, linktype, data, stats)
            if segment is None:
                stats.not_tcp += 1
            else:
                stats.tcp += 1
                yield segment


def format_address(ip: str, port: int) -> str:
    """``1.2.3.4:9092`` or ``[::1]:9092``."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# -- files -----------------------------------------------------------------------------------


def _frames(f: BinaryIO, stats: PacketStats) -> Iterator[tuple[int, int, bytes]]:
    """(timestamp in ns, link type, link-layer bytes) per packet."""
    magic = f.read(4)
    f.seek(0)
    if magic == PCAPNG_MAGIC:
        yield from _pcapng_frames(f, stats)
    else:
        yield from _pcap_frames(f, stats)


def _pcap_frames(f: BinaryIO, stats: PacketStats) -> Iterator[tuple[int, int, bytes]]:
    header = f.read(24)
    formats = _PCAP_MAGIC.get(header[:4])
    if formats is None or len(header) < 24:
        raise ValueError("not a pcap or pcapng file")
    order, nano = formats
    linktype = struct.unpack(order + "I", header[20:24])[0] & _PCAP_LINKTYPE_MASK
    record = struct.Struct(order + "IIII")
    while True:
        head = f.read(record.size)
        if len(head) < record.size:
            stats.truncated_file = stats.truncated_file or bool(head)
            return
        seconds, fraction, captured, _original = record.unpack(head)
        data = f.read(captured)
        if len(data) < captured:
            stats.truncated_file = True  # the writer was stopped in the middle of a record
            return
        yield seconds * 1_000_000_000 + (fraction if nano else fraction * 1000), linktype, data


@dataclass(slots=True)
class _Interface:
    linktype: int
    snaplen: int
    units_per_second: int = 1_000_000
    offset_s: int = 0

    def ts_ns(self, high: int, low: int) -> int:
        ticks = (high << 32) | low
        ns = ticks * 1_000_000_000 // self.units_per_second + self.offset_s * 1_000_000_000
        if not _MIN_NS <= ns <= _MAX_NS:
            raise ValueError(f"a packet timestamp beyond 64-bit nanoseconds ({ns} ns): a damaged file?")
        return ns


def _pcapng_frames(f: BinaryIO, stats: PacketStats) -> Iterator[tuple[int, int, bytes]]:
    size = os.fstat(f.fileno()).st_size
    little = True
    interfaces: list[_Interface] = []
    last_ts = 0
    while True:
        start = f.tell()
        head = f.read(8)
        if len(head) < 8:
            return
        section = head[:4] == PCAPNG_MAGIC  # a section header: byte order may change, interfaces reset
        bom = f.read(4) if section else b""
        if bom in _PCAPNG_BYTE_ORDERS:
            little = bom == _PCAPNG_BYTE_ORDER_LE
        order = "<" if little else ">"
        block_type, length = struct.unpack(order + "II", head)
        whole = block_fits(block_type, length, start, size) and (not section or bom in _PCAPNG_BYTE_ORDERS)
        body = bom + f.read(length - 8 - len(bom)) if whole else b""
        if not whole or body[-4:] != head[4:]:  # cut short (or damaged): a next section may follow it
            stats.truncated_file = True
            if not _seek_section(f, start + 1):
                return
            continue
        if section:
            interfaces = []
            continue
        epb, pb = _EPB[order], _PB[order]
        if block_type == _PCAPNG_IDB:
            block = head + body
            cls = dpkt.pcapng.InterfaceDescriptionBlockLE if little else dpkt.pcapng.InterfaceDescriptionBlock
            try:
                interfaces.append(_interface(cls(block), order))
            except (dpkt.UnpackError, struct.error, IndexError) as exc:
                raise ValueError(
                    f"a damaged pcapng interface description block at byte {start}: {exc}"
                ) from exc
        elif block_type in (_PCAPNG_EPB, _PCAPNG_PB):
            # EPB: interface (32), stamp (2 x 32), captured and original lengths; PB: interface
            # and drops (16 + 16), then the same. Read by hand: this runs for every packet.
            if block_type == _PCAPNG_EPB:
                iface_id, ts_high, ts_low, captured = epb.unpack_from(body)
            else:
                iface_id, _drops, ts_high, ts_low, captured = pb.unpack_from(body)
            if iface_id < len(interfaces) and 20 + captured <= len(body):
                iface = interfaces[iface_id]
                last_ts = iface.ts_ns(ts_high, ts_low)
                yield last_ts, iface.linktype, body[20 : 20 + captured]
        elif block_type == _PCAPNG_SPB and interfaces:
            # No timestamp of its own: it inherits the previous packet's.
            original = struct.unpack(order + "I", body[:4])[0]
            iface = interfaces[0]
            captured = min(original, iface.snaplen or original, len(body) - 8)
            yield last_ts, iface.linktype, bytes(body[4 : 4 + captured])


def block_fits(block_type: int, length: int, start: int, size: int) -> bool:
    """Whether a pcapng block of this type and length can start at ``start`` of a file of ``size``
    bytes: long enough for its fields, a multiple of 4, within the file, and not so long
    that it must be damage (it would be read whole)."""
    return (
        _MIN_BLOCK.get(block_type, 12) <= length <= _MAX_BLOCK and not length % 4 and start + length <= size
    )


def _seek_section(f: BinaryIO, start: int) -> bool:
    """Move to the next section header block from ``start`` on (files written one after the
    other, the first cut short); False when there is none."""
    f.seek(start)
    data = b""
    while chunk := f.read(_SEARCH_CHUNK):
        data = data[-11:] + chunk  # a header may straddle two chunks
        base = f.tell() - len(data)
        at = data.find(PCAPNG_MAGIC)
        while at != -1 and at + 12 <= len(data):
            if data[at + 8 : at + 12] in _PCAPNG_BYTE_ORDERS:
                f.seek(base + at)
                return True
            at = data.find(PCAPNG_MAGIC, at + 1)
    return False


def _interface(idb: dpkt.pcapng.InterfaceDescriptionBlock, order: str) -> _Interface:
    iface = _Interface(idb.linktype, idb.snaplen)
    for opt in idb.opts:
        if opt.code == _OPT_TSRESOL and opt.data:
            resolution = opt.data[0]
            base = 2 if resolution & 0x80 else 10
            iface.units_per_second = base ** (resolution & 0x7F)
        elif opt.code == _OPT_TSOFFSET and len(opt.data) >= 8:
            iface.offset_s = struct.unpack(order + "q", opt.data[:8])[0]
    return iface


# -- packets ---------------------------------------------------------------------------------


def _network_bytes(linktype: int, data: bytes) -> bytes | None:
    """The IP packet inside a link-layer frame, or None for anything else."""
    if linktype == LINKTYPE_ETHERNET:
        if len(data) < 14:
            return None
        pos, ethertype = 14, int.from_bytes(data[12:14], "big")
        while ethertype in _ETHERTYPE_VLAN and len(data) >= pos + 4:
            ethertype = int.from_bytes(data[pos + 2 : pos + 4], "big")
            pos += 4
        return data[pos:] if ethertype in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if linktype == LINKTYPE_LINUX_SLL:
        ethertype = int.from_bytes(data[14:16], "big")
        return data[16:] if ethertype in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if linktype == LINKTYPE_LINUX_SLL2:
        ethertype = int.from_bytes(data[0:2], "big")
        return data[20:] if ethertype in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        return data[4:]  # the address family's byte order varies; the IP version nibble decides
    if linktype in _RAW_ALIASES:
        return data
    return None


def _parse(index: int, ts_ns: int, linktype: int, data: bytes, stats: PacketStats) -> TcpSegment | None:
    fast = _FAST_IPV4.get(linktype)
    if fast is not None:  # IPv4 without options nor fragments, carrying TCP: one unpack, one copy
        offset, ethertype_at = fast
        if (ethertype_at is None or data[ethertype_at : ethertype_at + 2] == b"\x08\x00") and len(
            data
        ) >= offset + _IPV4_TCP.size:
            vihl, total, fragment, proto, src, dst, sport, dport, seq, ack, tcp_offset, flags = (
                _IPV4_TCP.unpack_from(data, offset)
            )
            if vihl == 0x45 and proto == _PROTO_TCP and not fragment & 0x3FFF and tcp_offset >= 0x50:
                header = (tcp_offset >> 4) * 4
                start = offset + 20 + header
                end = offset + total if total else len(data)
                length = max(end - start, 0)
                return TcpSegment(
                    index,
                    ts_ns,
                    _address(src),
                    sport,
                    _address(dst),
                    dport,
                    seq,
                    ack,
                    flags,
                    data[start:end],
                    length,
                )
    network = _network_bytes(linktype, data)
    if network is None:
        if linktype not in _KNOWN_LINKTYPES:
            stats.unsupported_link[linktype] = stats.unsupported_link.get(linktype, 0) + 1
        return None
    ip = _ip_payload(network, stats)
    if ip is None:
        return None
    src, dst, segment, tcp_length = ip
    if len(segment) < _TCP.size:
        return None
    sport, dport, seq, ack, offset, flags = _TCP.unpack_from(segment)
    header = (offset >> 4) * 4
    if header < _TCP.size or len(segment) < header:
        return None
    payload = segment[header:]
    length = len(payload) if tcp_length is None else max(tcp_length - header, 0)
    return TcpSegment(
        index, ts_ns, _address(src), sport, _address(dst), dport, seq, ack, flags, payload[:length], length
    )


def _ip_payload(network: bytes, stats: PacketStats) -> tuple[bytes, bytes, bytes, int | None] | None:
    """(source, destination, TCP segment as captured, its real length) of an IP packet carrying TCP.

    IPv4 and plain IPv6 headers are read by hand (this runs for every packet); dpkt walks
    IPv6 extension headers. A zero total length (segmentation offload) means "as captured".
    """
    if not network:
        return None
    version = network[0] >> 4
    if version == 4 and len(network) >= 20:
        if network[9] != _PROTO_TCP:
            return None
        if int.from_bytes(network[6:8], "big") & 0x3FFF:  # more fragments, or a fragment offset
            stats.fragments += 1
            return None
        header = (network[0] & 0x0F) * 4
        total = int.from_bytes(network[2:4], "big")
        segment = network[header:total] if total else network[header:]
        return network[12:16], network[16:20], segment, (total - header if total else None)
    if version == 6 and len(network) >= 40:
        length = int.from_bytes(network[4:6], "big")
        extensions = 0
        if network[6] != _PROTO_TCP:
            try:
                ip6 = dpkt.ip6.IP6(network)
            except (dpkt.UnpackError, struct.error, IndexError):
                return None
            if 44 in ip6.extension_hdrs:
                stats.fragments += 1
                return None
            if ip6.p != _PROTO_TCP:
                return None
            extensions = sum(h.length for h in ip6.all_extension_headers)
        start = 40 + extensions
        segment = network[start : 40 + length] if length else network[start:]
        return network[8:24], network[24:40], segment, (length - extensions if length else None)
    return None


@functools.lru_cache(maxsize=4096)
def _address(packed: bytes) -> str:
    return str(ipaddress.ip_address(packed))


# Link types the fast path reads: where IP starts, and where the ethertype is (None: none).
_FAST_IPV4 = {
    LINKTYPE_ETHERNET: (14, 12),
    LINKTYPE_LINUX_SLL: (16, 14),
    LINKTYPE_LINUX_SLL2: (20, 0),
    LINKTYPE_RAW: (0, None),
}

_KNOWN_LINKTYPES = (
    frozenset({LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_NULL, LINKTYPE_LOOP})
    | _RAW_ALIASES
)
