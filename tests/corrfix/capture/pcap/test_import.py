"""``corrfix capture import-pcap`` on synthetic captures of known frames: the rows are the frames."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import dpkt
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrfix.capture import read_capture
from corrfix.capture.format import SOURCE_KEY
from corrfix.capture.pcap import (
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    import_pcap,
)
from tests.support.kafka_frames import Exchange, api_versions, metadata, produce, session
from tests.support.tcp_synth import Segment, TcpSession, ip_packet, link_frame, split, timed, write_capture

START_NS = 1_700_000_000_000_000_000


def conversation(tcp: TcpSession, exchanges: list[Exchange], acks: bool = True) -> list[list[Segment]]:
    """One group of segments per message, request then response, in exchange order."""
    groups = []
    for exchange in exchanges:
        groups.append(tcp.send(True, exchange.request, with_ack=acks))
        if exchange.response is not None:
            groups.append(tcp.send(False, exchange.response, with_ack=acks))
    return groups


def flatten(groups: list[list[Segment]]) -> list[Segment]:
    return [seg for group in groups for seg in group]


def full_session(tcp: TcpSession, exchanges: list[Exchange]) -> list[Segment]:
    return (
        tcp.handshake()
        + flatten(conversation(tcp, exchanges))
        + [tcp.fin(True), tcp.fin(False), tcp.ack(True)]
    )


def run_import(tmp_path: Path, tcp: TcpSession, segments: list[Segment], **write) -> list[dict]:
    source = write_capture(tmp_path / "in.pcap", tcp, timed(segments), **write)
    out = tmp_path / "out"
    import_pcap(source, out, [9092])
    return read_capture(out).to_pylist()


def frames(rows: list[dict]) -> list[tuple[str, bytes]]:
    return [(r["direction"], r["frame"]) for r in rows if r["kind"] == "frame"]


def expected(exchanges: list[Exchange]) -> list[tuple[str, bytes]]:
    out = []
    for exchange in exchanges:
        out.append(("request", exchange.request))
        if exchange.response is not None:
            out.append(("response", exchange.response))
    return out


def frame_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["kind"] == "frame"]


# -- a clean session, every link layer ------------------------------------------------------


@pytest.mark.parametrize(
    "linktype",
    [LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_RAW, LINKTYPE_NULL, LINKTYPE_LOOP],
)
@pytest.mark.parametrize("pcapng", [False, True])
def test_clean_session_rows_are_the_frames(tmp_path, linktype, pcapng):
    exchanges = session()
    tcp = TcpSession()
    segments = full_session(tcp, exchanges)
    rows = run_import(tmp_path, tcp, segments, linktype=linktype, pcapng=pcapng)

    assert frames(rows) == expected(exchanges)
    assert [r["kind"] for r in rows] == ["open"] + ["frame"] * 10 + ["close"]
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert {r["connection_id"] for r in rows} == {"10.0.0.1:40001-10.0.0.2:9092"}
    assert {r["source"] for r in rows} == {"wire"}
    opened, closed = rows[0], rows[-1]
    assert (opened["reason"], closed["reason"]) == ("syn", "fin")
    assert (opened["client_address"], opened["upstream_address"]) == ("10.0.0.1:40001", "10.0.0.2:9092")
    for row, exchange in zip(frame_rows(rows)[::2], exchanges, strict=True):
        assert (row["api_key"], row["api_version"], row["client_correlation_id"]) == (
            exchange.api_key,
            exchange.api_version,
            exchange.correlation_id,
        )
    for row in frame_rows(rows):
        assert row["side"] == "client"
        assert row["upstream_correlation_id"] is None
        assert row["reason"] is None
        assert row["frame_length"] == len(row["frame"])
        assert row["mono_ns"] == row["wall_ns"]
    # Responses carry their request's api key and version.
    for request, response in zip(frame_rows(rows)[::2], frame_rows(rows)[1::2], strict=True):
        assert (response["api_key"], response["api_version"], response["client_correlation_id"]) == (
            request["api_key"],
            request["api_version"],
            request["client_correlation_id"],
        )


def test_frame_time_is_the_capture_time_of_its_first_packet(tmp_path):
    exchanges = session(n_produce=1)
    tcp = TcpSession()
    segments = timed(full_session(tcp, exchanges))
    rows = frame_rows(run_import(tmp_path, tcp, segments))
    starts = []
    for i, seg in enumerate(segments):  # the first data segment of each message
        before = segments[i - 1] if i else None
        if seg.payload and (before is None or before.from_client != seg.from_client or not before.payload):
            starts.append(seg.ts_ns)
    assert [r["wall_ns"] for r in rows] == starts
    assert starts[0] == START_NS + 3 * 1000  # the first packet after the handshake
    assert len({len(seg.payload) for seg in segments if seg.payload}) > 1  # some frames span packets


def test_file_metadata_marks_a_wire_capture(tmp_path):
    tcp = TcpSession()
    source = write_capture(tmp_path / "in.pcap", tcp, timed(full_session(tcp, session(1))))
    stats = import_pcap(source, tmp_path / "out", [9092], capture_id="wire-test-1")
    [file] = [Path(f) for f in stats.files]
    with pa.OSFile(str(file), "rb") as f:
        schema = pa.ipc.open_stream(f).schema
    assert schema.metadata[SOURCE_KEY] == b"wire"
    assert (stats.requests, stats.responses, stats.connections) == (3, 3, 1)


@pytest.mark.parametrize("linktype", [LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL2])
def test_ipv6(tmp_path, linktype):
    exchanges = session()
    tcp = TcpSession(client=("2001:db8::1", 40001), server=("2001:db8::2", 9092))
    rows = run_import(tmp_path, tcp, full_session(tcp, exchanges), linktype=linktype, ipv6=True)
    assert frames(rows) == expected(exchanges)
    assert rows[0]["client_address"] == "[2001:db8::1]:40001"
    assert rows[0]["connection_id"] == "[2001:db8::1]:40001-[2001:db8::2]:9092"


def test_ipv6_extension_headers_are_skipped(tmp_path):
    exchanges = session()
    tcp = TcpSession(client=("::1", 40001), server=("::1", 9092))
    segments = full_session(tcp, exchanges)
    rows = run_import(tmp_path, tcp, segments, ipv6=True, hop_by_hop=True, snaplen=14 + 48 + 20 + 60)
    got = frame_rows(rows)
    assert [(r["direction"], r["frame_length"]) for r in got] == [(d, len(f)) for d, f in expected(exchanges)]
    assert all(row["frame"] == frame[:60] for row, (_, frame) in zip(got, expected(exchanges), strict=True))


def test_other_ports_are_ignored_and_the_kafka_port_may_be_either_end(tmp_path):
    exchanges = session(1)
    tcp = TcpSession(server=("10.0.0.2", 19092))
    segments = full_session(tcp, exchanges)
    source = write_capture(tmp_path / "in.pcap", tcp, timed(segments))
    import_pcap(source, tmp_path / "none", [9092])
    assert read_capture(tmp_path / "none").num_rows == 0
    import_pcap(source, tmp_path / "some", [9092, 19092])
    assert frames(read_capture(tmp_path / "some").to_pylist()) == expected(exchanges)


# -- damaged streams -------------------------------------------------------------------------


def test_retransmissions_and_duplicates(tmp_path):
    exchanges = session()
    tcp = TcpSession()
    segments = full_session(tcp, exchanges)
    damaged = []
    for seg in segments:
        damaged.append(seg)
        if seg.payload:
            damaged.append(seg)  # duplicated at once
    damaged += [s for s in segments if s.payload][:4]  # and retransmitted late
    rows = run_import(tmp_path, tcp, damaged)
    assert frames(rows) == expected(exchanges)
    assert all(r["reason"] is None for r in frame_rows(rows))


def test_overlapping_segments(tmp_path):
    exchanges = session()
    tcp = TcpSession()
    segments = full_session(tcp, exchanges)
    damaged = []
    for seg in segments:
        if len(seg.payload) > 100:
            first, _ = split(seg, 70)
            _, second = split(seg, 30)  # re-sends 40 bytes of the first piece
            damaged += [first, second]
        else:
            damaged.append(seg)
    rows = run_import(tmp_path, tcp, damaged)
    assert frames(rows) == expected(exchanges)


def test_out_of_order_segments(tmp_path):
    exchanges = session()
    tcp = TcpSession(mss=500)
    head = tcp.handshake()
    groups = conversation(tcp, exchanges)
    shuffled = []
    rng = random.Random(4)
    for group in groups:
        group = list(group)
        rng.shuffle(group)
        shuffled += group
    rows = run_import(tmp_path, tcp, head + shuffled + [tcp.fin(True), tcp.fin(False)])
    assert frames(rows) == expected(exchanges)


def _acknowledged_before_captured(
    tcp: TcpSession, exchanges: list[Exchange], answer_first: bool
) -> list[Segment]:
    """A session whose capture holds the last two segments of each request after the server's
    acknowledgement of them: its pure ACK, or (``answer_first``) its answer, which acknowledges
    the request too. tcpdump on a host with several receive queues, or on ``-i any``, writes
    packets from different CPUs in this order now and then (Wireshark: "ACKed unseen segment")."""
    segments = tcp.handshake()
    for exchange in exchanges:
        request = tcp.send(True, exchange.request, with_ack=True)
        answer = tcp.send(False, exchange.response, with_ack=True) if answer_first else [tcp.ack(False)]
        segments += request[:-2] + answer[:1] + request[-2:] + answer[1:]
        if not answer_first:
            segments += tcp.send(False, exchange.response, with_ack=True)
    return [*segments, tcp.fin(True), tcp.fin(False), tcp.ack(True)]


@pytest.mark.parametrize("answer_first", [False, True])
def test_data_captured_after_its_acknowledgement(tmp_path, answer_first):
    exchanges = session()
    tcp = TcpSession()
    rows = run_import(tmp_path, tcp, _acknowledged_before_captured(tcp, exchanges, answer_first))
    assert frames(rows) == expected(exchanges)
    assert all(r["reason"] is None for r in frame_rows(rows))


def test_sequence_numbers_wrap_around(tmp_path):
    exchanges = session()
    tcp = TcpSession(client_isn=(1 << 32) - 3000, server_isn=(1 << 32) - 10)
    rows = run_import(tmp_path, tcp, full_session(tcp, exchanges))
    assert frames(rows) == expected(exchanges)


def test_capture_starting_mid_frame_resyncs_on_the_next_request(tmp_path):
    exchanges = session(n_produce=3)
    tcp = TcpSession()
    tcp.handshake()
    groups = conversation(tcp, exchanges)
    # The capture starts with the second segment of the first Produce request (cid 3).
    produce_request = groups[4]
    cut = produce_request[1:]
    segments = cut + flatten(groups[5:]) + [tcp.fin(True), tcp.fin(False)]
    rows = run_import(tmp_path, tcp, segments)

    assert rows[0]["reason"] == "midstream"
    assert frames(rows) == expected(exchanges[3:])
    first_request, first_response = frame_rows(rows)[:2]
    assert first_request["reason"] == f"skipped_before={len(exchanges[2].request) - 1000}"
    # The answer to the request whose start was not captured cannot be matched: skipped.
    assert first_response["reason"] == f"skipped_before={len(exchanges[2].response)}"
    assert first_response["api_key"] == 0


def test_capture_starting_mid_frame_with_pipelined_requests(tmp_path):
    """Several requests in flight when the capture starts: responses to them are skipped, the
    first response to a captured request is found by its correlation id."""
    records = bytes(range(256)) * 8
    exchanges = [produce(10 + i, records) for i in range(4)]
    tcp = TcpSession(mss=700)
    tcp.handshake()
    requests = flatten([tcp.send(True, e.request, with_ack=True) for e in exchanges])
    responses = flatten([tcp.send(False, e.response, with_ack=True) for e in exchanges])
    # Starts in the middle of request 10; requests 11-13 follow, then all four answers.
    rows = run_import(tmp_path, tcp, requests[1:] + responses)
    assert frames(rows) == [("request", e.request) for e in exchanges[1:]] + [
        ("response", e.response) for e in exchanges[1:]
    ]
    responses_rows = [r for r in frame_rows(rows) if r["direction"] == "response"]
    assert [r["client_correlation_id"] for r in responses_rows] == [11, 12, 13]


def test_lost_segment_inside_a_frame_truncates_only_that_frame(tmp_path):
    exchanges = session()
    tcp = TcpSession()
    head = tcp.handshake()
    groups = conversation(tcp, exchanges)
    produce_request = groups[4]
    assert len(produce_request) == 3
    del produce_request[1]  # the capture missed it; the broker's ACK shows it was sent
    rows = run_import(tmp_path, tcp, head + flatten(groups) + [tcp.fin(True), tcp.fin(False)])

    got = frame_rows(rows)
    assert len(got) == 10
    truncated = got[4]
    assert truncated["frame"] == exchanges[2].request[:1000]
    assert truncated["frame_length"] == len(exchanges[2].request)
    assert truncated["reason"] == "missing=1000"
    assert (truncated["api_key"], truncated["client_correlation_id"]) == (0, 3)
    assert got[5]["frame"] == exchanges[2].response and got[5]["api_key"] == 0
    assert frames(rows)[6:] == expected(exchanges)[6:]


def test_lost_size_prefix_resyncs_at_the_next_request(tmp_path):
    exchanges = session(n_produce=3)
    tcp = TcpSession()
    head = tcp.handshake()
    groups = conversation(tcp, exchanges)
    lost_request = groups[6]  # Produce cid 4: its first segment holds the size prefix
    del lost_request[0]
    rows = run_import(tmp_path, tcp, head + flatten(groups) + [tcp.fin(True), tcp.fin(False)])

    want = expected(exchanges)
    del want[6]  # the request is gone entirely
    # Its answer waits until the requests are framed again (it might have answered the
    # request found next), then stays unmatched.
    want[6], want[7] = want[7], want[6]
    assert frames(rows) == want
    got = frame_rows(rows)
    unmatched = got[7]
    assert unmatched["reason"] == "unmatched" and unmatched["api_key"] is None
    after = got[6]
    skipped = len(exchanges[3].request) - 1000
    assert after["reason"] == f"gap_before=1000,skipped_before={skipped}"
    assert after["client_correlation_id"] == 5


def test_snap_length_keeps_frame_starts_and_lengths(tmp_path):
    exchanges = session()
    tcp = TcpSession()
    segments = full_session(tcp, exchanges)
    keep = 60
    rows = run_import(tmp_path, tcp, segments, snaplen=14 + 20 + 20 + keep)
    got = frame_rows(rows)
    assert [(r["direction"], r["frame_length"]) for r in got] == [(d, len(f)) for d, f in expected(exchanges)]
    for row, (_, frame) in zip(got, expected(exchanges), strict=True):
        assert row["frame"] == frame[:keep]
    assert got[4]["reason"] == f"missing={len(exchanges[2].request) - 3 * keep}"
    assert got[4]["client_correlation_id"] == 3 and got[5]["api_key"] == 0


def test_capture_ending_mid_frame_gives_an_incomplete_frame(tmp_path):
    exchanges = session(n_produce=1)
    tcp = TcpSession()
    head = tcp.handshake()
    groups = conversation(tcp, exchanges)
    segments = head + flatten(groups[:4]) + groups[4][:1]
    rows = run_import(tmp_path, tcp, segments)
    last_frame, closed = rows[-2], rows[-1]
    assert last_frame["reason"] == "incomplete"
    assert last_frame["frame"] == exchanges[2].request[:1000]
    assert last_frame["frame_length"] == len(exchanges[2].request)
    assert closed["kind"] == "close" and closed["reason"] == "capture_end"


def test_rst_closes_and_port_reuse_opens_a_new_connection(tmp_path):
    first = TcpSession(client_isn=100)
    second = TcpSession(client_isn=900_000, server_isn=77)
    a, b = [api_versions(1)], [api_versions(1), produce(2, b"r" * 300)]
    segments = first.handshake() + flatten(conversation(first, a)) + [first.rst(True), first.ack(False)]
    segments += second.handshake() + flatten(conversation(second, b)) + [second.fin(True), second.fin(False)]
    rows = run_import(tmp_path, first, segments)
    ids = list(dict.fromkeys(r["connection_id"] for r in rows))
    assert ids == ["10.0.0.1:40001-10.0.0.2:9092", "10.0.0.1:40001-10.0.0.2:9092#2"]
    by_id = {i: [r for r in rows if r["connection_id"] == i] for i in ids}
    assert frames(by_id[ids[0]]) == expected(a)
    assert frames(by_id[ids[1]]) == expected(b)
    assert by_id[ids[0]][-1]["reason"] == "rst"
    assert by_id[ids[1]][-1]["reason"] == "fin"


def test_a_new_syn_on_an_open_tuple_ends_the_old_connection(tmp_path):
    first = TcpSession(client_isn=100)
    second = TcpSession(client_isn=900_000, server_isn=77)
    segments = first.handshake() + flatten(conversation(first, [api_versions(1)]))  # its end is not captured
    segments += second.handshake() + flatten(conversation(second, [api_versions(1)])) + [second.rst(False)]
    rows = run_import(tmp_path, first, segments)
    closes = [(r["connection_id"], r["reason"]) for r in rows if r["kind"] == "close"]
    assert closes == [
        ("10.0.0.1:40001-10.0.0.2:9092", "new_syn"),
        ("10.0.0.1:40001-10.0.0.2:9092#2", "rst"),
    ]
    assert len(frames(rows)) == 4


def test_acks0_produce_has_no_answer_and_later_answers_still_match(tmp_path):
    exchanges = [api_versions(1), produce(2, b"x" * 100, acks=0), produce(3, b"y" * 100)]
    tcp = TcpSession()
    rows = run_import(tmp_path, tcp, full_session(tcp, exchanges))
    assert frames(rows) == expected(exchanges)
    assert frame_rows(rows)[-1]["client_correlation_id"] == 3 and frame_rows(rows)[-1]["api_key"] == 0


# -- file formats ----------------------------------------------------------------------------


def test_pcapng_with_two_interfaces_and_nanosecond_stamps(tmp_path):
    """tcpdump -i any, or a merged file: interfaces of different link types, exact stamps."""
    exchanges = session(n_produce=1)
    tcp = TcpSession()
    segments = full_session(tcp, exchanges)
    le = dpkt.pcapng
    blocks = [bytes(le.SectionHeaderBlockLE())]
    for linktype in (LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL2):
        opts = [le.PcapngOptionLE(code=9, data=b"\x09"), le.PcapngOptionLE(code=0)]
        blocks.append(bytes(le.InterfaceDescriptionBlockLE(linktype=linktype, snaplen=65535, opts=opts)))
    stamps = []
    for i, seg in enumerate(segments):
        iface = i % 2
        linktype = (LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL2)[iface]
        ts = START_NS + i * 1_000_003  # not a whole microsecond
        stamps.append(ts)
        epb = le.EnhancedPacketBlockLE(
            iface_id=iface,
            ts_high=ts >> 32,
            ts_low=ts & 0xFFFFFFFF,
            pkt_data=link_frame(linktype, ip_packet(tcp, seg)),
        )
        blocks.append(bytes(epb))
    source = tmp_path / "in.pcapng"
    source.write_bytes(b"".join(blocks))
    import_pcap(source, tmp_path / "out", [9092])
    rows = read_capture(tmp_path / "out").to_pylist()
    assert frames(rows) == expected(exchanges)
    assert rows[0]["wall_ns"] == stamps[0]
    assert {r["wall_ns"] for r in rows} <= set(stamps)


@pytest.mark.parametrize("clean_path", [True, False])
def test_pcap_link_type_field_saying_frames_end_in_a_check_sequence(tmp_path, clean_path):
    """libpcap keeps a link type's upper 16 bits for the frame check sequence: bit 26 says the
    FCS length in bits 28-31 is valid. Such a file is Ethernet, its frames 4 bytes longer."""
    exchanges = session(n_produce=12)  # enough packets for the clean path
    tcp = TcpSession()
    source = write_capture(tmp_path / "in.pcap", tcp, timed(full_session(tcp, exchanges)))
    data = bytearray(source.read_bytes())
    data[20:24] = struct.pack("<I", LINKTYPE_ETHERNET | 0x04000000 | 4 << 28)
    out, pos = bytearray(data[:24]), 24
    while pos < len(data):  # each frame followed by its 4-byte check sequence
        ts_s, ts_us, captured, original = struct.unpack_from("<IIII", data, pos)
        out += struct.pack("<IIII", ts_s, ts_us, captured + 4, original + 4)
        out += data[pos + 16 : pos + 16 + captured] + b"\xde\xad\xbe\xef"
        pos += 16 + captured
    source.write_bytes(bytes(out))
    stats = import_pcap(source, tmp_path / "out", [9092], clean_path=clean_path)
    assert stats.unsupported_link_types == {}
    assert frames(read_capture(tmp_path / "out").to_pylist()) == expected(exchanges)


def test_truncated_pcap_file_keeps_whole_packets(tmp_path):
    exchanges = session(n_produce=1)
    tcp = TcpSession()
    source = write_capture(tmp_path / "in.pcap", tcp, timed(full_session(tcp, exchanges)))
    data = source.read_bytes()
    source.write_bytes(data[:-30])  # tcpdump killed mid-record
    stats = import_pcap(source, tmp_path / "out", [9092])
    assert stats.truncated_file
    assert frames(read_capture(tmp_path / "out").to_pylist()) == expected(exchanges)


@pytest.mark.parametrize("cut", [30, 200])
def test_pcapng_files_concatenated_after_one_cut_short(tmp_path, cut):
    """``cat a.pcapng b.pcapng`` is a valid pcapng of two sections, but when tcpdump was killed
    while writing ``a``, its last block runs into ``b``: ``b`` is read from its section header
    on, and the file is said to be cut."""
    exchanges = session(n_produce=12)
    first, second = TcpSession(client=("10.0.0.1", 40001)), TcpSession(client=("10.0.0.1", 40002))
    a = write_capture(tmp_path / "a.pcapng", first, timed(full_session(first, exchanges)), pcapng=True)
    b = write_capture(tmp_path / "b.pcapng", second, timed(full_session(second, exchanges)), pcapng=True)
    source = tmp_path / "in.pcapng"
    source.write_bytes(a.read_bytes()[:-cut] + b.read_bytes())
    stats = import_pcap(source, tmp_path / "out", [9092])
    assert stats.truncated_file
    rows = read_capture(tmp_path / "out").to_pylist()
    second_rows = [r for r in rows if r["connection_id"] == "10.0.0.1:40002-10.0.0.2:9092"]
    assert frames(second_rows) == expected(exchanges)
    assert [r["reason"] for r in second_rows if r["kind"] != "frame"] == ["syn", "fin"]


def test_not_a_capture_file(tmp_path):
    bogus = tmp_path / "bogus.pcap"
    bogus.write_bytes(struct.pack(">I", 0x12345678) + b"\0" * 40)
    with pytest.raises(ValueError):
        import_pcap(bogus, tmp_path / "out", [9092])


# -- property: any segmentation, duplication and local reordering -----------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mss=st.integers(min_value=8, max_value=1500), seed=st.integers(min_value=0, max_value=2**32))
def test_any_segmentation_duplication_overlap_and_reordering(tmp_path_factory, mss, seed):
    rng = random.Random(seed)
    exchanges = session(n_produce=2, record_size=700)
    tcp = TcpSession(mss=mss)
    head = tcp.handshake()
    damaged = []
    for group in conversation(tcp, exchanges):
        pieces = []
        for seg in group:
            if len(seg.payload) > 2 and rng.random() < 0.3:  # re-segmented with an overlap
                at = rng.randrange(1, len(seg.payload))
                back = rng.randrange(0, at)
                pieces += [split(seg, at)[0], split(seg, back)[1]]
            else:
                pieces.append(seg)
        rng.shuffle(pieces)
        damaged += pieces + [rng.choice(pieces) for _ in range(rng.randrange(3))]
    rows = run_import(tmp_path_factory.mktemp("prop"), tcp, head + damaged + [tcp.fin(True), tcp.fin(False)])
    assert frames(rows) == expected(exchanges)


# -- what the acknowledgements prove, and frame times around holes ---------------------------


def test_bytes_acknowledged_before_the_first_captured_byte_are_a_gap(tmp_path):
    """The capture starts after the client sent a request it never saw: the server's
    acknowledgements prove it was sent, and the first captured request says how much."""
    exchanges = [api_versions(1), metadata(2), produce(3, b"z" * 300)]
    tcp = TcpSession()
    tcp.handshake()
    groups = conversation(tcp, exchanges)  # request, response, request, response, ...
    # Seen: the first answer (acknowledging the first request), then the third exchange.
    segments = groups[1] + groups[4] + groups[5] + [tcp.fin(True), tcp.fin(False)]
    rows = run_import(tmp_path, tcp, segments)
    requests = [r for r in frame_rows(rows) if r["direction"] == "request"]
    assert [r["client_correlation_id"] for r in requests] == [3]
    assert requests[0]["reason"] == f"gap_before={len(exchanges[1].request)}"
    assert rows[0]["reason"] == "midstream"


def test_a_direction_never_captured_still_reports_what_was_acknowledged(tmp_path):
    exchanges = [api_versions(1), metadata(2)]
    tcp = TcpSession()
    tcp.handshake()
    groups = conversation(tcp, exchanges)
    # Only the answers were captured: the requests are known from the acknowledgements alone.
    rows = run_import(tmp_path, tcp, groups[1] + groups[3] + [tcp.ack(True)])
    closed = rows[-1]
    assert f"request_gap={len(exchanges[1].request)}" in closed["reason"]


def test_an_answer_after_a_hole_in_the_answers_has_latency_unknown(tmp_path):
    """Two requests in flight, the first answer lost by the capture: the second answer's
    latency is not measured (its first answer might have been in the hole)."""
    first, second = metadata(1), metadata(2)
    tcp = TcpSession()
    head = tcp.handshake()
    requests = tcp.send(True, first.request, with_ack=True) + tcp.send(True, second.request, with_ack=True)
    lost = tcp.send(False, first.response, with_ack=True)
    answer = tcp.send(False, second.response, with_ack=True)
    rows = run_import(
        tmp_path, tcp, head + requests + answer + [tcp.ack(True), tcp.fin(True), tcp.fin(False)]
    )
    del lost
    responses = [r for r in frame_rows(rows) if r["direction"] == "response"]
    assert [(r["client_correlation_id"], r["reason"]) for r in responses] == [
        (2, f"gap_before={len(first.response)},latency_unknown")
    ]


def test_a_hole_before_the_request_leaves_the_latency_known(tmp_path):
    exchanges = [metadata(1), metadata(2)]
    tcp = TcpSession()
    head = tcp.handshake()
    groups = conversation(tcp, exchanges)
    del groups[1]  # the first answer, acknowledged by the second request
    rows = run_import(tmp_path, tcp, head + flatten(groups) + [tcp.fin(True), tcp.fin(False)])
    responses = [r for r in frame_rows(rows) if r["direction"] == "response"]
    assert [(r["client_correlation_id"], r["reason"]) for r in responses] == [
        (2, f"gap_before={len(exchanges[0].response)}")
    ]


def test_a_frame_held_behind_a_hole_keeps_its_own_packet_time(tmp_path):
    """The old importer stamped such a frame with the packet that closed the hole (often
    its own answer's), so its latency read 0 ms."""
    first, second = metadata(1), metadata(2)
    tcp = TcpSession()
    head = tcp.handshake()
    lost = tcp.send(True, first.request)  # not captured; proven by the server's ack below
    held = tcp.send(True, second.request)
    answers = tcp.send(False, first.response, with_ack=True) + tcp.send(False, second.response, with_ack=True)
    segments = timed(head + held + answers + [tcp.fin(True), tcp.fin(False)], step_ns=1_000_000)
    del lost
    source = write_capture(tmp_path / "in.pcap", tcp, segments)
    import_pcap(source, tmp_path / "out", [9092])
    rows = frame_rows(read_capture(tmp_path / "out").to_pylist())
    request = next(r for r in rows if r["direction"] == "request")
    assert request["client_correlation_id"] == 2
    assert request["wall_ns"] == segments[3].ts_ns  # the packet that carried it
    answer = next(r for r in rows if r["direction"] == "response" and r["client_correlation_id"] == 2)
    assert answer["wall_ns"] - request["wall_ns"] == 2_000_000
