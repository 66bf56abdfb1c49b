"""Real wire captures for the tests: tcpdump on loopback around a block of Kafka traffic.

tcpdump needs to be installed and allowed to capture (root or CAP_NET_RAW). Without it the
tests skip, unless ``CORRFIX_REQUIRE_TCPDUMP=1`` makes that a failure. Start and stop are
synchronised on what tcpdump reports and writes, never on sleeps: it is ready once it
prints "listening on", and done once a marker request sent last is in the file.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.tools import require_tool, unavailable

MARKER_PREFIX = b"corrfix-capture-end-"
"""Client id of the marker requests; tests leave their connections out of their checks."""
START_TIMEOUT = 10.0
FLUSH_TIMEOUT = 10.0
_POLL = 0.01
REQUIRE_ENV = "CORRFIX_REQUIRE_TCPDUMP"


def require_tcpdump() -> str:
    """The tcpdump binary; skips (or fails, see above) the calling test without one.

    Call it from synchronous code: a skip raised inside a trio test loses its reason.
    """
    return require_tool("tcpdump", REQUIRE_ENV, "apt-get install tcpdump")


def _wait_listening(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stderr is not None
    output = b""
    deadline = time.monotonic() + START_TIMEOUT
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while b"listening on" not in output:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                proc.kill()
                proc.wait()
                started = output.decode(errors="replace")
                unavailable(f"tcpdump did not start within {START_TIMEOUT:g} s: {started}", REQUIRE_ENV)
            if selector.select(remaining):
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    proc.wait()
                    unavailable(
                        f"tcpdump cannot capture here: {output.decode(errors='replace').strip()}", REQUIRE_ENV
                    )
                output += chunk


def marker_connections(rows: list[dict]) -> set[str]:
    """Connection ids of the marker requests in an imported capture."""
    return {
        r["connection_id"]
        for r in rows
        if r["kind"] == "frame" and r["direction"] == "request" and MARKER_PREFIX in (r["frame"] or b"")
    }


def send_marker(port: int, marker: bytes) -> None:
    """A raw ApiVersions v0 request whose client id is ``marker``; waits for the answer."""
    body = struct.pack(">hhih", 18, 0, 0x7EA, len(marker)) + marker
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv(sock, 4))[0]
        _recv(sock, size)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@contextlib.contextmanager
def tcpdump(path: Path, port: int, interface: str = "lo") -> Iterator[Path]:
    """Capture ``tcp port PORT`` on ``interface`` into ``path`` for the duration of the block.

    On leaving, marker requests are sent on connections of their own, and tcpdump is
    stopped once the last marker is in the file, so every packet of the block is in it too.
    """
    binary = require_tcpdump()
    command = [
        binary,
        "-i",
        interface,
        "-w",
        str(path),
        "-U",
        "--immediate-mode",
        "-s",
        "0",
        "-n",
        "-B",
        "32768",
    ]
    proc = subprocess.Popen(
        [*command, f"tcp port {port}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(proc)
        yield path
        # Two markers: the file can lag a little behind the wire, so the first one's whole
        # exchange is in it by the time the second one's request is.
        send_marker(port, MARKER_PREFIX + uuid.uuid4().hex.encode())
        marker = MARKER_PREFIX + uuid.uuid4().hex.encode()
        send_marker(port, marker)
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while marker not in path.read_bytes():
            if time.monotonic() > deadline:
                raise AssertionError(f"tcpdump did not write the end marker within {FLUSH_TIMEOUT:g} s")
            time.sleep(_POLL)  # polling a condition, bounded by the deadline
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        report = b""
        if proc.stderr is not None:
            with contextlib.suppress(OSError):
                report = proc.stderr.read()
                path.with_suffix(".log").write_bytes(report)
            proc.stderr.close()
    dropped = packets_dropped(report.decode(errors="replace"))
    if dropped:
        raise AssertionError(f"tcpdump dropped {dropped} packets: {path} is not the whole traffic")


def packets_dropped(report: str) -> int:
    """Packets tcpdump's closing report says were lost, by the kernel or the interface.

    A capture the tests take as the truth must hold every packet of its block; a
    dropped one would show up far away, as bytes missing from a stream.
    """
    return sum(int(m.group(1)) for m in re.finditer(r"^(\d+) packets? dropped by", report, re.MULTILINE))
