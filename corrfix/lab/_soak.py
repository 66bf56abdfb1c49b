"""Chaos soak: real clients through corrfix and a lossy link to Tansu, counted message by message.

The chain is client → corrfix (capturing) → chaos relay → Tansu. Tansu advertises the chaos
relay, and corrfix rewrites that address to its own broker listener, so every connection
the clients open after bootstrap also crosses corrfix and then the chaos relay. Three
workloads run at once:

- a kafka-python producer without idempotence (acks=all), into one topic;
- a confluent-kafka idempotent producer, into another topic;
- a confluent-kafka consumer group of two members subscribed to both topics.

Afterwards both topics are read back in full and every message is accounted for (see
:meth:`SoakOutcome.problems`). The test suite runs a small plan; ``bench/soak.py`` runs
100,000 messages.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import trio
from kafka.record import MemoryRecords

from corrfix._netutil import free_port
from corrfix.capture import CaptureWriter, read_capture
from corrfix.chaos import ChaosConfig, ChaosPolicy, ChaosRules, serve_chaos
from corrfix.core import Address, RepairKind
from corrfix.lab import workload
from corrfix.lab._tansu import TansuBroker
from corrfix.proxy import Proxy, ProxyConfig
from protocol import ApiKey, parse_request_header, request_class

PLAIN_TOPIC = "soak-kafka-python"
IDEMPOTENT_TOPIC = "soak-idempotent"
PLAIN_PREFIX = b"kp-"
IDEMPOTENT_PREFIX = b"ck-"
GROUP = "soak-group"
GROUP_MEMBERS = 2
CAPTURE_SNAPLEN = 4 * 1024 * 1024
"""Whole Produce frames are kept, so flagged requests can be decoded down to their records."""


@dataclass(frozen=True)
class SoakPlan:
    """How much traffic and how much damage. Probabilities apply to responses of every api key."""

    messages: int = 2_000
    """Per producer."""
    partitions: int = 4
    drop_probability: float = 0.02
    duplicate_probability: float = 0.01
    delay_probability: float = 0.02
    delay_seconds: float = 0.05
    kill_every: int = 1_500
    """Kill the upstream connection (corrfix ↔ broker) at every this-many-th response."""
    batch_records: int = 10
    """Records per produce batch, kept small so that there are many Produce requests to damage."""
    seed: int = 2026
    timeout: float = 180.0
    """Bounds the whole run; a workload still going then counts as a failure."""

    def rules(self) -> ChaosRules:
        return ChaosRules(
            drop_probability=self.drop_probability,
            duplicate_probability=self.duplicate_probability,
            delay_probability=self.delay_probability,
            delay_seconds=self.delay_seconds,
            kill_every=self.kill_every,
            seed=self.seed,
        )


@dataclass
class SoakOutcome:
    """What happened; :meth:`problems` turns it into the zero-loss verdict."""

    plan: SoakPlan
    plain: workload.ProduceResult
    idempotent: workload.ProduceResult
    stored_plain: list[bytes]
    stored_idempotent: list[bytes]
    group_seen: set[bytes]
    flagged_values: set[bytes]
    """Values inside Produce requests the capture marks as possible duplicates."""
    client_order_errors: list[str]
    """Client-side answers that did not match the oldest unanswered request (should be none)."""
    rows_lost: int
    chaos: dict[str, int]
    repairs: collections.Counter[str] = field(default_factory=collections.Counter)
    elapsed: float = 0.0
    group_errors: list[str] = field(default_factory=list)
    """Errors that stopped a consumer group member (should be none)."""

    def problems(self) -> list[str]:
        """Every broken guarantee, in words; an empty list is a pass."""
        found: list[str] = []
        n = self.plan.messages
        plain_expected = set(workload.expected_values(n, PLAIN_PREFIX))
        idempotent_expected = set(workload.expected_values(n, IDEMPOTENT_PREFIX))
        for name, result in (("kafka-python", self.plain), ("confluent idempotent", self.idempotent)):
            if not result.ok:
                found.append(f"{name} producer did not deliver everything: {result}")
            if result.correlation_errors:
                found.append(f"{name} producer saw {result.correlation_errors} correlation errors")
        if lost := plain_expected - set(self.stored_plain):
            found.append(f"{len(lost)} kafka-python messages lost, e.g. {sorted(lost)[:3]}")
        if lost := idempotent_expected - set(self.stored_idempotent):
            found.append(f"{len(lost)} idempotent messages lost, e.g. {sorted(lost)[:3]}")
        if dups := workload.duplicates(self.stored_idempotent):
            found.append(f"idempotent producer stored {len(dups)} values twice, e.g. {list(dups)[:3]}")
        unflagged = set(workload.duplicates(self.stored_plain)) - self.flagged_values
        if unflagged:
            found.append(f"{len(unflagged)} unflagged kafka-python duplicates, e.g. {sorted(unflagged)[:3]}")
        if missed := (plain_expected | idempotent_expected) - self.group_seen:
            found.append(f"the consumer group never saw {len(missed)} messages, e.g. {sorted(missed)[:3]}")
        if self.client_order_errors:
            found.append(f"clients saw mismatched answers: {self.client_order_errors[:3]}")
        if self.group_errors:
            found.append(f"consumer group members failed: {self.group_errors[:3]}")
        if self.rows_lost:
            found.append(f"the capture lost {self.rows_lost} rows, so the accounting is incomplete")
        return found

    def summary(self) -> dict[str, Any]:
        """Counts for a report (the bench writes this as JSON)."""
        return {
            "messages_per_producer": self.plan.messages,
            "elapsed_seconds": round(self.elapsed, 1),
            "stored_kafka_python": len(self.stored_plain),
            "stored_idempotent": len(self.stored_idempotent),
            "kafka_python_duplicates": len(workload.duplicates(self.stored_plain)),
            "flagged_possible_duplicate_values": len(self.flagged_values),
            "group_distinct_seen": len(self.group_seen),
            "chaos": self.chaos,
            "repairs": dict(self.repairs),
            "problems": self.problems(),
        }


class _GroupProgress:
    """Values the consumer group has seen, shared by its member threads."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._changed = threading.Condition()

    def add(self, values: list[bytes]) -> None:
        with self._changed:
            self.seen.update(values)
            self._changed.notify_all()

    def snapshot(self) -> set[bytes]:
        with self._changed:
            return set(self.seen)

    def wait_for(self, wanted: set[bytes], deadline: float) -> bool:
        """Block until every wanted value was seen, a member failed, or the deadline passed."""
        with self._changed:
            return self._changed.wait_for(
                lambda: wanted <= self.seen or bool(self.errors), max(deadline - time.monotonic(), 0.0)
            )

    def fail(self, error: str) -> None:
        with self._changed:
            self.errors.append(error)
            self._changed.notify_all()


