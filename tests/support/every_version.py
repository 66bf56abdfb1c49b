"""Every version of every request api Kafka defines, with an answer each, as synthetic TCP connections.

kafka-python's schemas give every api it knows at every version from 0 (its classes accept
the versions Kafka 4.0 dropped from validVersions); the bodies are random but well formed,
built by :func:`protocol.testing.random_message`. The api keys kafka-python has no schema
for (the 0.8-era inter-broker keys, KRaft, share and streams groups) get a valid header and
an opaque body. One connection per api key, requests and answers taking turns.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, replace

from corrfix.capture.pcap import TcpSegment
from protocol import ApiKey, every_request_schema, request_class, response_class
from protocol.testing import encode_request, encode_response, encode_uvarint, random_message
from tests.support.tcp_synth import Segment, TcpSession

CLIENT_ID = "every-version"
SERVER = ("10.9.0.1", 9092)
START_NS = 1_700_000_000_000_000_000


@dataclass(frozen=True)
class VersionExchange:
    api_key: int
    api_version: int
    correlation_id: int
    request: bytes
    response: bytes
    decodable: bool  # kafka-python has a class for this api and version


def exchanges_for(api_key: int, rnd: random.Random) -> list[VersionExchange]:
    """Every version of one api, correlation ids from 1."""
    schema = every_request_schema()[api_key]
    request_cls, response_cls = request_class(api_key), response_class(api_key)
    out = []
    for version in range(schema.valid_versions[1] + 1):
        cid = version + 1
        if request_cls is not None and response_cls is not None and version <= request_cls.max_version:
            request = encode_request(random_message(request_cls, version, rnd), cid, CLIENT_ID)
            response = encode_response(random_message(response_cls, version, rnd), cid)
            out.append(VersionExchange(api_key, version, cid, request, response, True))
        else:
            flexible = schema.is_flexible(version)
            head = struct.pack(">hhih", api_key, version, cid, len(CLIENT_ID)) + CLIENT_ID.encode()
            if api_key == ApiKey.CONTROLLED_SHUTDOWN and version == 0:
                head = struct.pack(">hhi", api_key, version, cid)  # header v0
            elif flexible:
                head += encode_uvarint(0)
            body = rnd.randbytes(rnd.randint(0, 40))
            answer = struct.pack(">i", cid) + (encode_uvarint(0) if flexible else b"") + rnd.randbytes(12)
            out.append(VersionExchange(api_key, version, cid, _framed(head + body), _framed(answer), False))
    return out


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def every_version(seed: int = 5) -> dict[int, list[VersionExchange]]:
    """Exchanges per api key, for every api key Kafka defines."""
    rnd = random.Random(seed)
    return {api_key: exchanges_for(api_key, rnd) for api_key in sorted(every_request_schema())}


def connection_segments(api_key: int, exchanges: list[VersionExchange], mss: int = 200) -> list[TcpSegment]:
    """One TCP connection (client port 20000 + api key) carrying the exchanges in turn."""
    tcp = TcpSession(client=("10.9.0.2", 20000 + api_key), server=SERVER, mss=mss)
    segments = tcp.handshake()
    for exchange in exchanges:
        segments += tcp.send(True, exchange.request, with_ack=True)
        segments += tcp.send(False, exchange.response, with_ack=True)
    segments += [tcp.fin(True), tcp.fin(False), tcp.ack(True)]
    start = START_NS + api_key * 1_000_000_000
    return [_tcp_segment(tcp, replace(seg, ts_ns=start + i * 1000), i) for i, seg in enumerate(segments)]


def _tcp_segment(tcp: TcpSession, seg: Segment, index: int) -> TcpSegment:
    src, dst = (tcp.client, tcp.server) if seg.from_client else (tcp.server, tcp.client)
    return TcpSegment(
        index,
        seg.ts_ns,
        src[0],
        src[1],
        dst[0],
        dst[1],
        seg.seq,
        seg.ack,
        seg.flags,
        seg.payload,
        len(seg.payload),
    )
