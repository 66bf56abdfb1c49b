"""The numpy packet-table reader against the per-packet reader it replaced, which stays the
reference: the same segments and the same statistics, or the same error, on whole, cut and
bit-flipped files, pcap and pcapng."""

from __future__ import annotations

import dataclasses
import io
import struct
from pathlib import Path

import dpkt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrfix.capture.pcap import TcpSegment, _packet_table
from corrfix.capture.pcap._packet_table import read_segments
from corrfix.capture.pcap._packets import PacketStats, read_segments_per_packet
from corrfix.capture.pcap._pcapng_blocks import PcapngWriter
from tests.support.wire_damage import LINKS, write_pcap


def _segments(count: int, payload: int) -> list[TcpSegment]:
    """A request and its answer per pair, on one connection, each with ``payload`` bytes."""
    out = []
    for i in range(count):
        to_broker = i % 2 == 0
        src, sport, dst, dport = ("10.0.0.1", 40000, "10.0.0.2", 9092)
        if not to_broker:
            src, sport, dst, dport = dst, dport, src, sport
        data = bytes([i % 251]) * payload
        seq = 1000 + (i // 2) * payload
        out.append(
            TcpSegment(
                i, 1_700_000_000_000_000_000 + i * 1000, src, sport, dst, dport, seq, seq, 0x18, data, payload
            )
        )
    return out


def _read(reader, path: Path) -> tuple[object, dict]:
    stats = PacketStats()
    try:
        segments: object = list(reader(path, stats))
    except Exception as exc:  # the reference's errors are part of what must match
        segments = type(exc)
    return segments, dataclasses.asdict(stats)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(1, 12),
    payload=st.integers(0, 300),
    cut=st.floats(0.0, 1.0),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), max_size=3),
    link=st.sampled_from(LINKS),
)
def test_the_table_reader_reads_what_the_per_packet_reader_reads(tmp_path, count, payload, cut, flips, link):
    """Every link and network layer the table reads in columns: IPv4 with or without
    options, IPv6, VLAN tags, BSD loopback (bits flipped in them land the damaged packets in
    the per-packet parser's other branches, whose results must match too)."""
    path = write_pcap(tmp_path / "t.pcap", _segments(count, payload), link=link)
    _assert_read_alike(path, count, cut, flips, header=24)


@pytest.mark.parametrize("link", LINKS)
def test_every_link_the_table_reads_is_read_in_columns(tmp_path, link):
    """Not left to the per-packet parser: IPv6, VLAN trunks and macOS loopback captures
    imported several times slower than IPv4 on Ethernet."""
    path = write_pcap(tmp_path / "t.pcap", _segments(6, 50), link=link)
    with _packet_table.packet_columns(path) as columns:
        assert columns is not None and len(columns.index) == 6 and columns.others == []
        assert columns.segments() == list(read_segments_per_packet(path))


def _assert_read_alike(
    path: Path, count: int, cut: float, flips: list[tuple[float, int]], header: int
) -> None:
    """Both readers give the same on the file and on a copy with bits flipped, then cut (not
    inside its first ``header`` bytes); the whole file holds ``count`` segments."""
    data = bytearray(path.read_bytes())
    for where, mask in flips:
        data[int(where * (len(data) - 1))] ^= mask
    damaged = path.with_name("damaged" + path.suffix)
    damaged.write_bytes(bytes(data[: max(int(cut * len(data)), header)]) if cut < 1 else bytes(data))
    whole, stats = _read(read_segments, path)
    assert isinstance(whole, list) and len(whole) == stats["tcp"] == count
    for file in (path, damaged):
        assert _read(read_segments, file) == _read(read_segments_per_packet, file)


_FAKE_BLOCK = struct.pack("<IIIIIIII", 6, 32, 0, 0, 0, 0, 0, 32)  # an empty enhanced packet block
_PAYLOAD_AT = 14 + 20 + 20  # Ethernet, IPv4 and TCP headers


def _pcapng(path: Path, pcap: Path, comments: list[bool], others: list[int], fakes: list[int]) -> Path:
    """The packets of ``pcap`` as pcapng: a comment on the packets ``comments`` marks, a block
    of another type before the packets ``others`` numbers, and in the payload of the packets
    ``fakes`` numbers, at an offset a block could start at, bytes that look like a block."""
    out = io.BytesIO()
    writer = PcapngWriter(out)
    for n, (ts, frame) in enumerate(dpkt.pcap.Reader(io.BytesIO(pcap.read_bytes()))):
        if n in fakes and len(frame) >= _PAYLOAD_AT + 2 + len(_FAKE_BLOCK):
            at = _PAYLOAD_AT + 2  # the block's packet data starts 28 bytes in: 2 more reach a multiple of 4
            frame = frame[:at] + _FAKE_BLOCK + frame[at + len(_FAKE_BLOCK) :]
        if n in others:
            out.write(struct.pack("<III", 0x00000BAD, 16, 0) + struct.pack("<I", 16))  # a custom block
        writer.packet(int(ts * 1_000_000_000), frame, ["a note"] if n < len(comments) and comments[n] else ())
    path.write_bytes(out.getvalue())
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(1, 12),
    payload=st.integers(0, 300),
    comments=st.lists(st.booleans(), max_size=12),
    others=st.lists(st.integers(0, 11), max_size=3),
    fakes=st.lists(st.integers(0, 11), max_size=3),
    cut=st.floats(0.0, 1.0),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), max_size=3),
    window=st.sampled_from([1 << 20, 64, 7]),
)
def test_the_pcapng_block_chain_is_the_per_packet_readers(
    tmp_path, monkeypatch, count, payload, comments, others, fakes, cut, flips, window
):
    """Enhanced packet blocks are chained a run at a time; other blocks, comments, payloads
    that look like blocks, cuts, flipped bits and the window the file is searched in must not
    change what is read."""
    monkeypatch.setattr(_packet_table, "_RUN_WINDOW", window)
    pcap = write_pcap(tmp_path / "t.pcap", _segments(count, payload))
    path = _pcapng(tmp_path / "t.pcapng", pcap, comments, others, fakes)
    _assert_read_alike(path, count, cut, flips, header=12)
