"""A real wire capture: tcpdump on loopback while kafka-python produces to and consumes from Tansu."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from kafka.record import MemoryRecords

from corrfix.capture import read_capture
from corrfix.capture.pcap import import_pcap
from corrfix.lab import workload
from protocol import ApiKey, parse_request_header, request_class
from tests.support.tcpdump import marker_connections, packets_dropped, tcpdump

N = 300


def produced_values(rows: list[dict]) -> list[bytes]:
    """Record values inside every captured Produce request."""
    values = []
    for row in rows:
        if row["kind"] != "frame" or row["direction"] != "request" or row["api_key"] != ApiKey.PRODUCE:
            continue
        frame = row["frame"]
        header = parse_request_header(frame)
        body = request_class(ApiKey.PRODUCE).decode(frame[header.body_offset :], version=header.api_version)
        for topic in body.topic_data:
            for partition in topic.partition_data:
                records = MemoryRecords(bytes(partition.records))
                while (batch := records.next_batch()) is not None:
                    values += [record.value for record in batch]
    return values


@pytest.mark.parametrize("interface", ["lo", "any"])  # Ethernet, and Linux cooked v2
def test_tcpdump_capture_of_kafka_python_and_tansu(tmp_path: Path, tansu, interface):
    pcap = tmp_path / "wire.pcap"
    with tcpdump(pcap, tansu.port, interface):
        workload.create_topic(tansu.bootstrap, "wire")
        result = workload.produce_kafka_python(tansu.bootstrap, "wire", N, acks=1)
        consumed = workload.consume_all(tansu.bootstrap, "wire", N, client="kafka-python")
    assert result.ok and sorted(consumed) == workload.expected_values(N)

    report = pcap.with_suffix(".log").read_text()
    assert "packets dropped by kernel" in report and packets_dropped(report) == 0
    stats = import_pcap(pcap, tmp_path / "capture", [tansu.port])
    everything = read_capture(tmp_path / "capture").to_pylist()
    markers = marker_connections(everything)
    assert len(markers) == 2
    rows = [r for r in everything if r["connection_id"] not in markers]  # the markers end the capture

    assert stats.connections >= 5  # admin, producer, consumer, bootstrap connections, the markers
    assert {r["reason"] for r in rows if r["kind"] == "open"} == {"syn"}
    assert {r["reason"] for r in rows if r["kind"] == "close"} == {"fin"}
    frames = [r for r in rows if r["kind"] == "frame"]
    assert all(r["reason"] is None and r["frame_length"] == len(r["frame"]) for r in frames)
    # Every request was answered on its own connection, with the request's api key and version.
    by_connection: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in frames:
        by_connection[row["connection_id"]][(row["direction"], row["api_key"], row["api_version"])] += 1
    for counts in by_connection.values():
        requests = {k[1:]: v for k, v in counts.items() if k[0] == "request"}
        responses = {k[1:]: v for k, v in counts.items() if k[0] == "response"}
        assert requests == responses
    api_keys = {r["api_key"] for r in frames}
    assert {0, 1, 3, 18, 19} <= api_keys  # Produce, Fetch, Metadata, ApiVersions, CreateTopics
    assert sorted(produced_values(rows)) == workload.expected_values(N)
    assert {r["client_address"].rsplit(":", 1)[0] for r in rows if r["kind"] == "open"} == {"127.0.0.1"}


def test_packets_tcpdump_reports_dropped_are_counted():
    """A capture taken as the truth must be whole; tcpdump says otherwise only in its closing report."""
    report = (
        "tcpdump: listening on lo, link-type EN10MB (Ethernet), snapshot length 262144 bytes\n"
        "1204 packets captured\n1210 packets received by filter\n"
        "5 packets dropped by kernel\n1 packet dropped by interface\n"
    )
    assert packets_dropped(report) == 6
    assert packets_dropped(report.replace("5 packets", "0 packets").replace("1 packet ", "0 packets ")) == 0
