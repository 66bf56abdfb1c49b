"""Topic ids in a replay: the captured cluster's ids, translated into the target's.

Since KIP-516 some requests name topics by id (Fetch v13+, Produce v13+, OffsetCommit and
OffsetFetch v10+, DeleteTopics v6+, Metadata v10+ when asked by id), and a topic gets a new
id in every cluster that creates it. Replayed as captured, those requests name topics the
target does not know (UNKNOWN_TOPIC_ID, or UNKNOWN_TOPIC_OR_PARTITION from some brokers).

So the captured ids are learned from the captured answers that pair a name with an id
(Metadata, CreateTopics, DescribeTopicPartitions), the target's from the same answers in
the replay (or from a Metadata request of our own), and every ``topic_id`` field of the
requests kafka-python can decode is rewritten before it is sent. What was remapped, what
the target lacks and what the capture never named are counted for the report.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields import SimpleField, StructArrayField, StructField
from kafka.protocol.schemas.fields.codecs import UUID

from protocol import (
    SIZE_PREFIX,
    ApiKey,
    ProtocolError,
    decode_body,
    encode_body,
    parse_request_header,
    request_class,
    response_body_offset,
)

NO_TOPIC_ID = uuid.UUID(int=0)
TOPIC_ID = "topic_id"
_NAME_FIELDS = ("name", "topic", "topic_name")
# Answers that pair a topic's name with its id in the cluster that answered. (DeleteTopics
# answers do too, but for a topic that is gone.)
NAMING_ANSWERS = frozenset({ApiKey.METADATA, ApiKey.CREATE_TOPICS, ApiKey.DESCRIBE_TOPIC_PARTITIONS})
LOOKUP_CLIENT_ID = "corrfix-replay"
DEFAULT_LOOKUP_VERSION = 12


def _struct_objects(struct: StructField, obj: Any, version: int) -> Iterator[tuple[StructField, Any]]:
    """``obj`` and every struct inside it, with its schema, at ``version``."""
    yield struct, obj
    for child in struct._fields:
        if not child.for_version_q(version):
            continue
        value = getattr(obj, child.name, None)
        if isinstance(child, StructArrayField):
            for item in value or ():
                yield from _struct_objects(child.array_of, item, version)
        elif isinstance(child, StructField) and value is not None:
            yield from _struct_objects(child, value, version)


def _has_topic_id(struct: StructField, version: int) -> bool:
    return any(
        f.name == TOPIC_ID and isinstance(f, SimpleField) and f._type is UUID and f.for_version_q(version)
        for f in struct._fields
    )


@cache
def carries_topic_ids(api_key: int, api_version: int) -> bool:
    """Whether kafka-python's request schema has a ``topic_id`` field (type uuid) at this version."""
    cls = request_class(api_key)
    if cls is None or not 0 <= api_version <= cls.max_version:
        return False
    pending = [cls._struct]
    while pending:
        struct = pending.pop()
        if _has_topic_id(struct, api_version):
            return True
        for child in struct._fields:
            if isinstance(child, StructArrayField):
                pending.append(child.array_of)
            elif isinstance(child, StructField):
                pending.append(child)
    return False


def named_topic_ids(message: ApiMessage, version: int) -> Iterator[tuple[str, uuid.UUID]]:
    """(name, id) of every struct in ``message`` that holds both."""
    for struct, obj in _struct_objects(type(message)._struct, message, version):
        if not _has_topic_id(struct, version):
            continue
        topic_id = getattr(obj, TOPIC_ID, None)
        name = next((getattr(obj, n, None) for n in _NAME_FIELDS if getattr(obj, n, None)), None)
        if name and isinstance(topic_id, uuid.UUID) and topic_id != NO_TOPIC_ID:
            yield name, topic_id


def replace_topic_ids(
    message: ApiMessage, version: int, new_id: Callable[[uuid.UUID], uuid.UUID | None]
) -> int:
    """Set every ``topic_id`` to ``new_id(old)`` where that is not None; returns how many changed."""
    changed = 0
    for struct, obj in _struct_objects(type(message)._struct, message, version):
        if not _has_topic_id(struct, version):
            continue
        old = getattr(obj, TOPIC_ID, None)
        if (
            isinstance(old, uuid.UUID)
            and old != NO_TOPIC_ID
            and (new := new_id(old)) is not None
            and new != old
        ):
            setattr(obj, TOPIC_ID, new)
            changed += 1
    return changed


def response_message(frame: bytes, api_key: int, api_version: int) -> ApiMessage:
    """A whole response frame's body, decoded exactly (:class:`ProtocolError` if it cannot be)."""
    return decode_body(
        api_key, api_version, frame[response_body_offset(frame, api_key, api_version) :], request=False
    )


