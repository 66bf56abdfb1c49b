"""The closed-loop load generator of the relay benchmarks: N connections, W requests in flight.

One epoll loop in the calling process. Every response is exactly as long as its request
(the echo broker's contract), so completed answers are counted from received bytes
without parsing frames; the first answer of every receive that starts on a frame boundary
has its correlation id checked. New requests for a receive's completed answers go out in
one ``sendmsg`` whose buffers share the request body, so the generator never copies a
1 MiB frame. Only answers inside the measuring window count.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from frames import CORRELATION_OFFSET

RECEIVE = 1024 * 1024
IOV_MAX = 512


class LoadError(RuntimeError):
    """A connection broke or an answer carried the wrong correlation id."""


@dataclass
class LoadResult:
    requests: int
    seconds: float
    frame_size: int
    latencies: list[float] = field(repr=False)

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        """Request bytes per second (the answers move as many bytes the other way)."""
        return self.requests * self.frame_size / self.seconds / 1e6


class _Client:
    __slots__ = ("next_id", "outq", "received", "sent_at", "sock", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.next_id = 0
        self.sent_at: deque[float] = deque()
        self.outq: list[memoryview] = []
        self.received = 0
        self.writing = False


def run_load(
    address: tuple[str, int],
    request: bytes,
    connections: int,
    in_flight: int,
    seconds: float,
    warmup: float,
    on_window: Callable[[str], None] | None = None,
) -> LoadResult:
    """Drive ``connections`` × ``in_flight`` copies of ``request`` through ``address``.

    ``on_window("start")`` and ``on_window("end")`` bracket the measuring window, so the
    caller can sample the proxy's CPU over exactly that span.
    """
    size = len(request)
    body = memoryview(request)[CORRELATION_OFFSET + 4 :]
    head = request[:CORRELATION_OFFSET]
    epoll = select.epoll()
    clients: dict[int, _Client] = {}
    try:
        for _ in range(connections):
            sock = socket.create_connection(address, timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            clients[sock.fileno()] = _Client(sock)
            epoll.register(sock.fileno(), select.EPOLLIN)
        buffer = bytearray(RECEIVE)
        view = memoryview(buffer)
        latencies: list[float] = []
        counted = 0
        start = time.perf_counter()
        window_start = start + warmup
        window_end = window_start + seconds
        in_window = False

        def queue(client: _Client, count: int, now: float) -> None:
            outq = client.outq
            for _ in range(count):
                cid = client.next_id
                client.next_id = cid + 1 if cid < 2**31 - 1 else 0
                outq.append(memoryview(head + cid.to_bytes(4, "big")))
                outq.append(body)
                client.sent_at.append(now)
            flush(client)

        def flush(client: _Client) -> None:
            outq = client.outq
            while outq:
                try:
                    sent = client.sock.sendmsg(outq[:IOV_MAX])
                except BlockingIOError:
                    break
                whole = 0
                for buf in outq:
                    if sent < len(buf):
                        break
                    sent -= len(buf)
                    whole += 1
                del outq[:whole]
                if sent:
                    outq[0] = outq[0][sent:]
            want = bool(outq)
            if want != client.writing:
                client.writing = want
                epoll.modify(client.sock.fileno(), select.EPOLLIN | (select.EPOLLOUT if want else 0))

        now = time.perf_counter()
        for client in clients.values():
            queue(client, in_flight, now)
        while True:
            now = time.perf_counter()
            if not in_window and now >= window_start:
                in_window = True
                if on_window:
                    on_window("start")
                window_start = time.perf_counter()
                window_end = window_start + seconds
            if now >= window_end:
                if on_window:
                    on_window("end")
                break
            for fd, mask in epoll.poll(0.5):
                client = clients[fd]
                if mask & select.EPOLLOUT:
                    flush(client)
                if not mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    continue
                try:
                    n = client.sock.recv_into(buffer, RECEIVE)
                except BlockingIOError:
                    continue
                if n == 0:
                    raise LoadError("the relay closed a connection")
                before = client.received
                if before % size == 0 and n >= 8:
                    expect = (client.next_id - len(client.sent_at)) & 0x7FFFFFFF
                    got = int.from_bytes(view[4:8], "big")
                    if got != expect:
                        raise LoadError(f"answer with correlation id {got}, expected {expect}")
                client.received = before + n
                done = (before + n) // size - before // size
                if not done:
                    continue
                now = time.perf_counter()
                sent_at = client.sent_at
                if in_window and now < window_end:
                    counted += done
                    for _ in range(done):
                        latencies.append(now - sent_at.popleft())
                else:
                    for _ in range(done):
                        sent_at.popleft()
                queue(client, done, now)
        elapsed = time.perf_counter() - window_start
        return LoadResult(counted, elapsed, size, latencies)
    finally:
        for client in clients.values():
            client.sock.close()
        epoll.close()