def _group_member(bootstrap: str, progress: _GroupProgress, deadline: float) -> None:
    """One member of the soak's consumer group (committing as it goes); runs until told to
    stop or the deadline."""
    consumer = workload.group_consumer_confluent(bootstrap, GROUP, config={"enable.auto.commit": True})
    try:
        consumer.subscribe([PLAIN_TOPIC, IDEMPOTENT_TOPIC])
        while not progress.stop.is_set() and time.monotonic() < deadline:
            progress.add(workload.group_values_confluent(consumer, 1000))
    except workload.confluent_kafka.KafkaException as exc:
        progress.fail(str(exc))
    finally:
        consumer.close()


async def _in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), abandon_on_cancel=True)


async def run_soak(plan: SoakPlan, capture_dir: Path) -> SoakOutcome:
    """Run the soak against a Tansu of its own; the capture is left in ``capture_dir``."""
    started = time.monotonic()
    deadline = started + plan.timeout
    relay_port = free_port()
    policy = ChaosPolicy(plan.rules())
    writer = CaptureWriter(capture_dir, snaplen=CAPTURE_SNAPLEN, flush_seconds=0.5).start()
    progress = _GroupProgress()
    try:
        with TansuBroker(advertised_port=relay_port) as broker:
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    functools.partial(
                        serve_chaos,
                        ChaosConfig("127.0.0.1", relay_port, "127.0.0.1", broker.port),
                        policy=policy,
                    )
                )
                proxy = Proxy(
                    ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", relay_port)), observer=writer
                )
                bound = await nursery.start(proxy.serve)
                bootstrap = f"127.0.0.1:{bound[0].port}"
                outcome = await _run_workloads(plan, bootstrap, progress, deadline)
                progress.stop.set()
                nursery.cancel_scope.cancel()
    finally:
        progress.stop.set()
        writer.close()
    outcome.rows_lost = writer.stats.rows_lost
    totals = policy.totals()
    outcome.chaos = {
        "responses": totals.responses,
        "dropped": totals.dropped,
        "duplicated": totals.duplicated,
        "delayed": totals.delayed,
        "killed": totals.kills,
    }
    outcome.repairs = collections.Counter(proxy.stats.repairs)
    table = read_capture(capture_dir)
    outcome.flagged_values = flagged_produce_values(table)
    outcome.client_order_errors = client_order_errors(table)
    outcome.elapsed = time.monotonic() - started
    return outcome


