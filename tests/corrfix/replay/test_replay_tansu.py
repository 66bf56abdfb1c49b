"""A tcpdump capture of kafka-python producing to Tansu, imported and replayed into a fresh Tansu.

The session includes the admin client's CreateTopics, so the fresh broker gets the topic
from the replay itself; causal order makes it exist before the first Produce arrives.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio
from kafka.record import MemoryRecords

from corrfix.capture.pcap import import_pcap
from corrfix.core import Address
from corrfix.lab import workload
from corrfix.proxy import Proxy, ProxyConfig
from corrfix.replay import ReplayConfig, build_report, load_plan, render_text, replay
from corrfix.replay._topic_ids import response_message
from protocol import ApiKey
from tests.support.tcpdump import require_tcpdump, tcpdump

N = 500


@pytest.fixture
def tcpdump_installed() -> None:
    require_tcpdump()


@pytest.mark.parametrize(
    ("through_corrfix", "speed"),
    [(False, None), (False, 1.0), (True, None)],
    ids=["direct-as-fast-as-possible", "direct-captured-timing", "corrfix-as-fast-as-possible"],
)
async def test_replayed_produce_session_rebuilds_the_topic_on_a_fresh_broker(
    tmp_path: Path, tansu_factory, tcpdump_installed, through_corrfix, speed
):
    original = tansu_factory()
    pcap = tmp_path / "wire.pcap"

    def produce_session() -> workload.ProduceResult:
        workload.create_topic(original.bootstrap, "replayed", partitions=2)
        return workload.produce_kafka_python(original.bootstrap, "replayed", N, acks=1)

    # tcpdump starts and stops in this thread (briefly blocking it), so a skip keeps its reason.
    with tcpdump(pcap, original.port):
        result = await trio.to_thread.run_sync(produce_session)
    assert result.ok
    import_pcap(pcap, tmp_path / "capture", [original.port])

    fresh = tansu_factory()
    plan = load_plan(tmp_path / "capture")
    async with trio.open_nursery() as nursery:
        target = fresh.port
        if through_corrfix:
            proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", fresh.port)))
            [bound, *_] = await nursery.start(proxy.serve)
            target = bound.port
        with trio.fail_after(60):
            outcome = await replay(plan, ReplayConfig("127.0.0.1", target, speed=speed, response_timeout=10))
        nursery.cancel_scope.cancel()
    report = build_report(outcome)
    lost = (report["missing_responses"], report["not_sent"], report["skipped_truncated"])
    assert lost == (0, 0, 0), report["differences"]
    assert report["error_differences"] == 0, report["differences"]
    assert report["answered"] == report["requests"] > 0
    assert any(row["api"] == "CreateTopics" and row["answered"] == 1 for row in report["by_api"])

    values = await trio.to_thread.run_sync(
        functools.partial(workload.consume_all, fresh.bootstrap, "replayed", N, timeout=30)
    )
    assert sorted(values) == workload.expected_values(N)


def fetched_values(outcomes) -> list[bytes]:
    """Record values in the Fetch answers of a replay (or of a capture's answers)."""
    values = []
    for outcome in outcomes:
        request = outcome.request
        if request.api_key != ApiKey.FETCH or outcome.response is None:
            continue
        message = response_message(outcome.response, ApiKey.FETCH, request.api_version)
        for topic in message.responses:
            for partition in topic.partitions:
                records = MemoryRecords(bytes(partition.records or b""))
                while (batch := records.next_batch()) is not None:
                    values += [record.value for record in batch]
    return values


async def test_replayed_produce_and_consume_session_fetches_the_same_values_by_topic_id(
    tmp_path: Path, tansu_factory, tcpdump_installed
):
    """librdkafka fetches by topic id (Fetch v13+), and a fresh broker gives the topic a new
    id: the replay learns both and rewrites every Fetch, so the consumer's half of the
    session reads back exactly the values the producer's half wrote."""
    original = tansu_factory()
    pcap = tmp_path / "wire.pcap"
    n = 200

    def session() -> list[bytes]:
        workload.create_topic_confluent(original.bootstrap, "by-id", partitions=2)
        assert workload.produce_confluent(original.bootstrap, "by-id", n, acks="all").ok
        return workload.consume_all(original.bootstrap, "by-id", n, timeout=30)

    with tcpdump(pcap, original.port):
        consumed = await trio.to_thread.run_sync(session)
    assert sorted(consumed) == workload.expected_values(n)
    import_pcap(pcap, tmp_path / "capture", [original.port])
    plan = load_plan(tmp_path / "capture")
    fetches = [r for r in plan.requests if r.api_key == ApiKey.FETCH]
    assert fetches and all(r.api_version is not None and r.api_version >= 13 for r in fetches)

    fresh = tansu_factory()
    with trio.fail_after(90):
        result = await replay(plan, ReplayConfig("127.0.0.1", fresh.port, speed=None, response_timeout=10))
    report = build_report(result)
    assert (report["missing_responses"], report["not_sent"]) == (0, 0), report["differences"]
    assert report["error_differences"] == 0, report["differences"]
    [remapped] = report["topic_ids"]["remapped"]
    assert remapped["topic"] == "by-id" and remapped["capture_id"] != remapped["target_id"]
    assert remapped["requests"] >= len(fetches)
    assert report["topic_ids"]["missing_on_target"] == []
    assert sorted(fetched_values(result.outcomes)) == workload.expected_values(n)
    assert "topic id of 'by-id' remapped" in render_text(report)


async def test_a_topic_missing_on_the_target_is_reported(tmp_path: Path, tansu_factory, tcpdump_installed):
    """Only the consumer's connections replayed, so the topic is never created on the target."""
    original = tansu_factory()
    pcap = tmp_path / "wire.pcap"

    def session() -> None:
        workload.create_topic_confluent(original.bootstrap, "absent")
        assert workload.produce_confluent(original.bootstrap, "absent", 20, acks="all").ok
        assert len(workload.consume_all(original.bootstrap, "absent", 20, timeout=30)) == 20

    with tcpdump(pcap, original.port):
        await trio.to_thread.run_sync(session)
    import_pcap(pcap, tmp_path / "capture", [original.port])
    everything = load_plan(tmp_path / "capture")
    consumers = {r.connection_id for r in everything.requests if r.api_key == ApiKey.FETCH}
    plan = load_plan(tmp_path / "capture", consumers)

    fresh = tansu_factory()
    with trio.fail_after(60):
        result = await replay(plan, ReplayConfig("127.0.0.1", fresh.port, speed=None, response_timeout=10))
    report = build_report(result)
    [missing] = report["topic_ids"]["missing_on_target"]
    assert missing["topic"] == "absent" and missing["requests"] > 0
    assert "topic 'absent' is missing on the target" in render_text(report)
