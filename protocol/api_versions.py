"""Cap the versions a broker advertises to those the proxy can decode.

A proxy that rewrites addresses must decode every response that may carry one. If the
broker advertises, say, Metadata v14 and the client picks it, kafka-python's schema cannot
read the answer and the proxy could neither rewrite nor safely pass it on (grepplabs'
kafka-proxy fails this way after every Kafka upgrade). So ApiVersions answers are capped
to :func:`decodable_max_versions`, derived from kafka-python's bundled schemas, and an
ApiVersions request newer than the proxy can read is answered the way a broker would:
UNSUPPORTED_VERSION in a v0 body, which makes the client retry at a version we know.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from kafka.protocol.api_message import ApiMessage

from .encoding import encode_response
from .errors import ProtocolError
from .framing import BytesLike
from .headers import API_VERSIONS_KEY
from .rewrite import (
    REWRITTEN_API_KEYS,
    decode_response_body,
    encode_response_body,
    join_response,
    split_response,
)
from .schemas import api_schemas, request_class, response_class

NO_ERROR = 0
UNSUPPORTED_VERSION = 35
"""Kafka's UNSUPPORTED_VERSION error code."""

CAPPED_API_KEYS: frozenset[int] = REWRITTEN_API_KEYS | {API_VERSIONS_KEY}
"""The APIs whose responses the proxy must decode: those it rewrites, and ApiVersions itself."""


def _max_version(api_key: int) -> int:
    """The highest version kafka-python can both encode as a request and decode as a response."""
    highs = [cls.max_version for cls in (request_class(api_key), response_class(api_key)) if cls is not None]
    schema = api_schemas().get(api_key)
    if schema is not None:
        highs.append(schema.valid_versions[1])
    if len(highs) < 3:  # pragma: no cover - kafka-python 3 ships all of them
        raise RuntimeError(f"kafka-python lacks a schema or class for api key {api_key}")
    return min(highs)


@cache
def _decodable_max_versions() -> dict[int, int]:
    return {api_key: _max_version(api_key) for api_key in sorted(CAPPED_API_KEYS)}


def decodable_max_versions() -> dict[int, int]:
    """Per api key, the newest version the proxy can decode: Metadata, FindCoordinator,
    DescribeCluster, Produce, Fetch and ApiVersions. A fresh dict, safe to modify."""
    return dict(_decodable_max_versions())


def _api_versions_class() -> type[ApiMessage]:
    cls = response_class(API_VERSIONS_KEY)
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
        return decode_response_body(API_VERSIONS_KEY, api_version, body)
    if error != UNSUPPORTED_VERSION:
        return None
    try:
        return decode_response_body(API_VERSIONS_KEY, 0, body)
    except ProtocolError:
        if api_version == 0:
            raise
        return decode_response_body(API_VERSIONS_KEY, api_version, body)


def cap_api_versions(frame: BytesLike, api_version: int, caps: Mapping[int, int]) -> bytes:
    """The ApiVersions response frame with each capped API's max version lowered to its cap.

    ``api_version`` is the version of the ApiVersions request the frame answers. An API
    whose min version exceeds its cap is dropped, since the client could not use it
    through the proxy. Api keys without a cap (unknown or proprietary ones) are kept as
    they are, and so is everything else in the body. The header (always v0) is kept byte
    for byte. When nothing is capped the input comes back as bytes, the same object if it
    was bytes. Malformed frames raise :class:`ProtocolError`.
    """
    header, body = split_response(frame, API_VERSIONS_KEY, api_version)
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
        max_version = _decodable_max_versions()[API_VERSIONS_KEY]
    cls = _api_versions_class()
    entry = cls.ApiVersion(version=0, api_key=API_VERSIONS_KEY, min_version=0, max_version=max_version)
    message = cls(version=0, error_code=UNSUPPORTED_VERSION, api_keys=[entry])
    return encode_response(message, correlation_id)
