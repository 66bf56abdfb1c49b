"""Cap the versions a broker advertises to those the proxy can decode.

A proxy that rewrites addresses must decode every response that may carry one. If the
broker advertises, say, Metadata v14 and the client picks it, kafka-python's schema cannot
read the answer and the proxy could neither rewrite nor safely pass it on (grepplabs'
kafka-proxy fails this way after every Kafka upgrade). So ApiVersions answers are capped
to :func:`decodable_max_versions`, derived from kafka-python's bundled schemas, and an
ApiVersions request newer than the proxy can read is answered the way a broker would:
UNSUPPORTED_VERSION in a v0 body, which makes the client retry at a version we know.

It also holds the one client-compatibility rewrite of ApiVersions answers: librdkafka
1.4.0 to 2.1.1 mis-skips tagged fields, so for those clients the answer is re-encoded
without its optional tagged fields (see :func:`strip_tagged_fields` and docs/repair.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from protocol._api_key import ApiKey
from protocol._encoding import encode_response
from protocol._errors import ProtocolError
from protocol._framing import BytesLike
from protocol._headers import RequestHeader
from protocol._rewrite import (
    REWRITTEN_API_KEYS,
    decode_response_body,
    encode_response_body,
    join_response,
    split_response,
)
from protocol._schemas import api_schemas, request_class, response_class
from protocol._varint import read_compact_string

if TYPE_CHECKING:  # kafka-python loads only when an ApiVersions body is decoded or made
    from kafka.protocol.api_message import ApiMessage

NO_ERROR = 0
UNSUPPORTED_VERSION = 35
"""Kafka's UNSUPPORTED_VERSION error code."""

DECODED_RESPONSE_API_KEYS: frozenset[int] = REWRITTEN_API_KEYS | {ApiKey.API_VERSIONS}
"""The APIs whose responses the proxy must decode: those it rewrites, and ApiVersions itself."""

CAPPED_API_KEYS: frozenset[int] = DECODED_RESPONSE_API_KEYS | {ApiKey.JOIN_GROUP}
"""The APIs offered only in versions the proxy can read: those whose responses it decodes,
and JoinGroup, whose request's rebalance timeout sets how long the proxy waits for its answer
(a version it could not read would get the plain deadline and cut members off a long
rebalance)."""


NO_VERSION = -1
"""The cap of an api whose answers carry addresses kafka-python cannot read (share groups):
below every version, so ApiVersions answers drop it and clients never use it through us."""


def _max_version(api_key: int) -> int:
    """The highest version kafka-python can both encode as a request and decode as a response
    (:data:`NO_VERSION` if it lacks the api's schema or classes)."""
    highs = [cls.max_version for cls in (request_class(api_key), response_class(api_key)) if cls is not None]
    schema = api_schemas().get(api_key)
    if schema is not None:
        highs.append(schema.valid_versions[1])
    if len(highs) < 3:
        if api_key == ApiKey.API_VERSIONS:  # pragma: no cover - kafka-python 3 ships it
            raise RuntimeError("kafka-python lacks ApiVersions")
        return NO_VERSION
    return min(highs)


_SHARE_CONSUMING = (ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE)


@cache
def _decodable_max_versions() -> dict[int, int]:
    caps = {api_key: _max_version(api_key) for api_key in sorted(CAPPED_API_KEYS)}
    if NO_VERSION in (caps[key] for key in _SHARE_CONSUMING):
        # A share consumer offered ShareGroupHeartbeat but not ShareFetch joins its group and
        # is assigned partitions it can never fetch (the Java client retries the ShareFetch it
        # cannot send, logging at debug level): nobody consumes them. Offered neither, it stops
        # with "The cluster does not support the share group protocol".
        caps[ApiKey.SHARE_GROUP_HEARTBEAT] = NO_VERSION
    return caps


def decodable_max_versions() -> dict[int, int]:
    """Per api key, the newest version the proxy can decode: Metadata, FindCoordinator,
    DescribeCluster, Produce, Fetch, ApiVersions and JoinGroup, and :data:`NO_VERSION` for
    ShareFetch and ShareAcknowledge while kafka-python cannot read them, and then for ShareGroupHeartbeat,
    which would let a share consumer into a group it cannot consume from. A fresh dict, safe
    to modify."""
    return dict(_decodable_max_versions())


def _api_versions_class() -> type[ApiMessage]:
    cls = response_class(ApiKey.API_VERSIONS)
    if cls is None:  # pragma: no cover - kafka-python 3 ships ApiVersionsResponse
        raise RuntimeError("kafka-python has no ApiVersionsResponse")
    return cls


