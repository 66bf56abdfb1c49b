"""Build whole request and response frames with kafka-python (tests, probes, fake brokers)."""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage


def encode_request(message: ApiMessage, correlation_id: int, client_id: str | None = "corrfix") -> bytes:
    """A framed request: size, header (version from the schema) and body."""
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


def encode_response(message: ApiMessage, correlation_id: int) -> bytes:
    """A framed response; ApiVersions keeps header v0 through kafka-python's override."""
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))
