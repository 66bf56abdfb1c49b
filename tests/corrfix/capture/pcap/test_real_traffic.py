"""Real client traffic (kafka-python new and 0.10-era, confluent-kafka) to Tansu, damaged like real tcpdumps.

One recording per module (tcpdump on loopback). Its clean import is the truth, checked
against tshark's Kafka dissector. Then the capture is damaged: started at every byte offset
of every stream, a segment dropped, segments re-cut, duplicated and reordered, snapped, two
brokers merged. Whatever the damage: no phantom frame, and every real frame is imported or
reported lost with its byte count (``tests/support/wire_damage.py``).
"""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrfix.capture.pcap import TcpSegment, import_pcap
from corrfix.lab import TansuBroker
from protocol import (
    ApiKey,
    body_decodes_exactly,
    parse_request_header,
    request_header_end,
    response_body_offset,
)
from tests.support import wire_damage as damage
from tests.support.every_version import SERVER, connection_segments, every_version
from tests.support.tcpdump import require_tcpdump
from tests.support.tshark import TsharkPdu, kafka_pdus
from tests.support.wire_traffic import Recording, record_client_traffic, record_two_brokers, recording


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    require_tcpdump()
    directory = tmp_path_factory.mktemp("real")
    with TansuBroker() as broker:
        pcap = record_client_traffic(directory / "clients.pcap", broker)
        ports = (broker.port,)
    yield recording(pcap, ports)


def segments_of(real: Recording) -> dict[int, list[TcpSegment]]:
    return damage.by_connection(real.segments, real.ports)


def imported_keys(rows: list[dict]) -> collections.Counter:
    return collections.Counter(
        (damage.row_port(r), r["direction"], r["client_correlation_id"], r["frame_length"], r["api_key"])
        for r in rows
        if r["kind"] == "frame"
    )


def tshark_keys(pdus: list[TsharkPdu]) -> collections.Counter:
    return collections.Counter(
        (p.client_port, p.direction, p.correlation_id, p.frame_length, p.api_key) for p in pdus
    )


# -- the clean recording ----------------------------------------------------------------------


def test_the_recording_holds_every_client_era(real):
    versions = {(r["api_key"], r["api_version"]) for r in real.rows if r["kind"] == "frame"}
    assert {(ApiKey.PRODUCE, 2), (ApiKey.METADATA, 1), (ApiKey.LIST_OFFSETS, 0)} <= versions  # 0.10-era
    assert {(ApiKey.PRODUCE, 9), (ApiKey.FETCH, 16)} <= versions  # kafka-python 3 against Tansu
    assert ApiKey.GET_TELEMETRY_SUBSCRIPTIONS in {
        key for key, _ in versions
    }  # librdkafka; no kafka-python schema
    frames = [r for r in real.rows if r["kind"] == "frame"]
    assert all(r["reason"] is None for r in frames)


def test_clean_import_equals_tshark_frame_for_frame(real, tmp_path):
    """Every frame tshark dissects is imported with its correlation id and length, and with
    its api key wherever tshark knows it; per api key the counts are equal."""
    stats = import_pcap(real.pcap, tmp_path / "capture", real.ports)
    pdus = kafka_pdus(real.pcap, real.ports)
    ours = imported_keys(real.rows)
    assert stats.requests + stats.responses == len(pdus) == sum(ours.values())
    known = tshark_keys([p for p in pdus if p.api_key is not None])
    assert not known - ours
    unmatched_by_tshark = {k[:4] for k in tshark_keys([p for p in pdus if p.api_key is None])}
    assert unmatched_by_tshark <= {k[:4] for k in ours}
    per_key = collections.Counter((p.direction, p.api_key) for p in pdus if p.api_key is not None)
    ours_per_key = collections.Counter(
        (d, key) for (_, d, _, _, key), n in (ours & known).items() for _ in range(n)
    )
    assert per_key == ours_per_key
    requests = [p for p in pdus if not p.is_response]
    assert collections.Counter((p.api_key, p.api_version) for p in requests) == collections.Counter(
        (r["api_key"], r["api_version"])
        for r in real.rows
        if r["kind"] == "frame" and r["direction"] == "request"
    )


