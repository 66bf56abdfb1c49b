"""Socket helpers shared by the lab, the benchmarks and the tests."""

from __future__ import annotations

import contextlib
import socket

from corrfix.core import LOOPBACK


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago.

    The kernel picks it (bind to port 0), so parallel callers get different ports. The
    port is released before returning, so another process can still take it: callers that
    hand it to a child process must detect "address in use" and retry.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` different TCP ports on ``host`` that were free a moment ago.

    Every socket stays bound until all are picked: ports picked one after another can repeat,
    as the kernel may hand a just-released port out again.
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def can_connect(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to ``host:port`` is accepted within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
