"""A large capture made by corrfix's own capture writer, without running a proxy.

The writer is fed exactly as the relay feeds it (client requests, the same requests
upstream with new ids, the answers upstream, then to the client), so the files are what a
proxy would have written. The traffic is Produce v7 (acks=1) with a real record batch and
answers whose base offsets advance, on several connections. The writer's queue is
flushed as the feed goes, so no row is dropped.
"""

from __future__ import annotations

import struct
from pathlib import Path

from frames import PRODUCE_VERSION as VERSION
from frames import produce_request
from kafka.protocol.producer import ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from corrfix.capture import CaptureWriter
from corrfix.core import HEADER_COPY, Forwarded, Received, Sent
from protocol import ApiKey
from protocol.testing import encode_response

OFFSET_SENTINEL = 0x0123456789ABCDEF
BATCH = 16
"""Requests relayed per receive, as a pipelining client produces them."""


def _templates() -> tuple[bytes, bytes, int]:
    """A Produce request, its answer, and where the answer's base offset sits."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=1_700_000_000_000, key=None, value=b"v" * 40, headers=[])
    builder.close()
    records = builder.buffer()
    request = produce_request(records, client_id="bench-producer")
    R = ProduceResponse
    response = encode_response(
        R[VERSION](
            responses=[
                R.TopicProduceResponse(
                    name="bench",
                    partition_responses=[
                        R.TopicProduceResponse.PartitionProduceResponse(
                            index=0,
                            error_code=0,
                            base_offset=OFFSET_SENTINEL,
                            log_append_time_ms=-1,
                            log_start_offset=0,
                        )
                    ],
                )
            ],
            throttle_time_ms=0,
        ),
        correlation_id=0,
    )
    offset_at = response.index(OFFSET_SENTINEL.to_bytes(8, "big"))
    return request, response, offset_at


def write_capture(directory: Path, frames: int, connections: int = 8) -> int:
    """Write at least ``frames`` frame rows (4 per request) into ``directory``; returns the count."""
    request, response, offset_at = _templates()
    pairs = -(-frames // 4)
    per_connection = -(-pairs // connections)
    pack = struct.Struct(">i").pack_into
    pack_offset = struct.Struct(">q").pack_into
    written = 0
    with CaptureWriter(directory, queue_rows=1_000_000, queue_bytes=1 << 30) as writer:
        for number in range(connections):
            conn = f"c{number + 1}"
            writer.connection_opened(conn, f"127.0.0.1:{40000 + number}", "127.0.0.1:9092")
            for start in range(0, per_connection, BATCH):
                count = min(BATCH, per_connection - start)
                client_req, upstream_req, upstream_resp, client_resp = [], [], [], []
                for i in range(start, start + count):
                    for frames_, cid in ((client_req, i), (upstream_req, i + 1000)):
                        frame = bytearray(request)
                        pack(frame, 8, cid)
                        frames_.append(frame)
                    for frames_, cid in ((upstream_resp, i + 1000), (client_resp, i)):
                        frame = bytearray(response)
                        pack(frame, 4, cid)
                        pack_offset(frame, offset_at, i)
                        frames_.append(frame)
                forwarded = [
                    Forwarded(i, i + 1000, ApiKey.PRODUCE, VERSION) for i in range(start, start + count)
                ]
                writer.events(
                    conn,
                    [
                        *forwarded,
                        Received("client", [bytes(f[:HEADER_COPY]) for f in client_req], client_req),
                        Sent("upstream", upstream_req),
                        Received("upstream", [bytes(f[:HEADER_COPY]) for f in upstream_resp], upstream_resp),
                        Sent("client", client_resp),
                    ],
                )
                written += 4 * count
                if start % 8192 == 0:
                    writer.flush()
            writer.connection_closed(conn, "client closed")
        writer.flush()
        lost = writer.stats.rows_lost
    if lost:
        raise RuntimeError(f"the capture writer dropped {lost} rows")
    return written
