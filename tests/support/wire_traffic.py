"""Real client traffic on the wire, for the pcap import tests: tcpdump around real clients and Tansu.

One recording holds kafka-python at its newest versions, confluent-kafka (librdkafka), and
kafka-python pinned to ``api_version=(0, 10)``, which speaks the 0.10-era versions
(Metadata v1, Fetch v2, ListOffsets v0, Produce v2). Tansu refuses some of the old ones
(it closes the connection on a magic v1 batch, and answers ListOffsets v0 in a way
kafka-python cannot read), so those clients fail; their requests are on the wire all the
same, which is what the import tests need. Every client is bounded in time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from corrfix.capture.pcap import TcpSegment, read_segments
from corrfix.lab import TansuBroker, workload
from tests.support.tcpdump import tcpdump
from tests.support.wire_damage import import_segments, merge, true_frames, write_pcap

OLD_API_VERSION = (0, 10)
_OLD_TIMEOUT = 3.0


def record_client_traffic(pcap: Path, broker: TansuBroker, n: int = 40) -> Path:
    """Record ``n`` values produced and consumed by each client into ``pcap``."""
    with tcpdump(pcap, broker.port):
        workload.create_topic(broker.bootstrap, "wire-modern", partitions=2)
        produced = workload.produce_kafka_python(broker.bootstrap, "wire-modern", n, acks=1)
        assert produced.ok, produced
        consumed = workload.consume_all(broker.bootstrap, "wire-modern", n, client="kafka-python", timeout=20)
        assert sorted(consumed) == workload.expected_values(n)
        workload.create_topic_confluent(broker.bootstrap, "wire-librdkafka")
        produced = workload.produce_confluent(broker.bootstrap, "wire-librdkafka", n, acks="all")
        assert produced.ok, produced
        consumed = workload.consume_all(broker.bootstrap, "wire-librdkafka", n, timeout=20)
        assert sorted(consumed) == workload.expected_values(n)
        _old_clients(broker)
    return pcap


def _old_clients(broker: TansuBroker) -> None:
    """kafka-python at 0.10-era versions: a consumer of the modern topic, then a producer."""
    with contextlib.suppress(Exception):  # Tansu's answers to old versions break this client
        workload.consume_all(
            broker.bootstrap,
            "wire-modern",
            1,
            client="kafka-python",
            timeout=_OLD_TIMEOUT,
            settle=0.2,
            config={"api_version": OLD_API_VERSION},
        )
    timeout_ms = int(_OLD_TIMEOUT * 1000)
    workload.produce_kafka_python(
        broker.bootstrap,
        "wire-modern",
        3,
        acks=1,
        timeout=_OLD_TIMEOUT,
        config={
            "api_version": OLD_API_VERSION,
            "linger_ms": 0,
            "retries": 0,
            "request_timeout_ms": timeout_ms // 3,
            "delivery_timeout_ms": timeout_ms // 2,
        },
    )


@dataclass(frozen=True)
class Recording:
    """A clean recording, its segments, and the truth its import gives (per client port and direction)."""

    pcap: Path
    ports: tuple[int, ...]
    segments: list[TcpSegment]
    truth: dict[tuple[int, str], list[bytes]]
    rows: list[dict]


def recording(pcap: Path, ports: Collection[int]) -> Recording:
    """Read a clean recording and take its import as the truth the damaged imports are checked against."""
    segments = list(read_segments(pcap))
    rows = import_segments(segments, ports)
    return Recording(pcap, tuple(ports), segments, true_frames(rows, ports), rows)


def record_two_brokers(directory: Path, first: TansuBroker, second: TansuBroker) -> Path:
    """Client traffic to two brokers, recorded apart, merged into one pcap in time order."""
    a = record_client_traffic(directory / "first.pcap", first)
    b = directory / "second.pcap"
    with tcpdump(b, second.port):
        workload.create_topic(second.bootstrap, "second")
        assert workload.produce_kafka_python(second.bootstrap, "second", 20, acks=1).ok
        assert len(workload.consume_all(second.bootstrap, "second", 20, client="kafka-python")) == 20
    merged = merge([list(read_segments(a)), list(read_segments(b))], (first.port, second.port))
    return write_pcap(directory / "merged.pcap", merged)
