"""Every request version ever defined, of every api key Kafka defines, found again mid-stream.

The old importer knew only the versions in kafka-python's current schemas (Produce 3-13,
Fetch 4-18, ...) and no api keys 4-7, 38-41, 68-73 or 76+, so a capture that started in a
0.10-era connection imported nothing. Here each api gets one connection holding all its
versions, and the capture is started at every byte (``tests/support/wire_damage.py``).
"""

from __future__ import annotations

import collections

import pytest

from corrfix.capture.pcap import Data, FrameSplitter, RequestBoundary, ResponseBoundary, import_pcap
from protocol import ApiKey, every_request_schema
from tests.support import wire_damage as damage
from tests.support.every_version import SERVER, VersionExchange, connection_segments, every_version
from tests.support.tshark import kafka_pdus

PORTS = (SERVER[1],)


@pytest.fixture(scope="module")
def versions() -> dict[int, list[VersionExchange]]:
    return every_version()


@pytest.fixture(scope="module")
def segments(versions) -> dict[int, list]:
    return {key: connection_segments(key, exchanges) for key, exchanges in versions.items()}


@pytest.fixture(scope="module")
def truth(versions) -> dict[tuple[int, str], list[bytes]]:
    out = {}
    for key, exchanges in versions.items():
        out[(20000 + key, "request")] = [e.request for e in exchanges]
        out[(20000 + key, "response")] = [e.response for e in exchanges]
    return out


def test_every_api_key_kafka_defines_from_version_0(versions):
    assert set(versions) == {int(key) for key in ApiKey}
    assert all(exchanges[0].api_version == 0 for exchanges in versions.values())
    produce = {e.api_version for e in versions[ApiKey.PRODUCE]}
    assert {0, 1, 2} <= produce  # dropped from Kafka 4.0's schemas, still on old clients' wires
    assert sum(len(e) for e in versions.values()) > 350


def test_clean_capture_imports_every_version_with_its_answer(segments, truth):
    rows = damage.import_segments([s for segs in segments.values() for s in segs], PORTS)
    assert damage.true_frames(rows, PORTS) == truth
    for row in rows:
        if row["kind"] == "frame":
            port = damage.row_port(row)
            assert row["api_key"] == port - 20000
            assert row["api_version"] == row["client_correlation_id"] - 1


def test_tshark_reads_the_same_requests(segments, tmp_path):
    pcap = damage.write_pcap(tmp_path / "every.pcap", [s for segs in segments.values() for s in segs])
    stats = import_pcap(pcap, tmp_path / "capture", PORTS)
    pdus = kafka_pdus(pcap, PORTS)
    requests = [p for p in pdus if not p.is_response]
    assert stats.requests == len(requests) > 350
    theirs = collections.Counter(
        (p.client_port - 20000, p.correlation_id - 1, p.frame_length) for p in requests
    )
    ours = collections.Counter(
        (key, e.api_version, len(e.request)) for key, exchanges in every_version().items() for e in exchanges
    )
    assert theirs == ours


@pytest.mark.parametrize("one_direction", [False, True], ids=["from-a-time", "one-direction-only"])
def test_cut_anywhere_finds_the_next_request_of_any_version(segments, truth, one_direction):
    """A start at any byte of the requests: no phantom, and the first request that starts
    after the cut is imported (whatever its version), with its answer."""
    late = []
    for key, segs in segments.items():
        frames = truth[(20000 + key, "request")]
        starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
        for offset in range(damage.stream_bytes(segs, True, PORTS)):
            cut = damage.cut(segs, True, offset, PORTS, one_direction=one_direction)
            rows = damage.import_segments(cut, PORTS)
            found = damage.check(rows, truth, PORTS, ends=True)
            assert found.ok, (key, offset, found)
            assert found.lost_after_first == 0, (key, offset, found)
            expect = next((i for i, s in enumerate(starts) if s >= offset), None)
            if expect is not None and found.first.get((20000 + key, "request"), len(frames)) > expect:
                late.append((key, offset))
            answered = [r for r in rows if r["kind"] == "frame" and r["direction"] == "response"]
            assert all(r["api_key"] == key for r in answered if r["reason"] != "unmatched")
    assert late == []


def test_cut_anywhere_in_the_answers_makes_no_phantom(segments, truth):
    for key, segs in segments.items():
        for offset in range(damage.stream_bytes(segs, False, PORTS)):
            cut = damage.cut(segs, False, offset, PORTS, one_direction=True)
            found = damage.check(damage.import_segments(cut, PORTS), truth, PORTS, ends=True)
            assert found.ok and found.lost_after_first == 0, (key, offset, found)


@pytest.mark.parametrize("api_key", [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.OFFSET_COMMIT])
def test_old_versions_are_found_after_noise(versions, api_key):
    """Each old version, right after the tail of another frame, is found by the splitter alone."""
    low = every_request_schema()[api_key].valid_versions[0]
    assert low == 0
    for exchange in versions[api_key][:4]:
        noise = versions[ApiKey.METADATA][3].request[7:]
        splitter = FrameSplitter(RequestBoundary(), synced=False)
        frames = splitter.feed(Data(0, noise + exchange.request, 1))
        assert [f.data for f in frames] == [exchange.request], exchange.api_version
        assert frames[0].skipped_before == len(noise)


def test_an_old_answer_is_proven_by_its_request(versions):
    produce_v2 = versions[ApiKey.PRODUCE][2]
    pending = {produce_v2.correlation_id: (ApiKey.PRODUCE, 2)}
    boundary = ResponseBoundary(pending.get, lambda: iter(pending), lambda: max(pending))
    splitter = FrameSplitter(boundary, synced=False)
    noise = produce_v2.response[: len(produce_v2.response) // 2]
    frames = splitter.feed(Data(0, noise + produce_v2.response, 1))
    assert [f.data for f in frames] == [produce_v2.response]


def test_versions_newer_than_any_schema_are_not_resynced_on(versions):
    """A header with a version beyond what Kafka defines is taken for noise, not a frame."""
    exchange = versions[ApiKey.METADATA][-1]
    bumped = bytearray(exchange.request)
    bumped[6:8] = (every_request_schema()[ApiKey.METADATA].valid_versions[1] + 1).to_bytes(2, "big")
    splitter = FrameSplitter(RequestBoundary(), synced=False)
    assert splitter.feed(Data(0, bytes(bumped), 1)) == []
    assert splitter.finish(2) == ([], 0, len(bumped))
