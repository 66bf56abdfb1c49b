"""TCP segments of a pcap or pcapng file, its packet table read with numpy.

Reading packets one at a time (:func:`._packets.read_segments_per_packet`) took about a
quarter of an import. Here the file is mapped into memory, the record or block headers
are walked in one tight loop, and the common packet (IPv4 without options nor fragments
carrying TCP, behind Ethernet, Linux cooked headers or nothing) has its header fields
gathered for all packets at once. Every other packet goes through the per-packet parser,
and a file this walker does not cover in full (simple or obsolete packet blocks, several
sections, timestamps whose unit does not divide a nanosecond, anything malformed) is read
by the per-packet reader from the start, so the segments are always the same.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dpkt
import numpy as np
import numpy.typing as npt

from corrfix.capture.pcap._packets import (
    _ETHERTYPE_IPV4,
    _ETHERTYPE_IPV6,
    _ETHERTYPE_VLAN,
    _FAST_IPV4,
    _MAX_BLOCK,
    _MAX_NS,
    _MIN_NS,
    _PCAP_LINKTYPE_MASK,
    _PCAP_MAGIC,
    _PCAPNG_BYTE_ORDER_LE,
    _PCAPNG_EPB,
    _PCAPNG_IDB,
    _PCAPNG_PB,
    _PCAPNG_SPB,
    _PROTO_TCP,
    _RAW_ALIASES,
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    PCAPNG_MAGIC,
    PacketStats,
    TcpSegment,
    _address,
    _Interface,
    _interface,
    _parse,
    block_fits,
    read_segments_per_packet,
)

_NS = 1_000_000_000
_SHB = 0x0A0D0D0A  # the section header block: the same in either byte order
_new_segment = functools.partial(tuple.__new__, TcpSegment)
_CHUNK = 65536  # packets whose segments are made at once
_IPV4_TCP_SIZE = 34  # the fixed IPv4 header and TCP's first 14 bytes, as ``_packets`` reads them
_Ints = npt.NDArray[np.int64]


class _Table:
    """Per packet: where its bytes start in the file, how many were captured, link type, time."""

    def __init__(self) -> None:
        self.offsets: _Ints = np.zeros(0, np.int64)
        self.captured: _Ints = np.zeros(0, np.int64)
        self.linktypes: _Ints = np.zeros(0, np.int64)
        self.stamps: _Ints = np.zeros(0, np.int64)
        self.truncated = False


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    """The file mapped read-only while the context lasts.

    Closing a mapping fails while numpy or Arrow views of it are alive, and an error on its
    way up keeps them alive in its traceback: the mapping is then left to close with its last
    view, so that the error reported is the one that ended the import, not a BufferError.
    """
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield mm
    finally:
        with contextlib.suppress(BufferError):
            mm.close()


def read_segments(path: Path, stats: PacketStats | None = None) -> Iterator[TcpSegment]:
    """Every TCP segment of a pcap or pcapng file, in file order."""
    stats = stats if stats is not None else PacketStats()
    if path.stat().st_size == 0:
        yield from read_segments_per_packet(path, stats)
        return
    with _mapped(path) as mm:
        table = _walk(mm)
        if table is None:
            yield from read_segments_per_packet(path, stats)
            return
        yield from _segments(mm, table, stats)
        stats.truncated_file = table.truncated


def _walk(mm: mmap.mmap) -> _Table | None:
    """The packet table, or None when the per-packet reader must read this file."""
    try:
        if mm[:4] == PCAPNG_MAGIC:
            return _walk_pcapng(mm)
        return _walk_pcap(mm)
    except (struct.error, ValueError, IndexError, dpkt.UnpackError):
        return None


def _walk_pcap(mm: mmap.mmap) -> _Table | None:
    formats = _PCAP_MAGIC.get(mm[:4])
    size = len(mm)
    if formats is None or size < 24:
        return None
    order, nano = formats
    linktype = struct.unpack_from(order + "I", mm, 20)[0] & _PCAP_LINKTYPE_MASK
    record = struct.Struct(order + "IIII")
    table = _Table()
    offsets: list[int] = []
    captured: list[int] = []
    seconds: list[int] = []
    fractions: list[int] = []
    pos = 24
    while True:
        if pos + 16 > size:
            table.truncated = pos < size
            break
        second, fraction, length, _original = record.unpack_from(mm, pos)
        if pos + 16 + length > size:
            table.truncated = True
            break
        offsets.append(pos + 16)
        captured.append(length)
        seconds.append(second)
        fractions.append(fraction)
        pos += 16 + length
    table.offsets = np.array(offsets, np.int64)
    table.captured = np.array(captured, np.int64)
    table.linktypes = np.full(len(offsets), linktype, np.int64)
    table.stamps = np.array(seconds, np.int64) * _NS + np.array(fractions, np.int64) * (1 if nano else 1000)
    return table


def _walk_pcapng(mm: mmap.mmap) -> _Table | None:
    size = len(mm)
    if size < 12:
        return None
    little = mm[8:12] == _PCAPNG_BYTE_ORDER_LE
    order = "<" if little else ">"
    header = struct.Struct(order + "II")
    first = header.unpack_from(mm, 0)[1]
    if first < 12 or first > size or first % 4:
        return None
    cls = dpkt.pcapng.InterfaceDescriptionBlockLE if little else dpkt.pcapng.InterfaceDescriptionBlock
    table = _Table()
    words = np.frombuffer(mm, np.dtype(order + "u4"), count=size // 4)
    chained = _chain(mm, words, first, order, table)
    if chained is None:
        return None
    at_all = chained // 4
    types, lengths_all = words[at_all], words[at_all + 1]
    if ((types == _SHB) | (types == _PCAPNG_PB) | (types == _PCAPNG_SPB)).any():
        return None
    if ((types == _PCAPNG_EPB) & (lengths_all < 32)).any():
        return None
    is_idb = types == _PCAPNG_IDB
    interfaces: list[_Interface] = []
    for at in at_all[is_idb].tolist():
        iface = _interface(cls(mm[at * 4 : at * 4 + int(words[at + 1])]), order)
        if _NS % iface.units_per_second:
            return None
        interfaces.append(iface)
    is_epb = types == _PCAPNG_EPB
    blocks = at_all[is_epb] * 4  # where each enhanced packet block starts
    seen = np.cumsum(is_idb)[is_epb]  # how many interfaces were described by then
    at = blocks // 4
    ids, highs, lows, captured = (words[at + n].astype(np.int64) for n in (2, 3, 4, 5))
    lengths = words[at + 1].astype(np.int64)
    keep = (ids < seen) & (20 + captured <= lengths - 8)
    at, ids, highs, lows, captured = at[keep], ids[keep], highs[keep], lows[keep], captured[keep]
    if not interfaces:
        return table
    linktypes = np.array([iface.linktype for iface in interfaces], np.int64)[ids]
    units = np.array([_NS // iface.units_per_second for iface in interfaces], np.int64)[ids]
    shifts = np.array([iface.offset_s for iface in interfaces], np.int64)[ids]
    if highs.size:
        top = (int(highs.max()) + 1) << 32  # more ticks than any packet's
        for iface in interfaces:
            offset = iface.offset_s * _NS
            if offset < _MIN_NS or top * (_NS // iface.units_per_second) + offset > _MAX_NS:
                return None  # beyond int64 nanoseconds: the per-packet reader says so
    table.offsets = at * 4 + 28
    table.captured = captured
    table.linktypes = linktypes
    table.stamps = ((highs << 32) | lows) * units + shifts * _NS
    return table


_RUN_WINDOW = 1 << 20
"""Words of the file compared at once when looking for packet blocks (4 MiB of the file)."""


class _Runs:
    """Where enhanced packet blocks may start: every aligned word holding the block type whose
    length is plausible and repeated at the block's end, in runs that chain (each ends where
    the next begins). A position of the real chain that is one of these is followed, from
    there to the end of its run, without reading the blocks one by one."""

    def __init__(self, words: npt.NDArray[np.uint32], first: int, size: int) -> None:
        # Compared a window at a time: a mask of the whole file would cost a byte per word.
        last = len(words) - 1
        at = np.concatenate(
            [
                np.flatnonzero(words[lo : min(lo + _RUN_WINDOW, last)] == _PCAPNG_EPB).astype(np.int64) + lo
                for lo in range(first // 4, max(last, first // 4), _RUN_WINDOW)
            ]
            or [np.zeros(0, np.int64)]
        )
        lengths = words[at + 1].astype(np.int64)
        ok = (lengths >= 12) & (lengths <= _MAX_BLOCK) & (lengths % 4 == 0) & (at * 4 + lengths <= size)
        at, lengths = at[ok], lengths[ok]
        ok = words[at + lengths // 4 - 1] == lengths
        self.starts = at[ok] * 4
        self.ends = self.starts + lengths[ok]
        breaks = np.flatnonzero(self.ends[:-1] != self.starts[1:]) + 1
        self.run_ends = np.append(breaks, len(self.starts))

    def run_from(self, pos: int) -> tuple[npt.NDArray[np.int64], int] | None:
        """The block starts from ``pos`` to the end of its run and where the run ends, or None
        when ``pos`` is not one of the candidates."""
        k = int(np.searchsorted(self.starts, pos))
        if k == len(self.starts) or self.starts[k] != pos:
            return None
        stop = int(self.run_ends[np.searchsorted(self.run_ends, k, side="right")])
        return self.starts[k:stop], int(self.ends[stop - 1])


def _chain(
    mm: mmap.mmap, words: npt.NDArray[np.uint32], first: int, order: str, table: _Table
) -> _Ints | None:
    """Where each block starts, chained by their lengths from ``first`` up to the first whose
    length is broken (the file is then truncated, ``table.truncated``); None when another
    section or a broken or unaligned length means the per-packet reader must decide. Enhanced
    packet blocks are taken a run at a time (:class:`_Runs`), any other block on its own."""
    size = len(mm)
    runs = _Runs(words, first, size)
    read_block = struct.Struct(order + "II").unpack_from
    pieces: list[_Ints] = []
    single: list[int] = []
    pos = first
    while pos + 8 <= size:
        if words[pos // 4] == _PCAPNG_EPB:
            run = runs.run_from(pos)
            if run is not None:
                if single:
                    pieces.append(np.array(single, np.int64))
                    single = []
                pieces.append(run[0])
                pos = run[1]
                continue
        block_type, length = read_block(mm, pos)
        if not block_fits(block_type, length, pos, size) or words[(pos + length) // 4 - 1] != length:
            if mm.find(PCAPNG_MAGIC, pos + 1) != -1 or not (length < 12 or pos + length > size):
                return None  # damaged, or a section may follow: the per-packet reader decides
            table.truncated = True
            break
        single.append(pos)
        pos += length
    pieces.append(np.array(single, np.int64))
    return np.concatenate(pieces)


def _segments(mm: mmap.mmap, table: _Table, stats: PacketStats) -> Iterator[TcpSegment]:
    """The table's segments, a chunk of packets at a time (the payloads are copies)."""
    v6: dict[bytes, int] = {}
    for first in range(0, len(table.offsets), _CHUNK):
        yield from _chunk_columns(
            mm, table, first, min(first + _CHUNK, len(table.offsets)), stats, v6
        ).segments()


