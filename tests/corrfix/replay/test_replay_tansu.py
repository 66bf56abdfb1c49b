"""A tcpdump capture of kafka-python producing to Tansu, imported and replayed into a fresh Tansu.

The session includes the admin client's CreateTopics, so the fresh broker gets the topic
from the replay itself; causal order makes it exist before the first Produce arrives.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

from corrfix.capture.pcap import import_pcap
from corrfix.core import Address
from corrfix.lab import workload
from corrfix.proxy import Proxy, ProxyConfig
from corrfix.replay import ReplayConfig, build_report, load_plan, replay
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
