"""Five real clients produce and consume through corrfix, on a plain link and a lossy one.

kafka-python, confluent-kafka, KafkaJS, aiokafka and kcat (tests/support/clients.py) each
produce MESSAGES unique values with acks=all, then one member of a consumer group reads the
topic back through corrfix, commits and leaves. Tansu advertises itself: only corrfix's
rewriting keeps the clients on it, and the proxy's request counters show the Produce, Fetch
and group traffic went through it. kcat (Debian's, librdkafka 2.0.2) gets in thanks to
corrfix's client compatibility repair (tests/corrfix/proxy/test_kcat.py).

``lossy``: the chaos relay, configured from the command line ``corrfix chaos`` + LOSSY_LINK,
sits between corrfix and Tansu and drops every DROP_EVERY-th Produce answer (Tansu
advertises the relay: the broker's address over that link). corrfix's probe finds each loss
and re-sends the request. Nothing is lost, and no client sees an error.

What the broker stores is read back directly (to the Fetch high watermark), apart from the
client: every value sent is there. Re-sending is at-least-once (``--produce-policy
requeue``, docs/repair.md). The idempotent producers (kafka-python, confluent-kafka, kcat)
store nothing twice, because the broker drops a batch it already has. KafkaJS and aiokafka
cannot be idempotent on Tansu (tests/support/clients.py says why): each batch corrfix
re-sends for them is stored twice and flagged ``possible_duplicate``, and nothing else is
duplicated. The group member must read exactly what is stored, each record once, and commit
it all.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import trio

from corrfix._netutil import free_port
from corrfix.chaos import ChaosConfig, ChaosRelay, add_chaos_arguments, chaos_config_from_args, serve_chaos
from corrfix.core import LOOPBACK, Address, RepairKind
from corrfix.lab import TansuBroker, workload
from corrfix.proxy import Proxy, ProxyConfig, ProxyMetrics
from protocol import ApiKey
from tests.conftest import TansuFactory
from tests.support.clients import (
    CLIENT_NAMES,
    REQUEST_RECORDS,
    AioKafka,
    ConfluentKafka,
    KafkaJSClient,
    KafkaPython,
    RealClient,
    committed_offsets,
    require_kcat,
    stored_records,
)
from tests.support.kafkajs import require_kafkajs

pytestmark = pytest.mark.broker

MESSAGES = 2_000
PARTITIONS = 2
DROP_EVERY = 25
LOSSY_LINK = ("--drop-every", str(DROP_EVERY), "--api", "Produce")
"""The chaos relay's command line (``corrfix chaos``), less its addresses."""
THROUGH_CORRFIX = ("Produce", "Fetch", "FindCoordinator", "JoinGroup", "SyncGroup", "OffsetCommit")
"""Requests every client must have sent through corrfix: its produce and its group read."""

Link = Literal["plain", "lossy"]

CLIENTS: dict[str, Callable[[], RealClient]] = {
    "kafka-python": KafkaPython,
    "confluent-kafka": ConfluentKafka,
    "kafkajs": lambda: KafkaJSClient(require_kafkajs()),
    "aiokafka": AioKafka,
    "kcat": require_kcat,
}
assert tuple(CLIENTS) == CLIENT_NAMES


@dataclass
class Stack:
    broker: TansuBroker
    proxy: Proxy
    metrics: ProxyMetrics
    bootstrap: str
    relay: ChaosRelay | None

    def requests(self, api: str) -> float:
        return self.metrics.registry.get_sample_value("corrfix_requests_total", {"api": api}) or 0.0


def lossy_link(listen: int, upstream: int) -> ChaosConfig:
    """The relay's configuration, parsed from its command line as an operator would type it."""
    parser = argparse.ArgumentParser()
    add_chaos_arguments(parser)
    where = ("--listen", f"{LOOPBACK}:{listen}", "--upstream", f"{LOOPBACK}:{upstream}")
    return chaos_config_from_args(parser.parse_args([*where, *LOSSY_LINK]))


