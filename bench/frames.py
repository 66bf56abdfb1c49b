"""The request frames the relay benchmarks send: real Produce v7 requests with acks=1.

Produce v7 is a tracked request on corrfix's zero-decode path: corrfix reads its header
and ``acks`` by hand, patches the correlation id and never decodes the body, and its
answers (below v10) carry no broker addresses to rewrite. kafka-python builds the frame,
so the header and the fields before the records are exactly what a producer sends.
"""

from __future__ import annotations

from kafka.protocol.producer import ProduceRequest

from protocol import SIZE_PREFIX, ApiKey, parse_request_header, produce_acks
from protocol.testing import encode_request

PRODUCE_VERSION = 7
CORRELATION_OFFSET = SIZE_PREFIX + 4
"""Where the request correlation id sits in a frame (after size, api key and version)."""


def produce_request(records: bytes, client_id: str = "bench") -> bytes:
    """A framed Produce v7 (acks=1) request to partition 0 of topic ``bench``."""
    request = ProduceRequest[PRODUCE_VERSION](
        transactional_id=None,
        acks=1,
        timeout_ms=30_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="bench",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
                ],
            )
        ],
    )
    return encode_request(request, correlation_id=0, client_id=client_id)


def produce_frame(size: int, client_id: str = "bench") -> bytes:
    """A framed Produce v7 (acks=1) request of exactly ``size`` bytes, size prefix included."""

    def build(records: int) -> bytes:
        return produce_request(b"x" * records, client_id)

    overhead = len(build(0))
    if size < overhead:
        raise ValueError(f"a Produce frame needs at least {overhead} bytes, asked for {size}")
    data = build(size - overhead)
    assert len(data) == size, (len(data), size)
    header = parse_request_header(bytearray(data))
    assert header.api_key == ApiKey.PRODUCE and produce_acks(bytearray(data), header) == 1
    return data
