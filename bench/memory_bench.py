"""Memory figures: proxy RSS with many idle connections, and under slowloris clients.

Idle: N clients connect and each completes one request, so every client also has its
upstream connection; the proxy then holds them all idle. Slowloris: clients announce a
1 MiB request and send its bytes one a second; the figure is RSS growth while they trickle
(a proxy that pre-allocated by announced size would show it). Both are reported as
growth over the same proxy's RSS with no clients, for corrfix and haproxy alike.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import procstat
import targets
from frames import produce_frame

MIB = 1024 * 1024


def _open_idle(port: int, count: int, request: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(request)
        socks.append(sock)
    for sock in socks:
        got = 0
        while got < len(request):
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("the relay closed an idle connection during set-up")
            got += len(chunk)
    return socks


def _slowloris(port: int, clients: int, seconds: float) -> tuple[int, int]:
    """Trickle one byte a second per client; returns (bytes sent, clients still open)."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(clients)]
    frame = produce_frame(MIB)
    sent = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(frame[sent : sent + 1])
            sent += 1
            time.sleep(1.0)
        open_ = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                open_ += sock.recv(1) != b""
            except BlockingIOError:
                open_ += 1
            except OSError:
                pass
        return sent, open_
    finally:
        for sock in socks:
            sock.close()


def _settle(pid: int) -> int:
    time.sleep(0.5)
    return procstat.rss_bytes(pid)


def run_memory(
    work: Path, idle: int, slow_clients: int, slow_seconds: float, log: object = print
) -> dict[str, object]:
    report: dict[str, object] = {"idle_connections": idle, "slowloris_clients": slow_clients}
    names = ["corrfix", "haproxy"] if targets.haproxy_binary() else ["corrfix"]
    if "haproxy" not in names:
        report["skipped"] = {"haproxy": "haproxy is not installed: baseline skipped"}
    request = produce_frame(100)
    with targets.echo_broker(work) as echo:
        for name in names:
            with contextlib.ExitStack() as stack:
                if name == "haproxy":
                    target = stack.enter_context(targets.haproxy(echo.port, work))
                else:
                    target = stack.enter_context(targets.corrfix(echo.port, work, "memory-corrfix"))
                assert target.pid is not None
                base = _settle(target.pid)
                socks = _open_idle(target.port, idle, request)
                try:
                    loaded = _settle(target.pid)
                finally:
                    for sock in socks:
                        sock.close()
                after_idle = _settle(target.pid)
                sent, still_open = _slowloris(target.port, slow_clients, slow_seconds)
                slow = procstat.rss_bytes(target.pid)
                figures = {
                    "rss_base_mib": round(base / MIB, 1),
                    "rss_idle_mib": round(loaded / MIB, 1),
                    "idle_kib_per_connection": round((loaded - base) / idle / 1024, 1),
                    "rss_slowloris_growth_mib": round((slow - after_idle) / MIB, 2),
                    "slowloris_bytes_each": sent,
                    "slowloris_still_open": still_open,
                }
                report[name] = figures
                log(f"  {name}: {figures}")
    return report
