"""What the KIP-951 check costs the relay: decoding Produce v10+ and Fetch v16+ answers.

Those answers may carry broker addresses (``NodeEndpoints``), so the relay passes each one
through :func:`protocol.rewrite.rewrite_response`: split, decode with kafka-python, look
for addresses. This times that path on answers with no addresses (the common case, passed
on unchanged) against copying the same frame twice (what a relay does with it at least:
into and out of its buffers), measured in the same run.

    python bench/rewrite_cost.py
"""

from __future__ import annotations

import timeit

from protocol import ApiKey, response_class, rewrite_response

PRODUCE_VERSION = 11
FETCH_VERSION = 16
FETCH_PARTITIONS = 10
FETCH_RECORDS = 1 << 20


def produce_answer() -> bytes:
    """A one-partition Produce answer with no error, as most are."""
    cls = response_class(ApiKey.PRODUCE)
    topic, part = cls.TopicProduceResponse, cls.TopicProduceResponse.PartitionProduceResponse
    v = PRODUCE_VERSION
    partition = part(version=v, index=0, error_code=0, base_offset=1234, log_start_offset=0)
    answer = cls(version=v, responses=[topic(version=v, name="orders", partition_responses=[partition])])
    return answer.encode(version=v)


def fetch_answer() -> bytes:
    """A Fetch answer of ten partitions, one holding ``FETCH_RECORDS`` bytes of records."""
    cls = response_class(ApiKey.FETCH)
    topic, part = cls.FetchableTopicResponse, cls.FetchableTopicResponse.PartitionData
    v = FETCH_VERSION
    sizes = [FETCH_RECORDS] + [1000] * (FETCH_PARTITIONS - 1)
    partitions = [part(version=v, partition_index=i, records=b"x" * size) for i, size in enumerate(sizes)]
    return cls(version=v, responses=[topic(version=v, partitions=partitions)]).encode(version=v)


def frame(body: bytes, correlation_id: int = 7) -> bytes:
    """A response frame: size prefix, correlation id, empty header tags (header v1), body."""
    rest = correlation_id.to_bytes(4, "big") + b"\x00" + body
    return len(rest).to_bytes(4, "big") + rest


def keep(node_id: int, host: str, port: int) -> tuple[str, int]:
    """An address mapper that changes nothing, so the answer is decoded, checked and passed on."""
    return host, port


def per_call_us(statement: str, names: dict[str, object]) -> float:
    """Microseconds per run of ``statement``: the best of five timeit rounds of about 0.2 s."""
    timer = timeit.Timer(statement, globals=names)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=5, number=number)) / number * 1e6


def main() -> None:
    for name, key, version, body in (
        (f"Produce v{PRODUCE_VERSION}, 1 partition", 0, PRODUCE_VERSION, produce_answer()),
        (f"Fetch v{FETCH_VERSION}, {FETCH_PARTITIONS} partitions", 1, FETCH_VERSION, fetch_answer()),
    ):
        names = {"rewrite_response": rewrite_response, "keep": keep, "frame": frame(body), "key": key}
        names["version"] = version
        check = per_call_us("rewrite_response(frame, key, version, keep)", names)
        copy = per_call_us("bytes(bytearray(frame))", names)
        print(
            f"{name}, {len(names['frame']):,} bytes: the KIP-951 check {check:.1f} µs per answer, "
            f"{check / copy:.1f}× copying the frame twice ({copy:.1f} µs)"
        )


if __name__ == "__main__":
    main()
