"""Frame builders for tests, fuzzing and benchmarks; the product never encodes requests."""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from protocol._api_key import ApiKey


def encode_request(message: ApiMessage, correlation_id: int, client_id: str | None = "corrfix") -> bytes:
    """A framed request: size, header (version from the schema) and body."""
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


def encode_uvarint(value: int) -> bytes:
    """Encode an unsigned varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def request_frame(api_key: int, correlation_id: int, token: int, acks: int = 1) -> bytearray:
    """A request with header v1; Produce v3 gets a null transactional id and ``acks``."""
    body = token.to_bytes(8, "big")
    if api_key == ApiKey.PRODUCE:
        body = b"\xff\xff" + acks.to_bytes(2, "big", signed=True) + body
    payload = (
        api_key.to_bytes(2, "big")
        + (3 if api_key == ApiKey.PRODUCE else 0).to_bytes(2, "big")
        + correlation_id.to_bytes(4, "big", signed=True)
        + b"\x00\x01c"
        + body
    )
    return bytearray(len(payload).to_bytes(4, "big") + payload)


def response_frame(correlation_id: int, token: int) -> bytearray:
    payload = correlation_id.to_bytes(4, "big", signed=True) + token.to_bytes(8, "big")
    return bytearray(len(payload).to_bytes(4, "big") + payload)
