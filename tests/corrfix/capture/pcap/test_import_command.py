"""``corrfix capture import-pcap`` as an operator runs it: ports, re-imports, file names, pipes."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
from pathlib import Path

import dpkt
import pytest

from corrfix._cli import main
from corrfix.capture import read_capture
from corrfix.capture.pcap import CaptureIdTakenError, import_pcap
from tests.support.kafka_frames import session
from tests.support.tcp_synth import TcpSession, timed, write_capture


def capture_file(path: Path, server_port: int = 9092, client_port: int = 40001, n_produce: int = 1) -> Path:
    tcp = TcpSession(client=("10.0.0.1", client_port), server=("10.0.0.2", server_port))
    segments = tcp.handshake()
    for exchange in session(n_produce=n_produce):
        segments += tcp.send(True, exchange.request, with_ack=True)
        if exchange.response is not None:
            segments += tcp.send(False, exchange.response, with_ack=True)
    segments += [tcp.fin(True), tcp.fin(False), tcp.ack(True)]
    return write_capture(path, tcp, timed(segments))


START_NS = 1_700_000_000_000_000_000


def run(*argv: str) -> int:
    return main(["capture", "import-pcap", *argv])


def test_a_wrong_kafka_port_fails_and_names_the_port_that_carried_kafka(tmp_path, capsys):
    pcap = capture_file(tmp_path / "in.pcap", server_port=19092)
    assert run(str(pcap), "-o", str(tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert "no connection to Kafka port(s) 9092" in err
    assert "19092 (3 segments)" in err and "--kafka-port" in err
    assert run(str(pcap), "-o", str(tmp_path / "out"), "--kafka-port", "19092") == 0


def test_kafka_like_traffic_on_another_port_is_named_as_a_warning(tmp_path, capsys):
    tcp_a = capture_file(tmp_path / "a.pcap", server_port=9092)
    tcp_b = capture_file(tmp_path / "b.pcap", server_port=9093, client_port=40002)
    merged = tmp_path / "merged.pcap"
    merged.write_bytes(tcp_a.read_bytes() + tcp_b.read_bytes()[24:])  # one pcap header, both packet lists
    assert run(str(merged), "-o", str(tmp_path / "out")) == 0
    assert "Kafka-like requests also went to port(s) 9093" in capsys.readouterr().err


def test_nothing_kafka_like_anywhere_fails_with_a_plain_message(tmp_path, capsys):
    tcp = TcpSession(server=("10.0.0.2", 8080))
    pcap = write_capture(
        tmp_path / "http.pcap", tcp, timed(tcp.handshake() + tcp.send(True, b"GET / HTTP/1.1\r\n\r\n"))
    )
    assert run(str(pcap), "-o", str(tmp_path / "out")) == 1
    assert "no Kafka-like requests to any other port" in capsys.readouterr().err


def test_the_same_pcap_twice_is_imported_once(tmp_path, capsys):
    pcap = capture_file(tmp_path / "in.pcap")
    out = tmp_path / "out"
    assert run(str(pcap), "-o", str(out)) == 0
    files = sorted(out.iterdir())
    capsys.readouterr()
    assert run(str(pcap), "-o", str(out)) == 0
    assert "already imported" in capsys.readouterr().err
    assert run(str(pcap), "-o", str(out), "--capture-id", "another-id") == 0  # same content, whatever its id
    assert sorted(out.iterdir()) == files
    rows = read_capture(out).to_pylist()
    assert len({r["capture_id"] for r in rows}) == 1
    assert len(rows) == len({(r["connection_id"], r["seq"]) for r in rows})  # nothing twice


def test_ids_that_share_a_prefix_never_share_files(tmp_path):
    out = tmp_path / "out"
    first = import_pcap(capture_file(tmp_path / "a.pcap", n_produce=1), out, [9092], capture_id="kafka-run-a")
    second = import_pcap(
        capture_file(tmp_path / "c.pcap", n_produce=2), out, [9092], capture_id="kafka-run-c"
    )
    assert set(first.files).isdisjoint(second.files)
    assert all("kafka-run-a" in f for f in first.files) and all("kafka-run-c" in f for f in second.files)
    assert {r["capture_id"] for r in read_capture(out).to_pylist()} == {"kafka-run-a", "kafka-run-c"}
    summaries = sorted(p.name for p in out.glob("*.capture.json"))
    assert len(summaries) == 2


def test_an_id_unfit_for_a_file_name_still_names_distinct_files(tmp_path):
    out = tmp_path / "out"
    a = import_pcap(capture_file(tmp_path / "a.pcap", n_produce=1), out, [9092], capture_id="run/1 ü")
    b = import_pcap(capture_file(tmp_path / "b.pcap", n_produce=2), out, [9092], capture_id="run/1 ö")
    names = [Path(f).name for f in a.files + b.files]
    assert len(set(names)) == 2 and all("/" not in name and " " not in name for name in names)


def test_an_id_taken_by_other_content_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    import_pcap(capture_file(tmp_path / "a.pcap", n_produce=1), out, [9092], capture_id="run-1")
    with pytest.raises(CaptureIdTakenError):
        import_pcap(capture_file(tmp_path / "b.pcap", n_produce=2), out, [9092], capture_id="run-1")
    assert run(str(tmp_path / "b.pcap"), "-o", str(out), "--capture-id", "run-1") == 2
    assert "already holds capture run-1" in capsys.readouterr().err


def test_the_default_id_comes_from_the_content(tmp_path):
    pcap = capture_file(tmp_path / "in.pcap")
    first = import_pcap(pcap, tmp_path / "one", [9092])
    again = import_pcap(pcap, tmp_path / "two", [9092])
    assert first.capture_id == again.capture_id == first.pcap_sha256[:32]


@pytest.mark.parametrize("command", ["info", "import-pcap"])
def test_piped_into_head_ends_quietly(tmp_path, command):
    """A reader that is gone (``| head -1``) ends the command as SIGPIPE would: no traceback."""
    pcap = capture_file(tmp_path / "in.pcap")
    out = tmp_path / "out"
    if command == "info":
        import_pcap(pcap, out, [9092])
        args = ["capture", "info", str(out)]
    else:
        args = ["capture", "import-pcap", str(pcap), "-o", str(out), "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "corrfix", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes a line
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141, err
    assert b"Traceback" not in err and b"BrokenPipeError" not in err


def _pcapng(path: Path, stamps_ns: list[int], offset_s: int = 0) -> tuple[Path, int]:
    """A pcapng of the synthetic session's first packets at these times (nanosecond ticks, plus
    ``offset_s`` as the interface's if_tsoffset); and where its interface description starts."""
    pcap = capture_file(path.with_suffix(".pcap"))
    ng = dpkt.pcapng
    shb = bytes(ng.SectionHeaderBlockLE())
    options = [
        ng.PcapngOptionLE(code=9, data=b"\x09"),
        ng.PcapngOptionLE(code=14, data=struct.pack("<q", offset_s)),
    ]
    blocks = [
        shb,
        bytes(ng.InterfaceDescriptionBlockLE(snaplen=65535, opts=[*options, ng.PcapngOptionLE(code=0)])),
    ]
    for stamp, (_, frame) in zip(stamps_ns, dpkt.pcap.Reader(io.BytesIO(pcap.read_bytes())), strict=False):
        blocks.append(
            bytes(ng.EnhancedPacketBlockLE(ts_high=stamp >> 32, ts_low=stamp & 0xFFFFFFFF, pkt_data=frame))
        )
    path.write_bytes(b"".join(blocks))
    return path, len(shb)


