"""Real Kafka client workloads for the demo, the benchmarks and the tests: topics, produce N, read back.

Everything here blocks (the clients have their own I/O threads or loops) and everything is
bounded in time. From a trio test that also runs a proxy, call these through
``trio.to_thread.run_sync(functools.partial(...))``.

Message values are unique (``b"m-000123"``) so a caller can check exactly-once delivery
with :func:`expected_values` and :func:`duplicates`.

Reads and setup calls retry transient client errors (see :func:`is_transient`) until their
deadline, because chaos runs kill connections under them; only queries are retried, never
counted values, so a caller's count still catches every message really missing.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

try:
    import confluent_kafka
    import confluent_kafka.admin
except ImportError as exc:  # a plain install has no demo clients
    raise ImportError(
        "corrfix's workloads drive real clients and need confluent-kafka: pip install 'corrfix[demo]'"
    ) from exc
import kafka
import kafka.admin
import kafka.errors

VALUE_PREFIX = b"m-"
DEFAULT_TIMEOUT = 30.0
RETRY_PAUSE = 0.1
"""Pause between attempts after a transient error (librdkafka's default retry.backoff.ms), so
errors that come back at once (a destroyed broker handle) do not spin."""

T = TypeVar("T")


def make_value(i: int, prefix: bytes = VALUE_PREFIX) -> bytes:
    """The i-th unique message value, e.g. ``b"m-000123"``."""
    return prefix + b"%06d" % i


def expected_values(n: int, prefix: bytes = VALUE_PREFIX) -> list[bytes]:
    """The values produced by ``produce_*(…, n)``, in order."""
    return [make_value(i, prefix) for i in range(n)]


def duplicates(values: list[bytes]) -> dict[bytes, int]:
    """Values seen more than once, with their counts."""
    return {v: c for v, c in collections.Counter(values).items() if c > 1}


@dataclass
class ProduceResult:
    """What a producer reported for N sends.

    ``delivered`` counts sends the client reported as successful. With acks=0 that only
    means "handed to the connection", so it says nothing about what the broker stored.
    ``correlation_errors`` counts CorrelationIdError seen in delivery reports or logged by
    kafka-python when it drops a connection (the log is process-wide, so concurrent
    producers in other threads are counted too). ``connection_losses`` likewise.
    """

    topic: str
    attempted: int
    delivered: int = 0
    failed: int = 0
    undelivered: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    correlation_errors: int = 0
    connection_losses: int = 0
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        """Every send reported delivered and no error was seen."""
        return self.delivered == self.attempted and not self.errors and not self.correlation_errors


# -- transient errors ------------------------------------------------------------------------

_E = confluent_kafka.KafkaError
TRANSIENT_CONFLUENT_CODES = frozenset(
    {
        # What librdkafka's own rd_kafka_err_action() answers with RETRY or REFRESH (ask again,
        # perhaps after a metadata refresh) ...
        _E._TRANSPORT,
        _E._TIMED_OUT,
        _E._TIMED_OUT_QUEUE,
        _E._WAIT_COORD,
        _E._DESTROY_BROKER,  # a broker handle decommissioned, e.g. by a KIP-899 re-bootstrap
        _E.LEADER_NOT_AVAILABLE,
        _E.NOT_LEADER_FOR_PARTITION,
        _E.BROKER_NOT_AVAILABLE,
        _E.REPLICA_NOT_AVAILABLE,
        _E.COORDINATOR_NOT_AVAILABLE,
        _E.NOT_COORDINATOR,
        _E.COORDINATOR_LOAD_IN_PROGRESS,
        _E.KAFKA_STORAGE_ERROR,
        _E.REQUEST_TIMED_OUT,
        _E.NOT_ENOUGH_REPLICAS,
        _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        # ... and the local and broker states that only mean "not known (again) yet".
        _E._ALL_BROKERS_DOWN,
        _E._RESOLVE,
        _E._NODE_UPDATE,
        _E._UNKNOWN_BROKER,
        _E._UNKNOWN_PARTITION,  # leader not yet known after a reconnect
        _E._WAIT_CACHE,
        _E._RETRY,
        _E.NETWORK_EXCEPTION,
        _E.UNKNOWN_TOPIC_OR_PART,
        _E.FENCED_LEADER_EPOCH,
        _E.UNKNOWN_LEADER_EPOCH,
        _E.OFFSET_NOT_AVAILABLE,
    }
)
"""confluent-kafka error codes a read-back asks again after. Each is about a connection, a broker
handle or cluster state, never about the data. Left out on purpose: ``_DESTROY`` (our own handle
is closing), ``_SSL`` (usually configuration), ``_BAD_MSG`` and ``INVALID_MSG`` (damaged data
must fail loudly). ``KafkaError.retriable()`` alone is not enough: confluent-kafka sets it only
for errors librdkafka hands over as ``rd_kafka_error_t`` (admin, transactions), never for the
plain error codes that ``get_watermark_offsets`` or ``list_topics`` raise."""


def is_transient_confluent(error: confluent_kafka.KafkaError) -> bool:
    """True when asking again may succeed; a fatal error never is (the client is unusable)."""
    if error.fatal():
        return False
    return error.retriable() or error.code() in TRANSIENT_CONFLUENT_CODES


def is_transient(exc: BaseException) -> bool:
    """True for a client error that a retry may cure, from either client library.

    kafka-python marks its retriable errors itself (``RetriableError`` and friends), except
    that a CorrelationIdError is never transient here: it means an answer reached the wrong
    request, which is exactly what corrfix must never let happen, so it must stay loud.
    """
    if isinstance(exc, confluent_kafka.KafkaException):
        error = exc.args[0] if exc.args else None
        return isinstance(error, confluent_kafka.KafkaError) and is_transient_confluent(error)
    if isinstance(exc, kafka.errors.CorrelationIdError):
        return False
    return isinstance(exc, kafka.errors.KafkaError) and bool(exc.retriable)


def retry_transient(
    call: Callable[[], T],
    deadline: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, repeated after each transient error until ``deadline``.

    A non-transient error is raised at once; a transient one still failing at the deadline
    is raised then, so a read-back that cannot finish says why instead of returning short.
    Retrying a query never adds values, so it cannot hide a loss: callers count what they read.
    """
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc) or clock() >= deadline:
                raise
        sleep(max(min(RETRY_PAUSE, deadline - clock()), 0.0))


