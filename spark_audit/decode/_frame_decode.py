"""Kafka bodies to flat facts, with kafka-python: plain Python, no Spark (run in executors).

Produce requests are the exception: :mod:`._produce_scalar` reads their record batch
headers by hand (throughput), and hands anything unusual back to kafka-python. So is
ConsumerGroupHeartbeat, which kafka-python has no class for (:mod:`._consumer_group`).

Only the api keys some check needs are decoded (``REQUEST_KEYS``, ``RESPONSE_KEYS``); each
decoded frame gives zero or more facts, dicts of :data:`spark_audit.decode.FACT_SCHEMA`
fields. ``error`` facts come from any decoded response: every non-zero ``error_code`` in
the body, with the group, topic and partition around it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from protocol import (
    RECORD_BATCH_LOG_OVERHEAD,
    ApiKey,
    ProtocolError,
    parse_request_header,
    request_class,
    response_body_offset,
    response_class,
)
from spark_audit.decode._consumer_group import HIGHEST_VERSION, heartbeat_answer, heartbeat_request
from spark_audit.decode._produce_scalar import produce_batch_facts

Fact = dict[str, Any]

OFFSET_FETCH_BATCHED = 8
METADATA_CLUSTER_ID = 2
"""The first Metadata version whose answer names its cluster."""
GROUP_REQUESTS = frozenset(
    {
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.JOIN_GROUP,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.DELETE_GROUPS,
        ApiKey.OFFSET_DELETE,
    }
)
HAND_READ: dict[int, tuple[Callable[[bytes], list[Fact]], Callable[[bytes], list[Fact]]]] = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (heartbeat_request, heartbeat_answer)
}
"""Keys kafka-python has no class for, read by hand (request, answer), looked up by a frame's int key."""
TRANSACTION_KEYS = frozenset({ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN})
"""A transaction's offsets (TxnOffsetCommit) are committed when it commits (EndTxn)."""
REQUEST_KEYS = frozenset({ApiKey.PRODUCE}) | GROUP_REQUESTS | frozenset(HAND_READ) | TRANSACTION_KEYS
RESPONSE_KEYS = (
    frozenset(
        {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH}
        | {ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER}
    )
    | GROUP_REQUESTS
    | frozenset(HAND_READ)
    | TRANSACTION_KEYS
)
DECODED_KEYS = REQUEST_KEYS | RESPONSE_KEYS


class Undecodable(Exception):
    """The frame cannot be decoded (cut by the snap length, unknown version, malformed)."""


def decode(api_key: int, api_version: int, direction: str, frame: bytes, frame_length: int) -> list[Fact]:
    """Facts of one frame (size prefix included); one ``undecodable`` fact if it cannot be read."""
    if api_key not in (REQUEST_KEYS if direction == "request" else RESPONSE_KEYS):
        return []
    try:
        if len(frame) < frame_length:
            raise Undecodable(f"cut to {len(frame)} of {frame_length} bytes")
        if api_key in HAND_READ:
            return _read_by_hand(api_key, api_version, direction, frame)
        if direction == "request":
            if api_key == ApiKey.PRODUCE and (walked := _walk_produce(api_version, frame)) is not None:
                return walked
            return list(_request_facts(api_key, api_version, _body(api_key, api_version, frame, True)))
        body = _body(api_key, api_version, frame, False)
        found = produce_errors(body) if api_key == ApiKey.PRODUCE else errors(body)
        return list(_response_facts(api_key, api_version, body)) + list(found)
    except Undecodable as exc:
        return [{"fact": "undecodable", "note": str(exc)}]
    except Exception as exc:  # kafka-python raises assorted errors on malformed bodies
        return [{"fact": "undecodable", "note": f"{type(exc).__name__}: {exc}"[:200]}]


def _read_by_hand(api_key: int, api_version: int, direction: str, frame: bytes) -> list[Fact]:
    """Facts of a key of :data:`HAND_READ` (versions up to its :data:`HIGHEST_VERSION`)."""
    if api_version > HIGHEST_VERSION:
        raise Undecodable(f"no decoder for api {api_key} v{api_version}")
    request, answer = HAND_READ[api_key]
    try:
        return request(frame) if direction == "request" else answer(frame)
    except ProtocolError as exc:
        raise Undecodable(str(exc)) from exc


def _walk_produce(api_version: int, frame: bytes) -> list[Fact] | None:
    """A Produce request's batches by :mod:`._produce_scalar` (None: decode it with kafka-python)."""
    cls = request_class(ApiKey.PRODUCE)
    if cls is None or api_version > cls.max_version:
        return None
    try:
        offset = parse_request_header(frame).body_offset
    except ProtocolError:
        return None
    return None if offset is None else produce_batch_facts(frame, offset, api_version)


