"""The clean-connection path of ``import-pcap`` writes exactly what the per-segment path writes.

Random Kafka-like traffic (requests and answers of random sizes, correlation ids that repeat,
answers that match nothing, insane sizes) over one or more TCP connections, cut into random
segments, then damaged or not (a segment dropped, duplicated or moved, a snap length, a start
mid-stream, alone or with a segment dropped or moved after it, no FIN, an RST, a port reused,
acknowledgements ahead of the data). A connection that starts mid-stream is read segment by
segment until it is at rest, then, if the rest is clean, whole. The import
with the clean path must give the same files, byte for byte, and the same summary and stats
as the per-segment path alone, the reference.
"""

from __future__ import annotations

import dataclasses
import json
import random
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrfix.capture.pcap import TcpSegment, _clean_streams, import_pcap
from corrfix.capture.pcap._import import CaptureRowWriter
from tests.support import wire_damage as damage
from tests.support.tcp_synth import ACK, FIN, SYN, TcpSession

SERVER = ("10.1.0.9", 9092)
START_NS = 1_700_000_000_000_000_000


@dataclasses.dataclass(frozen=True)
class Plan:
    """One connection's traffic and what is done to it."""

    port: int
    exchanges: list[tuple[bytes, bytes | None]]
    mss: int
    damage: str
    where: int
    isn: int = 1000  # the client's first sequence number; the server's is 5,000,000 further


