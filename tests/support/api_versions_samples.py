"""ApiVersions bytes captured from Tansu, kcat and confluent-kafka, and a port of how
librdkafka 2.0.2 reads an answer, for the client-compatibility tests."""

from __future__ import annotations

from typing import Any

from protocol import ApiKey, response_class

TANSU_V3_ANSWER = bytes.fromhex(
    "0000011b00000007000025002a0000000200002400000002000012000000040000010000001100001100000001000016"
    "0000000500000a000000060000180000000500000b00000009000015000000020000030000000c0000000000000b0000"
    "450000000000000d0000000500000f00000005000009000000090000470000000000001c0000000400001e0000000300"
    "0033000000000000320000000000001a00000004000008000000090000100000000500000c0000000400001900000004"
    "00002e0000000000002c0000000100001d0000000300000e0000000500003c0000000100001400000006000013000000"
    "0700004b0000000000000200000009000020000000040000000000040001010108ffffffffffffffff020101030100"
)


TANSU_TAGS = ["SupportedFeatures", "FinalizedFeaturesEpoch", "FinalizedFeatures", "ZkMigrationReady"]


KCAT_REQUEST = bytes.fromhex(
    "00000024" + "0012000300000001000772646b61666b61000b6c696272646b61666b6106322e302e3200"
)


CONFLUENT_REQUEST = bytes.fromhex(
    "0000003e0012000300000001000772646b61666b610017636f6e666c75656e742d6b61666b612d707974686f6e16322e"
    "31362e312d72646b61666b612d322e31362e3000"
)


def librdkafka_reads(frame: bytes, *, fixed: bool) -> list[tuple[int, int, int]]:
    """The (api key, min, max) entries librdkafka's ``rd_kafka_handle_ApiVersion`` reads from
    an ApiVersions v3+ answer (a port of v2.0.2's src/rdkafka_request.c).

    ``fixed=False`` skips tagged fields as ``rd_kafka_buf_skip_tags`` did from v1.4.0 to
    v2.1.1 (``size - 1`` bytes, when size > 1); ``fixed=True`` as PR #4278 (v2.2.0) does.
    Like librdkafka, it does not insist that the whole body is read.
    """
    body = frame[8:]  # size prefix, then response header v0: the correlation id
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n > len(body) - pos:
            raise ReadUnderflow(f"expected {n} bytes > {len(body) - pos} remaining bytes")
        pos += n
        return body[pos - n : pos]

    def uvarint() -> int:  # rd_uvarint_dec: up to 64 bits
        value = shift = 0
        while True:
            byte = take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value & (2**64 - 1)
            shift += 7

    def skip_tags() -> None:
        for _ in range(uvarint()):
            uvarint()  # the tag
            size = uvarint()
            if fixed:
                take(size)
            elif size > 1:
                take(size - 1)

    take(2)  # ErrorCode
    entries = []
    for _ in range(uvarint() - 1):
        entries.append(tuple(int.from_bytes(take(2), "big", signed=True) for _ in range(3)))
        skip_tags()
    take(4)  # ThrottleTimeMs
    skip_tags()
    return entries


def ranges(frame: bytes, version: int) -> list[tuple[int, int, int]]:
    return [(e.api_key, e.min_version, e.max_version) for e in decode(frame, version).api_keys]


class ReadUnderflow(Exception):
    """librdkafka's ``rd_kafka_buf_parse_fail``: "Protocol read buffer underflow"."""


def decode(frame: bytes, version: int) -> Any:
    """The way kafka-python's client reads it (v0 whenever error_code != 0)."""
    return response_class(ApiKey.API_VERSIONS).decode(frame, version=version, header=True, framed=True)