def _body(api_key: int, api_version: int, frame: bytes, is_request: bool) -> Any:
    cls = request_class(api_key) if is_request else response_class(api_key)
    if cls is None or api_version > cls.max_version:
        raise Undecodable(f"no decoder for api {api_key} v{api_version}")
    try:
        if is_request:
            offset = parse_request_header(frame).body_offset
        else:
            offset = response_body_offset(frame, api_key, api_version)
    except ProtocolError as exc:
        raise Undecodable(str(exc)) from exc
    if offset is None:
        raise Undecodable("body cannot be located")
    return cls.decode(frame[offset:], version=api_version)


def _topic(obj: Any) -> str | None:
    name = getattr(obj, "name", None) or getattr(obj, "topic", None)
    if name:
        return name
    topic_id = getattr(obj, "topic_id", None)
    return str(topic_id) if topic_id is not None else None


def _request_facts(api_key: int, api_version: int, body: Any) -> Iterator[Fact]:
    if api_key == ApiKey.PRODUCE:
        yield from _produce_batches(body)
        return
    if api_key == ApiKey.OFFSET_COMMIT:
        yield from _commits(body)
    if api_key == ApiKey.TXN_OFFSET_COMMIT:  # committed only if the transaction commits
        producer = _producer(body)
        yield from ({**fact, **producer} for fact in _commits(body))
        return
    if api_key == ApiKey.END_TXN:
        yield {"fact": "txn_commit" if body.committed else "txn_abort", **_producer(body)}
        return
    if api_key == ApiKey.DELETE_GROUPS:
        for group in body.groups_names or ():
            yield {"fact": "group", "group_id": group}
        return
    if api_key == ApiKey.OFFSET_DELETE:  # the group's committed offsets of these partitions
        yield from (fact for fact, _ in _group_partitions(body, "group"))
        return
    if api_key == ApiKey.OFFSET_FETCH:  # require_stable (v7+): pending transactional offsets
        stable = getattr(body, "require_stable", None)
        if api_version >= OFFSET_FETCH_BATCHED:  # a batch of groups
            for group in body.groups or ():
                member = getattr(group, "member_id", None)
                yield {
                    "fact": "group",
                    "group_id": group.group_id,
                    "member_id": member,
                    "require_stable": stable,
                }
            return
        yield {"fact": "group", "group_id": body.group_id, "require_stable": stable}
        return
    member = getattr(body, "member_id", None)
    if member is None and getattr(body, "members", None):
        member = body.members[0].member_id
    generation = getattr(body, "generation_id", None)
    if generation is None:
        generation = getattr(body, "generation_id_or_member_epoch", None)
    yield {"fact": "group", "group_id": body.group_id, "member_id": member, "generation_id": generation}


def _produce_batches(body: Any) -> Iterator[Fact]:
    common = {"acks": body.acks, "transactional_id": getattr(body, "transactional_id", None)}
    for topic in body.topic_data or ():
        for partition in topic.partition_data or ():
            if not partition.records:
                continue
            records = MemoryRecords(bytes(partition.records))
            while (batch := records.next_batch()) is not None:
                fact: Fact = {
                    "fact": "produce_batch",
                    "topic": _topic(topic),
                    "partition": partition.index,
                    **common,
                }
                if isinstance(batch, DefaultRecordBatch):
                    fact.update(
                        producer_id=batch.producer_id,
                        producer_epoch=batch.producer_epoch,
                        base_sequence=batch.base_sequence,
                        record_count=batch.records_count,
                        crc=batch.crc,
                        first_timestamp=batch.first_timestamp,
                        batch_length=batch.size_in_bytes - RECORD_BATCH_LOG_OVERHEAD,
                    )
                yield fact


def _group_partitions(body: Any, kind: str) -> Iterator[tuple[Fact, Any]]:
    """A fact of ``kind`` per partition a group request names (OffsetCommit, OffsetDelete),
    with the decoded partition."""
    for topic in body.topics or ():
        place = {"fact": kind, "group_id": body.group_id, "topic": _topic(topic)}
        for partition in topic.partitions or ():
            yield {**place, "partition": partition.partition_index}, partition


def _producer(body: Any) -> Fact:
    """The transaction a TxnOffsetCommit or EndTxn request belongs to."""
    return {
        "transactional_id": body.transactional_id,
        "producer_id": body.producer_id,
        "producer_epoch": body.producer_epoch,
    }


def _commits(body: Any) -> Iterator[Fact]:
    for fact, partition in _group_partitions(body, "commit"):
        yield {**fact, "offset": partition.committed_offset}