def metadata_request(names: Iterable[str], correlation_id: int, version: int) -> bytes:
    """A framed Metadata request for these topics (no auto-creation), to learn the target's ids."""
    request_cls = request_class(ApiKey.METADATA)
    assert request_cls is not None
    topic = request_cls.MetadataRequestTopic
    message = request_cls[version](
        topics=[topic(name=name, topic_id=NO_TOPIC_ID) for name in sorted(names)],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    message.with_header(correlation_id=correlation_id, client_id=LOOKUP_CLIENT_ID)
    return bytes(message.encode(header=True, framed=True))


def _naming_pairs(
    frame: bytes | None, api_key: int | None, api_version: int | None
) -> list[tuple[str, uuid.UUID]]:
    """(name, id) pairs of an answer that names topics with their ids; none for other answers."""
    if frame is None or api_key not in NAMING_ANSWERS or api_version is None:
        return []
    try:
        return list(named_topic_ids(response_message(frame, api_key, api_version), api_version))
    except ProtocolError:
        return []


@dataclass
class TopicIdMap:
    """Captured ids, the target's ids, and what was done with them."""

    capture_names: dict[uuid.UUID, str] = field(default_factory=dict)
    target_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    remapped: collections.Counter[tuple[str, uuid.UUID, uuid.UUID]] = field(
        default_factory=collections.Counter
    )
    missing_on_target: collections.Counter[str] = field(default_factory=collections.Counter)
    unknown_in_capture: collections.Counter[uuid.UUID] = field(default_factory=collections.Counter)
    lookup_version: int = DEFAULT_LOOKUP_VERSION
    asked: set[str] = field(default_factory=set)  # names looked up on the target already

    def learn_capture(self, frame: bytes | None, api_key: int | None, api_version: int | None) -> None:
        """The captured cluster's ids, from one of its answers."""
        for name, topic_id in _naming_pairs(frame, api_key, api_version):
            self.capture_names[topic_id] = name

    def learn_target(self, frame: bytes | None, api_key: int | None, api_version: int | None) -> None:
        """The target's ids, from one of its answers."""
        for name, topic_id in _naming_pairs(frame, api_key, api_version):
            self.target_ids[name] = topic_id

    def unresolved(self, frame: bytes) -> set[str]:
        """Names of the captured topics this request names by id that the target's ids lack."""
        message, version = self._decoded(frame)
        if message is None:
            return set()
        wanted: set[str] = set()
        for struct, obj in _struct_objects(type(message)._struct, message, version):
            if _has_topic_id(struct, version):
                name = self.capture_names.get(getattr(obj, TOPIC_ID, None))  # type: ignore[arg-type]
                if name is not None and name not in self.target_ids and name not in self.asked:
                    wanted.add(name)
        return wanted

    def rewrite(self, frame: bytes) -> bytes:
        """The request with the target's topic ids (unchanged where nothing maps)."""
        message, version = self._decoded(frame)
        if message is None:
            return frame

        def target(old: uuid.UUID) -> uuid.UUID | None:
            name = self.capture_names.get(old)
            if name is None:
                self.unknown_in_capture[old] += 1
                return None
            new = self.target_ids.get(name)
            if new is None:
                self.missing_on_target[name] += 1
                return None
            self.remapped[(name, old, new)] += 1
            return new

        if not replace_topic_ids(message, version, target):
            return frame
        header = parse_request_header(frame)
        assert header.body_offset is not None
        head = frame[SIZE_PREFIX : header.body_offset]
        body = encode_body(message)
        return (len(head) + len(body)).to_bytes(SIZE_PREFIX, "big") + head + body

    @staticmethod
    def _decoded(frame: bytes) -> tuple[ApiMessage | None, int]:
        try:
            header = parse_request_header(frame)
        except ProtocolError:
            return None, 0
        if header.body_offset is None or not carries_topic_ids(header.api_key, header.api_version):
            return None, header.api_version
        try:
            body = frame[header.body_offset :]
            return decode_body(header.api_key, header.api_version, body, request=True), header.api_version
        except ProtocolError:
            return None, header.api_version

    def summary(self) -> dict[str, list[dict[str, Any]]]:
        """What the report shows: ids remapped, topics the target lacks, ids the capture never named."""
        return {
            "remapped": [
                {"topic": name, "capture_id": str(old), "target_id": str(new), "requests": count}
                for (name, old, new), count in sorted(self.remapped.items(), key=lambda item: item[0][0])
            ],
            "missing_on_target": [
                {"topic": name, "requests": count} for name, count in sorted(self.missing_on_target.items())
            ],
            "unknown_in_capture": [
                {"capture_id": str(topic_id), "requests": count}
                for topic_id, count in sorted(self.unknown_in_capture.items(), key=lambda item: str(item[0]))
            ],
        }
