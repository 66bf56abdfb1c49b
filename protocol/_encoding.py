"""Encode a whole response frame with kafka-python (the ApiVersions answers the proxy makes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kafka-python loads only when a body is encoded
    from kafka.protocol.api_message import ApiMessage


def encode_response(message: ApiMessage, correlation_id: int) -> bytes:
    """A framed response; ApiVersions keeps header v0 through kafka-python's override."""
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))