def _response_facts(api_key: int, api_version: int, body: Any) -> Iterator[Fact]:
    if api_key == ApiKey.PRODUCE:
        for topic in body.responses or ():
            for partition in topic.partition_responses or ():
                yield {
                    "fact": "produce_ack",
                    "topic": _topic(topic),
                    "partition": partition.index,
                    "error_code": partition.error_code,
                    "offset": partition.base_offset,
                }
    elif api_key == ApiKey.METADATA:
        cluster = body.cluster_id if api_version >= METADATA_CLUSTER_ID else None
        if cluster:  # also when the answer names no topic: the connection's cluster
            yield {"fact": "cluster", "cluster_id": cluster}
        for topic in body.topics or ():
            for partition in topic.partitions or ():
                yield {
                    "fact": "leader",
                    "topic": _topic(topic),
                    "partition": partition.partition_index,
                    "leader_id": partition.leader_id,
                    "leader_epoch": partition.leader_epoch if api_version >= 7 else None,
                    "error_code": partition.error_code,
                    "isr_size": _size(partition.isr_nodes),
                    "replica_size": _size(partition.replica_nodes),
                    "cluster_id": cluster,
                }
    elif api_key == ApiKey.DESCRIBE_CLUSTER:
        if body.cluster_id:
            yield {"fact": "cluster", "cluster_id": body.cluster_id}
    elif api_key == ApiKey.END_TXN:
        yield {"fact": "txn_end_ack", "error_code": body.error_code}
    elif api_key in (ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT):  # the same answer
        for topic in body.topics or ():
            for partition in topic.partitions or ():
                yield {
                    "fact": "commit_ack",
                    "topic": _topic(topic),
                    "partition": partition.partition_index,
                    "error_code": partition.error_code,
                }
    elif api_key == ApiKey.OFFSET_FETCH:
        yield from _fetched_offsets(body, api_version)
    elif api_key == ApiKey.JOIN_GROUP:
        yield {
            "fact": "generation",
            "generation_id": body.generation_id,
            "member_id": body.member_id,
            "error_code": body.error_code,
        }


def _size(nodes: list[int] | None) -> int | None:
    """How many brokers a Metadata partition lists (None: the list itself is null)."""
    return None if nodes is None else len(nodes)


def _fetched_offsets(body: Any, api_version: int) -> Iterator[Fact]:
    # Up to v7 one group, named only in the request; from v8 a batch of named groups.
    groups = (body.groups or ()) if api_version >= OFFSET_FETCH_BATCHED else [body]
    for group in groups:
        for topic in group.topics or ():
            for partition in topic.partitions or ():
                yield {
                    "fact": "fetched_offset",
                    "group_id": getattr(group, "group_id", None),
                    "topic": _topic(topic),
                    "partition": partition.partition_index,
                    "offset": partition.committed_offset,
                    "error_code": partition.error_code,
                }


_PARTITION_ATTRS = ("partition_index", "index", "partition")


def errors(body: Any) -> Iterator[Fact]:
    """Every non-zero error code in a decoded body, with its group, topic and partition."""
    yield from _walk(body, {})


def produce_errors(body: Any) -> Iterator[Fact]:
    """:func:`errors` of a Produce answer, without the generic walk (it cost more than the
    decode): error codes sit only on partitions, under their topic."""
    for topic in body.responses or ():
        name = _topic(topic)
        for partition in topic.partition_responses or ():
            if partition.error_code:
                code, index = partition.error_code, partition.index
                fact: Fact = {"fact": "error", "error_code": code, "partition": index}
                if isinstance(name, str):
                    fact["topic"] = name
                yield fact


def _walk(obj: Any, context: dict[str, Any]) -> Iterator[Fact]:
    slots = getattr(type(obj), "__slots__", None)
    if not slots:
        return
    values = {name: getattr(obj, name, None) for name in slots}
    context = dict(context)
    group = values.get("group_id") or values.get("key")
    if isinstance(group, str):
        context["group_id"] = group
    if any(isinstance(v, list) for v in values.values()) and ("name" in values or "topic_id" in values):
        topic = _topic(obj)
        if isinstance(topic, str):
            context["topic"] = topic
    for attr in _PARTITION_ATTRS:
        if isinstance(values.get(attr), int):
            context["partition"] = values[attr]
            break
    code = values.get("error_code")
    if isinstance(code, int) and code != 0:
        yield {"fact": "error", "error_code": code, **context}
    for value in values.values():
        if isinstance(value, list):
            for item in value:
                yield from _walk(item, context)
        elif getattr(type(value), "__slots__", None):
            yield from _walk(value, context)
