"""Five real Kafka clients behind one face, for the end-to-end client tests.

kafka-python, confluent-kafka, KafkaJS, aiokafka and kcat each get a :class:`RealClient`:
``produce`` sends ``n`` unique values (``corrfix.lab.workload.make_value``) with acks=all,
in requests of about REQUEST_RECORDS records; ``consume_group`` joins a consumer group,
reads ``n`` values from the group's offsets (earliest without any), commits them and leaves.

kafka-python, confluent-kafka and kcat produce with their idempotent producer (a producer id
and sequence numbers, so the broker stores a batch sent twice once). KafkaJS and aiokafka
cannot on Tansu (``idempotent = False``): they ask for a producer id with InitProducerId v1
and v0, which Tansu answers with UNKNOWN_SERVER_ERROR (it logs "producer=None epoch=None":
those fields came with v3); their producers are plain acks=all ones.

Both calls return what the client showed its user: the values or the count acknowledged,
and the ``errors`` it reported (failed sends, error callbacks, error log lines; the group
reads of kafka-python and confluent-kafka raise theirs), each run bounded in time.
Everything blocks; from trio, call it through ``trio.to_thread.run_sync``.

aiokafka is asyncio: each call runs its own event loop (``asyncio.run``) in the calling
thread, so it never meets trio's. KafkaJS runs ``kafkajs/client.js`` on Node
(:mod:`tests.support.kafkajs`), kcat runs as a process; both are killed past their timeout.
Missing tools skip the test that asks for them, or fail it under CORRFIX_REQUIRE_NODE=1 /
CORRFIX_REQUIRE_KCAT=1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiokafka
import kafka

from corrfix.lab import workload
from tests.support.kafkajs import KafkaJS
from tests.support.tools import require_tool

CLIENT_NAMES = ("kafka-python", "confluent-kafka", "kafkajs", "aiokafka", "kcat")
REQUEST_RECORDS = 10
"""Records per Produce request, about: small requests make many answers for a lossy link
to drop (2,000 values take a hundred or more requests)."""
KAFKA_PYTHON_BATCH_BYTES = 200
"""kafka-python batches by bytes: a value here takes about 15, so about REQUEST_RECORDS a batch."""
TIMEOUT = 60.0
"""Bound on one produce or consume run; far above what one takes."""
GROUP_SESSION_TIMEOUT_MS = workload.GROUP_SESSION_TIMEOUT_MS
KCAT_NAMES = ("kcat", "kafkacat")
REQUIRE_KCAT_ENV = "CORRFIX_REQUIRE_KCAT"


@dataclass
class Produced:
    """What a producer run told its user: values acknowledged, and any error it showed."""

    acknowledged: int
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0


@dataclass
class Consumed:
    """What a group member read, in order, and any error it showed."""

    values: list[bytes]
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0


class RealClient(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def idempotent(self) -> bool:
        """Whether its producer has a producer id, so that a re-sent batch is stored once."""
        ...

    def produce(self, bootstrap: str, topic: str, n: int) -> Produced: ...

    def consume_group(self, bootstrap: str, topic: str, group: str, n: int) -> Consumed: ...


# -- kafka-python and confluent-kafka: corrfix.lab.workload ------------------------------------


class KafkaPython:
    name = "kafka-python"
    idempotent = True

    def produce(self, bootstrap: str, topic: str, n: int) -> Produced:
        result = workload.produce_kafka_python(
            bootstrap,
            topic,
            n,
            acks="all",
            idempotent=True,
            timeout=TIMEOUT,
            config={"batch_size": KAFKA_PYTHON_BATCH_BYTES, "linger_ms": 1},
        )
        return Produced(result.delivered, _workload_errors(result), result.elapsed)

    def consume_group(self, bootstrap: str, topic: str, group: str, n: int) -> Consumed:
        start = time.monotonic()
        values = workload.consume_group(bootstrap, topic, group, n, client="kafka-python", timeout=TIMEOUT)
        return Consumed(values, elapsed=time.monotonic() - start)


class ConfluentKafka:
    name = "confluent-kafka"
    idempotent = True

    def produce(self, bootstrap: str, topic: str, n: int) -> Produced:
        reported: list[str] = []
        result = workload.produce_confluent(
            bootstrap,
            topic,
            n,
            idempotent=True,
            timeout=TIMEOUT,
            config={
                "batch.num.messages": REQUEST_RECORDS,
                "linger.ms": 1,
                # librdkafka's error callback: what it tells the application besides delivery reports.
                "error_cb": lambda error: reported.append(f"error_cb: {error}"),
            },
        )
        return Produced(result.delivered, _workload_errors(result) + reported, result.elapsed)

    def consume_group(self, bootstrap: str, topic: str, group: str, n: int) -> Consumed:
        start = time.monotonic()
        values = workload.consume_group(bootstrap, topic, group, n, client="confluent", timeout=TIMEOUT)
        return Consumed(values, elapsed=time.monotonic() - start)


def _workload_errors(result: workload.ProduceResult) -> list[str]:
    errors = [f"{name} x{count}" for name, count in result.errors.items()]
    if result.undelivered:
        errors.append(f"{result.undelivered} sends never reported")
    if result.correlation_errors:
        errors.append(f"{result.correlation_errors} CorrelationIdError")
    if result.connection_losses:
        errors.append(f"{result.connection_losses} connections lost")
    return errors


# -- KafkaJS: tests/support/kafkajs -------------------------------------------------------------


@dataclass(frozen=True)
class KafkaJSClient:
    runner: KafkaJS
    name: str = "kafkajs"
    idempotent: bool = False  # see the module docstring

    def produce(self, bootstrap: str, topic: str, n: int) -> Produced:
        run = self.runner.produce(
            bootstrap,
            topic,
            n,
            acks=-1,
            batch=REQUEST_RECORDS,
            prefix=workload.VALUE_PREFIX.decode(),
            timeout=TIMEOUT,
        )
        return Produced(run["sent"], _kafkajs_errors(run.log), run.elapsed)

    def consume_group(self, bootstrap: str, topic: str, group: str, n: int) -> Consumed:
        run = self.runner.consume(
            bootstrap,
            topic,
            group,
            n,
            timeout=TIMEOUT,
            session_timeout_ms=GROUP_SESSION_TIMEOUT_MS,
            values=True,
        )
        values = [value.encode() for value in run["values"]]
        return Consumed(values, _kafkajs_errors(run.log), run.elapsed)


def _kafkajs_errors(log: list[str]) -> list[str]:
    """KafkaJS's error-level log lines (its warnings, e.g. a group rebalance, are not errors)."""
    return [line for line in log if '"level":"ERROR"' in line]