def _error_code(body: BytesLike) -> int:
    if len(body) < 2:
        raise ProtocolError("ApiVersions response body is shorter than its error code")
    return int.from_bytes(body[:2], "big", signed=True)


def _decode_api_versions(body: memoryview, api_version: int) -> ApiMessage | None:
    """Decode an ApiVersions body the way clients do; None if it lists nothing to cap.

    A broker answers an ApiVersions request it cannot serve with UNSUPPORTED_VERSION in a
    *v0* body (kafka-python decodes every error answer as v0; Apache Kafka's client tries
    the request version first, then v0). Other errors make the client give up, so their
    bodies are relayed as they are.
    """
    error = _error_code(body)
    if error == NO_ERROR:
        return decode_response_body(ApiKey.API_VERSIONS, api_version, body)
    if error != UNSUPPORTED_VERSION:
        return None
    try:
        return decode_response_body(ApiKey.API_VERSIONS, 0, body)
    except ProtocolError:
        if api_version == 0:
            raise
        return decode_response_body(ApiKey.API_VERSIONS, api_version, body)


def cap_api_versions(frame: BytesLike, api_version: int, caps: Mapping[int, int]) -> bytes:
    """The ApiVersions response frame with each capped API's max version lowered to its cap.

    ``api_version`` is the version of the ApiVersions request the frame answers. An API
    whose min version exceeds its cap is dropped, since the client could not use it
    through the proxy. Api keys without a cap (unknown or proprietary ones) are kept as
    they are, and so is everything else in the body. The header (always v0) is kept byte
    for byte. When nothing is capped the input comes back as bytes, the same object if it
    was bytes. Malformed frames raise :class:`ProtocolError`.
    """
    header, body = split_response(frame, ApiKey.API_VERSIONS, api_version)
    message = _decode_api_versions(body, api_version)
    if message is None:
        return frame if isinstance(frame, bytes) else bytes(frame)
    kept: list[Any] = []
    changed = False
    for entry in message.api_keys or ():
        cap = caps.get(entry.api_key)
        if cap is None:
            kept.append(entry)
        elif entry.min_version > cap:
            changed = True
        else:
            if entry.max_version > cap:
                entry.max_version = cap
                changed = True
            kept.append(entry)
    if not changed:
        return frame if isinstance(frame, bytes) else bytes(frame)
    message.api_keys = kept
    return join_response(header, encode_response_body(message))


def unsupported_api_versions_response(correlation_id: int, max_version: int | None = None) -> bytes:
    """What a broker answers to an ApiVersions request newer than it supports.

    UNSUPPORTED_VERSION in a v0 body (header v0) that lists only ApiVersions' own range,
    0 to ``max_version`` (default: what the proxy can decode). Clients then retry at
    ``min(their max, max_version)``; kafka-python reads that entry, Apache Kafka's client
    does the same.
    """
    if max_version is None:
        max_version = _decodable_max_versions()[ApiKey.API_VERSIONS]
    cls = _api_versions_class()
    entry = cls.ApiVersion(version=0, api_key=ApiKey.API_VERSIONS, min_version=0, max_version=max_version)
    message = cls(version=0, error_code=UNSUPPORTED_VERSION, api_keys=[entry])
    return encode_response(message, correlation_id)


# -- client compatibility -------------------------------------------------------------------

FIRST_CLIENT_SOFTWARE_VERSION = 3
"""ApiVersions v3 (KIP-511) is the first request that names the client software, and the
first answer with tagged fields."""

Version = tuple[int, int, int]

LIBRDKAFKA_TAG_SKIP_FIXED: Version = (2, 2, 0)
"""The first librdkafka release that skips a tagged field correctly.

From v1.4.0 (KIP-511, its first ApiVersions v3 request) to v2.1.1, librdkafka's
``rd_kafka_buf_skip_tags`` skipped ``size - 1`` bytes of each tagged field, as if the size
were a compact length. The first non-empty tagged field then desynchronises the reader:
"Read underflow" (``PROTOUFLOW ... rd_kafka_handle_ApiVersion``), and the client cannot
connect. Fixed by confluentinc/librdkafka PR #4278 (commit 8c8f8b9c4, May 2023, issue
#4253), first released in v2.2.0 (the CHANGELOG's "v2.1.2" was never tagged).
"""

LIBRDKAFKA_BARE_VERSION_NAMES = frozenset({"librdkafka", "confluent-kafka-go", "confluent-kafka-dotnet"})
"""Client software names whose version string is librdkafka's own ``rd_kafka_version_str()``:
librdkafka's default (kcat, node-rdkafka, plain C/C++), and the Go and .NET bindings."""

