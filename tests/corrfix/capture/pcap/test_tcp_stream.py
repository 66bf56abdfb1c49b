"""What one TCP direction holds behind its holes, alone and with the other streams of an import
(corrfix.capture.pcap._tcp_stream)."""

from __future__ import annotations

from corrfix.capture.pcap import StreamReassembler, TcpSegment
from corrfix.capture.pcap._import import WireImporter
from corrfix.capture.pcap._packets import TH_ACK
from corrfix.capture.pcap._tcp_stream import Data, Gap, HeldBudget


def holding(budget: HeldBudget, held: int) -> StreamReassembler:
    """A stream that holds ``held`` bytes behind a 10-byte hole."""
    stream = StreamReassembler(budget=budget)
    stream.syn(99)
    assert stream.segment(110, b"x" * held, held, 1) == []
    return stream


def test_the_stream_that_goes_over_the_shared_limit_gives_up_its_own_holes():
    """A one-direction capture with drops holds bytes behind a hole on every connection, each
    within its own 32 MiB: together they must stay bounded too."""
    budget = HeldBudget(limit=100)
    first = holding(budget, 80)
    second = StreamReassembler(budget=budget)
    second.syn(99)
    assert second.segment(110, b"y" * 40, 40, 2) == [Gap(0, 10, 2), Data(10, b"y" * 40, 2)]
    assert (first.held_bytes, second.held_bytes, budget.held) == (80, 0, 80)
    assert first.segment(100, b"0123456789", 10, 3) == [Data(0, b"0123456789", 3), Data(10, b"x" * 80, 1)]
    assert budget.held == 0


def test_streams_under_the_shared_limit_keep_their_holes_open():
    budget = HeldBudget(limit=100)
    streams = [holding(budget, 30), holding(budget, 30), holding(budget, 40)]
    assert [s.held_bytes for s in streams] == [30, 30, 40] and budget.held == 100
    assert streams[0].finish(4) == [Gap(0, 10, 4), Data(10, b"x" * 30, 1)]
    assert budget.held == 70


def segment(ts: int, sport: int, seq: int, payload: bytes) -> TcpSegment:
    return TcpSegment(ts, ts, "10.0.0.1", sport, "10.0.0.2", 9092, seq, 0, TH_ACK, payload, len(payload))


def test_every_connection_of_an_import_shares_one_limit():
    importer = WireImporter([9092])
    importer.held.limit = 150
    for n, sport in enumerate(range(40_000, 40_004)):
        importer.segment(segment(2 * n, sport, 1_000, b"\x00\x00\x00\x10"))  # mid-stream: offset 0
        importer.segment(segment(2 * n + 1, sport, 1_100, b"z" * 60))  # 96 bytes missed before it
        assert importer.held.held <= 150
    assert importer.held.held == 120
    importer.finish()
    assert importer.held.held == 0