@contextlib.asynccontextmanager
async def corrfix_in_front(tansu_factory: TansuFactory, link: Link) -> AsyncIterator[Stack]:
    """client -> corrfix [-> chaos relay] -> Tansu; everything stopped on exit (the broker by
    the fixture)."""
    async with trio.open_nursery() as nursery:
        relay = None
        if link == "plain":
            broker = tansu_factory()
            upstream = broker.port
        else:
            upstream = free_port()
            broker = tansu_factory(advertised_port=upstream)
            relay = await nursery.start(serve_chaos, lossy_link(upstream, broker.port))
        metrics = ProxyMetrics()
        proxy = Proxy(ProxyConfig(Address(LOOPBACK, 0), Address(LOOPBACK, upstream)), metrics=metrics)
        bound = await nursery.start(proxy.serve)
        yield Stack(broker, proxy, metrics, f"{LOOPBACK}:{bound[0].port}", relay)
        nursery.cancel_scope.cancel()


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


@pytest.mark.parametrize("link", ["plain", "lossy"])
@pytest.mark.parametrize("name", CLIENT_NAMES)
async def test_client_produces_and_reads_in_a_group_through_corrfix(
    tansu_factory: TansuFactory, name: str, link: Link
):
    client = CLIENTS[name]()
    topic, group = f"clients-{name}-{link}", f"group-{name}-{link}"
    sent = workload.expected_values(MESSAGES)
    async with corrfix_in_front(tansu_factory, link) as stack:
        await in_thread(workload.create_topic, stack.bootstrap, topic, PARTITIONS)
        produced = await in_thread(client.produce, stack.bootstrap, topic, MESSAGES)
        stored = await in_thread(stored_records, stack.broker.bootstrap, topic)
        consumed = await in_thread(client.consume_group, stack.bootstrap, topic, group, len(stored.values))
        committed = await in_thread(committed_offsets, stack.broker.bootstrap, topic, group)
    repairs = stack.proxy.stats.repairs
    flagged = repairs[RepairKind.POSSIBLE_DUPLICATE]
    extra = len(stored.values) - MESSAGES
    detail = (
        f"{name}, {link} link: {produced.acknowledged} acknowledged in {produced.elapsed:.1f}s, "
        f"{len(stored.values)} stored, {len(consumed.values)} read in {consumed.elapsed:.1f}s; "
        f"repairs {dict(repairs)}; high watermarks {stored.high}, committed {committed}"
    )

    # Nothing lost, and no client saw an error.
    assert produced.errors == [], detail
    assert produced.acknowledged == MESSAGES, detail
    assert set(stored.values) == set(sent), f"{len(set(sent) - set(stored.values))} lost; {detail}"
    # Stored twice only what corrfix re-sent and flagged (these producers put at most
    # REQUEST_RECORDS records in a request): an idempotent producer's never.
    if client.idempotent:
        assert extra == 0, f"{extra} records stored twice; {detail}"
    else:
        assert extra <= flagged * REQUEST_RECORDS, f"{extra} records stored twice; {detail}"
    # The group member read every stored record once, committed all, and saw no error.
    assert consumed.errors == [], detail
    assert Counter(consumed.values) == Counter(stored.values), detail
    # librdkafka (confluent-kafka, kcat) has no position on a partition it read nothing from,
    # so when the producer put every record in one partition it commits nothing for the
    # empty one: the group then has no offset there, which is what it read.
    read_to = {
        p: 0 if offset is None and stored.high.get(p) == 0 else offset for p, offset in committed.items()
    }
    assert read_to == stored.high, f"the group did not commit what it read; {detail}"

    missing = [api for api in THROUGH_CORRFIX if not stack.requests(api)]
    assert missing == [], f"no {missing} through corrfix: the client bypassed it; {detail}"
    assert repairs[RepairKind.GIVE_UP] == 0, detail
    if link == "plain":
        assert flagged == 0 and repairs[RepairKind.REQUEUE] == 0, detail
        return
    assert stack.relay is not None
    answers = stack.relay.policy.counts[ApiKey.PRODUCE]
    assert answers.dropped == answers.responses // DROP_EVERY >= 2, f"too few Produce answers; {detail}"
    assert repairs[RepairKind.REQUEUE] >= answers.dropped, detail
    if client.idempotent:
        assert flagged == 0, detail
    else:
        assert flagged >= answers.dropped, detail