# -- topics ----------------------------------------------------------------------------------


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, *, exist_ok: bool = False, timeout: float = 10.0
) -> None:
    """Create ``name`` with kafka-python's admin client (replication factor 1).

    Transient errors are retried until ``timeout``. A retry that finds the topic existing
    counts as success: the attempt before it failed without reporting "already exists", so
    the topic is taken to be the one that attempt created before its answer was lost.
    """
    deadline = time.monotonic() + timeout
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        budget_ms = int(max(deadline - time.monotonic(), 1.0) * 1000)
        admin = kafka.KafkaAdminClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=budget_ms,
            bootstrap_timeout_ms=budget_ms,
            client_id="corrfix-tests-admin",
        )
        try:
            admin.create_topics(
                [kafka.admin.NewTopic(name, partitions, 1)], timeout_ms=budget_ms, raise_errors=True
            )
        except kafka.errors.TopicAlreadyExistsError:
            if not exist_ok and attempts == 1:
                raise
        finally:
            admin.close()

    retry_transient(attempt, deadline)


def create_topic_confluent(bootstrap: str, name: str, partitions: int = 1, *, timeout: float = 10.0) -> None:
    """Create ``name`` with confluent-kafka's AdminClient (replication factor 1).

    Transient errors are retried until ``timeout``, like :func:`create_topic`.
    """
    deadline = time.monotonic() + timeout
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        budget = max(deadline - time.monotonic(), 1.0)
        futures = admin.create_topics(
            [confluent_kafka.admin.NewTopic(name, partitions, 1)],
            operation_timeout=budget,
            request_timeout=budget,
        )
        try:
            futures[name].result(timeout=budget)
        except confluent_kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            already = isinstance(error, confluent_kafka.KafkaError) and (
                error.code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
            )
            if not already or attempts == 1:
                raise

    retry_transient(attempt, deadline)