@dataclass(slots=True)
class PacketColumns:
    """TCP segments as columns: one entry per packet the numpy pass read (``index`` is the
    packet's number in the file), payloads as ``[start, stop)`` ranges of ``data``; the
    segments of the other packets, made by the per-packet parser, in ``others``."""

    data: mmap.mmap
    index: _Ints
    ts_ns: _Ints
    src: _Ints  # addresses as numbers (IPv4's own, IPv6 numbered from 2**32); ``addresses`` names them
    sport: _Ints
    dst: _Ints
    dport: _Ints
    seq: _Ints
    ack: _Ints
    flags: _Ints
    start: _Ints
    stop: _Ints
    length: _Ints
    addresses: dict[int, str]
    others: list[TcpSegment]

    def segments(self) -> list[TcpSegment]:
        """All segments, as :func:`read_segments` gives them (payloads copied), in file order."""
        made = map(
            _new_segment,
            zip(
                self.index.tolist(),
                self.ts_ns.tolist(),
                list(map(self.addresses.__getitem__, self.src.tolist())),
                self.sport.tolist(),
                list(map(self.addresses.__getitem__, self.dst.tolist())),
                self.dport.tolist(),
                self.seq.tolist(),
                self.ack.tolist(),
                self.flags.tolist(),
                list(map(self.data.__getitem__, map(slice, self.start.tolist(), self.stop.tolist()))),
                self.length.tolist(),
                strict=True,
            ),
        )
        if not self.others:
            return list(made)
        return list(heapq.merge(made, self.others))  # by packet index, the first field

    def select(self, rows: _Ints) -> PacketColumns:
        """The segments at these positions of the columns (``others`` left out)."""
        columns = {name: getattr(self, name)[rows] for name in _COLUMNS}
        return PacketColumns(self.data, **columns, addresses=self.addresses, others=[])