def _request(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    payload = struct.pack(">hhi", api_key, version, correlation_id) + body
    return struct.pack(">i", len(payload)) + payload


def _response(correlation_id: int, body: bytes) -> bytes:
    payload = struct.pack(">i", correlation_id) + body
    return struct.pack(">i", len(payload)) + payload


exchanges = st.lists(
    st.tuples(
        st.integers(0, 80),
        st.integers(0, 12),
        st.integers(-3, 12),
        st.binary(max_size=300),
        st.sampled_from(["answer"] * 8 + ["none", "other id", "insane"]),
    ).map(
        lambda e: (
            _request(e[0], e[1], e[2], e[3]),
            None
            if e[4] == "none"
            else _response(e[2] + 100 if e[4] == "other id" else e[2], e[3][::-1])
            if e[4] != "insane"
            else struct.pack(">i", -5) + e[3],
        )
    ),
    max_size=12,
)
# Requests and answers whose bodies decode (ApiVersions v0, Metadata v0, no client id): the
# per-segment path can prove a frame boundary in them after a mid-stream start.
_DECODABLE = {18: (b"\xff\xff", struct.pack(">hi", 0, 0)), 3: (b"\xff\xff" + bytes(4), bytes(8))}
decodable_exchange = st.tuples(
    st.sampled_from(sorted(_DECODABLE)),
    st.integers(-3, 40),
    st.sampled_from(["answer"] * 8 + ["none", "other id"]),
).map(
    lambda e: (
        _request(e[0], 0, e[1], _DECODABLE[e[0]][0]),
        None
        if e[2] == "none"
        else _response(e[1] + 100 if e[2] == "other id" else e[1], _DECODABLE[e[0]][1]),
    )
)
DAMAGES = ["none"] * 6 + ["drop", "duplicate", "swap", "snap", "no_fin", "rst", "ack_ahead"]
DAMAGES += ["midstream"] * 3 + ["midstream_drop", "midstream_swap", "midstream_no_fin"]
plans = st.builds(
    Plan,
    # 9092: both ends on the Kafka port; a server on 9093: no Kafka port (other traffic).
    port=st.sampled_from([40001, 40002, 40003, 9092, -40004]),
    exchanges=st.one_of(exchanges, st.lists(decodable_exchange, max_size=30)),
    mss=st.integers(1, 400),
    damage=st.sampled_from(DAMAGES),
    where=st.integers(0, 10_000),
    isn=st.sampled_from([1000, 2**32 - 700, 2**32 - 5_000_300]),  # sequence numbers that wrap
)


# Connections cut early, in traffic the per-segment path can resync on: most are taken whole
# from where that path is at rest.
midstream_plans = st.builds(
    Plan,
    port=st.sampled_from([40001, 40002, 40003]),
    exchanges=st.lists(decodable_exchange, min_size=6, max_size=30),
    mss=st.integers(1, 60),
    damage=st.sampled_from(
        ["midstream", "midstream_drop", "midstream_swap", "midstream_no_fin", "midstream_holes", "holes"]
    ),
    where=st.integers(0, 40),
    isn=st.sampled_from([1000, 2**32 - 700, 2**32 - 5_000_300]),
)


def _segments(plan: Plan) -> list[tuple[bool, TcpSegment]]:
    """The connection's segments (without times nor indexes), damaged as planned."""
    server = (SERVER[0], 9093) if plan.port < 0 else SERVER
    tcp = TcpSession(
        client=("10.1.0.1", abs(plan.port)),
        server=server,
        client_isn=plan.isn,
        server_isn=(plan.isn + 5_000_000) % (1 << 32),
        mss=plan.mss,
    )
    out = tcp.handshake()
    for request, response in plan.exchanges:
        out += tcp.send(True, request, with_ack=True)
        if response is not None:
            out += tcp.send(False, response, with_ack=True)
    if plan.damage == "rst":
        out.append(tcp.rst(True))
    elif not plan.damage.endswith("no_fin"):
        out += [tcp.fin(True), tcp.fin(False), tcp.ack(True)]
    segments = []
    for seg in out:
        src, dst = (tcp.client, tcp.server) if seg.from_client else (tcp.server, tcp.client)
        flags = seg.flags
        ack = seg.ack % (1 << 32)  # the session's handshake and FIN do not wrap their numbers
        if (
            plan.damage == "ack_ahead"
            and seg.payload
            and flags & ACK
            and len(segments) == plan.where % len(out)
        ):
            ack = (ack + 1000) % (1 << 32)
        segments.append(
            TcpSegment(
                0,
                0,
                src[0],
                src[1],
                dst[0],
                dst[1],
                seg.seq % (1 << 32),
                ack,
                flags,
                seg.payload,
                len(seg.payload),
            )
        )
    at = plan.where % len(segments)
    if plan.damage == "drop":
        del segments[at]
    elif plan.damage == "duplicate":
        segments.insert(at, segments[at])
    elif plan.damage == "swap" and at + 1 < len(segments):
        segments[at], segments[at + 1] = segments[at + 1], segments[at]
    elif plan.damage.startswith("midstream"):
        segments = segments[at:]
        later = (plan.where // 7) % max(len(segments) - 1, 1)
        if plan.damage == "midstream_drop" and segments:
            del segments[later]
        elif plan.damage == "midstream_swap" and later + 1 < len(segments):
            segments[later], segments[later + 1] = segments[later + 1], segments[later]
    if plan.damage.endswith("holes"):  # two segments lost anywhere
        for n in (13, 29):
            if segments:
                del segments[(plan.where * n) % len(segments)]
    elif plan.damage == "snap":
        keep = plan.where % 40
        segments = [s._replace(payload=s.payload[:keep]) for s in segments]
    return [(s.flags & FIN != 0, s) for s in segments]


def _capture(plans: list[Plan], order: random.Random) -> list[TcpSegment]:
    """The connections' segments interleaved at random (each keeps its order), stamped in turn."""
    queues = [_segments(plan) for plan in plans]
    merged = []
    while any(queues):
        queue = order.choice([q for q in queues if q])
        merged.append(queue.pop(0)[1])
    return [seg._replace(index=i, ts_ns=START_NS + i * 1000) for i, seg in enumerate(merged)]


def _import(pcap: Path, out: Path, clean_path: bool) -> tuple[dict[str, bytes], dict, dict]:
    stats = import_pcap(pcap, out, [SERVER[1]], capture_id="same-id", clean_path=clean_path)
    files = {path.name: path.read_bytes() for path in sorted(out.glob("*.arrows"))}
    summaries = [json.loads(path.read_text()) for path in sorted(out.glob("*.json"))]
    for summary in summaries:
        summary.pop("updated_wall_ns", None)
    found = dataclasses.asdict(stats)
    found["files"] = [Path(name).name for name in found["files"]]
    return files, {"summaries": summaries}, found


def _same_import(segments: list[TcpSegment]) -> None:
    with tempfile.TemporaryDirectory() as work:
        pcap = damage.write_pcap(Path(work) / "traffic.pcap", segments)
        reference = _import(pcap, Path(work) / "reference", clean_path=False)
        clean = _import(pcap, Path(work) / "clean", clean_path=True)
    assert clean == reference


@pytest.fixture
def every_connection_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the clean path take connections of any size (it leaves short ones to the other)."""
    monkeypatch.setattr(_clean_streams, "MIN_PACKETS", 2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(plans, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_clean_path_writes_what_the_per_segment_path_writes(every_connection_size, plans, order):
    _same_import(_capture(plans, order))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(midstream_plans, min_size=1, max_size=3), st.randoms(use_true_random=False))
def test_connections_cut_mid_stream_write_what_the_per_segment_path_writes(
    every_connection_size, plans, order
):
    _same_import(_capture(plans, order))


def test_a_clean_connection_takes_the_clean_path_and_a_damaged_one_does_not(every_connection_size, tmp_path):
    exchanges = [(_request(0, 7, i, bytes(50)), _response(i, bytes(20))) for i in range(20)]
    clean = Plan(40001, exchanges, 64, "none", 0)
    dropped = Plan(40002, exchanges, 64, "drop", 30)
    segments = _capture([clean, dropped], random.Random(3))
    pcap = damage.write_pcap(tmp_path / "traffic.pcap", segments)
    from corrfix.capture.pcap._packet_table import packet_columns

    with packet_columns(pcap) as columns:
        assert columns is not None
        found = _clean_streams.import_clean(columns, [SERVER[1]], 1 << 20)
        assert [c.client_address for c in found.connections] == ["10.1.0.1:40001"]
        assert [c.endpoints for c in found.midstream] == [(("10.1.0.1", 40002), SERVER)]
        assert not len(found.rest)  # the damaged one: segment by segment, then clean runs
    _same_import(segments)


def test_an_error_while_writing_is_the_error_reported(every_connection_size, tmp_path, monkeypatch):
    """Views of the mapped pcap are alive in the error's traceback: closing the mapping must not
    replace the error with a BufferError."""
    exchanges = [(_request(0, 7, i, bytes(50)), _response(i, bytes(20))) for i in range(20)]
    pcap = damage.write_pcap(
        tmp_path / "traffic.pcap", _capture([Plan(40001, exchanges, 64, "none", 0)], random.Random(3))
    )

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(CaptureRowWriter, "write_columns", disk_full)
    with pytest.raises(OSError, match="No space left") as raised:
        import_pcap(pcap, tmp_path / "out", [SERVER[1]], capture_id="full-disk")
    assert not isinstance(raised.value, BufferError)


def test_short_connections_are_left_to_the_per_segment_path(tmp_path):
    exchanges = [(_request(0, 7, 1, bytes(50)), _response(1, bytes(20)))]
    segments = _capture([Plan(40001, exchanges, 1000, "none", 0)], random.Random(1))
    assert len(segments) < _clean_streams.MIN_PACKETS
    pcap = damage.write_pcap(tmp_path / "traffic.pcap", segments)
    from corrfix.capture.pcap._packet_table import packet_columns

    with packet_columns(pcap) as columns:
        assert columns is not None
        assert not _clean_streams.import_clean(columns, [SERVER[1]], 1 << 20).connections


def test_a_connection_with_a_packet_the_per_packet_parser_read_is_left_to_it(every_connection_size, tmp_path):
    """IPv6, IP options, other link layers: such packets are not in the numpy columns, so
    their connection cannot be checked whole."""
    exchanges = [(_request(0, 7, i, bytes(50)), _response(i, bytes(20))) for i in range(10)]
    segments = _capture([Plan(40001, exchanges, 64, "none", 0)], random.Random(3))
    pcap = damage.write_pcap(tmp_path / "traffic.pcap", segments)
    from corrfix.capture.pcap._packet_table import packet_columns

    with packet_columns(pcap) as columns:
        assert columns is not None
        assert _clean_streams.import_clean(columns, [SERVER[1]], 1 << 20).connections
        keep = np.flatnonzero(columns.index != 5)
        partial = columns.select(keep)
        partial.others = [segments[5]]
        found = _clean_streams.import_clean(partial, [SERVER[1]], 1 << 20)
        assert not found.connections
        assert len(found.rest) == len(keep)


# ApiVersions v0 and its answer: bodies that decode, so that resync can prove a boundary.
_API_VERSIONS = [(_request(18, 0, i, b"\xff\xff"), _response(i, struct.pack(">hi", 0, 0))) for i in range(60)]


def _runs(tmp_path: Path, segments: list[TcpSegment]) -> tuple[list[_clean_streams.CleanConnection], int]:
    """The clean runs of the one connection of ``segments`` (not clean itself), and how many
    rows the per-segment path made for it."""
    from corrfix.capture.pcap._import import ImportStats, _import_candidate, _SegmentRows
    from corrfix.capture.pcap._packet_table import packet_columns

    pcap = damage.write_pcap(tmp_path / "traffic.pcap", segments)
    with packet_columns(pcap) as columns:
        assert columns is not None
        found = _clean_streams.import_clean(columns, [SERVER[1]], 1 << 20)
        assert not found.connections and len(found.midstream) == 1
        out = _SegmentRows()
        runs = _import_candidate(columns, found.midstream[0], [SERVER[1]], ImportStats(), out, 1 << 20)
        return runs, len(out.rows)


def test_a_connection_that_starts_mid_stream_is_taken_whole_once_at_rest(tmp_path):
    """Cut inside a frame, with a segment lost soon after: the per-segment path reads it until
    it is in sync and no request waits, the clean path the rest; the files are the same."""
    segments = _capture([Plan(40001, _API_VERSIONS[:40], 5, "midstream_drop", 7 + 7 * 3)], random.Random(5))
    assert not segments[0].flags & SYN and len(segments[0].payload) < len(_API_VERSIONS[0][0])
    runs, per_segment_rows = _runs(tmp_path, segments)
    assert sum(run.requests for run in runs) > 20 and per_segment_rows < 20
    _same_import(segments)


def test_a_connection_that_loses_a_segment_is_taken_whole_on_either_side_of_the_hole(tmp_path):
    segments = _capture([Plan(40001, _API_VERSIONS, 5, "drop", 200)], random.Random(5))
    runs, _ = _runs(tmp_path, segments)
    assert len(runs) == 2 and runs[0].closed_at is None and runs[1].closed_at is not None
    _same_import(segments)