# -- kafka-python ----------------------------------------------------------------------------


class _KafkaLogCounter(logging.Handler):
    """Counts connection losses that kafka-python only logs (e.g. CorrelationIdError)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.correlation_errors = 0
        self.connection_losses = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != "kafka.net.connection":
            return
        message = record.getMessage()
        if "Connection lost" in message:
            self.connection_losses += 1
            if "CorrelationIdError" in message:
                self.correlation_errors += 1


@contextlib.contextmanager
def _count_kafka_logs() -> Iterator[_KafkaLogCounter]:
    counter = _KafkaLogCounter()
    logger = logging.getLogger("kafka.net.connection")
    level = logger.level
    if logger.getEffectiveLevel() > logging.ERROR:
        logger.setLevel(logging.ERROR)  # the records must exist for the handler to see them
    logger.addHandler(counter)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)


def _record_failure(result: ProduceResult, exc: BaseException) -> None:
    result.failed += 1
    result.errors[type(exc).__name__] += 1
    if isinstance(exc, kafka.errors.CorrelationIdError):
        result.correlation_errors += 1


def produce_kafka_python(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    acks: int | Literal["all"] = 1,
    sync: bool = False,
    idempotent: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    prefix: bytes = VALUE_PREFIX,
    config: Mapping[str, Any] | None = None,
) -> ProduceResult:
    """Send ``n`` unique values with ``KafkaProducer`` and count what it reports.

    ``sync=True`` waits for each send before the next (one request in flight), else all
    are sent and then flushed. ``timeout`` bounds the whole run and each delivery;
    ``config`` overrides producer settings (e.g. ``request_timeout_ms``).
    """
    timeout_ms = int(timeout * 1000)
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "corrfix-tests-producer",
        "acks": acks,
        "enable_idempotence": idempotent,
        "linger_ms": 5,
        "request_timeout_ms": min(10_000, timeout_ms),
        "delivery_timeout_ms": timeout_ms,
        "max_block_ms": timeout_ms,
        "bootstrap_timeout_ms": timeout_ms,
    }
    settings.update(config or {})
    result = ProduceResult(topic=topic, attempted=n)
    start = time.monotonic()
    deadline = start + timeout
    with _count_kafka_logs() as logs:
        producer = kafka.KafkaProducer(**settings)
        try:
            futures = []
            for i in range(n):
                try:
                    future = producer.send(topic, make_value(i, prefix))
                except kafka.errors.KafkaError as exc:
                    _record_failure(result, exc)
                    continue
                if sync:
                    try:
                        future.get(timeout=max(deadline - time.monotonic(), 0.001))
                        result.delivered += 1
                    except kafka.errors.KafkaTimeoutError as exc:
                        _record_failure(result, exc)
                        break  # the run's deadline is gone
                    except kafka.errors.KafkaError as exc:
                        _record_failure(result, exc)
                else:
                    futures.append(future)
            if futures:
                with contextlib.suppress(kafka.errors.KafkaTimeoutError):
                    producer.flush(timeout=max(deadline - time.monotonic(), 0.001))
                for future in futures:
                    if not future.is_done:
                        result.undelivered += 1
                    elif future.succeeded():
                        result.delivered += 1
                    else:
                        _record_failure(result, future.exception)
        finally:
            # Past the deadline, unsent records are counted as undelivered, not raised.
            with contextlib.suppress(kafka.errors.KafkaTimeoutError):
                producer.close(timeout=max(min(5.0, deadline - time.monotonic()), 0.5))
    result.undelivered += n - result.delivered - result.failed - result.undelivered
    result.correlation_errors += logs.correlation_errors
    result.connection_losses = logs.connection_losses
    result.elapsed = time.monotonic() - start
    return result


def consume_kafka_python(
    bootstrap: str,
    topic: str,
    expected: int | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    settle: float = 1.0,
    config: Mapping[str, Any] | None = None,
) -> list[bytes]:
    """:func:`consume_all` with ``KafkaConsumer``; see there."""
    timeout_ms = int(timeout * 1000)
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "corrfix-tests-consumer",
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100,  # Tansu's long poll does not wake early when data arrives
        "request_timeout_ms": min(10_000, timeout_ms),
        "bootstrap_timeout_ms": timeout_ms,
    }
    settings.update(config or {})
    deadline = time.monotonic() + timeout
    consumer = kafka.KafkaConsumer(**settings)
    try:
        partitions = _wait_for(
            lambda: consumer.partitions_for_topic(topic), deadline, f"partitions of {topic!r}"
        )
        tps = [kafka.TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []

        def budget_ms() -> int:
            return int(max(min(5.0, deadline - time.monotonic()), 0.1) * 1000)

        def end_offsets() -> dict[int, int]:
            def ask() -> dict[int, int]:
                return {tp.partition: off for tp, off in consumer.end_offsets(tps, budget_ms()).items()}

            return retry_transient(ask, deadline)

        def positions() -> dict[int, int]:
            def ask() -> dict[int, int]:
                # None: the position is being reset and not known yet, so not caught up either.
                found = {tp.partition: consumer.position(tp, timeout_ms=budget_ms()) for tp in tps}
                return {p: -1 if pos is None else pos for p, pos in found.items()}

            return retry_transient(ask, deadline)

        def poll(wait: float) -> int:
            def ask() -> dict[Any, list[Any]]:
                return consumer.poll(timeout_ms=int(wait * 1000), max_records=5000)

            batches = retry_transient(ask, deadline)
            got = [r.value for records in batches.values() for r in records]
            values.extend(got)
            return len(got)

        _drain(poll, positions, end_offsets, values, expected, deadline, settle)
        return values
    finally:
        consumer.close(autocommit=False)


# -- confluent-kafka -------------------------------------------------------------------------


def produce_confluent(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    acks: int | Literal["all"] = 1,
    idempotent: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    prefix: bytes = VALUE_PREFIX,
    config: Mapping[str, Any] | None = None,
) -> ProduceResult:
    """Send ``n`` unique values with confluent-kafka's ``Producer`` and count delivery reports.

    ``idempotent=True`` sets ``enable.idempotence`` (librdkafka then forces acks=all).
    """
    timeout_ms = int(timeout * 1000)
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": "corrfix-tests-producer",
        "enable.idempotence": idempotent,
        "linger.ms": 5,
        "message.timeout.ms": timeout_ms,
        "socket.timeout.ms": min(10_000, timeout_ms),
    }
    if not idempotent:
        settings["acks"] = str(acks)
    settings.update(config or {})
    result = ProduceResult(topic=topic, attempted=n)

    def on_delivery(err: confluent_kafka.KafkaError | None, _msg: confluent_kafka.Message) -> None:
        if err is None:
            result.delivered += 1
        else:
            result.failed += 1
            result.errors[err.name()] += 1

    start = time.monotonic()
    deadline = start + timeout
    producer = confluent_kafka.Producer(settings)
    for i in range(n):
        while True:
            try:
                producer.produce(topic, make_value(i, prefix), on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                if time.monotonic() >= deadline:
                    result.errors["BufferError"] += 1
                    break
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(max(deadline - time.monotonic(), 0.001))
    result.undelivered = n - result.delivered - result.failed
    result.elapsed = time.monotonic() - start
    return result


def consume_confluent(
    bootstrap: str,
    topic: str,
    expected: int | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    settle: float = 1.0,
    config: Mapping[str, Any] | None = None,
) -> list[bytes]:
    """:func:`consume_all` with confluent-kafka's ``Consumer``; see there."""
    timeout_ms = int(timeout * 1000)
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": "corrfix-tests-consumer",
        "group.id": f"corrfix-tests-{uuid.uuid4().hex}",  # required by librdkafka, never joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,  # Tansu's long poll does not wake early when data arrives
        "socket.timeout.ms": min(10_000, timeout_ms),
    }
    settings.update(config or {})
    deadline = time.monotonic() + timeout
    consumer = confluent_kafka.Consumer(settings)
    try:

        def partition_ids() -> list[int] | None:
            wait = max(min(2.0, deadline - time.monotonic()), 0.1)
            meta = consumer.list_topics(topic, timeout=wait).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return None
            return sorted(meta.partitions)

        ids = _wait_for(partition_ids, deadline, f"partitions of {topic!r}")
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in ids]
        )
        values: list[bytes] = []
        next_offsets = dict.fromkeys(ids, 0)

        def end_offset(p: int) -> int:
            wait = max(min(5.0, deadline - time.monotonic()), 0.1)
            tp = confluent_kafka.TopicPartition(topic, p)
            return consumer.get_watermark_offsets(tp, timeout=wait, cached=False)[1]

        def end_offsets() -> dict[int, int]:
            # A killed connection to a cluster's only broker makes librdkafka (2.10+) re-bootstrap
            # and destroy that broker's handle, failing the query with _DESTROY_BROKER; it
            # reconnects on its own, so every transient error is asked again.
            return {p: retry_transient(functools.partial(end_offset, p), deadline) for p in ids}

        def poll(wait: float) -> int:
            got = 0
            for msg in consumer.consume(num_messages=5000, timeout=wait):
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise confluent_kafka.KafkaException(error)
                    continue
                values.append(msg.value())  # type: ignore[arg-type]  # the lab writes no null values
                next_offsets[msg.partition()] = msg.offset() + 1  # type: ignore[operator]  # a fetched record has one
                got += 1
            return got

        _drain(poll, lambda: dict(next_offsets), end_offsets, values, expected, deadline, settle)
        return values
    finally:
        consumer.close()


