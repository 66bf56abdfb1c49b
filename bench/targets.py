"""The processes a benchmark measures: the echo broker, corrfix, haproxy in tcp mode, and
the bare Python relay.

Each is a context manager that starts a child process on loopback and always stops it.
``pid`` is what :mod:`procstat` samples; for ``corrfix --workers 2`` that is the
supervisor, whose tree includes the workers.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from corrfix._netutil import can_connect, free_port
from corrfix.core import LOOPBACK
from corrfix.lab import CorrfixProcess

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Target:
    """A relay (or the broker itself, for direct) that load is pointed at."""

    name: str
    port: int
    pid: int | None


class Child:
    """A child process started and stopped in order, ready once its port accepts."""

    def __init__(self, command: list[str], port: int, log_path: Path) -> None:
        self.command, self.port, self.log_path = command, port, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 15
        while not can_connect(LOOPBACK, self.port, timeout=0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"{self.command[0]} did not listen: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def echo_broker(work: Path) -> Iterator[Target]:
    port = free_port()
    command = [sys.executable, str(HERE / "echo_broker.py"), "--port", str(port)]
    with Child(command, port, work / "echo.log") as child:
        assert child.proc is not None
        yield Target("direct", port, child.proc.pid)


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None
    )


def haproxy_version() -> str | None:
    binary = haproxy_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else None


@contextlib.contextmanager
def haproxy(upstream: int, work: Path, port: int | None = None) -> Iterator[Target]:
    """haproxy in tcp mode with Debian's defaults (one thread per CPU, no splice)."""
    binary = haproxy_binary()
    if binary is None:
        raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
    port = port or free_port()
    config = work / "haproxy.cfg"
    config.write_text(
        "global\n  maxconn 9000\n"
        "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n"
        f"listen relay\n  bind {LOOPBACK}:{port}\n  server broker {LOOPBACK}:{upstream}\n"
    )
    with Child([binary, "-db", "-f", str(config)], port, work / "haproxy.log") as child:
        assert child.proc is not None
        yield Target("haproxy", port, child.proc.pid)


@contextlib.contextmanager
def bare_relay(upstream: int, work: Path) -> Iterator[Target]:
    """The least a Python relay does (bench/bare_relay.py): this interpreter's floor."""
    port = free_port()
    command = [sys.executable, str(HERE / "bare_relay.py"), "--listen", f"{LOOPBACK}:{port}"]
    command += ["--upstream", f"{LOOPBACK}:{upstream}"]
    with Child(command, port, work / "bare-python.log") as child:
        assert child.proc is not None
        yield Target("bare-python", port, child.proc.pid)


def proxy_arguments(port: int, upstream: int) -> list[str]:
    """``corrfix proxy`` listening on ``port`` in front of ``upstream``, both on loopback."""
    return ["proxy", "--listen", f"{LOOPBACK}:{port}", "--upstream", f"{LOOPBACK}:{upstream}"]


@contextlib.contextmanager
def corrfix(
    upstream: int, work: Path, name: str, *, workers: int = 1, extra: list[str] | None = None
) -> Iterator[Target]:
    """``corrfix proxy`` in front of ``upstream``; with workers, ready once every worker listens."""
    port = free_port()
    args = [*proxy_arguments(port, upstream), "--workers", str(workers), *(extra or [])]
    process = CorrfixProcess(args, port, work / f"{name}.log")
    with process:
        deadline = time.monotonic() + 15
        while workers > 1 and time.monotonic() < deadline:
            listening = [r for r in process.records() if r.get("event") == "proxy listening"]
            if len(listening) >= workers:
                break
            time.sleep(0.05)
        assert process._proc is not None
        yield Target(name, port, process._proc.pid)