_COLUMNS = (
    "index",
    "ts_ns",
    "src",
    "sport",
    "dst",
    "dport",
    "seq",
    "ack",
    "flags",
    "start",
    "stop",
    "length",
)


@contextlib.contextmanager
def packet_columns(path: Path, stats: PacketStats | None = None) -> Iterator[PacketColumns | None]:
    """Every TCP segment of a pcap or pcapng file as :class:`PacketColumns`, the file mapped
    while the context lasts; None when only the per-packet reader can read this file."""
    stats = stats if stats is not None else PacketStats()
    if path.stat().st_size == 0:
        yield None
        return
    with _mapped(path) as mm:
        table = _walk(mm)
        if table is None:
            yield None
            return
        v6: dict[bytes, int] = {}
        chunks = [
            _chunk_columns(mm, table, first, min(first + _CHUNK, len(table.offsets)), stats, v6)
            for first in range(0, len(table.offsets), _CHUNK)
        ]
        stats.truncated_file = table.truncated
        if not chunks:
            chunks = [_chunk_columns(mm, table, 0, 0, stats, v6)]
        if len(chunks) == 1:
            yield chunks[0]
            return
        addresses: dict[int, str] = {}
        for chunk in chunks:
            addresses.update(chunk.addresses)
        columns = {name: np.concatenate([getattr(c, name) for c in chunks]) for name in _COLUMNS}
        others = [segment for chunk in chunks for segment in chunk.others]
        yield PacketColumns(mm, **columns, addresses=addresses, others=others)


