"""A scripted in-process broker for what Tansu cannot do: echo load and injected faults.

Every request is answered in order with its correlation id, except where the script says
otherwise. ApiVersions gets a real kafka-python-encoded answer (the proxy's probes use it);
any other request is answered with its own body echoed back, so a test can tell answers
apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from kafka.protocol.metadata import ApiVersionsResponse

from protocol import ApiKey, FrameDecoder, parse_request_header
from protocol.testing import encode_response

# "answer", "lose", "duplicate", "close", or "garbage" (an impossible size prefix instead of
# the answer, after the answers before it in the same write).
Script = Callable[[int, int], str]


def _always_answer(_index: int, _api_key: int) -> str:
    return "answer"


def api_versions_answer(correlation_id: int, version: int = 0) -> bytes:
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=k, min_version=0, max_version=v) for k, v in ((0, 9), (3, 9))
    ]
    return encode_response(ApiVersionsResponse[version](error_code=0, api_keys=keys), correlation_id)


def echo_answer(frame: bytes | bytearray, body_offset: int) -> bytes:
    payload = bytes(frame[8:12]) + bytes(frame[body_offset:])
    return len(payload).to_bytes(4, "big") + payload


@dataclass
class FakeBroker:
    script: Script = _always_answer
    requests: list[tuple[int, int]] = field(default_factory=list)  # (api key, correlation id)
    connections: int = 0
    ended: int = 0  # connections the broker has seen end (its side then closes)
    port: int = 0

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            await self._answer(stream)
        finally:
            self.ended += 1

    async def _answer(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        index = 0
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                out = bytearray()
                for frame in decoder.feed(data):
                    header = parse_request_header(frame)
                    self.requests.append((header.api_key, header.correlation_id))
                    action = self.script(index, header.api_key)
                    index += 1
                    if action == "close":
                        await stream.send_all(out)
                        return
                    if action == "lose":
                        continue
                    if action == "garbage":
                        out += b"\xff\xff\xff\xff"
                        continue
                    if header.api_key == ApiKey.API_VERSIONS:
                        answer = api_versions_answer(header.correlation_id, header.api_version)
                    else:
                        assert header.body_offset is not None
                        answer = echo_answer(frame, header.body_offset)
                    out += answer
                    if action == "duplicate":
                        out += answer
                if out:
                    try:
                        await stream.send_all(out)
                    except trio.BrokenResourceError:
                        return


def answers(frames: list[bytearray]) -> list[tuple[int, int]]:
    """(client correlation id, token) of each echoed answer."""
    return [(int.from_bytes(f[4:8], "big", signed=True), int.from_bytes(f[-8:], "big")) for f in frames]


async def read_frames(stream: trio.abc.Stream, count: int) -> list[bytearray]:
    """Up to ``count`` frames; fewer if the proxy closes (or resets) the connection first."""
    decoder = FrameDecoder()
    frames: list[bytearray] = []
    while len(frames) < count:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            break
        if not data:
            break
        frames.extend(decoder.feed(data))
    return frames
