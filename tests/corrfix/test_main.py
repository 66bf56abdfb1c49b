"""The ``corrfix`` entry point: ``capture import-pcap`` without the proxy's modules, same result."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
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


def _ignores_sighup(pid: int) -> bool:
    """Whether the process ignores SIGHUP now (``SigIgn`` in /proc: bit 0 is signal 1)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & 1 << (signal.SIGHUP - 1))
    return False


def test_a_sighup_while_the_proxy_starts_is_ignored_not_its_end():
    """A reload (logrotate, ``systemctl reload``) during the second or so of imports ended the
    process: SIGHUP's default action, which systemd counts as a clean exit, so no restart."""
    proxy = subprocess.Popen(
        [sys.executable, "-m", "corrfix", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"],
        stderr=subprocess.PIPE,
        text=True,
    )
    guard = threading.Timer(30, proxy.kill)  # bounds the blocking reads below
    guard.start()
    try:
        deadline = time.monotonic() + 20
        while not _ignores_sighup(proxy.pid):  # from main() on, until the proxy handles it
            assert proxy.poll() is None and time.monotonic() < deadline, "SIGHUP was never ignored"
            time.sleep(0.001)  # the poll's interval: the window it looks for lasts the imports
        proxy.send_signal(signal.SIGHUP)
        assert proxy.stderr is not None
        started = any("proxy listening" in line for line in proxy.stderr)
        assert started and proxy.poll() is None, "the proxy died of SIGHUP while it started"
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(timeout=20) == 0
    finally:
        guard.cancel()
        proxy.kill()
        proxy.wait()
