"""An observer that sees what corrfix's clients were told, through the proxy's observer hook.

Per connection it remembers the api key and version of each client request (by the
client's correlation id) and, for every answer delivered to the client that can carry
broker addresses, decodes it with kafka-python and records each address in it. The walk
over the decoded bodies is written out here, independently of ``protocol.rewrite``, so a
site the proxy forgets to rewrite is still seen.

Frames a client exchanges raw (SASL v0 tokens) have no Kafka header; they are skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corrfix.core import Event, Received, Repaired, RepairEvent, Sent
from protocol import ApiKey, ProtocolError, parse_request_header, response_correlation_id
from protocol._rewrite import decode_response_body, split_response
from tests.support.changes import Changes

ADDRESS_APIS = frozenset(
    {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER}
)


@dataclass(frozen=True, slots=True)
class SeenAddress:
    """A broker address a client was given."""

    api_key: int
    api_version: int
    node_id: int
    host: str
    port: int


def addresses_in(api_key: int, api_version: int, message: Any) -> list[SeenAddress]:
    """Every (node, host, port) in a decoded answer; error placeholders (node -1) included."""
    entries: list[tuple[int, str, int]] = []
    if api_key == ApiKey.METADATA:
        entries = [(b.node_id, b.host, b.port) for b in message.brokers or ()]
    elif api_key == ApiKey.DESCRIBE_CLUSTER:
        entries = [(b.broker_id, b.host, b.port) for b in message.brokers or ()]
    elif api_key == ApiKey.FIND_COORDINATOR:
        if api_version <= 3:
            entries = [(message.node_id, message.host, message.port)]
        else:
            entries = [(c.node_id, c.host, c.port) for c in message.coordinators or ()]
    elif api_key in (ApiKey.PRODUCE, ApiKey.FETCH) and "node_endpoints" in type(message).fields:
        entries = [(e.node_id, e.host, e.port) for e in getattr(message, "node_endpoints", None) or ()]
    return [SeenAddress(api_key, api_version, node, host, port) for node, host, port in entries]


def decode_answer(frame: bytes | bytearray, api_key: int, api_version: int) -> Any:
    """Decode a whole response frame (size prefix included) with kafka-python."""
    _header, body = split_response(frame, api_key, api_version)
    return decode_response_body(api_key, api_version, body)


@dataclass
class ClientView:
    """A :class:`corrfix.proxy.ConnectionObserver` recording what clients saw."""

    upstreams: dict[str, str] = field(default_factory=dict)
    """Connection id -> the upstream address the proxy connected it to."""
    closed: dict[str, str] = field(default_factory=dict)
    api_calls: Counter[int] = field(default_factory=Counter)
    """Client requests by api key, as the proxy received them."""
    addresses: list[SeenAddress] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    repairs: list[RepairEvent] = field(default_factory=list)
    _pending: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    snaplen: int = 0
    """Request headers are all it reads of what clients sent."""
    changes: Changes = field(default_factory=Changes)
    """Notified when a connection opens or closes."""

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        del client
        self.upstreams[connection] = upstream
        self._pending[connection] = {}
        self.changes.notify()

    def events(self, connection: str, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, Received) and event.side == "client":
                self._requests(connection, event.heads)
            elif isinstance(event, Sent) and event.side == "client":
                self._answers(connection, event.frames)
            elif isinstance(event, Repaired):
                self.repairs.append(event)

    def _requests(self, connection: str, heads: list[bytes]) -> None:
        pending = self._pending.setdefault(connection, {})
        for request in heads:
            try:
                header = parse_request_header(request)
            except ProtocolError:
                continue  # a raw SASL token
            self.api_calls[header.api_key] += 1
            pending[header.correlation_id] = (header.api_key, header.api_version)

    def _answers(self, connection: str, frames: list[bytearray]) -> None:
        pending = self._pending.setdefault(connection, {})
        for answer in frames:
            try:
                correlation_id = response_correlation_id(answer)
            except ProtocolError:
                continue  # a raw SASL reply (PLAIN's is empty)
            api_key, api_version = pending.pop(correlation_id, (-1, -1))
            if api_key not in ADDRESS_APIS:
                continue
            try:
                message = decode_answer(answer, api_key, api_version)
            except ProtocolError as exc:
                self.undecodable.append(f"{connection} api {api_key} v{api_version}: {exc}")
                continue
            self.addresses.extend(addresses_in(api_key, api_version, message))

    def connection_closed(self, connection: str, reason: str) -> None:
        self.closed[connection] = reason
        self.changes.notify()

    def opened_to(self, address: str) -> int:
        """How many proxy connections went upstream to ``address``."""
        return sum(1 for upstream in self.upstreams.values() if upstream == address)
