"""What the connection core costs per request over the bare repair machine, without sockets.

The relay before issue #14 fed frames to the ``RepairMachine`` itself; it now feeds bytes to
a ``ConnectionCore``, which owns the decoders and deadlines and hands back bytes, events and
flags. This drives both paths with the same batches of requests and answers, in one process,
interleaved, and reports CPU µs per request (``time.process_time``), medians of the rounds.

    python bench/core_overhead.py [--rounds 7] [--requests 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from corrfix.core import ConnectionConfig, ConnectionCore, RepairConfig, RepairMachine
from protocol import ApiKey, FrameDecoder
from protocol.testing import request_frame, response_frame


def frames(size: int, count: int, batch: int) -> tuple[list[bytes], list[bytes]]:
    """Request and answer byte chunks of ``batch`` frames each, bodies padded to ``size``."""
    pad = b"x" * max(size - 30, 0)
    requests, answers = [], []
    for start in range(0, count, batch):
        ids = range(start, min(start + batch, count))
        requests.append(b"".join(bytes(request_frame(ApiKey.METADATA, i, i)) + b"" for i in ids))
        answers.append(b"".join(_padded(response_frame(i, i), pad) for i in ids))
    return requests, answers


def _padded(frame: bytearray, pad: bytes) -> bytes:
    body = bytes(frame[4:]) + pad
    return len(body).to_bytes(4, "big") + body


def machine_path(requests: list[bytes], answers: list[bytes]) -> float:
    """The old relay's per-receive work: decode, machine, next deadline."""
    machine = RepairMachine(RepairConfig(), flow_events=False)
    client, upstream = FrameDecoder(), FrameDecoder()
    started = time.process_time()
    now = 0.0
    for chunk, answer in zip(requests, answers, strict=True):
        now += 0.001
        actions = machine.client_frames(client.feed(chunk), now)
        machine.next_deadline()
        actions = machine.upstream_frames(upstream.feed(answer), now)
        machine.next_deadline()
        del actions
    return time.process_time() - started


def core_path(requests: list[bytes], answers: list[bytes]) -> float:
    """The new relay's: feed the core, take bytes and events, see whether it decided
    anything new, read the deadline (as ``ProxyConnection._sync`` does)."""
    core = ConnectionCore(ConnectionConfig(), RepairMachine(RepairConfig(), flow_events=False), 0.0)
    decided = 0
    started = time.process_time()
    now = 0.0
    for chunk, answer in zip(requests, answers, strict=True):
        now += 0.001
        for feed, data in ((core.receive_client, chunk), (core.receive_upstream, answer)):
            feed(data, now)
            to_upstream, to_client, events = core.take()
            if to_upstream or to_client or events:
                pass
            if core.decided != decided:
                decided = core.decided
            core.next_deadline()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    print(f"{'case':>16}  {'machine µs/req':>15}  {'core µs/req':>12}  {'core − machine':>15}")
    for size, batch in ((100, 5), (100, 1), (16 * 1024, 1)):
        requests, answers = frames(size, args.requests, batch)
        old, new = [], []
        for _ in range(args.rounds):
            old.append(machine_path(requests, answers) / args.requests * 1e6)
            new.append(core_path(requests, answers) / args.requests * 1e6)
        o, n = statistics.median(old), statistics.median(new)
        print(f"{f'{size} B, batch {batch}':>16}  {o:>15.2f}  {n:>12.2f}  {n - o:>+15.2f}")


if __name__ == "__main__":
    main()
