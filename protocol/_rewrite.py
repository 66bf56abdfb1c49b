"""Rewrite the broker addresses a client learns from responses, so it keeps talking to the proxy.

A client that learns a broker's real address from Metadata, FindCoordinator,
DescribeCluster or a KIP-951 ``NodeEndpoints`` hint in Produce or Fetch connects there
directly and bypasses the proxy. This module is the mechanism: it finds every such
address in a response frame and replaces it with what an address mapper says. Which
address stands in for which broker is the proxy's policy, so the mapper is passed in.

Bodies are decoded and re-encoded only by kafka-python, from Apache Kafka's JSON schemas.
The response header is copied byte for byte and only the size prefix is recomputed.
:func:`needs_rewrite` is a pure predicate on (api key, version), so the hot path skips
every other response without looking at its body.

What re-encoding through kafka-python cannot keep: *unknown* tagged fields (tags a newer
broker added to a version kafka-python already knows). kafka-python decodes them into
``unknown_tags`` but never encodes them, so a rewritten response drops them. For a proxy
that is the safe direction: a client never learns something the proxy did not vet, such as
a future tagged field that carries addresses. Responses that need no rewrite (and every
response whose mapped addresses come out equal) are passed on untouched.

What kafka-python cannot decode at all: a struct inside a tagged field (a ``NodeEndpoint``)
whose own tagged-field section is not empty. It asserts that section is empty, which
raises here as ProtocolError, and under ``python -O`` the assert vanishes and the next
fields are misread; the exact-length check below turns that into a ProtocolError too.
Do not run the proxy with ``-O``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from protocol._api_key import ApiKey
from protocol._bodies import decode_exactly, encode_body
from protocol._errors import ProtocolError
from protocol._framing import SIZE_PREFIX, BytesLike
from protocol._headers import response_body_offset
from protocol._schemas import (
    api_name,
    api_schemas,
    every_request_schema,
    response_class,
    response_field_versions,
)

if TYPE_CHECKING:  # kafka-python loads only when an answer is rewritten
    from kafka.protocol.api_message import ApiMessage

AddressMapper = Callable[[int, str, int], tuple[str, int]]
"""``(node_id, host, port) -> (host, port)``: the address the client should use instead."""


_INT32_MAX = 2**31 - 1
_INT16_MAX = 2**15 - 1


class UndecodableVersionError(ProtocolError):
    """The response's version is newer than kafka-python's schema, so its body cannot be read.

    Capping ApiVersions (:mod:`protocol.api_versions`) keeps clients from negotiating such
    versions; this surfaces a client or path that bypassed the cap.
    """

    def __init__(self, api_key: int, api_version: int, max_version: int) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.max_version = max_version
        super().__init__(
            f"{api_name(api_key)} v{api_version} response cannot be decoded "
            f"(kafka-python's schema stops at v{max_version})"
        )


@dataclass(frozen=True, slots=True)
class _Site:
    """Where addresses sit in a response: entries of a struct array, or the top-level struct.

    ``array`` None means the host/port fields are on the message itself (FindCoordinator
    up to v3). An entry whose ``error_field`` is non-zero carries a placeholder (node -1,
    empty host, port -1) that clients ignore, so it is left alone.
    """

    array: str | None
    node_field: str
    error_field: str | None = None


_SITES: dict[int, tuple[_Site, ...]] = {
    ApiKey.METADATA: (_Site("brokers", "node_id"),),
    ApiKey.FIND_COORDINATOR: (
        _Site(None, "node_id", "error_code"),
        _Site("coordinators", "node_id", "error_code"),
    ),
    ApiKey.DESCRIBE_CLUSTER: (_Site("brokers", "broker_id"),),
    ApiKey.PRODUCE: (_Site("node_endpoints", "node_id"),),
    ApiKey.FETCH: (_Site("node_endpoints", "node_id"),),
    # KIP-932 share groups: leader hints as in KIP-951, from their first version. kafka-python
    # 3.0 has no schema for either, so every version counts as carrying addresses: ApiVersions
    # answers drop both (protocol._api_versions) and an answer a client asked for anyway
    # raises instead of leaking a broker. A kafka-python that reads them makes them rewritten.
    ApiKey.SHARE_FETCH: (_Site("node_endpoints", "node_id"),),
    ApiKey.SHARE_ACKNOWLEDGE: (_Site("node_endpoints", "node_id"),),
}

REWRITTEN_API_KEYS: frozenset[int] = frozenset(_SITES)
"""Api keys whose responses can carry broker addresses (some perhaps unreadable to kafka-python)."""


def _response_class(api_key: int) -> type[ApiMessage]:
    cls = response_class(api_key)
    if cls is None:  # pragma: no cover - kafka-python 3 ships a class for every rewritten API
        raise RuntimeError(f"kafka-python has no response class for {api_name(api_key)}")
    return cls


def _site_versions(cls: type[ApiMessage], site: _Site) -> tuple[int, int]:
    field = cls.fields[site.array if site.array is not None else "host"]
    return field.min_version, field.max_version


def _json_field_name(site: _Site) -> str:
    """The schema's name of the field holding a site's addresses (``node_endpoints``: ``NodeEndpoints``)."""
    return "".join(part.title() for part in (site.array or "host").split("_"))


@cache
def _first_address_version() -> dict[int, int]:
    """The first version of each API whose response carries addresses, from the JSON schemas
    (read without kafka-python's classes: every Produce and Fetch answer asks this)."""
    first: dict[int, int] = {}
    for api_key, sites in _SITES.items():
        if api_key not in api_schemas():
            first[api_key] = 0  # no schema to tell which versions: all of them may
            continue
        lows = []
        for site in sites:
            versions = response_field_versions(api_key, _json_field_name(site))
            if versions is None:  # pragma: no cover - Apache Kafka's schemas name every site
                raise RuntimeError(f"{api_name(api_key)} response schema lacks {_json_field_name(site)}")
            lows.append(versions[0])
        first[api_key] = min(lows)
    return first


def needs_rewrite(api_key: int, api_version: int) -> bool:
    """Whether a response to this request can carry broker addresses; no body is read.

    Produce answers carry ``NodeEndpoints`` from v10 and Fetch answers from v16, so older
    versions of those hot-path APIs are never decoded. Versions newer than kafka-python's
    schema count as carrying addresses: :func:`rewrite_response` then raises instead of
    leaking them.
    """
    if api_key not in _SITES:  # most responses: one dict lookup
        return False
    return api_version >= _first_address_version()[api_key]


def decode_response_body(api_key: int, api_version: int, body: BytesLike) -> ApiMessage:
    """Decode a response body with kafka-python, insisting that it is consumed exactly.

    A truncated body must not decode "successfully": a re-encode would hand the client a
    repaired frame. Every failure is a :class:`ProtocolError` (:func:`protocol._bodies.decode_exactly`).
    """
    cls = response_class(api_key)
    if cls is None:  # share groups' answers, named from Kafka's list (kafka-python's lacks them)
        known = every_request_schema().get(api_key)
        raise ProtocolError(
            f"kafka-python cannot decode {known.name if known else api_name(api_key)} responses"
        )
    if api_version < 0:
        raise ProtocolError(f"{api_name(api_key)} response has negative version {api_version}")
    if api_version > cls.max_version:
        raise UndecodableVersionError(api_key, api_version, cls.max_version)
    return decode_exactly(cls, api_version, body)


def encode_response_body(message: ApiMessage) -> bytes:
    """Encode a decoded answer again at its own version (:func:`protocol._bodies.encode_body`)."""
    return encode_body(message)


def split_response(frame: BytesLike, api_key: int, api_version: int) -> tuple[bytes, memoryview]:
    """Check the size prefix and split a response frame into (header bytes, body view)."""
    if len(frame) < SIZE_PREFIX:
        raise ProtocolError("response frame is shorter than its size prefix")
    size = int.from_bytes(frame[:SIZE_PREFIX], "big", signed=True)
    if size != len(frame) - SIZE_PREFIX:
        raise ProtocolError(f"response frame announces {size} bytes but holds {len(frame) - SIZE_PREFIX}")
    start = response_body_offset(frame, api_key, api_version)
    view = memoryview(frame)
    return bytes(view[SIZE_PREFIX:start]), view[start:]


def join_response(header: bytes, body: bytes) -> bytes:
    """A frame from header and body bytes, with the size prefix recomputed."""
    return (len(header) + len(body)).to_bytes(SIZE_PREFIX, "big", signed=True) + header + body


def _checked(mapped: tuple[str, int], node_id: int) -> tuple[str, int]:
    """A mapper result that kafka-python can encode; a bad one is a bug in the proxy, not the peer."""
    host, port = mapped
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"address mapper returned {mapped!r} for node {node_id}; expected (str, int)")
    if not -(2**31) <= port <= _INT32_MAX:
        raise ValueError(f"address mapper returned port {port} for node {node_id}; not an int32")
    if len(host.encode("utf-8")) > _INT16_MAX:
        raise ValueError(f"address mapper returned a host of more than {_INT16_MAX} bytes for node {node_id}")
    return host, port