def big_endian(buffer: mmap.mmap | bytes, at: _Ints, width: int, signed: bool = False) -> _Ints:
    """The big-endian integers of ``width`` bytes (2 or 4) at these offsets of ``buffer``: one
    gather from a view that starts an integer at every byte."""
    dtype = np.dtype((">i" if signed else ">u") + str(width))
    count = len(buffer) - width + 1
    if count <= 0:
        return np.zeros(len(at), np.int64)
    every = np.ndarray((count,), dtype, buffer=buffer, strides=(1,))
    return every[at].astype(np.int64)


class _Fields:
    """The TCP segments one way of reading found, as columns (positions within the chunk)."""

    __slots__ = ("ack", "dport", "dst", "flags", "length", "rows", "seq", "sport", "src", "start", "stop")

    def __init__(
        self, rows: _Ints, src: _Ints, dst: _Ints, tcp: _Ints, mm: mmap.mmap, data: npt.NDArray[np.uint8]
    ) -> None:
        self.rows, self.src, self.dst = rows, src, dst
        self.sport, self.dport = big_endian(mm, tcp, 2), big_endian(mm, tcp + 2, 2)
        self.seq, self.ack = big_endian(mm, tcp + 4, 4), big_endian(mm, tcp + 8, 4)
        self.flags = data[tcp + 13].astype(np.int64)
        self.start = self.stop = self.length = np.zeros(0, np.int64)