# -- starting mid-stream at every byte -------------------------------------------------------


@pytest.mark.parametrize("one_direction", [False, True], ids=["from-a-time", "one-direction-only"])
def test_cut_at_every_offset_no_phantom_and_nothing_lost_after_the_first_frame(real, one_direction):
    """``from-a-time``: the capture starts at a packet, which starts at any byte of either
    stream. ``one-direction-only``: the other direction is whole, so every request waits for an
    answer while the responses are searched (where the old importer found most phantoms)."""
    cuts = problems = 0
    late_requests = []
    for port, segments in segments_of(real).items():
        for client in (True, False):
            direction = "request" if client else "response"
            frames = real.truth.get((port, direction), [])
            starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
            for offset in range(damage.stream_bytes(segments, client, real.ports)):
                cut = damage.cut(segments, client, offset, real.ports, one_direction=one_direction)
                found = damage.check(
                    damage.import_segments(cut, real.ports), real.truth, real.ports, ends=True
                )
                cuts += 1
                if not found.ok or found.lost_after_first:
                    problems += 1
                if client:  # the first request after the cut is proven at once (or one before, retransmitted)
                    expect = next((i for i, s in enumerate(starts) if s >= offset), None)
                    first = found.first.get((port, direction), len(frames))
                    if expect is not None and first > expect:
                        late_requests.append((port, offset, expect, first))
    assert cuts > 10_000
    assert problems == 0
    assert late_requests == []


# -- other damage ------------------------------------------------------------------------------


def test_dropping_any_one_segment_loses_only_the_frames_it_carried(real):
    """Only the frames the segment carried are lost, and the frames after them that nothing
    proves: a run of frames kafka-python cannot decode exactly (Tansu's ListOffsets v0
    answer) up to the end of the stream, where no later frame lines up behind them."""
    dropped = lost = 0
    for port, segments in segments_of(real).items():
        for index, seg in enumerate(segments):
            if not seg.payload:
                continue
            found = damage.check(
                damage.import_segments(damage.drop(segments, index), real.ports),
                real.truth,
                real.ports,
                ends=True,
            )
            assert found.ok, (port, index, found)
            carried, unprovable = _frames_lost_to(real, segments, seg)
            assert found.lost_after_first <= carried + unprovable, (port, index, found)
            dropped += 1
            lost += found.lost_after_first
    assert dropped > 100 and lost > 0


def _frames_lost_to(real: Recording, segments: list[TcpSegment], seg: TcpSegment) -> tuple[int, int]:
    """Frames of the segment's direction that share a byte with it, and the frames after
    those that cannot be proven once it is gone: the undecodable ones, when they run to the
    end of the direction's frames."""
    client = damage.from_client(seg, real.ports)
    isn = next(s.seq + 1 for s in segments if s.syn and damage.from_client(s, real.ports) == client)
    start = (seg.seq - isn) % damage.SEQ_MOD
    end = start + seg.length
    direction = "request" if client else "response"
    port = damage.client_port(seg, real.ports)
    frames = real.truth.get((port, direction), [])
    rows = [
        r
        for r in real.rows
        if r["kind"] == "frame" and damage.row_port(r) == port and r["direction"] == direction
    ]
    position, touching, after = 0, 0, []
    for frame, row in zip(frames, rows, strict=True):
        if position < end and start < position + len(frame):
            touching += 1
        elif position >= end:
            after.append(
                decodes_exactly((row["frame"], row["api_version"]), (port, direction, 0, 0, row["api_key"]))
            )
        position += len(frame)
    unprovable = len(after) if not any(after) else 0
    return touching, unprovable


