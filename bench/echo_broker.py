"""A fast frame-echo "broker" for the relay benchmarks, run as its own process.

It answers each whole request frame with a response of the same size carrying the
request's correlation id: response = size prefix, correlation id, then the request's bytes
from its correlation id on. That is the request patched in place (4 bytes per frame), so
the echo costs one receive, one patch per frame and one send per batch; it stays out of
the way of the proxies it measures. It is single-threaded on epoll, with no dependencies.

    python bench/echo_broker.py --port PORT
"""

from __future__ import annotations

import argparse
import select
import signal
import socket

RECEIVE = 1024 * 1024
MAX_PENDING = 8 * 1024 * 1024
"""Bytes owed to one client before the echo stops reading from it."""


class _Conn:
    __slots__ = ("inbox", "mask", "outbox", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.mask = select.EPOLLIN


def _answer(conn: _Conn) -> None:
    """Patch every whole request in the inbox into its response and move it to the outbox."""
    buf = conn.inbox
    pos = 0
    end = len(buf)
    while end - pos >= 12:
        size = int.from_bytes(buf[pos : pos + 4], "big")
        stop = pos + 4 + size
        if stop > end:
            break
        buf[pos + 4 : pos + 8] = buf[pos + 8 : pos + 12]
        pos = stop
    if pos == 0:
        return
    if pos == end and not conn.outbox:
        conn.outbox = buf
        conn.inbox = bytearray()
    else:
        conn.outbox += memoryview(buf)[:pos]
        del buf[:pos]


def serve(port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    listener.setblocking(False)
    epoll = select.epoll()
    epoll.register(listener.fileno(), select.EPOLLIN)
    conns: dict[int, _Conn] = {}
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    def close(fd: int) -> None:
        conn = conns.pop(fd)
        epoll.unregister(fd)
        conn.sock.close()

    def flush(fd: int, conn: _Conn) -> None:
        out = conn.outbox
        try:
            sent = conn.sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError:
            close(fd)
            return
        if sent == len(out):
            conn.outbox = bytearray()
        else:
            del out[:sent]
        pending = len(conn.outbox)
        mask = (select.EPOLLOUT if pending else 0) | (select.EPOLLIN if pending < MAX_PENDING else 0)
        if mask != conn.mask:
            conn.mask = mask
            epoll.modify(fd, mask)

    while not stop:
        try:
            events = epoll.poll(1.0)
        except InterruptedError:
            continue
        for fd, mask in events:
            if fd == listener.fileno():
                while True:
                    try:
                        sock, _ = listener.accept()
                    except BlockingIOError:
                        break
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns[sock.fileno()] = _Conn(sock)
                    epoll.register(sock.fileno(), select.EPOLLIN)
                continue
            conn = conns.get(fd)
            if conn is None:
                continue
            if mask & select.EPOLLIN:
                try:
                    data = conn.sock.recv(RECEIVE)
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    close(fd)
                    continue
                if data:
                    conn.inbox += data
                    _answer(conn)
            if conn.outbox or mask & select.EPOLLOUT:
                flush(fd, conn)
    for fd in list(conns):
        close(fd)
    listener.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