def _chunk_columns(
    mm: mmap.mmap, table: _Table, first: int, stop: int, stats: PacketStats, v6: dict[bytes, int]
) -> PacketColumns:
    """The chunk's packets in columns: IPv4 without options as ``_packets._parse``'s quick
    unpack reads it, and every other IPv4 or plain IPv6 packet (VLAN tags, loopback captures,
    options) as its general path does; the rest, parsed one by one, in ``others``. ``v6``: the
    file's IPv6 addresses, numbered as met, so every chunk names them alike."""
    offsets = table.offsets[first:stop]
    captured = table.captured[first:stop]
    linktypes = table.linktypes[first:stop]
    count = len(offsets)
    data = np.frombuffer(mm, np.uint8)
    ends = offsets + captured
    quick = _quick_ipv4(mm, data, offsets, captured, linktypes)
    general = _general_ip(mm, data, offsets, ends, linktypes, quick.rows, v6)
    if len(general.rows):
        order = np.argsort(np.concatenate([quick.rows, general.rows]), kind="stable")

        def merged(name: str) -> _Ints:
            return np.concatenate([getattr(quick, name), getattr(general, name)])[order]
    else:

        def merged(name: str) -> _Ints:
            return getattr(quick, name)

    rows, src, dst = merged("rows"), merged("src"), merged("dst")
    numbers = np.unique(np.concatenate([src, dst]))
    addresses = {v: _address(v.to_bytes(4, "big")) for v in numbers[numbers < _V6_FIRST].tolist()}
    addresses.update({number: _address(packed) for packed, number in v6.items()})
    stamps = table.stamps[first:stop]
    others: list[TcpSegment] = []
    if len(rows) < count:
        parsed = set(rows.tolist())
        for row in range(count):
            if row not in parsed:
                at, size = int(offsets[row]), int(captured[row])
                segment = _parse(
                    first + row, int(stamps[row]), int(linktypes[row]), mm[at : at + size], stats
                )
                if segment is not None:
                    others.append(segment)
    stats.packets += count
    stats.tcp += len(rows) + len(others)
    stats.not_tcp += count - len(rows) - len(others)
    return PacketColumns(
        mm,
        rows + first,
        stamps[rows],
        src,
        merged("sport"),
        dst,
        merged("dport"),
        merged("seq"),
        merged("ack"),
        merged("flags"),
        merged("start"),
        merged("stop"),
        merged("length"),
        addresses,
        others,
    )


def _quick_ipv4(
    mm: mmap.mmap, data: npt.NDArray[np.uint8], offsets: _Ints, captured: _Ints, linktypes: _Ints
) -> _Fields:
    """IPv4 without options nor fragments, carrying TCP, where ``_packets._parse`` unpacks it
    in one go (no VLAN tag): its payload runs to the IP length, whatever the TCP header says."""
    count = len(offsets)
    fast = np.zeros(count, bool)
    ip = np.zeros(count, np.int64)
    for linktype, (at, ethertype_at) in _FAST_IPV4.items():
        mine = (linktypes == linktype) & (captured >= at + _IPV4_TCP_SIZE)
        if ethertype_at is not None:
            where = offsets[mine] + ethertype_at
            ok = (data[where] == 0x08) & (data[where + 1] == 0x00)
            mine[np.flatnonzero(mine)[~ok]] = False
        fast |= mine
        ip[mine] = offsets[mine] + at
    rows = np.flatnonzero(fast)
    base = ip[rows]
    tcp_offset = data[base + 32].astype(np.int64)
    ok = (
        (data[base] == 0x45)
        & (data[base + 9] == _PROTO_TCP)
        & ((big_endian(mm, base + 6, 2) & 0x3FFF) == 0)
        & (tcp_offset >= 0x50)
    )
    rows, base, tcp_offset = rows[ok], base[ok], tcp_offset[ok]
    fields = _Fields(rows, big_endian(mm, base + 12, 4), big_endian(mm, base + 16, 4), base + 20, mm, data)
    total = big_endian(mm, base + 2, 2)
    start = base + 20 + (tcp_offset >> 4) * 4
    ends = offsets[rows] + captured[rows]
    end = np.where(total > 0, base + total, ends)
    fields.start = start
    fields.length = np.maximum(end - start, 0)
    fields.stop = np.maximum(np.minimum(end, ends), start)
    return fields


# Where the network layer starts for the link types read in columns, and where their
# ethertype is (None: the IP version decides). Ethernet's may follow up to two VLAN tags.
_NETWORK_AT = {
    LINKTYPE_ETHERNET: (14, 12),
    LINKTYPE_LINUX_SLL: (16, 14),
    LINKTYPE_LINUX_SLL2: (20, 0),
    LINKTYPE_NULL: (4, None),
    LINKTYPE_LOOP: (4, None),
    **{linktype: (0, None) for linktype in _RAW_ALIASES},
}
_VLAN_TAGS_PEELED = 2
_V6_FIRST = 1 << 32
"""IPv6 addresses are numbered from here, above every IPv4 address read as a number."""