_BARE_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
_EMBEDDED_VERSION = re.compile(r"(?:^|-)(?:lib)?rdkafka-v?(\d+)\.(\d+)(?:\.(\d+))?")
"""A binding that names itself appends librdkafka's version to its own:
confluent-kafka-python ``2.3.0-rdkafka-2.3.0``, confluent-kafka-javascript
``1.0.0-librdkafka-2.6.1``, karafka ``v2.5.0-rdkafka-ruby-v0.19.5-librdkafka-v2.8.0``."""


@dataclass(frozen=True, slots=True)
class ClientSoftware:
    """What an ApiVersions v3+ request says about the client (KIP-511)."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def client_software(frame: BytesLike, header: RequestHeader) -> ClientSoftware | None:
    """The client software an ApiVersions request names; None before v3 or if it names none.

    Called once per connection at most, so two compact strings are read by hand rather than
    through kafka-python. A malformed body raises :class:`ProtocolError`.
    """
    if header.api_key != ApiKey.API_VERSIONS or header.api_version < FIRST_CLIENT_SOFTWARE_VERSION:
        return None
    if header.body_offset is None:  # pragma: no cover - ApiVersions' schema is always known
        raise ProtocolError("ApiVersions request body cannot be located")
    name, pos = read_compact_string(frame, header.body_offset)
    version, _ = read_compact_string(frame, pos)
    if name is None or version is None:
        return None
    return ClientSoftware(name, version)


def librdkafka_version(software: ClientSoftware) -> Version | None:
    """The librdkafka version a client runs on, when its client software says so."""
    if software.name in LIBRDKAFKA_BARE_VERSION_NAMES:
        match = _BARE_VERSION.match(software.version)
    else:
        matches = list(_EMBEDDED_VERSION.finditer(software.version))
        match = matches[-1] if matches else None
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def mis_skips_tagged_fields(software: ClientSoftware) -> bool:
    """True for clients known to misread non-empty tagged fields (librdkafka before 2.2.0).

    Clients that hide librdkafka behind a name and version of their own cannot be
    recognised; they get the broker's answer unchanged.
    """
    version = librdkafka_version(software)
    return version is not None and version < LIBRDKAFKA_TAG_SKIP_FIXED


@cache
def _tagged_fields(api_version: int) -> tuple[tuple[str, str, Any], ...]:
    """(attribute, schema name, default) of each tagged field of the ApiVersions answer at
    this version, from kafka-python's schema rather than a list of our own."""
    return tuple(
        (name, field._name, field.default)
        for name, field in _api_versions_class().fields.items()
        if field.tag is not None and field.tagged_field_q(api_version)
    )


def strip_tagged_fields(frame: BytesLike, api_version: int) -> tuple[bytes, list[str]] | None:
    """The ApiVersions answer without its tagged fields, and the schema names of those dropped.

    Every optional tagged field (SupportedFeatures, FinalizedFeaturesEpoch,
    FinalizedFeatures, ZkMigrationReady, and any tag unknown to kafka-python, at the top
    level or in an ``ApiKeys`` entry) is dropped by resetting it to its schema default and
    re-encoding with kafka-python, which writes only tagged fields that differ from their
    default and never writes unknown ones. Clients lose nothing they use: the fields are
    optional, and librdkafka before 2.2.0 reads none of them. None when there is nothing to
    drop: no tagged field present, an answer before v3, or an error answer (its body is v0).
    The header is kept byte for byte. Malformed frames raise :class:`ProtocolError`.
    """
    if api_version < FIRST_CLIENT_SOFTWARE_VERSION:
        return None
    header, body = split_response(frame, ApiKey.API_VERSIONS, api_version)
    if _error_code(body) != NO_ERROR:
        return None
    message = decode_response_body(ApiKey.API_VERSIONS, api_version, body)
    present = message.tags or set()
    dropped: list[str] = []
    for attribute, schema_name, default in _tagged_fields(api_version):
        if attribute in present:
            dropped.append(schema_name)
        setattr(message, attribute, list(default) if isinstance(default, list) else default)
    if message.unknown_tags:
        dropped.extend(f"tag {name.lstrip('_')}" for name in message.unknown_tags)
    if any(entry.unknown_tags for entry in message.api_keys or ()):
        dropped.append("ApiKeys entry tags")
    if not dropped:
        return None
    message.tags = None
    message.unknown_tags = None
    return join_response(header, encode_response_body(message)), dropped