# -- consumer groups ---------------------------------------------------------------------------


GROUP_SESSION_TIMEOUT_MS = 6000
"""Short, because Tansu holds the first JoinGroup of a group for half the session timeout."""
COMMIT_GRACE = 10.0
"""Seconds a group read's final commit may keep retrying transient errors past its deadline."""


def consume_group(
    bootstrap: str,
    topic: str,
    group: str,
    limit: int,
    *,
    client: Literal["confluent", "kafka-python"] = "confluent",
    timeout: float = DEFAULT_TIMEOUT,
    session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS,
    config: Mapping[str, Any] | None = None,
) -> list[bytes]:
    """Join ``group`` on ``topic``, read exactly ``limit`` values, commit them, and leave.

    Offsets start at the group's committed offsets (earliest when it has none), so a second
    call with the same group resumes where the first one stopped. The commit is synchronous
    and only covers what was returned. Returns early with fewer values at ``timeout``.
    """
    deadline = time.monotonic() + timeout
    consumer: Any
    if client == "confluent":
        consumer = group_consumer_confluent(bootstrap, group, session_timeout_ms, config)

        def poll(most: int) -> list[bytes]:
            return group_values_confluent(consumer, most)

        def commit() -> None:
            consumer.commit(asynchronous=False)

        close = consumer.close
    else:
        consumer = _group_consumer_kafka_python(bootstrap, group, session_timeout_ms, config)

        def poll(most: int) -> list[bytes]:
            batches = consumer.poll(timeout_ms=200, max_records=most)
            return [r.value for records in batches.values() for r in records]

        commit = consumer.commit
        close = functools.partial(consumer.close, autocommit=False)
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        while len(values) < limit and time.monotonic() < deadline:
            values.extend(poll(limit - len(values)))
        if values:
            # Committing the same offsets again is harmless; the commit may outlive the read.
            retry_transient(commit, max(deadline, time.monotonic() + COMMIT_GRACE))
        return values
    finally:
        close()


