"""sd_notify: tell a service manager (systemd ``Type=notify``) how the proxy is doing.

The protocol is one datagram of ``KEY=VALUE`` lines to the unix socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` is Linux's abstract namespace). corrfix sends
``READY=1`` once its listeners are up, ``STOPPING=1`` when it starts draining, and
``RELOADING=1`` then ``READY=1`` around a SIGHUP re-opening its files (only between its
first ``READY=1`` and ``STOPPING=1``). A proxy's (or a worker's) ``READY=1`` carries
``X_CORRFIX_ENDPOINT=HOST:PORT`` when it serves health: that is how a worker tells its
supervisor the port the kernel gave it (systemd ignores variables it does not know).
Without the variable nothing is sent; a failing send is logged and never stops the proxy.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("corrfix.systemd")

NOTIFY_SOCKET = "NOTIFY_SOCKET"
READY = "READY=1"
STOPPING = "STOPPING=1"
ENDPOINT = "X_CORRFIX_ENDPOINT"
"""Where a process serves ``/livez`` and ``/readyz`` (and ``/metrics`` if asked)."""
MAX_MESSAGE = 4096
_UCRED = struct.Struct("3i")
"""struct ucred: the sender's pid, uid and gid."""


def reloading() -> str:
    """``RELOADING=1`` with the monotonic time systemd wants alongside it (``Type=notify-reload``)."""
    return f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def endpoint(address: object) -> str:
    """The message that says where this process's health listener is bound."""
    return f"{ENDPOINT}={address}"


def socket_address(path: str) -> str:
    """The address to send to: an abstract socket's ``@`` becomes the leading NUL byte."""
    return "\0" + path[1:] if path.startswith("@") else path


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` to ``$NOTIFY_SOCKET``; True if sent, False without one or on failure."""
    path = (os.environ if environ is None else environ).get(NOTIFY_SOCKET)
    if not path:
        return False
    if not path.startswith(("/", "@")):
        log.warning("NOTIFY_SOCKET is not a unix socket path, not notifying", notify_socket=path)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(socket_address(path))
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify failed", notify_socket=path, error=str(exc))
        return False
    return True


class NotifyReceiver:
    """The receiving end of the protocol, for a supervisor between systemd and its workers.

    A datagram socket in Linux's abstract namespace, named by the kernel (autobind): no file,
    so a read-only root file system without a /tmp does not stop ``--workers``; with
    ``SO_PASSCRED`` the kernel tells which process sent each message.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.bind("")  # autobind: a unique abstract name
        self.path = "@" + self._sock.getsockname()[1:].decode()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def receive(self, timeout: float) -> list[tuple[int | None, list[str]]]:
        """Messages that arrive within ``timeout`` (then all that are queued): sender pid, lines."""
        messages: list[tuple[int | None, list[str]]] = []
        ready, _, _ = select.select([self._sock], [], [], timeout)
        while ready:
            try:
                data, ancillary, _flags, _address = self._sock.recvmsg(
                    MAX_MESSAGE, socket.CMSG_SPACE(_UCRED.size), socket.MSG_DONTWAIT
                )
            except BlockingIOError:
                break
            pid = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[: _UCRED.size])[0]
            messages.append((pid, data.decode(errors="replace").splitlines()))
        return messages

    def close(self) -> None:
        self._sock.close()
