"""The frame splitter and the TCP reassembler on their own (sans-IO)."""

from __future__ import annotations

from corrfix.capture.pcap import (
    Data,
    FrameSplitter,
    Gap,
    RequestBoundary,
    ResponseBoundary,
    StreamReassembler,
)
from protocol import ApiKey
from tests.support.kafka_frames import api_versions, metadata, produce


def feed(splitter: FrameSplitter, *pieces: Data | Gap) -> list:
    out = []
    for piece in pieces:
        out += splitter.feed(piece)
    return out


def test_impossible_size_in_sync_resyncs_on_the_next_request():
    garbage = (-5).to_bytes(4, "big", signed=True) + b"\x00" * 20
    good = [api_versions(1).request, metadata(2).request]
    stream = garbage + b"".join(good)
    splitter = FrameSplitter(RequestBoundary(), synced=True)
    frames = feed(splitter, *(Data(i, stream[i : i + 7], 0) for i in range(0, len(stream), 7)))
    assert [f.data for f in frames] == good
    assert frames[0].skipped_before == len(garbage)
    assert frames[0].offset == len(garbage)


def test_noise_that_looks_like_a_header_until_its_client_id_is_rejected():
    # Size, api key 18 (ApiVersions) v3, correlation id 7, client id length 3 with unprintable bytes.
    fake = (30).to_bytes(4, "big") + bytes([0, 18, 0, 3, 0, 0, 0, 7, 0, 3, 1, 2, 3])
    real = api_versions(8).request
    splitter = FrameSplitter(RequestBoundary(), synced=False)
    frames = feed(splitter, Data(0, fake + real, 0))
    assert [f.data for f in frames] == [real]
    assert frames[0].skipped_before == len(fake)


def test_response_resync_needs_a_pending_correlation_id():
    pending = {12: (18, 3)}
    boundary = ResponseBoundary(pending.get, lambda: iter(pending), lambda: max(pending))
    splitter = FrameSplitter(boundary, synced=False)
    other, wanted = api_versions(11).response, api_versions(12).response
    frames = feed(splitter, Data(0, other[5:] + other + wanted, 0))
    assert [f.data for f in frames] == [wanted]
    assert frames[0].skipped_before == len(other) - 5 + len(other)


def test_a_gap_across_a_frame_boundary_truncates_then_resyncs():
    first, second, third = (
        produce(1, b"a" * 100).request,
        produce(2, b"b" * 100).request,
        api_versions(3).request,
    )
    splitter = FrameSplitter(RequestBoundary(), synced=True)
    stream = first + second + third
    cut = len(first) - 10  # the gap takes the end of the first frame and the start of the second
    resume = len(first) + 20
    frames = feed(
        splitter,
        Data(0, stream[:cut], 1),
        Gap(cut, resume - cut, 2),
        Data(resume, stream[resume:], 3),
    )
    assert [(f.data, f.length, f.missing) for f in frames] == [
        (first[:cut], len(first), 10),
        (third, len(third), 0),
    ]
    assert (frames[1].gap_before, frames[1].skipped_before) == (20, len(second) - 20)
    assert [f.ts_ns for f in frames] == [1, 3]  # each frame: the packet of its first byte


def test_finish_reports_a_partial_frame_and_unframed_bytes():
    request = produce(1, b"c" * 50).request
    splitter = FrameSplitter(RequestBoundary(), synced=True)
    assert feed(splitter, Data(0, request[:30], 5)) == []
    [partial], gap, skipped = splitter.finish(9)
    assert (partial.data, partial.length, partial.complete) == (request[:30], len(request), False)
    assert (gap, skipped) == (0, 0)

    lost = FrameSplitter(RequestBoundary(), synced=False)
    assert feed(lost, Data(0, b"\xff" * 40, 5), Gap(40, 10, 6)) == []
    assert lost.finish(9) == ([], 10, 40)


def test_reassembler_unwraps_sequence_numbers_and_drops_old_data():
    stream = StreamReassembler()
    isn = (1 << 32) - 5
    stream.syn(isn - 1)
    assert stream.segment(isn + 10, b"later", 5, 2) == []  # held behind a hole
    assert stream.held_bytes == 5
    pieces = stream.segment(isn, b"0123456789", 10, 3)
    assert pieces == [Data(0, b"0123456789", 3), Data(10, b"later", 2)]  # each with its own packet's time
    assert stream.segment(isn + 2, b"23", 2, 4) == []  # a retransmission
    assert stream.acknowledged((isn + 20) % (1 << 32), 5) == [Gap(15, 5, 5)]
    assert stream.position == 20


def test_reassembler_keeps_a_fin_out_of_the_data():
    stream = StreamReassembler()
    stream.syn(99)
    assert stream.segment(100, b"abc", 3, 1, fin=True) == [Data(0, b"abc", 1)]
    assert stream.acknowledged(104, 2) == []  # the FIN's sequence number is no data
    assert stream.finish(3) == []


# The tail of a Tansu ApiVersions v3 answer, recorded: its (api key, min, max) entries read as a
# 10-byte "answer" to request 6 (GetTelemetrySubscriptions v0, no kafka-python schema) followed
# by a 29-byte "answer" to request 3 (ListOffsets v7) that kafka-python decodes exactly.
API_VERSIONS_TAIL = bytes.fromhex(
    "0000000a000000060000450000000000001d0000000300000d000000050000240000000200001900000004"
    "0000160000000500003c0000000100000200000009000012000000040000100000000500001100000001"
    "000015000000020000030000000c0000000000040001010108ffffffffffffffff020101030100"
)


def test_an_answer_is_not_proven_by_a_frame_that_would_answer_an_older_request():
    """Answers come in request order: a candidate answer to request 6 is not proven by a frame
    after it that would answer request 3, however exactly that frame decodes."""
    pending = {3: (ApiKey.LIST_OFFSETS, 7), 6: (ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0), 7: (18, 3)}
    boundary = ResponseBoundary(pending.get, lambda: iter(pending), lambda: max(pending))
    splitter = FrameSplitter(boundary, synced=False)
    wanted = api_versions(7).response
    frames = feed(splitter, Data(0, API_VERSIONS_TAIL + wanted, 0))
    assert [f.data for f in frames] == [wanted]
    assert frames[0].skipped_before == len(API_VERSIONS_TAIL)