def group_consumer_confluent(
    bootstrap: str,
    group: str,
    session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS,
    config: Mapping[str, Any] | None = None,
) -> confluent_kafka.Consumer:
    """A confluent-kafka group member that starts at the earliest offset when nothing is committed."""
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": "corrfix-tests-group",
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(session_timeout_ms // 6, 100),
        "fetch.wait.max.ms": 100,  # Tansu's long poll does not wake early when data arrives
        "socket.timeout.ms": 10_000,
    }
    settings.update(config or {})
    return confluent_kafka.Consumer(settings)


def group_values_confluent(consumer: confluent_kafka.Consumer, most: int, wait: float = 0.2) -> list[bytes]:
    """Up to ``most`` values from one poll; a fatal error raises, others are skipped."""
    values: list[bytes] = []
    for msg in consumer.consume(num_messages=most, timeout=wait):
        error = msg.error()
        if error is None:
            values.append(msg.value())  # type: ignore[arg-type]  # the lab writes no null values
        elif error.fatal():
            raise confluent_kafka.KafkaException(error)
    return values


def _group_consumer_kafka_python(
    bootstrap: str, group: str, session_timeout_ms: int, config: Mapping[str, Any] | None
) -> kafka.KafkaConsumer:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "corrfix-tests-group",
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": session_timeout_ms,
        "heartbeat_interval_ms": max(session_timeout_ms // 6, 100),
        "fetch_max_wait_ms": 100,
        "request_timeout_ms": 10_000,
    }
    settings.update(config or {})
    return kafka.KafkaConsumer(**settings)