def _general_ip(
    mm: mmap.mmap,
    data: npt.NDArray[np.uint8],
    offsets: _Ints,
    ends: _Ints,
    linktypes: _Ints,
    taken: _Ints,
    v6: dict[bytes, int],
) -> _Fields:
    """The packets not ``taken`` that ``_packets._parse``'s general path reads (the link
    layer, then ``_ip_payload``, then the TCP header): IPv4 of any header length and plain
    IPv6 carrying TCP. Fragments and IPv6 extension headers are left to it (it counts them)."""
    count = len(offsets)
    free = np.ones(count, bool)
    free[taken] = False
    net = np.full(count, -1, np.int64)
    for linktype, (at, ethertype_at) in _NETWORK_AT.items():
        mine = np.flatnonzero((linktypes == linktype) & free)
        if ethertype_at is None:
            net[mine] = offsets[mine] + at
            continue
        mine = mine[ends[mine] >= offsets[mine] + max(at, ethertype_at + 2)]
        ethertype = big_endian(mm, offsets[mine] + ethertype_at, 2)
        pos = offsets[mine] + at
        if linktype == LINKTYPE_ETHERNET:
            for _ in range(_VLAN_TAGS_PEELED):
                tagged = np.isin(ethertype, list(_ETHERTYPE_VLAN)) & (ends[mine] >= pos + 4)
                ethertype[tagged] = big_endian(mm, pos[tagged] + 2, 2)
                pos[tagged] += 4
        ip = (ethertype == _ETHERTYPE_IPV4) | (ethertype == _ETHERTYPE_IPV6)
        net[mine[ip]] = pos[ip]
    rows = np.flatnonzero((net >= 0) & (ends - net >= 20))
    base = net[rows]
    version = data[base] >> 4
    v4 = (version == 4) & (data[base + 9] == _PROTO_TCP) & ((big_endian(mm, base + 6, 2) & 0x3FFF) == 0)
    v6_rows = (version == 6) & (ends[rows] - base >= 40)
    v6_rows[v6_rows] = data[base[v6_rows] + 6] == _PROTO_TCP
    rows = rows[v4 | v6_rows]
    base, is_v6 = net[rows], v6_rows[v4 | v6_rows]
    header = np.where(is_v6, 40, (data[base] & 0x0F).astype(np.int64) * 4)
    total = np.where(is_v6, big_endian(mm, base + 4, 2), big_endian(mm, base + 2, 2))
    total_end = np.where(is_v6, base + 40 + total, base + total)  # where the IP length ends it
    segment = base + header
    segment_end = np.minimum(np.where(total > 0, total_end, ends[rows]), ends[rows])
    captured = np.maximum(segment_end - segment, 0)
    ok = captured >= 14  # ports to flags
    rows, base, is_v6, header, total, segment, captured = (
        a[ok] for a in (rows, base, is_v6, header, total, segment, captured)
    )
    tcp_header = (data[segment + 12] >> 4).astype(np.int64) * 4
    ok = (tcp_header >= 14) & (captured >= tcp_header)
    rows, base, is_v6, header, total, segment, captured, tcp_header = (
        a[ok] for a in (rows, base, is_v6, header, total, segment, captured, tcp_header)
    )
    src = big_endian(mm, base + 12, 4)
    dst = big_endian(mm, base + 16, 4)
    if is_v6.any():
        src[is_v6] = _v6_numbers(data, base[is_v6] + 8, v6)
        dst[is_v6] = _v6_numbers(data, base[is_v6] + 24, v6)
    fields = _Fields(rows, src, dst, segment, mm, data)
    tcp_length = np.where(is_v6, total, total - header)
    fields.start = segment + tcp_header
    fields.length = np.where(total > 0, np.maximum(tcp_length - tcp_header, 0), captured - tcp_header)
    fields.stop = fields.start + np.minimum(fields.length, captured - tcp_header)
    return fields


def _v6_numbers(data: npt.NDArray[np.uint8], at: _Ints, v6: dict[bytes, int]) -> _Ints:
    """The numbers of the IPv6 addresses at these offsets, new ones numbered as met."""
    packed = np.ascontiguousarray(data[at[:, None] + np.arange(16)]).view("V16").ravel()
    unique, inverse = np.unique(packed, return_inverse=True)
    numbers = np.array([v6.setdefault(u.tobytes(), _V6_FIRST + len(v6)) for u in unique], np.int64)
    return numbers[inverse.ravel()]
