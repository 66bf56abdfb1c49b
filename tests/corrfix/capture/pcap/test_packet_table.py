"""The numpy packet-table reader against the per-packet reader it replaced, which stays the
reference: the same segments and the same statistics, or the same error, on whole, cut and
bit-flipped files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrfix.capture.pcap import TcpSegment
from corrfix.capture.pcap._packet_table import read_segments
from corrfix.capture.pcap._packets import PacketStats, read_segments_per_packet
from tests.support.wire_damage import write_pcap


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
)
def test_the_table_reader_reads_what_the_per_packet_reader_reads(tmp_path, count, payload, cut, flips):
    path = write_pcap(tmp_path / "t.pcap", _segments(count, payload))
    data = bytearray(path.read_bytes())
    for where, mask in flips:
        data[int(where * (len(data) - 1))] ^= mask
    damaged = tmp_path / "damaged.pcap"
    damaged.write_bytes(bytes(data[: max(int(cut * len(data)), 24)]) if cut < 1 else bytes(data))
    whole, stats = _read(read_segments, path)
    assert isinstance(whole, list) and len(whole) == stats["tcp"] == count
    for file in (path, damaged):
        assert _read(read_segments, file) == _read(read_segments_per_packet, file)