# -- shared ----------------------------------------------------------------------------------


def consume_all(
    bootstrap: str,
    topic: str,
    expected: int | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    settle: float = 1.0,
    client: Literal["confluent", "kafka-python"] = "confluent",
    config: Mapping[str, Any] | None = None,
) -> list[bytes]:
    """Read ``topic`` from the earliest offset and return the values in the order read.

    Partitions are assigned directly (no consumer group, so no JoinGroup delay). Stops when
    ``expected`` values have been read and every partition is read up to its end offset
    (so duplicates already stored are included), or, when fewer arrive, once every
    partition is read to its end and the end offsets stayed put for ``settle`` seconds
    (records still in flight to the broker, e.g. after acks=0, keep moving them). Never
    runs past ``timeout``; returns what it has then, so callers assert on the result.
    """
    if client == "confluent":
        return consume_confluent(bootstrap, topic, expected, timeout=timeout, settle=settle, config=config)
    return consume_kafka_python(bootstrap, topic, expected, timeout=timeout, settle=settle, config=config)


def _wait_for(probe: Any, deadline: float, what: str) -> Any:
    """Call ``probe`` until it returns something truthy, or raise TimeoutError at ``deadline``.

    A transient client error counts as "not yet"; one still failing at the deadline is raised.
    """
    while True:
        value = retry_transient(probe, deadline)
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _drain(
    poll: Any,
    positions: Any,
    end_offsets: Any,
    values: list[bytes],
    expected: int | None,
    deadline: float,
    settle: float,
) -> None:
    """The stop rule of :func:`consume_all`, shared by both clients."""
    ends = end_offsets()
    stable_since = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline:
            return
        got = poll(min(0.2, deadline - now))
        pos = positions()
        if got or not all(pos.get(p, 0) >= end for p, end in ends.items()):
            continue
        new_ends = end_offsets()
        if new_ends != ends:
            ends, stable_since = new_ends, time.monotonic()
            continue
        if expected is not None and len(values) >= expected:
            return
        if time.monotonic() - stable_since >= settle:
            return


# -- raw protocol ----------------------------------------------------------------------------


def api_versions(bootstrap: str, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """Send a raw ApiVersions v0 request; return ``{api_key: (min, max)}``.

    Proves a broker answers Kafka requests without involving any client library.
    """
    host, _, port = bootstrap.rpartition(":")
    correlation_id = 0x5EED
    client_id = b"corrfix-tests"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        payload = _recv_exactly(sock, size)
    got_id, error_code, count = struct.unpack_from(">ihi", payload, 0)
    if got_id != correlation_id:
        raise AssertionError(f"ApiVersions answered with correlation id {got_id}, sent {correlation_id}")
    if error_code != 0:
        raise AssertionError(f"ApiVersions error code {error_code}")
    return {
        key: (lo, hi)
        for key, lo, hi in (struct.unpack_from(">hhh", payload, 10 + 6 * i) for i in range(count))
    }


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)