def test_a_damaged_interface_description_is_an_error_not_a_traceback(tmp_path, capsys):
    pcap, idb = _pcapng(tmp_path / "in.pcapng", [START_NS] * 3)
    data = pcap.read_bytes()
    length = struct.unpack_from("<I", data, idb + 4)[0]
    short = struct.pack("<IIHHI", 1, 16, 1, 0, 16)  # whole as a block, too short for its fields
    pcap.write_bytes(data[:idb] + short + data[idb + length :])
    assert run(str(pcap), "-o", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert f"cannot import {pcap}" in err and "interface description block" in err


def test_a_timestamp_beyond_64_bit_nanoseconds_is_an_error_not_a_traceback(tmp_path, capsys):
    pcap, _ = _pcapng(tmp_path / "in.pcapng", [START_NS] * 3 + [2**64 - 1] + [START_NS] * 50)  # a request
    assert run(str(pcap), "-o", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert f"cannot import {pcap}" in err and "timestamp" in err


def test_a_time_offset_beyond_64_bit_nanoseconds_is_an_error_not_wrapped_around(tmp_path, capsys):
    pcap, _ = _pcapng(tmp_path / "in.pcapng", [START_NS] * 60, offset_s=9_000_000_000)
    assert run(str(pcap), "-o", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert f"cannot import {pcap}" in err and "timestamp" in err
