"""A connection corrfix gives up on ends the broker's stream as every close does.

The give-up (an answer proven lost with ``max_requeues`` 0) comes while corrfix still holds
requests for a broker that has stopped reading: acks=0 Produces the client sent after the
request given up. Each request read must still reach the broker, followed by a clean end
of stream: not a truncated frame, not a reset. The broker reads again only once the client
has seen its end of stream and closed, and every task is blocked: a proxy that closes both
sockets once the client's side is done has done so by then (the engine is a trio task under
the MockClock, so ``wait_all_tasks_blocked`` covers it too).
"""

from __future__ import annotations

import socket

import trio
import trio.testing

from corrfix.core import Address, RepairConfig
from corrfix.proxy import Proxy, ProxyConfig
from protocol import ApiKey, FrameDecoder
from protocol.testing import request_frame, response_frame

BIG = 1024 * 1024
"""Bytes of each Produce after the first: the broker's tiny receive buffer and the proxy's
send buffer cannot hold eight of them, so the proxy keeps a backlog of its own."""


def padded_acks0_produce(correlation_id: int, size: int) -> bytearray:
    """An acks=0 Produce grown to ``size`` bytes after its size prefix."""
    frame = request_frame(ApiKey.PRODUCE, correlation_id, correlation_id, acks=0)
    frame += bytes(size - len(frame) + 4)
    frame[:4] = (len(frame) - 4).to_bytes(4, "big")
    return frame


class StallingBroker:
    """Reads the first two requests, answers the second (an acks=0 Produce: its reply proves
    the first one's answer lost) when told, then reads nothing until told again, then reads
    to the end of stream and closes."""

    def __init__(self) -> None:
        self.answer = trio.Event()
        self.read_on = trio.Event()
        self.done = trio.Event()
        self.frames: list[bytearray] = []
        self.truncated = 0
        self.ending = ""

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.socket.socket()
        with listener:
            # Before listen(): the accepted socket inherits it, and its window stays small.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await listener.bind(("127.0.0.1", 0))
            listener.listen()
            task_status.started(listener.getsockname()[1])
            sock, _ = await listener.accept()
        with sock:
            first = [await self._frame(sock), await self._frame(sock)]
            await self.answer.wait()
            await sock.send(response_frame(int.from_bytes(first[1][8:12], "big"), 0))
            await self.read_on.wait()
            decoder = FrameDecoder(max_frame_size=2 * BIG)
            self.frames = first
            try:
                while data := await sock.recv(65536):
                    self.frames += decoder.feed(data)
                self.ending = "end of stream"
            except ConnectionResetError:
                self.ending = "reset"
            self.truncated = decoder.buffered
        self.done.set()

    @staticmethod
    async def _frame(sock: trio.socket.SocketType) -> bytearray:
        """One whole frame, and not a byte more."""
        frame = bytearray()
        need = 4
        while need:
            chunk = await sock.recv(need)
            assert chunk, "the proxy closed early"
            frame += chunk
            need -= len(chunk)
            if not need and len(frame) == 4:
                need = int.from_bytes(frame, "big")
        return frame


async def test_after_a_give_up_every_request_read_reaches_the_broker_then_a_clean_end_of_stream(
    mock_clock, engine
):
    mock_clock.rate = 1.0  # real time flows, so that fail_after bounds the test
    broker = StallingBroker()
    frames = [request_frame(ApiKey.LIST_OFFSETS, 1, 1), request_frame(ApiKey.PRODUCE, 2, 2, acks=0)]
    frames += [padded_acks0_produce(3 + i, BIG) for i in range(8)]
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        config = ProxyConfig(
            Address("127.0.0.1", 0),
            Address("127.0.0.1", broker_port),
            repair=RepairConfig(probe_after=1000.0, request_deadline=1000.0, max_requeues=0),
            max_send_buffer=64 * BIG,  # every request is read: none is left in the client's socket
            engine=engine,
        )
        port = (await nursery.start(Proxy(config).serve))[0].port
        with trio.fail_after(20):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(b"".join(frames))
            await trio.testing.wait_all_tasks_blocked()  # the proxy has read them all
            broker.answer.set()  # the proxy gives up on the ListOffsets
            assert await client.receive_some(65536) == b""  # nothing owed: the end of stream
            await client.aclose()
            await trio.testing.wait_all_tasks_blocked()
            broker.read_on.set()
            await broker.done.wait()
        nursery.cancel_scope.cancel()
    assert broker.ending == "end of stream"
    assert broker.truncated == 0
    assert [bytes(f[12:]) for f in broker.frames] == [bytes(f[12:]) for f in frames]
