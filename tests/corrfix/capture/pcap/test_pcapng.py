"""pcapng export without Wireshark: blocks, timestamps, TCP numbers, segmentation, comments."""

from __future__ import annotations

import argparse
from collections import defaultdict

import dpkt
import pytest

from corrfix.capture import CaptureWriter, add_capture_commands, read_capture
from corrfix.capture.pcap import _pcapng as pcapng_module
from corrfix.capture.pcap import export_pcapng
from corrfix.core import RepairConfig
from protocol import ApiKey
from protocol.testing import request_frame
from tests.support.capture_shell import Shell, run_repair_scenario
from tests.support.pcapng_reading import checksums_valid, read_pcapng

BIG = 200_000
SYN, ACK, FIN = dpkt.tcp.TH_SYN, dpkt.tcp.TH_ACK, dpkt.tcp.TH_FIN
PROXY_IP = bytes([127, 0, 0, 2])


def big_request(correlation_id: int) -> bytes:
    small = request_frame(ApiKey.METADATA, correlation_id, 1)
    payload = bytes(small[4:]) + bytes(BIG)
    return len(payload).to_bytes(4, "big") + payload


def big_response(correlation_id: int) -> bytes:
    payload = correlation_id.to_bytes(4, "big") + bytes(range(256)) * (BIG // 256)
    return len(payload).to_bytes(4, "big") + payload


def make_capture(directory, snaplen=65536 * 8):
    writer = CaptureWriter(directory, snaplen=snaplen).start()
    shell = Shell(writer, config=RepairConfig(probe_after=1.0))
    run_repair_scenario(shell)
    other = Shell(writer, connection="c2")
    other.open(client="127.0.0.1:50002")
    other.client_sends(big_request(9))
    other.broker_answers(big_response(0))
    other.close()
    writer.close()
    return read_capture(directory).to_pylist()


def streams_of(packets):
    """Packets grouped by TCP connection (unordered address pair), in file order."""
    streams = defaultdict(list)
    for packet in packets:
        ip, tcp = packet.ip, packet.tcp
        ends = sorted([(ip.src, tcp.sport), (ip.dst, tcp.dport)])
        streams[tuple(ends)].append(packet)
    return streams


def test_export_is_tcp_that_adds_up_and_carries_every_frame(tmp_path):
    rows = make_capture(tmp_path / "cap")
    out = tmp_path / "out.pcapng"
    stats = export_pcapng(tmp_path / "cap", out, broker_port=19092)
    pcap = read_pcapng(out)
    assert pcap.linktype == 1 and pcap.tsresol == 9
    assert stats.packets == len(pcap.packets) and stats.connections == 2
    frame_rows = [r for r in rows if r["kind"] == "frame"]
    assert stats.frames == len(frame_rows) and stats.truncated_frames == 0
    assert all(checksums_valid(p) for p in pcap.packets)
    assert all(len(p.ip) <= 65535 for p in pcap.packets)
    assert {p.timestamp_ns for p in pcap.packets} <= {r["wall_ns"] for r in rows}  # exact nanoseconds

    streams = streams_of(pcap.packets)
    assert len(streams) == 4  # two connections, two sides each
    payloads = defaultdict(bytes)
    for packets in streams.values():
        syn, syn_ack, ack = (p.tcp for p in packets[:3])
        assert (syn.flags, syn_ack.flags, ack.flags) == (SYN, SYN | ACK, ACK)
        client, server = (packets[0].ip.src, syn.sport), (packets[0].ip.dst, syn.dport)
        assert server[1] == 19092
        next_seq = {client: syn.seq, server: syn_ack.seq}
        for packet in packets:
            ip, tcp = packet.ip, packet.tcp
            sender, receiver = (ip.src, tcp.sport), (ip.dst, tcp.dport)
            assert tcp.seq == next_seq[sender]
            if tcp.flags & ACK:
                assert tcp.ack == next_seq[receiver]
            next_seq[sender] += len(tcp.data) + (1 if tcp.flags & (SYN | FIN) else 0)
            side = "client" if PROXY_IP in (ip.src, ip.dst) else "upstream"
            direction = "request" if tcp.dport == 19092 else "response"
            payloads[(client, side, direction)] += tcp.data
        assert packets[-1].tcp.flags == ACK and packets[-3].tcp.flags & FIN

    expected = defaultdict(bytes)
    clients = {}
    for r in frame_rows:
        clients.setdefault(r["connection_id"], len(clients))
        expected[(clients[r["connection_id"]], r["side"], r["direction"])] += r["frame"]
    got = {}
    for (client, side, direction), data in payloads.items():
        number = int.from_bytes(client[0][2:], "big")  # 127.1.x.y / 127.2.x.y: the connection number
        got[(number, side, direction)] = data
    assert got == dict(expected)

    big = [p for p in pcap.packets if len(p.tcp.data) > 60_000]
    assert len(big) == 12  # four 200 KB frames on c2 (both ways, both sides): 4 segments each, 3 full
    assert max(len(p.tcp.data) for p in pcap.packets) == 65495


def test_repairs_open_and_close_become_comments_on_the_right_packets(tmp_path):
    make_capture(tmp_path / "cap")
    out = tmp_path / "out.pcapng"
    export_pcapng(tmp_path / "cap", out)
    pcap = read_pcapng(out)
    commented = [(p, c) for p in pcap.packets for c in p.comments]

    def upstream_cid(packet):
        data = packet.tcp.data
        return int.from_bytes(data[8:12] if packet.tcp.dport == 9092 else data[4:8], "big")

    by_event = defaultdict(list)
    for packet, comment in commented:
        by_event[comment.split()[1]].append((packet, comment))
    requeues = by_event["requeue"]
    assert [upstream_cid(p) for p, _ in requeues] == [3, 7]  # on the re-sent request itself
    assert all(p.tcp.dport == 9092 and "client_correlation_id=" in c for p, c in requeues)
    assert [upstream_cid(p) for p, _ in by_event["skip_detected"]] == [
        0,
        5,
    ]  # the requests whose answers were lost
    assert [upstream_cid(p) for p, _ in by_event["stale_drop"]] == [4]  # the stray answer
    assert by_event["stale_drop"][0][0].tcp.sport == 9092
    assert [upstream_cid(p) for p, _ in by_event["probe_sent"]] == [6]
    assert [upstream_cid(p) for p, _ in by_event["probe_found_loss"]] == [6]
    assert [p.tcp.flags for p, _ in by_event["open"]] == [SYN] * 2
    assert all(p.tcp.flags & FIN for p, _ in by_event["close"])
    assert "client closed" in by_event["close"][0][1]


def test_truncated_frames_are_zero_filled_and_marked(tmp_path):
    rows = make_capture(tmp_path / "cap", snaplen=100)
    out = tmp_path / "out.pcapng"
    stats = export_pcapng(tmp_path / "cap", out)
    assert stats.truncated_frames == 4
    pcap = read_pcapng(out)
    marked = [p for p in pcap.packets if any("truncated" in c for c in p.comments)]
    assert len(marked) == 4
    request_rows = [r for r in rows if r["frame_length"] == BIG + len(request_frame(ApiKey.METADATA, 9, 1))]
    first = marked[0].tcp.data
    assert first[:100] == request_rows[0]["frame"] and first[100:] == bytes(len(first) - 100)
    assert "100 of" in marked[0].comments[0]


def test_capture_commands_run_info_and_pcapng(tmp_path, capsys):
    make_capture(tmp_path / "cap")
    parser = argparse.ArgumentParser()
    add_capture_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["pcapng", str(tmp_path / "cap"), "-o", str(tmp_path / "x.pcapng"), "--broker-port", "9093"]
    )
    assert args.run(args) == 0
    assert "Kafka frames on 2 connections" in capsys.readouterr().out
    assert read_pcapng(tmp_path / "x.pcapng").packets[0].tcp.dport == 9093
    args = parser.parse_args(["info", str(tmp_path / "cap")])
    assert args.run(args) == 0
    assert "repair events" in capsys.readouterr().out


def test_an_export_that_fails_midway_leaves_no_short_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    """A failure after some packets (a disk full, a bad row) left a pcapng that read as a
    shorter capture, in place of the one written before."""
    make_capture(tmp_path / "cap")
    out = tmp_path / "out.pcapng"
    export_pcapng(tmp_path / "cap", out)
    before = out.read_bytes()
    rows = pcapng_module._rows

    def failing_rows(path, columns=None):
        for index, row in enumerate(rows(path, columns)):
            if index == 5 and columns is None:  # the packets' pass, not the comments' plan
                raise OSError(28, "No space left on device")
            yield row

    monkeypatch.setattr(pcapng_module, "_rows", failing_rows)
    with pytest.raises(OSError, match="No space left"):
        export_pcapng(tmp_path / "cap", out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap", "out.pcapng"]