def _map_entry(entry: Any, site: _Site, mapper: AddressMapper) -> bool:
    """Map one host/port pair in place (kafka-python containers are untyped, hence Any)."""
    if site.error_field is not None and getattr(entry, site.error_field):
        return False
    node_id: int = getattr(entry, site.node_field)
    host: str = entry.host
    port: int = entry.port
    new_host, new_port = _checked(mapper(node_id, host, port), node_id)
    if new_host == host and new_port == port:
        return False
    entry.host = new_host
    entry.port = new_port
    return True


def map_addresses(message: ApiMessage, api_key: int, api_version: int, mapper: AddressMapper) -> bool:
    """Apply the mapper to every address in a decoded response, in place; True if any changed.

    Split from :func:`rewrite_response` so a caller that already decoded a body (or a test)
    can reuse the exact rules.
    """
    changed = False
    for site in _SITES.get(api_key, ()):
        low, high = _site_versions(_response_class(api_key), site)
        if not low <= api_version <= high:
            continue
        if site.array is None:
            changed |= _map_entry(message, site, mapper)
            continue
        for entry in getattr(message, site.array) or ():  # a null array decodes as None
            changed |= _map_entry(entry, site, mapper)
    return changed


def rewrite_response(frame: BytesLike, api_key: int, api_version: int, mapper: AddressMapper) -> bytes | None:
    """The response frame with every broker address mapped, or None if nothing changes.

    ``api_key`` and ``api_version`` are those of the request the frame answers. The
    response header (v0 or v1 with its tagged fields) is kept byte for byte. A malformed
    frame or body raises :class:`ProtocolError`; a version newer than kafka-python's schema
    raises :class:`UndecodableVersionError` (a ProtocolError).
    """
    if not needs_rewrite(api_key, api_version):
        return None
    header, body = split_response(frame, api_key, api_version)
    message = decode_response_body(api_key, api_version, body)
    if not map_addresses(message, api_key, api_version, mapper):
        return None
    return join_response(header, encode_response_body(message))
