"""The connection core's CPU per request as the engine feeds it, without sockets (issue #15).

At 100 B x 16 x 5 every receive carries five frames each way, so this feeds one
``ConnectionCore`` batches of ``--in-flight`` Produce v7 requests (the relay bench's frames),
echoes one answer per request (an upstream id, 40 bytes of body) in one chunk, and reads the
deadline after each pair, with the cluster router's transform and local answer in place and
no observer. Each batch's round trip varies a little: a constant one drives the probe timer's
variation into subnormal floats, whose arithmetic is slow. Every batch's answers are checked
to reach the client, so a broken feed cannot pass for a fast one. Thread CPU µs per request;
best and median of the rounds. ``--core minimal`` feeds engine_floor.py's minimal core
instead (framing, ids, the request kept; no repair), the same way, for the difference.
``--metrics`` counts as ``corrfix proxy --metrics`` does without capture: the connection's
sinks with a ``ProxyMetrics``, told of each receive and handed each batch, as the engine does.

    PYTHONPATH=<tree> python bench/core_path.py [--in-flight 5] [--requests 40000] [--rounds 7]
        [--core minimal] [--metrics]

Run it from outside a checkout for an A/B, so that ``PYTHONPATH`` decides which tree is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import structlog
from engine_floor import MinimalCore
from frames import CORRELATION_OFFSET, produce_frame

from corrfix.core import Address, BrokerPorts, ClusterRouter, ConnectionConfig, ConnectionCore, RepairMachine
from corrfix.proxy import ProxyMetrics
from corrfix.proxy._sinks import ConnectionSinks, ProxyStats

ANSWER_BODY = bytes(40)


def one_round(
    request: bytes, in_flight: int, requests: int, minimal: bool = False, metrics: bool = False
) -> float:
    """CPU µs per request for ``requests`` requests, ``in_flight`` per receive."""
    router = ClusterRouter("127.0.0.1", BrokerPorts(), lambda node, port: 1, set)
    machine = RepairMachine(
        transform=router.transform, local_answer=router.local_answer, flow_events=False, answer_events=False
    )
    sinks = None
    if metrics:
        log = structlog.get_logger()
        address = Address("127.0.0.1", 9092)
        sinks = ConnectionSinks("c1", log, ProxyStats(), address, ProxyMetrics(), None, machine)
    core: ConnectionCore | MinimalCore = ConnectionCore(ConnectionConfig(), machine, 0.0)
    if minimal:
        core = MinimalCore(core)
    chunk = bytearray()
    for i in range(in_flight):
        frame = bytearray(request)
        frame[CORRELATION_OFFSET : CORRELATION_OFFSET + 4] = i.to_bytes(4, "big")
        chunk += frame
    answer_size = 8 + len(ANSWER_BODY)
    answer = (4 + len(ANSWER_BODY)).to_bytes(4, "big") + bytes(4) + ANSWER_BODY
    answers = bytearray(answer * in_flight)
    now = 1.0
    started = time.thread_time()
    for batch in range(requests // in_flight):
        if sinks is not None:
            sinks.received_from_client(len(chunk))
        core.receive_client(memoryview(chunk), now)
        to_upstream, to_client, events = core.take()
        if sinks is not None:
            sinks.output(to_upstream, to_client, events)
        pos = 4
        for frame in to_upstream:  # the broker answers each upstream id
            answers[pos : pos + 4] = frame[CORRELATION_OFFSET : CORRELATION_OFFSET + 4]
            pos += answer_size
        if sinks is not None:
            sinks.received_from_upstream(len(answers))
        core.receive_upstream(memoryview(answers), now + 0.0003 + (batch % 7) * 0.00001)
        to_upstream, to_client, events = core.take()
        if sinks is not None:
            sinks.output(to_upstream, to_client, events)
        if len(to_client) != in_flight:
            raise SystemExit(
                f"{len(to_client)} answers reached the client, not {in_flight}: {core.close_reason}"
            )
        core.next_deadline()
        now += 0.0001
    spent = time.thread_time() - started
    if sinks is not None and sinks.metrics is not None:
        counted = sum(sinks.metrics.tally().requests.values())
        if counted != requests // in_flight * in_flight:
            raise SystemExit(f"{counted} requests counted, not {requests}")
    return spent / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=100, help="request frame bytes")
    parser.add_argument("--core", choices=("real", "minimal"), default="real")
    parser.add_argument("--metrics", action="store_true", help="count as --metrics does (real core only)")
    args = parser.parse_args()
    if args.metrics and args.core == "minimal":
        parser.error("--metrics counts through the real core's machine")
    request = produce_frame(args.size)
    minimal = args.core == "minimal"
    rounds = sorted(
        one_round(request, args.in_flight, args.requests, minimal, args.metrics) for _ in range(args.rounds)
    )
    counted = ", --metrics" if args.metrics else ""
    print(
        f"{args.core} core{counted}, {args.size} B, {args.in_flight} in flight: best {rounds[0]:.3f}, "
        f"median {statistics.median(rounds):.3f} µs per request"
    )


if __name__ == "__main__":
    main()
