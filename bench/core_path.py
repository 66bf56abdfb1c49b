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
``--capture`` records as ``corrfix proxy --capture-dir`` does: the core's frame events and the
machine's ids to a running ``CaptureWriter`` (into a temporary directory, removed after), each
receive as one engine pass; it also gives the process's CPU, which includes the writer thread.

    PYTHONPATH=<tree> python bench/core_path.py [--in-flight 5] [--requests 40000] [--rounds 7]
        [--core minimal] [--metrics] [--capture]

Run it from outside a checkout for an A/B, so that ``PYTHONPATH`` decides which tree is timed.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import structlog
from engine_floor import MinimalCore
from frames import CORRELATION_OFFSET, produce_frame

from corrfix.capture import CaptureWriter
from corrfix.core import Address, BrokerPorts, ClusterRouter, ConnectionConfig, ConnectionCore, RepairMachine
from corrfix.proxy import ProxyMetrics
from corrfix.proxy._observer import SerializedObserver
from corrfix.proxy._sinks import ConnectionSinks, ProxyStats

ANSWER_BODY = bytes(40)


def one_round(
    request: bytes,
    in_flight: int,
    requests: int,
    minimal: bool = False,
    metrics: bool = False,
    capture: Path | None = None,
) -> tuple[float, float]:
    """CPU µs per request for ``requests`` requests, ``in_flight`` per receive: this thread's,
    and the process's (with capture, the writer thread's too)."""
    router = ClusterRouter("127.0.0.1", BrokerPorts(), lambda node, port: 1, set)
    # A queue that holds every row: in this loop the writer thread gets the GIL seldom.
    queue_rows, queue_bytes = 4 * requests + 16, requests * (2 * len(request) + 2048) + (64 << 20)
    writer = (
        None
        if capture is None
        else CaptureWriter(capture, queue_rows=queue_rows, queue_bytes=queue_bytes).start()
    )
    observer = None if writer is None else SerializedObserver(writer)
    machine = RepairMachine(
        transform=router.transform,
        local_answer=router.local_answer,
        flow_events=observer is not None,
        answer_events=False,
    )
    sinks = None
    if metrics or observer is not None:
        log = structlog.get_logger()
        address = Address("127.0.0.1", 9092)
        counts = ProxyMetrics() if metrics else None
        sinks = ConnectionSinks("c1", log, ProxyStats(), address, counts, observer, machine)
    if observer is not None:
        observer.connection_opened("c1", "127.0.0.1:50000", "127.0.0.1:9092")
    core: ConnectionCore | MinimalCore = ConnectionCore(
        ConnectionConfig(), machine, 0.0, record_frames=observer is not None
    )
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
    started, started_process = time.thread_time(), time.process_time()
    for batch in range(requests // in_flight):
        if observer is not None:
            observer.begin_pass()
        if sinks is not None:
            sinks.received_from_client(len(chunk))
        core.receive_client(memoryview(chunk), now)
        to_upstream, to_client, events = core.take()
        if sinks is not None:
            sinks.output(to_upstream, to_client, events)
        if observer is not None:
            observer.end_pass()
            observer.begin_pass()
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
        if observer is not None:
            observer.end_pass()
        if len(to_client) != in_flight:
            raise SystemExit(
                f"{len(to_client)} answers reached the client, not {in_flight}: {core.close_reason}"
            )
        core.next_deadline()
        now += 0.0001
    spent = time.thread_time() - started
    if writer is not None:
        writer.close()  # what is still queued is written: the writer thread's share is counted
        rows = writer.stats.rows_written
        if rows != 2 + 4 * (requests // in_flight * in_flight):
            raise SystemExit(f"{rows} capture rows written, not open and close rows and four per request")
    spent_process = time.process_time() - started_process
    if sinks is not None and sinks.metrics is not None:
        counted = sum(sinks.metrics.tally().requests.values())
        if counted != requests // in_flight * in_flight:
            raise SystemExit(f"{counted} requests counted, not {requests}")
    return spent / requests * 1e6, spent_process / requests * 1e6


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
    parser.add_argument("--capture", action="store_true", help="record as --capture-dir does (real core)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if (args.metrics or args.capture) and args.core == "minimal":
        parser.error("--metrics and --capture take the real core's events and counts")
    request = produce_frame(args.size)
    minimal = args.core == "minimal"
    results = []
    for _ in range(args.rounds):
        directory = Path(tempfile.mkdtemp(prefix="core-path-")) if args.capture else None
        try:
            result = one_round(request, args.in_flight, args.requests, minimal, args.metrics, directory)
            results.append(result)
        finally:
            if directory is not None:
                shutil.rmtree(directory)
    rounds = sorted(thread for thread, _ in results)
    options = "".join(f", --{name}" for name in ("metrics", "capture") if getattr(args, name))
    line = (
        f"{args.core} core{options}, {args.size} B, {args.in_flight} in flight: best {rounds[0]:.3f}, "
        f"median {statistics.median(rounds):.3f} µs per request"
    )
    if args.capture:
        process = sorted(total for _, total in results)
        best, median = process[0], statistics.median(process)
        line += f"; the process, with the writer: best {best:.3f}, median {median:.3f}"
    print(line)


if __name__ == "__main__":
    main()