# -- aiokafka: its own asyncio loop per call ------------------------------------------------------


class AioKafka:
    name = "aiokafka"
    idempotent = False  # see the module docstring

    def produce(self, bootstrap: str, topic: str, n: int) -> Produced:
        with _logged_errors("aiokafka") as logged:
            start = time.monotonic()
            acknowledged, failed = asyncio.run(asyncio.wait_for(_aio_produce(bootstrap, topic, n), TIMEOUT))
        return Produced(acknowledged, failed + logged, time.monotonic() - start)

    def consume_group(self, bootstrap: str, topic: str, group: str, n: int) -> Consumed:
        with _logged_errors("aiokafka") as logged:
            start = time.monotonic()
            values = asyncio.run(asyncio.wait_for(_aio_consume_group(bootstrap, topic, group, n), TIMEOUT))
        return Consumed(values, logged, time.monotonic() - start)


async def _aio_produce(bootstrap: str, topic: str, n: int) -> tuple[int, list[str]]:
    """Send REQUEST_RECORDS values, await their acknowledgements, repeat: one request each."""
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="corrfix-tests-aiokafka",
        acks="all",
        request_timeout_ms=10_000,
    )
    acknowledged, failed = 0, []
    try:
        await producer.start()
        for first in range(0, n, REQUEST_RECORDS):
            sent = [
                await producer.send(topic, workload.make_value(i))
                for i in range(first, min(first + REQUEST_RECORDS, n))
            ]
            for outcome in await asyncio.gather(*sent, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    failed.append(f"{type(outcome).__name__}: {outcome}")
                else:
                    acknowledged += 1
    finally:
        await producer.stop()
    return acknowledged, failed


async def _aio_consume_group(bootstrap: str, topic: str, group: str, n: int) -> list[bytes]:
    consumer = aiokafka.AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        client_id="corrfix-tests-aiokafka",
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=GROUP_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=GROUP_SESSION_TIMEOUT_MS // 6,
        fetch_max_wait_ms=100,  # Tansu's long poll does not wake early when data arrives
        request_timeout_ms=10_000,
    )
    values: list[bytes] = []
    try:
        await consumer.start()
        while len(values) < n:
            batches = await consumer.getmany(timeout_ms=200, max_records=n - len(values))
            values.extend(record.value for records in batches.values() for record in records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return values


class _ErrorLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _logged_errors(logger_name: str) -> Iterator[list[str]]:
    """Error records a library logs meanwhile (the logger is process-wide)."""
    handler = _ErrorLines()
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


# -- kcat ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kcat:
    """kcat (Debian's links librdkafka 2.0.2: through corrfix only, see test_kcat.py)."""

    path: str
    name: str = "kcat"
    idempotent: bool = True

    def produce(self, bootstrap: str, topic: str, n: int) -> Produced:
        lines = b"".join(workload.make_value(i) + b"\n" for i in range(n))
        config = {"enable.idempotence": "true", "batch.num.messages": REQUEST_RECORDS, "linger.ms": 1}
        run = self._run(bootstrap, ["-P", "-t", topic], config, stdin=lines)
        # kcat -P exits non-zero when a message was not delivered; it reports no count.
        return Produced(n if run.returncode == 0 else 0, _kcat_errors(run), run.elapsed)

    def consume_group(self, bootstrap: str, topic: str, group: str, n: int) -> Consumed:
        config = {
            "auto.offset.reset": "earliest",
            "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS,
            "fetch.wait.max.ms": 100,  # Tansu's long poll does not wake early when data arrives
        }
        # -G: a balanced consumer (auto-commit, final commit at close); -e ends it at the end
        # of every assigned partition, once all n stored values are read.
        run = self._run(bootstrap, ["-G", group, "-e", "-f", "%s\\n", topic], config)
        values = run.stdout.splitlines()
        return Consumed(values, _kcat_errors(run), run.elapsed)

    def _run(self, bootstrap: str, args: list[str], config: dict[str, Any], stdin: bytes = b"") -> _KcatRun:
        settings = [item for key, value in config.items() for item in ("-X", f"{key}={value}")]
        command = [self.path, "-b", bootstrap, "-q", *settings, *args]
        start = time.monotonic()
        done = subprocess.run(command, input=stdin, capture_output=True, timeout=TIMEOUT, check=False)
        return _KcatRun(
            done.returncode, done.stdout, done.stderr.decode(errors="replace"), time.monotonic() - start
        )


@dataclass(frozen=True)
class _KcatRun:
    returncode: int
    stdout: bytes
    stderr: str
    elapsed: float


def _kcat_errors(run: _KcatRun) -> list[str]:
    """With -q, kcat's stderr carries only errors and librdkafka's warnings."""
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    if run.returncode != 0:
        errors.append(f"kcat exited with {run.returncode}")
    return errors


def require_kcat() -> Kcat:
    """The installed kcat; skips the calling test without one (fails under CORRFIX_REQUIRE_KCAT=1)."""
    return Kcat(require_tool(KCAT_NAMES, REQUIRE_KCAT_ENV, "apt-get install kcat"))


# -- what the broker holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """Every record a topic holds, in partition order, and each partition's high watermark."""

    values: list[bytes]
    high: dict[int, int]


def stored_records(bootstrap: str, topic: str, timeout: float = TIMEOUT) -> Stored:
    """Read ``topic`` to its end straight from the broker with kafka-python (partitions
    assigned, no group). The end is the high watermark of Fetch answers: Tansu's
    ListOffsets(latest) answers an offset inside the last batch, short of the end."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        client_id="corrfix-tests-read-back",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,  # Tansu's long poll does not wake early when data arrives
    )
    deadline = time.monotonic() + timeout
    try:
        tps = [kafka.TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []
        while True:
            batches = consumer.poll(timeout_ms=200, max_records=10_000)
            values.extend(record.value for records in batches.values() for record in records)
            high = {tp: consumer.highwater(tp) for tp in tps}
            ends = {tp.partition: h for tp, h in high.items() if h is not None}
            if len(ends) == len(tps) and all(consumer.position(tp) >= ends[tp.partition] for tp in tps):
                return Stored(values, ends)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic!r} not read to its end in {timeout:g}s: {len(values)} values")
    finally:
        consumer.close(autocommit=False)


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    """What ``group`` committed on each partition of ``topic`` (OffsetFetch; joins nothing)."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        client_id="corrfix-tests-offsets",
    )
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        return {p: consumer.committed(kafka.TopicPartition(topic, p)) for p in partitions}
    finally:
        consumer.close(autocommit=False)
