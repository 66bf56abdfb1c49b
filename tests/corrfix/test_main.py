"""The ``corrfix`` entry point: ``capture import-pcap`` without the proxy's modules, same result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from corrfix._cli import main as full_command_line
from tests.support.kafka_frames import session
from tests.support.tcp_synth import TcpSession, timed, write_capture

_PROBE = """
import json, sys
from corrfix._main import main
status = main(sys.argv[1:])
heavy = ("trio", "structlog", "corrfix.proxy", "corrfix.core", "pandas")
print(json.dumps({"status": status, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def _pcap(path: Path) -> Path:
    """One clean connection, long enough for the whole-connection path."""
    tcp = TcpSession(client=("10.0.0.1", 40001), server=("10.0.0.2", 9092), mss=200)
    segments = tcp.handshake()
    for exchange in session(n_produce=8):
        segments += tcp.send(True, exchange.request, with_ack=True)
        if exchange.response is not None:
            segments += tcp.send(False, exchange.response, with_ack=True)
    segments += [tcp.fin(True), tcp.fin(False), tcp.ack(True)]
    assert len(segments) > 40
    return write_capture(path, tcp, timed(segments))


def test_import_pcap_loads_neither_the_proxy_nor_its_logging_nor_pandas(tmp_path):
    pcap = _pcap(tmp_path / "in.pcap")
    args = ["capture", "import-pcap", str(pcap), "-o", str(tmp_path / "lean"), "--json"]
    result = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=True)
    lines = result.stdout.strip().splitlines()
    summary, probe = json.loads("\n".join(lines[:-1])), json.loads(lines[-1])
    assert probe == {"status": 0, "loaded": []}
    assert summary["requests"] > 8 and summary["connections"] == 1


def test_import_pcap_writes_what_the_full_command_line_writes(tmp_path, capsys):
    pcap = _pcap(tmp_path / "in.pcap")
    from corrfix._main import main

    outputs = []
    for run, out in ((main, "lean"), (full_command_line, "full")):
        assert run(["capture", "import-pcap", str(pcap), "-o", str(tmp_path / out), "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        stats["files"] = [Path(f).name for f in stats["files"]]
        files = {p.name: p.read_bytes() for p in sorted((tmp_path / out).glob("*.arrows"))}
        outputs.append((stats, files))
    assert outputs[0] == outputs[1]