async def _run_workloads(
    plan: SoakPlan, bootstrap: str, progress: _GroupProgress, deadline: float
) -> SoakOutcome:
    for topic in (PLAIN_TOPIC, IDEMPOTENT_TOPIC):
        # exist_ok: a lost CreateTopics answer is re-sent, and the re-send finds the topic.
        await _in_thread(workload.create_topic, bootstrap, topic, plan.partitions, exist_ok=True, timeout=30)
    budget = max(deadline - time.monotonic(), 1.0)
    results: dict[str, workload.ProduceResult] = {}

    async def produce(name: str, fn: Callable[..., workload.ProduceResult], *args: Any, **kw: Any) -> None:
        results[name] = await _in_thread(fn, *args, **kw)

    async with trio.open_nursery() as clients:
        for _ in range(GROUP_MEMBERS):
            clients.start_soon(_in_thread, _group_member, bootstrap, progress, deadline)
        async with trio.open_nursery() as producers:
            producers.start_soon(
                functools.partial(
                    produce,
                    "plain",
                    workload.produce_kafka_python,
                    bootstrap,
                    PLAIN_TOPIC,
                    plan.messages,
                    acks="all",
                    timeout=budget,
                    prefix=PLAIN_PREFIX,
                    # Values are 9 bytes; a v2 record of one is about 20 bytes.
                    config={"linger_ms": 0, "batch_size": 64 + 20 * plan.batch_records},
                )
            )
            producers.start_soon(
                functools.partial(
                    produce,
                    "idempotent",
                    workload.produce_confluent,
                    bootstrap,
                    IDEMPOTENT_TOPIC,
                    plan.messages,
                    idempotent=True,
                    timeout=budget,
                    prefix=IDEMPOTENT_PREFIX,
                    config={"linger.ms": 0, "batch.num.messages": plan.batch_records},
                )
            )
        wanted = set(workload.expected_values(plan.messages, PLAIN_PREFIX))
        wanted |= set(workload.expected_values(plan.messages, IDEMPOTENT_PREFIX))
        await _in_thread(progress.wait_for, wanted, deadline)
        progress.stop.set()
    # The read-back crosses the same chaos; workload.consume_all retries every transient client
    # error (a killed connection, a re-bootstrapped broker handle) until read_timeout, and the
    # verdict then counts what it read, so a retry cannot hide a lost message.
    read_timeout = max(deadline - time.monotonic(), 10.0)
    stored = {}
    for topic in (PLAIN_TOPIC, IDEMPOTENT_TOPIC):
        stored[topic] = await _in_thread(
            workload.consume_all, bootstrap, topic, plan.messages, timeout=read_timeout
        )
    return SoakOutcome(
        plan=plan,
        plain=results["plain"],
        idempotent=results["idempotent"],
        stored_plain=stored[PLAIN_TOPIC],
        stored_idempotent=stored[IDEMPOTENT_TOPIC],
        group_seen=progress.snapshot(),
        flagged_values=set(),
        client_order_errors=[],  # from the capture, once it is closed
        rows_lost=0,
        chaos={},
        group_errors=list(progress.errors),
    )


# -- reading the capture -------------------------------------------------------------------


def flagged_produce_values(table: pa.Table) -> set[bytes]:
    """Record values of every client Produce the capture marks ``possible_duplicate``."""
    rows = table.select(
        ["connection_id", "kind", "side", "direction", "api_key", "client_correlation_id", "event", "frame"]
    ).to_pylist()
    flagged = {
        (r["connection_id"], r["client_correlation_id"])
        for r in rows
        if r["kind"] == "repair" and r["event"] == RepairKind.POSSIBLE_DUPLICATE.value
    }
    values: set[bytes] = set()
    for r in rows:
        if (
            r["kind"] == "frame"
            and r["side"] == "client"
            and r["direction"] == "request"
            and r["api_key"] == ApiKey.PRODUCE
            and (r["connection_id"], r["client_correlation_id"]) in flagged
        ):
            values.update(produce_values(r["frame"]))
    return values


def produce_values(frame: bytes) -> list[bytes]:
    """The record values inside one captured Produce request frame (size prefix included)."""
    header = parse_request_header(frame)
    cls = request_class(ApiKey.PRODUCE)
    if cls is None or header.body_offset is None:
        return []
    request = cls.decode(bytes(frame[header.body_offset :]), version=header.api_version)
    values: list[bytes] = []
    for topic in request.topic_data or ():
        for partition in topic.partition_data or ():
            if not partition.records:
                continue
            records = MemoryRecords(bytes(partition.records))
            while (batch := records.next_batch()) is not None:
                values.extend(record.value for record in batch if record.value is not None)
    return values


def client_order_errors(table: pa.Table) -> list[str]:
    """Client-side answers that were not the answer to the oldest request still owed.

    Every request in the soak expects an answer (no acks=0), so on each connection the
    client-side responses must repeat the client-side requests' correlation ids, in order.
    """
    frames = table.filter(pc.and_(pc.equal(table["kind"], "frame"), pc.equal(table["side"], "client")))
    rows = frames.select(["connection_id", "seq", "direction", "client_correlation_id"]).to_pylist()
    rows.sort(key=lambda r: (r["connection_id"], r["seq"]))
    owed: dict[str, collections.deque[int]] = collections.defaultdict(collections.deque)
    errors: list[str] = []
    for r in rows:
        connection, cid = r["connection_id"], r["client_correlation_id"]
        if r["direction"] == "request":
            owed[connection].append(cid)
        elif not owed[connection] or owed[connection].popleft() != cid:
            errors.append(f"{connection}: answer with correlation id {cid} out of order")
    return errors
