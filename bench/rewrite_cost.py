"""What the KIP-951 check costs the relay: decoding Produce v10+ and Fetch v16+ answers.

Those answers may carry broker addresses (``NodeEndpoints``), so the relay decodes each one
with kafka-python (:func:`protocol.rewrite.decode_response_body`). This prints the decode
time per answer against copying the same body once, measured in the same run.

    python bench/rewrite_cost.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from protocol.rewrite import decode_response_body
from protocol.schemas import response_class

PRODUCE_VERSION = 11
FETCH_VERSION = 16
FETCH_PARTITIONS = 10
FETCH_RECORDS = 1 << 20


def produce_answer() -> bytes:
    """A one-partition Produce answer with no error, as most are."""
    cls = response_class(0)
    topic, part = cls.TopicProduceResponse, cls.TopicProduceResponse.PartitionProduceResponse
    v = PRODUCE_VERSION
    partition = part(version=v, index=0, error_code=0, base_offset=1234, log_start_offset=0)
    answer = cls(version=v, responses=[topic(version=v, name="orders", partition_responses=[partition])])
    return answer.encode(version=v)


def fetch_answer() -> bytes:
    """A Fetch answer of ten partitions, one holding ``FETCH_RECORDS`` bytes of records."""
    cls = response_class(1)
    topic, part = cls.FetchableTopicResponse, cls.FetchableTopicResponse.PartitionData
    v = FETCH_VERSION
    sizes = [FETCH_RECORDS] + [1000] * (FETCH_PARTITIONS - 1)
    partitions = [part(version=v, partition_index=i, records=b"x" * size) for i, size in enumerate(sizes)]
    return cls(version=v, responses=[topic(version=v, partitions=partitions)]).encode(version=v)


def per_call_us(call: Callable[[], object], seconds: float = 1.0) -> float:
    """Microseconds per call, over about ``seconds``."""
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    for name, key, version, body in (
        (f"Produce v{PRODUCE_VERSION}, 1 partition", 0, PRODUCE_VERSION, produce_answer()),
        (f"Fetch v{FETCH_VERSION}, {FETCH_PARTITIONS} partitions", 1, FETCH_VERSION, fetch_answer()),
    ):
        decode = per_call_us(lambda: decode_response_body(key, version, body))  # noqa: B023
        copy = per_call_us(lambda: bytearray(body))  # noqa: B023
        ratio = decode / copy
        print(f"{name}, {len(body):,} bytes: decode {decode:.1f} µs, {ratio:.1f}× one copy ({copy:.1f} µs)")


if __name__ == "__main__":
    main()
