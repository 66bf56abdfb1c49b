"""The workload helpers' error handling, without a broker: which client errors a read-back asks
again after, and that a read-back survives them yet still reports what is really missing.

The fakes replay what the chaos soak caught librdkafka doing (issue #13): after a killed
connection to Tansu's only broker, librdkafka 2.10+ re-bootstraps, destroys that broker's
handle and fails a pending ``get_watermark_offsets`` with ``_DESTROY_BROKER``; after a lost
ApiVersions answer, ``list_topics`` fails with ``_TRANSPORT``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import kafka
import kafka.errors
import pytest

from corrfix.lab import SoakOutcome, SoakPlan, workload
from corrfix.lab._soak import IDEMPOTENT_PREFIX, PLAIN_PREFIX

E = confluent_kafka.KafkaError


def confluent_error(
    code: int, *, fatal: bool = False, retriable: bool = False
) -> confluent_kafka.KafkaException:
    return confluent_kafka.KafkaException(E(code, fatal=fatal, retriable=retriable))


@pytest.fixture(autouse=True)
def no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "RETRY_PAUSE", 0.0)


# -- classification ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        confluent_error(E._DESTROY_BROKER),  # the soak's failure: a re-bootstrapped broker handle
        confluent_error(E._TRANSPORT),
        confluent_error(E._ALL_BROKERS_DOWN),
        confluent_error(E._TIMED_OUT),
        confluent_error(E._UNKNOWN_PARTITION),
        confluent_error(E.NOT_LEADER_FOR_PARTITION),
        confluent_error(E.REQUEST_TIMED_OUT),
        confluent_error(E._INVALID_ARG, retriable=True),  # librdkafka's own verdict wins
        kafka.errors.KafkaTimeoutError(),
        kafka.errors.KafkaConnectionError(),
        kafka.errors.NotLeaderForPartitionError(),
    ],
    ids=repr,
)
def test_transient_errors_are_asked_again(exc: BaseException) -> None:
    assert workload.is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        confluent_error(E._TRANSPORT, fatal=True),  # a fatal error is never retried
        confluent_error(E._DESTROY),  # our own handle is closing
        confluent_error(E._BAD_MSG),  # damaged data must stay loud
        confluent_error(E._SSL),
        confluent_error(E._INVALID_ARG),
        confluent_error(E.TOPIC_AUTHORIZATION_FAILED),
        confluent_kafka.KafkaException("not a KafkaError"),
        kafka.errors.CorrelationIdError(),  # an answer reached the wrong request: corrfix's bug
        kafka.errors.IllegalStateError(),
        kafka.errors.TopicAlreadyExistsError(),
        ValueError("not a client error"),
    ],
    ids=repr,
)
def test_other_errors_are_not_transient(exc: BaseException) -> None:
    assert not workload.is_transient(exc)


# -- retry_transient --------------------------------------------------------------------------


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Flaky:
    """Raises the given errors in turn, then returns ``result``."""

    def __init__(self, errors: list[BaseException], result: str = "done") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def test_retry_transient_asks_again_until_it_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "RETRY_PAUSE", 0.1)
    clock = FakeClock()
    call = Flaky([confluent_error(E._DESTROY_BROKER), confluent_error(E._ALL_BROKERS_DOWN)])
    assert workload.retry_transient(call, deadline=10.0, clock=clock, sleep=clock.sleep) == "done"
    assert call.calls == 3
    assert clock.slept == [0.1, 0.1]


def test_retry_transient_raises_other_errors_at_once() -> None:
    clock = FakeClock()
    call = Flaky([confluent_error(E.TOPIC_AUTHORIZATION_FAILED)])
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        workload.retry_transient(call, deadline=10.0, clock=clock, sleep=clock.sleep)
    assert raised.value.args[0].code() == E.TOPIC_AUTHORIZATION_FAILED
    assert call.calls == 1


def test_retry_transient_raises_the_transient_error_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "RETRY_PAUSE", 1.0)
    clock = FakeClock()
    call = Flaky([confluent_error(E._TRANSPORT)] * 100)
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        workload.retry_transient(call, deadline=2.5, clock=clock, sleep=clock.sleep)
    assert raised.value.args[0].code() == E._TRANSPORT
    assert clock.now == 2.5  # the last pause is cut to the deadline, then one last attempt
    assert call.calls == 4


# -- the read-backs through fake clients --------------------------------------------------------


@dataclass
class FakeMessage:
    """What ``Consumer.consume`` returns, for a record."""

    _partition: int
    _offset: int
    _value: bytes

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


@dataclass
class TopicMeta:
    partitions: dict[int, Any]
    error: Any = None


@dataclass
class ClusterMeta:
    topics: dict[str, TopicMeta]


@dataclass
class FakeConfluentConsumer:
    """A topic of two partitions that each hold ``records[p]``; errors come from ``faults``."""

    settings: dict[str, Any]
    records: dict[int, list[bytes]] = field(default_factory=dict)
    faults: dict[str, list[BaseException]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    delivered: bool = False
    closed: bool = False

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.faults.get(name):
            raise self.faults[name].pop(0)

    def list_topics(self, topic: str, timeout: float) -> ClusterMeta:
        self._call("list_topics")
        return ClusterMeta({topic: TopicMeta(dict.fromkeys(self.records))})

    def assign(self, partitions: list[confluent_kafka.TopicPartition]) -> None:
        assert sorted(tp.partition for tp in partitions) == sorted(self.records)

    def get_watermark_offsets(
        self, tp: confluent_kafka.TopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        self._call("get_watermark_offsets")
        return 0, len(self.records[tp.partition])

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        if self.delivered:
            return []
        self.delivered = True
        return [FakeMessage(p, o, v) for p, values in self.records.items() for o, v in enumerate(values)]

    def close(self) -> None:
        self.closed = True


def fake_confluent(
    monkeypatch: pytest.MonkeyPatch, records: dict[int, list[bytes]], faults: dict[str, list[BaseException]]
) -> list[FakeConfluentConsumer]:
    made: list[FakeConfluentConsumer] = []

    def make(settings: dict[str, Any]) -> FakeConfluentConsumer:
        made.append(FakeConfluentConsumer(settings, records, faults))
        return made[-1]

    monkeypatch.setattr(confluent_kafka, "Consumer", make)
    return made


def test_confluent_read_back_survives_a_destroyed_broker_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    records = {0: [b"m-000000", b"m-000002"], 1: [b"m-000001"]}
    faults: dict[str, list[BaseException]] = {
        "list_topics": [confluent_error(E._TRANSPORT)],
        "get_watermark_offsets": [confluent_error(E._DESTROY_BROKER), confluent_error(E._ALL_BROKERS_DOWN)],
    }
    made = fake_confluent(monkeypatch, records, faults)
    values = workload.consume_confluent("proxy:9092", "t", 3, timeout=30.0)
    assert sorted(values) == workload.expected_values(3)
    (consumer,) = made
    assert consumer.calls["list_topics"] == 2
    assert consumer.calls["get_watermark_offsets"] >= 2 + 2  # two retries, then both partitions
    assert consumer.closed


def test_confluent_read_back_raises_a_permanent_error(monkeypatch: pytest.MonkeyPatch) -> None:
    faults: dict[str, list[BaseException]] = {
        "get_watermark_offsets": [confluent_error(E.TOPIC_AUTHORIZATION_FAILED)]
    }
    made = fake_confluent(monkeypatch, {0: [b"m-000000"]}, faults)
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        workload.consume_confluent("proxy:9092", "t", 1, timeout=30.0)
    assert raised.value.args[0].code() == E.TOPIC_AUTHORIZATION_FAILED
    assert made[0].calls["get_watermark_offsets"] == 1
    assert made[0].closed


@dataclass
class FakeRecord:
    value: bytes


class FakeKafkaPythonConsumer:
    """One partition holding ``values``; ``end_offsets`` and ``position`` fail first."""

    def __init__(self, values: list[bytes], faults: dict[str, list[BaseException]]) -> None:
        self.values = values
        self.faults = faults
        self.calls: dict[str, int] = {}
        self.read = 0
        self.closed = False

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.faults.get(name):
            raise self.faults[name].pop(0)

    def partitions_for_topic(self, topic: str) -> set[int]:
        self._call("partitions_for_topic")
        return {0}

    def assign(self, tps: list[kafka.TopicPartition]) -> None:
        self.tps = tps

    def seek_to_beginning(self, *tps: kafka.TopicPartition) -> None:
        self.read = 0

    def end_offsets(self, tps: list[kafka.TopicPartition], timeout_ms: int) -> dict[Any, int]:
        self._call("end_offsets")
        return {tp: len(self.values) for tp in tps}

    def position(self, tp: kafka.TopicPartition, timeout_ms: int) -> int | None:
        self._call("position")
        return self.read

    def poll(self, timeout_ms: int, max_records: int) -> dict[Any, list[FakeRecord]]:
        self._call("poll")
        batch = [FakeRecord(v) for v in self.values[self.read :]]
        self.read = len(self.values)
        return {self.tps[0]: batch} if batch else {}

    def close(self, autocommit: bool) -> None:
        self.closed = True


def test_kafka_python_read_back_survives_transient_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    values = workload.expected_values(4)
    faults: dict[str, list[BaseException]] = {
        "partitions_for_topic": [kafka.errors.KafkaConnectionError()],
        "end_offsets": [kafka.errors.KafkaTimeoutError()],
        "position": [kafka.errors.NodeNotReadyError()],
        "poll": [kafka.errors.KafkaConnectionError()],
    }
    consumer = FakeKafkaPythonConsumer(values, faults)
    monkeypatch.setattr(kafka, "KafkaConsumer", lambda **settings: consumer)
    assert workload.consume_kafka_python("proxy:9092", "t", 4, timeout=30.0) == values
    assert all(consumer.calls[name] >= 2 for name in faults)
    assert consumer.closed


def test_kafka_python_read_back_raises_a_correlation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = FakeKafkaPythonConsumer([b"m-000000"], {"end_offsets": [kafka.errors.CorrelationIdError()]})
    monkeypatch.setattr(kafka, "KafkaConsumer", lambda **settings: consumer)
    with pytest.raises(kafka.errors.CorrelationIdError):
        workload.consume_kafka_python("proxy:9092", "t", 1, timeout=30.0)
    assert consumer.calls["end_offsets"] == 1


# -- the soak's verdict still counts ----------------------------------------------------------


def soak_outcome(stored_plain: list[bytes], **changes: Any) -> SoakOutcome:
    plan = SoakPlan(messages=3)
    plain = workload.expected_values(3, PLAIN_PREFIX)
    idempotent = workload.expected_values(3, IDEMPOTENT_PREFIX)
    fields: dict[str, Any] = {
        "plan": plan,
        "plain": workload.ProduceResult("p", 3, delivered=3),
        "idempotent": workload.ProduceResult("i", 3, delivered=3),
        "stored_plain": stored_plain,
        "stored_idempotent": idempotent,
        "group_seen": set(plain) | set(idempotent),
        "flagged_values": set(),
        "client_order_errors": [],
        "rows_lost": 0,
        "chaos": {},
    }
    fields.update(changes)
    return SoakOutcome(**fields)


def test_soak_verdict_passes_a_complete_read_back() -> None:
    assert soak_outcome(workload.expected_values(3, PLAIN_PREFIX)).problems() == []


def test_soak_verdict_reports_a_message_missing_from_the_read_back() -> None:
    problems = soak_outcome(workload.expected_values(3, PLAIN_PREFIX)[:2]).problems()
    assert problems == ["1 kafka-python messages lost, e.g. [b'kp-000002']"]


def test_soak_verdict_reports_a_failed_group_member() -> None:
    outcome = soak_outcome(workload.expected_values(3, PLAIN_PREFIX), group_errors=["fatal: fenced"])
    assert outcome.problems() == ["consumer group members failed: ['fatal: fenced']"]
