"""The least a Python relay can do, as a baseline for the relay benchmarks.

It moves bytes and nothing else: no framing, no correlation ids, no repair, no timers, no
metrics. One thread is blocked in ``epoll.poll`` with the GIL released, as corrfix's engine
is; each ready socket is read with ``readv`` into one shared 1 MiB buffer, as corrfix's is,
at most four times a pass, and the bytes are written to its peer at once. A short write keeps
the rest for EPOLLOUT and stops reading the other side until it is sent, so one slow reader
stalls only its own connection. Measured in the same run as haproxy and corrfix, it shows
what a relay costs in this interpreter on this machine before any Kafka work: corrfix's
figure above it is its framing, its core and its engine's bookkeeping.

A floor, not a proxy: it pauses a side at the first short write where corrfix keeps reading
up to its send-buffer bound, it closes both sockets when either ends (no half-close, so a
client that half-closes loses its answers), and it receives into a ``bytearray`` where
corrfix uses an anonymous mapping. None of that moves the benchmark's figures.

    python bench/bare_relay.py --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import threading

RECEIVE = 1024 * 1024
READS_PER_PASS = 4


class _Side:
    """One socket of a relayed pair, and what it still owes its peer's socket."""

    __slots__ = ("backlog", "fd", "mask", "peer", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer: _Side | None = None
        self.backlog = b""  # bytes read from this side's peer, not yet written to this side
        self.mask = select.EPOLLIN


class BareRelay:
    """Every relayed pair, served by one thread; connections are adopted from another."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.epoll = select.epoll()
        self.sides: dict[int, _Side] = {}
        self.lock = threading.Lock()  # accept's registrations against the loop's
        self.buffer = bytearray(RECEIVE)
        self.view = memoryview(self.buffer)

    def adopt(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        one, other = _Side(client), _Side(upstream)
        one.peer, other.peer = other, one
        with self.lock:
            for side in (one, other):
                side.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                side.sock.setblocking(False)
                self.sides[side.fd] = side
                self.epoll.register(side.fd, side.mask)

    def serve_forever(self) -> None:
        """The loop thread: each ready socket's backlog written, then its bytes read and passed on."""
        buffers, view, size = [self.buffer], self.view, len(self.buffer)
        while True:
            ready = self.epoll.poll(-1, 1024)
            with self.lock:
                for fd, flags in ready:
                    side = self.sides.get(fd)
                    if side is None:
                        continue
                    if flags & select.EPOLLOUT and not self._flush(side):
                        continue
                    if not flags & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                        continue
                    if not side.mask & select.EPOLLIN:  # paused: its peer has a backlog
                        if flags & (select.EPOLLHUP | select.EPOLLERR):
                            self._close(side)
                        continue
                    peer = side.peer
                    assert peer is not None
                    for _ in range(READS_PER_PASS):
                        try:
                            received = os.readv(fd, buffers)
                        except BlockingIOError:
                            break
                        except OSError:
                            received = 0
                        if not received:
                            self._close(side)
                            break
                        if not self._send(peer, view[:received]):
                            break
                        if received < size:
                            break

    def _send(self, side: _Side, data: memoryview) -> bool:
        """Write to ``side``; keep what did not fit and pause its peer. Whether all went."""
        if side.backlog:  # defensive: the peer is paused while it is, so is not read
            side.backlog += bytes(data)
            return False
        try:
            sent = os.write(side.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(side)
            return False
        if sent == len(data):
            return True
        side.backlog = bytes(data[sent:])
        self._watch_pair(side)
        return False

    def _flush(self, side: _Side) -> bool:
        """Write the backlog on EPOLLOUT; once it is gone, read the peer again. Whether open."""
        try:
            sent = os.write(side.fd, side.backlog)
        except BlockingIOError:
            return True
        except OSError:
            self._close(side)
            return False
        side.backlog = side.backlog[sent:]
        if not side.backlog:
            self._watch_pair(side)
        return True

    def _watch_pair(self, side: _Side) -> None:
        """What epoll watches on both sockets of a pair, from both backlogs: a socket is read
        while its peer owes nothing, and written on EPOLLOUT while it owes something."""
        peer = side.peer
        assert peer is not None
        for each, other in ((side, peer), (peer, side)):
            mask = (0 if other.backlog else select.EPOLLIN) | (select.EPOLLOUT if each.backlog else 0)
            if mask != each.mask and each.fd in self.sides:
                each.mask = mask
                self.epoll.modify(each.fd, mask)

    def _close(self, side: _Side) -> None:
        """Close both sockets of the pair (no half-close: this is a floor, not a proxy)."""
        for each in (side, side.peer):
            if each is not None and self.sides.pop(each.fd, None) is not None:
                self.epoll.unregister(each.fd)
                each.sock.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, type=_address)
    parser.add_argument("--upstream", required=True, type=_address)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    relay = BareRelay(args.upstream)
    listener = socket.create_server(args.listen, backlog=1024)
    threading.Thread(target=relay.serve_forever, name="bare-relay", daemon=True).start()
    while True:
        client, _ = listener.accept()
        relay.adopt(client)


if __name__ == "__main__":
    main()