@pytest.mark.parametrize("snaplen", [54 + 4, 54 + 12, 96, 128, 262144])
def test_snap_lengths_keep_every_frame_start_and_length(real, snaplen):
    rows = damage.import_segments(damage.snap(real.segments, snaplen), real.ports)
    found = damage.check(rows, real.truth, real.ports, ends=True)
    assert found.ok and found.lost_after_first == 0
    assert found.imported == sum(len(frames) for frames in real.truth.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_random_cuts_drops_recuts_and_reorders(real, data):
    """Any mix: a start at any byte, segments dropped in either direction, a smaller MSS,
    duplicates and reordering. Never a phantom, and every byte of every real frame between
    two imported ones is accounted for."""
    connections = segments_of(real)
    port = data.draw(st.sampled_from(sorted(connections)))
    segments = connections[port]
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    segments = damage.resegment(segments, rnd, most=data.draw(st.integers(1, 400)))
    if data.draw(st.booleans()):
        client = data.draw(st.booleans())
        total = damage.stream_bytes(segments, client, real.ports)
        if total:
            offset = data.draw(st.integers(0, total - 1))
            segments = damage.cut(
                segments, client, offset, real.ports, one_direction=data.draw(st.booleans())
            )
    for _ in range(data.draw(st.integers(0, 3))):
        carrying = [i for i, s in enumerate(segments) if s.payload]
        if carrying:
            segments = damage.drop(segments, data.draw(st.sampled_from(carrying)))
    segments = damage.shuffle(segments, rnd, real.ports)
    found = damage.check(damage.import_segments(segments, real.ports), real.truth, real.ports, ends=True)
    assert found.ok, found


# -- damaged pcaps, with tshark's opinion ------------------------------------------------------


def damaged_captures(real: Recording) -> Iterator[tuple[str, int, list[TcpSegment]]]:
    """(what, original client port, segments) of damaged copies of some connections."""
    rnd = random.Random(17)
    connections = segments_of(real)
    for port in sorted(connections)[:: max(len(connections) // 8, 1)]:
        segments = connections[port]
        for client in (True, False):
            total = damage.stream_bytes(segments, client, real.ports)
            for offset in rnd.sample(range(total), min(total, 3)):
                yield f"{port} cut {client} {offset}", port, damage.cut(segments, client, offset, real.ports)
        carrying = [i for i, s in enumerate(segments) if s.payload]
        for index in rnd.sample(carrying, min(len(carrying), 3)):
            yield f"{port} drop {index}", port, damage.drop(segments, index)


def test_damaged_pcaps_import_every_real_frame_tshark_decodes(real, tmp_path):
    """Every damaged copy gets a client port of its own, and all are written to one pcap,
    read by both. Every real frame tshark dissects with its api key is imported, unless
    kafka-python cannot decode its body exactly (Tansu's ListOffsets v0 answer) and a hole
    came before it: nothing then proves it a frame, and its bytes are reported lost. So
    are those of an answer tshark cannot match either (its request was before the
    capture). Frames tshark makes up from bytes that are no frame are not counted."""
    copies = list(damaged_captures(real))
    segments, truth, real_frames, names, bodies = [], {}, collections.Counter(), {}, {}
    clean = tshark_keys(kafka_pdus(real.pcap, real.ports))
    for n, (name, port, damaged) in enumerate(copies):
        copy_port = 60000 + n
        names[copy_port] = name
        segments += damage.renumber(damaged, real.ports, copy_port)
        for direction in ("request", "response"):
            truth[(copy_port, direction)] = real.truth.get((port, direction), [])
        for key, count in clean.items():
            if key[0] == port:
                real_frames[(copy_port, *key[1:])] += count
        for row in real.rows:
            if row["kind"] == "frame" and damage.row_port(row) == port:
                key = (copy_port, row["direction"], row["client_correlation_id"], row["frame_length"])
                bodies[(*key, row["api_key"])] = (row["frame"], row["api_version"])
    pcap = damage.write_pcap(tmp_path / "damaged.pcap", segments)
    stats = import_pcap(pcap, tmp_path / "capture", real.ports)
    rows = damage.import_segments(segments, real.ports)
    assert stats.requests + stats.responses == sum(r["kind"] == "frame" for r in rows)
    assert damage.check(rows, truth, real.ports, ends=True).ok
    ours = imported_keys(rows)
    lost = damage.reported_lost(rows)
    decoded_with_key = 0
    missed: collections.Counter = collections.Counter()
    for key, count in (tshark_keys(kafka_pdus(pcap, real.ports)) & real_frames).items():
        if key[4] is not None:
            decoded_with_key += count
            if ours[key] < count:
                assert not decodes_exactly(bodies[key], key), (names[key[0]], key)
                missed[key[:2]] += key[3]
        elif sum(n for k, n in ours.items() if k[:4] == key[:4]) < count:
            missed[key[:2]] += key[3]
    for key, length in missed.items():
        assert lost[key] >= length, (names[key[0]], key, length, lost[key])
    assert len(copies) > 40 and decoded_with_key > 50


def decodes_exactly(body: tuple[bytes, int], key: tuple) -> bool:
    """Whether kafka-python decodes this (real) frame's body to exactly its length."""
    frame, api_version = body
    api_key, is_request = key[4], key[1] == "request"
    start = request_header_end(frame) if is_request else response_body_offset(frame, api_key, api_version)
    return bool(body_decodes_exactly(api_key, api_version, frame[start:], request=is_request))


def test_captures_merged_keep_apart_two_connections_on_one_client_port():
    """Linux picks ephemeral ports per destination, so tcpdumps of two brokers taken apart
    can hold one client port each (a CI run met it): merged as they were, the two
    connections read as one stream with two starts."""
    exchanges = every_version()[ApiKey.METADATA][:3]
    first = connection_segments(ApiKey.METADATA, exchanges)
    other = SERVER[1] + 1
    second = [
        seg._replace(
            ts_ns=seg.ts_ns + 10**12, **({"dport": other} if seg.dport == SERVER[1] else {"sport": other})
        )
        for seg in connection_segments(ApiKey.METADATA, exchanges[1:])
    ]
    ports = (SERVER[1], other)
    with pytest.raises(ValueError, match="client port"):
        damage.by_connection(first + second, ports)
    merged = damage.merge([first, second], ports)
    connections = damage.by_connection(merged, ports)
    assert len(connections) == 2
    truth = damage.true_frames(damage.import_segments(merged, ports), ports)
    assert sorted(len(frames) for frames in truth.values()) == [2, 2, 3, 3]
    for segments in connections.values():
        for client in (True, False):
            for offset in range(damage.stream_bytes(segments, client, ports)):
                cut = damage.cut(segments, client, offset, ports)
                assert damage.check(damage.import_segments(cut, ports), truth, ports, ends=True).ok


def test_two_brokers_merged_into_one_capture(tmp_path):
    require_tcpdump()
    with TansuBroker() as first, TansuBroker() as second:
        pcap = record_two_brokers(tmp_path, first, second)
        ports = (first.port, second.port)
    merged = recording(pcap, ports)
    servers = {r["upstream_address"] for r in merged.rows if r["kind"] == "open"}
    assert {address.rsplit(":", 1)[1] for address in servers} == {str(p) for p in ports}
    pdus = kafka_pdus(pcap, ports)
    assert not tshark_keys([p for p in pdus if p.api_key is not None]) - imported_keys(merged.rows)
    assert len(pdus) == sum(r["kind"] == "frame" for r in merged.rows)
    connections = damage.by_connection(merged.segments, ports)
    for segments in list(connections.values())[::3]:
        for client in (True, False):
            for offset in range(0, damage.stream_bytes(segments, client, ports), 7):
                cut = damage.cut(segments, client, offset, ports)
                assert damage.check(damage.import_segments(cut, ports), merged.truth, ports, ends=True).ok


def test_old_produce_mid_stream_imports_with_its_answer(real):
    """The issue's own case: a capture that starts inside a connection carrying 0.10-era
    requests still imports them (Produce v2 had been lost as "not framable")."""
    for port, segments in segments_of(real).items():
        for frame in real.truth.get((port, "request"), []):
            header = parse_request_header(frame)
            if (header.api_key, header.api_version) != (ApiKey.PRODUCE, 2):
                continue
            rows = damage.import_segments(damage.cut(segments, True, 1, real.ports), real.ports)
            produce = [r for r in rows if r["kind"] == "frame" and (r["api_key"], r["api_version"]) == (0, 2)]
            assert [r["frame"] for r in produce] == [frame]
            return
    pytest.fail("the recording holds no Produce v2")
