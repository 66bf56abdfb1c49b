"""Real traffic for the audit: clients -> corrfix (capturing) [-> chaos relay] -> Tansu,
and a tcpdump capture of clients talking to Tansu directly, imported as a wire capture.

Everything is on loopback; waits are on events (connections closed, tcpdump's own
markers) or are client polls bounded by deadlines.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kafka
import trio

from corrfix._netutil import free_port
from corrfix.capture import CaptureWriter
from corrfix.capture.pcap import import_pcap
from corrfix.chaos import ChaosConfig, ChaosRelay, ChaosRules, serve_chaos
from corrfix.core import Address, RepairConfig
from corrfix.lab import TansuBroker, workload
from corrfix.proxy import Proxy, ProxyConfig
from tests.support.tcpdump import tcpdump
from tests.support.watch import Watch

DEADLINE_S = 90.0
SECOND_MEMBER_TRIES = 4
SECOND_MEMBER_WAIT_S = 15.0
"""Polled 100 ms at a time while Tansu holds its JoinGroup for 3 s, a second kafka-python
member often went on rejoining after every SyncGroup, its assignment good, and never
settled (one run in five here). Polled a second at a time it settled at once in 22 runs
of 22; a fresh member, up to these many times, is the fallback."""


@dataclass
class Scenario:
    directory: Path
    relay: ChaosRelay | None = None
    result: dict[str, Any] = field(default_factory=dict)


def through_corrfix(directory: Path, work: Callable[[str], Any], chaos: ChaosRules | None = None) -> Scenario:
    """Run blocking ``work(bootstrap)`` in a thread against corrfix on Tansu, capturing."""
    scenario = Scenario(directory)

    async def main() -> None:
        port = free_port()
        with TansuBroker(advertised_port=port) as broker:
            writer = CaptureWriter(directory, flush_seconds=0.2).start()
            watch = Watch(writer)
            try:
                async with trio.open_nursery() as nursery:
                    upstream = broker.port
                    if chaos is not None:
                        config = ChaosConfig("127.0.0.1", 0, "127.0.0.1", broker.port, rules=chaos)
                        scenario.relay = await nursery.start(serve_chaos, config)
                        upstream = scenario.relay.port
                    proxy_config = ProxyConfig(
                        Address("127.0.0.1", port),
                        Address("127.0.0.1", upstream),
                        RepairConfig(probe_after=0.5),
                    )
                    await nursery.start(Proxy(proxy_config, observer=watch).serve)
                    with trio.fail_after(180):
                        result = await trio.to_thread.run_sync(functools.partial(work, f"127.0.0.1:{port}"))
                        scenario.result.update(result or {})
                        await watch.all_closed()
                    nursery.cancel_scope.cancel()
            finally:
                writer.close()

    trio.run(main)
    return scenario


def over_the_wire(directory: Path, work: Callable[[str], Any]) -> Scenario:
    """Run ``work(bootstrap)`` straight against Tansu under tcpdump; import the capture."""
    scenario = Scenario(directory / "capture")
    with TansuBroker() as broker:
        pcap = directory / "wire.pcap"
        with tcpdump(pcap, broker.port):
            scenario.result.update(work(broker.bootstrap) or {})
        import_pcap(pcap, scenario.directory, [broker.port])
    return scenario


# -- workloads -------------------------------------------------------------------------------


def lossy_produce(bootstrap: str, topic: str = "audit-lossy", n: int = 60) -> dict[str, Any]:
    """Synchronous non-idempotent produces (corrfix re-sends them), then read everything back."""
    workload.create_topic(bootstrap, topic)
    produced = workload.produce_kafka_python(bootstrap, topic, n, acks=1, sync=True)
    assert produced.ok, produced
    values = workload.consume_all(bootstrap, topic, n, client="kafka-python")
    return {"values": values}


def group_life(bootstrap: str, topic: str = "audit-groups", group: str = "audit-group") -> dict[str, Any]:
    """A consumer joins and commits, a second joins (rebalance), both leave, the group is
    deleted, and a third consumer of the same group finds no committed offsets."""
    workload.create_topic(bootstrap, topic, partitions=2)
    assert workload.produce_kafka_python(bootstrap, topic, 20, acks=1).ok

    def consumer() -> kafka.KafkaConsumer:
        return kafka.KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id="audit-consumer",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=6000,  # also the rebalance timeout; the default is 300 s
            fetch_max_wait_ms=100,
            request_timeout_ms=10_000,
        )

    deadline = time.monotonic() + DEADLINE_S
    first = consumer()
    read = 0
    while read < 20 and time.monotonic() < deadline:
        read += sum(len(records) for records in first.poll(timeout_ms=200).values())
    assert read == 20
    first.commit()
    committed = {tp.partition: first.committed(tp) for tp in first.assignment()}
    for _ in range(SECOND_MEMBER_TRIES):
        second = consumer()
        give_up = min(deadline, time.monotonic() + SECOND_MEMBER_WAIT_S)
        while not second.assignment() and time.monotonic() < give_up:
            first.poll(timeout_ms=100)
            second.poll(timeout_ms=1000)  # see SECOND_MEMBER_TRIES
        assigned = bool(second.assignment())
        second.close()
        if assigned:
            break
    assert assigned
    first.close()
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="audit-admin")
    try:
        admin.delete_groups([group])
    finally:
        admin.close()
    third = consumer()
    while not third.assignment() and time.monotonic() < deadline:
        third.poll(timeout_ms=100)
    after = {tp.partition: third.committed(tp) for tp in third.assignment()}
    third.close()
    return {"committed": committed, "after": after, "topic": topic, "group": group}


def acks0_produce(bootstrap: str, topic: str = "audit-acks0", n: int = 50) -> dict[str, Any]:
    """kafka-python with acks=0 straight to Tansu, which wrongly answers; one message per
    request (each send waits for its own), so there are many answers that should not be."""
    workload.create_topic(bootstrap, topic)
    result = workload.produce_kafka_python(bootstrap, topic, n, acks=0, sync=True)
    return {"produced": result}
