"""Fuzz targets for the sans-IO wire layer and a seeded mutator, shared by the tests and the bench.

Every target runs one input through the same functions the proxy runs it through, and
checks the contract: malformed input raises :class:`~protocol.errors.ProtocolError` (the
one error the I/O shell catches) and nothing else, the functions documented as total
(``fetch_max_wait_ms``, ``produce_is_idempotent``, ``sasl_mechanism``) never raise, what
comes back is well formed, and the frame decoder never holds more than one incomplete
frame. Anything else escapes as an exception, which is what a fuzzer reports.

All randomness comes from a ``random.Random`` passed in, so hypothesis (``st.randoms()``)
and the bench's seeded loop drive the very same code.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields import ArrayField, BaseField, SimpleField, StructArrayField, StructField
from kafka.protocol.schemas.fields.codecs import UUID as UuidCodec
from kafka.protocol.schemas.fields.codecs import (
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from protocol import ApiKey
from protocol._api_versions import DECODED_RESPONSE_API_KEYS, cap_api_versions, decodable_max_versions
from protocol._encoding import encode_response
from protocol._errors import FrameSizeError, ProtocolError
from protocol._framing import SIZE_PREFIX, FrameDecoder
from protocol._headers import (
    parse_request_header,
    patch_request_correlation_id,
    patch_response_correlation_id,
    request_correlation_id,
    response_body_offset,
    response_correlation_id,
)
from protocol._requests import (
    expects_response,
    fetch_max_wait_ms,
    produce_acks,
    produce_is_idempotent,
    sasl_mechanism,
)
from protocol._rewrite import needs_rewrite, rewrite_response
from protocol._schemas import api_schemas, request_class, response_class
from protocol._varint import read_tagged_fields, read_uvarint
from protocol.testing._frames import encode_request, encode_uvarint

COMPACTION_SLACK = 65536
"""Already returned bytes the decoder may keep before it compacts its buffer."""
STREAM_MAX_FRAME = 4096
"""The decoder's maximum in the stream target: small, so oversized frames are common."""

INT16_EDGES = (0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, -0x8000)
INT32_EDGES = (0, 1, -1, 0x7FFFFFFF, -0x80000000, 0x16030100, 0x47455420, 100 * 1024 * 1024 + 1)
BYTE_EDGES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
# Varints that overflow 32 bits, run past five bytes, or announce more than any frame holds.
BAD_VARINTS = (
    b"\xff\xff\xff\xff\x7f",
    b"\x80\x80\x80\x80\x80\x80",
    b"\xff\xff\xff\xff\x0f",
    b"\xff\xff\xff\x7f",
    b"\x80",
)


# -- a seed corpus, built by kafka-python from the JSON schemas -----------------------------


@dataclass(frozen=True, slots=True)
class Seed:
    """One well-formed frame; ``api_key``/``api_version`` are those of the request it is or answers."""

    frame: bytes
    api_key: int
    api_version: int


def _simple_value(field: SimpleField, rnd: random.Random) -> Any:
    codec = field._type
    ranges = {Int8: 7, Int16: 15, Int32: 31, Int64: 63}
    if codec in ranges:
        bits = ranges[codec]
        if field.name == "error_code":  # success, UNSUPPORTED_VERSION (ApiVersions retries on it), others
            return rnd.choice([0, 0, 35, rnd.randint(-(2**15), 2**15 - 1)])
        return rnd.choice([0, -1, 1, rnd.randint(-(2**bits), 2**bits - 1)])
    if codec is UnsignedInt16:
        return rnd.randint(0, 2**16 - 1)
    if codec is Boolean:
        return rnd.random() < 0.5
    if codec is Float64:
        return rnd.random()
    if codec is UuidCodec:
        return random_uuid(rnd)
    if isinstance(codec, String):
        if field.name == "host":
            return rnd.choice(["broker-1.example", "127.0.0.1", "", "ünïcødé"])
        return "".join(rnd.choice("abcxyz-_.") for _ in range(rnd.randint(0, 10)))
    if codec is Bytes:
        return rnd.randbytes(rnd.randint(0, 16))
    if codec is BitField:
        return {rnd.randint(0, 30) for _ in range(rnd.randint(0, 3))}
    raise NotImplementedError(f"no value for {field!r}")  # pragma: no cover


def random_uuid(rnd: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rnd.getrandbits(128))


def _field_value(field: BaseField, version: int, rnd: random.Random) -> Any:
    if field.nullable_for_version_q(version) and rnd.random() < 0.15:
        return None
    if isinstance(field, StructArrayField):
        return [_struct(field.array_of, field.data_class, version, rnd) for _ in range(rnd.randint(0, 2))]
    if isinstance(field, ArrayField):
        return [_simple_value(field.array_of, rnd) for _ in range(rnd.randint(0, 2))]
    if isinstance(field, StructField):
        return _struct(field, field.data_class, version, rnd)
    if isinstance(field, SimpleField):
        return _simple_value(field, rnd)
    raise NotImplementedError(f"no value for {field!r}")  # pragma: no cover


def _struct(struct: StructField, data_class: type, version: int, rnd: random.Random) -> Any:
    values = {}
    for field in struct._fields:
        if not field.for_version_q(version):
            continue
        if field.tagged_field_q(version) and rnd.random() < 0.5:
            continue
        values[field.name] = _field_value(field, version, rnd)
    return data_class(version=version, **values)


def random_message(cls: type[ApiMessage], version: int, rnd: random.Random) -> ApiMessage:
    """A whole message of ``cls`` at ``version`` with every field filled from ``rnd``."""
    return _struct(cls._struct, cls, version, rnd)


def _record_batch(producer_id: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 16,
    )
    builder.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"value", headers=[])
    return bytes(builder.build())


def _produce_with_batches(version: int, rnd: random.Random) -> ApiMessage:
    """A Produce whose records are real v2 batches, so idempotency is decided on real data."""
    produce = request_class(ApiKey.PRODUCE)
    assert produce is not None
    message = random_message(produce, version, rnd)
    batch = _record_batch(rnd.choice([-1, 4242]))
    for topic in message.topic_data or ():
        for partition in topic.partition_data or ():
            partition.records = batch
    return message


@cache
def request_seeds() -> tuple[Seed, ...]:
    """Every request api and version kafka-python knows, plus Produce with real record batches."""
    rnd = random.Random(7)
    seeds = []
    for api_key in sorted(api_schemas()):
        cls = request_class(api_key)
        if cls is None:
            continue
        for version in range(cls.min_version, cls.max_version + 1):
            message = random_message(cls, version, rnd)
            client_id = rnd.choice(["c", None, "client-é", ""])
            seeds.append(
                Seed(encode_request(message, rnd.randint(-(2**31), 2**31 - 1), client_id), api_key, version)
            )
            if api_key == ApiKey.PRODUCE:
                framed = encode_request(_produce_with_batches(version, rnd), version, "producer")
                seeds.append(Seed(framed, api_key, version))
    return tuple(seeds)


@cache
def response_seeds() -> tuple[Seed, ...]:
    """Every version of each response the proxy decodes: those carrying addresses, and ApiVersions."""
    rnd = random.Random(11)
    seeds = []
    for api_key in sorted(DECODED_RESPONSE_API_KEYS):
        cls = response_class(api_key)
        if cls is None:  # share groups: capped to no version, their answers refused unread
            continue
        for version in range(cls.min_version, cls.max_version + 1):
            for _ in range(2):
                message = random_message(cls, version, rnd)
                seeds.append(
                    Seed(encode_response(message, rnd.randint(-(2**31), 2**31 - 1)), api_key, version)
                )
    return tuple(seeds)


# -- the mutator ----------------------------------------------------------------------------


def _pos(rnd: random.Random, data: bytearray) -> int:
    return rnd.randrange(len(data)) if data else 0


def _flip(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    if data:
        data[_pos(rnd, data)] ^= 1 << rnd.randrange(8)


def _set_byte(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    if data:
        data[_pos(rnd, data)] = rnd.choice(BYTE_EDGES)


def _set_int16(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    pos = _pos(rnd, data)
    data[pos : pos + 2] = rnd.choice(INT16_EDGES).to_bytes(2, "big", signed=True)


def _set_int32(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    pos = _pos(rnd, data)
    value = rnd.choice([*INT32_EDGES, len(data), len(data) - SIZE_PREFIX + rnd.randint(-3, 3)])
    data[pos : pos + 4] = value.to_bytes(4, "big", signed=True)


def _insert(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    pos = _pos(rnd, data)
    data[pos:pos] = rnd.randbytes(rnd.randint(1, 16))


def _delete(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    pos = _pos(rnd, data)
    del data[pos : pos + rnd.randint(1, 16)]


def _truncate(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    del data[_pos(rnd, data) :]


def _bad_varint(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    pos = _pos(rnd, data)
    varint = rnd.choice([*BAD_VARINTS, encode_uvarint(rnd.choice([2**31, 2**32 - 1, 10**9, 255]))])
    if rnd.random() < 0.5:
        data[pos : pos + len(varint)] = varint
    else:
        data[pos:pos] = varint


def _duplicate(rnd: random.Random, data: bytearray, _other: bytes) -> None:
    pos = _pos(rnd, data)
    chunk = data[pos : pos + rnd.randint(1, 32)]
    at = _pos(rnd, data)
    data[at:at] = chunk


def _splice(rnd: random.Random, data: bytearray, other: bytes) -> None:
    pos = _pos(rnd, data)
    start = rnd.randrange(len(other)) if other else 0
    data[pos:] = other[start:]


MUTATIONS: tuple[Callable[[random.Random, bytearray, bytes], None], ...] = (
    _flip,
    _set_byte,
    _set_int16,
    _set_int32,
    _insert,
    _delete,
    _truncate,
    _bad_varint,
    _duplicate,
    _splice,
)


def mutate(data: bytes, rnd: random.Random, other: bytes = b"", rounds: int | None = None) -> bytearray:
    """A damaged copy of ``data``: one to four edits, then usually a size prefix that fits again.

    Fixing the prefix lets a damaged header or body get past framing to the parsers behind
    it; leaving it wrong exercises the framing checks themselves.
    """
    out = bytearray(data)
    for _ in range(rounds if rounds is not None else rnd.randint(1, 4)):
        rnd.choice(MUTATIONS)(rnd, out, other)
    if len(out) >= SIZE_PREFIX and rnd.random() < 0.7:
        out[:SIZE_PREFIX] = (len(out) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big", signed=True)
    return out


# -- targets --------------------------------------------------------------------------------


def request_target(frame: bytes | bytearray) -> str:
    """A client frame through everything the proxy reads from a request; returns how far it got."""
    try:
        header = parse_request_header(frame)
    except ProtocolError:
        return "rejected"
    assert header.api_key >= 0 and header.api_version >= 0
    assert header.correlation_id == request_correlation_id(frame)
    assert header.body_offset is None or 12 <= header.body_offset <= len(frame)
    assert header.client_id is None or isinstance(header.client_id, str)
    patched = bytearray(frame)
    acks: int | None = None
    patch_request_correlation_id(patched, 0x12345678)
    assert request_correlation_id(patched) == 0x12345678 and len(patched) == len(frame)
    if header.api_key == ApiKey.PRODUCE:
        try:
            acks = produce_acks(frame, header)
        except ProtocolError:
            acks = None
        else:
            assert -(2**15) <= acks < 2**15
            assert expects_response(frame, header) is (acks != 0)
        assert produce_is_idempotent(frame, header) in (True, False)  # total: never raises
    elif header.api_key == ApiKey.FETCH:
        assert 0 <= fetch_max_wait_ms(frame, header) < 2**31
    elif header.api_key == ApiKey.SASL_HANDSHAKE:
        mechanism = sasl_mechanism(frame, header)
        assert mechanism is None or isinstance(mechanism, str)
    if header.api_key != ApiKey.PRODUCE:
        assert expects_response(frame, header) is True
    return "acks read" if header.api_key == ApiKey.PRODUCE and acks is not None else "parsed"


def _to_proxy(node_id: int, host: str, port: int) -> tuple[str, int]:
    """Depends on the node id only, so rewriting a rewritten frame changes nothing."""
    return f"proxy-{node_id}", 9000 + (node_id & 0xFFF)


def response_target(frame: bytes | bytearray, api_key: int, api_version: int) -> str:
    """A broker frame through everything the proxy reads and rewrites in a response; returns
    how far it got."""
    try:
        correlation_id = response_correlation_id(frame)
    except ProtocolError:
        return "rejected"
    reached = "read"
    patched = bytearray(frame)
    patch_response_correlation_id(patched, ~correlation_id & 0x7FFFFFFF)
    assert response_correlation_id(patched) == ~correlation_id & 0x7FFFFFFF
    try:
        offset = response_body_offset(frame, api_key, api_version)
    except ProtocolError:
        pass
    else:
        assert 8 <= offset <= len(frame)
    try:
        rewritten = rewrite_response(frame, api_key, api_version, _to_proxy)
    except ProtocolError:
        rewritten = None
    if rewritten is not None:
        assert needs_rewrite(api_key, api_version)
        assert int.from_bytes(rewritten[:SIZE_PREFIX], "big") == len(rewritten) - SIZE_PREFIX
        assert rewritten[SIZE_PREFIX:8] == bytes(frame[SIZE_PREFIX:8])  # the header is kept
        assert rewrite_response(rewritten, api_key, api_version, _to_proxy) is None  # a fixed point
        reached = "rewritten"
    if api_key == ApiKey.API_VERSIONS:
        caps = decodable_max_versions()
        try:
            capped = cap_api_versions(frame, api_version, caps)
        except ProtocolError:
            return reached
        assert int.from_bytes(capped[:SIZE_PREFIX], "big", signed=True) == len(capped) - SIZE_PREFIX
        assert cap_api_versions(capped, api_version, caps) == capped  # capping twice changes nothing
        reached = "capped"
    return reached


def varint_target(data: bytes | bytearray, pos: int) -> None:
    """Varints and tagged-field sections anywhere in arbitrary bytes."""
    try:
        value, end = read_uvarint(data, pos)
    except ProtocolError:
        pass
    else:
        assert 0 <= value < 2**32 and pos < end <= min(len(data), pos + 5)
    try:
        end = read_tagged_fields(data, pos)
    except ProtocolError:
        return
    assert pos < end <= len(data)


def stream_target(
    stream: bytes | bytearray, rnd: random.Random, max_frame_size: int = STREAM_MAX_FRAME
) -> int:
    """Feed a byte stream in random chunks; check that memory stays within one frame.

    Returns the number of frames decoded. The only error allowed is FrameSizeError, raised
    exactly when the next announced size is negative or above the maximum.
    """
    decoder = FrameDecoder(max_frame_size)
    view = memoryview(bytes(stream))
    pos = 0
    consumed = 0  # bytes handed back as frames
    count = 0
    largest_chunk = 0
    while pos < len(view):
        chunk = view[pos : pos + rnd.choice([1, 2, 3, 5, 64, 1000, 5000, 70_000])]
        largest_chunk = max(largest_chunk, len(chunk))
        pos += len(chunk)
        try:
            frames = decoder.feed(chunk)
        except FrameSizeError as exc:
            _check_size_error(view, consumed, pos, exc, max_frame_size)
            return count
        for frame in frames:
            size = int.from_bytes(frame[:SIZE_PREFIX], "big", signed=True)
            assert 0 <= size <= max_frame_size and len(frame) == SIZE_PREFIX + size
            assert frame == view[consumed : consumed + len(frame)]
            consumed += len(frame)
        count += len(frames)
        assert decoder.buffered == pos - consumed
        assert decoder.buffered < SIZE_PREFIX + max_frame_size  # at most one incomplete frame
        assert len(decoder._buf) <= SIZE_PREFIX + max_frame_size + max(largest_chunk + 1, COMPACTION_SLACK)
    return count


def _check_size_error(
    view: memoryview, consumed: int, fed: int, exc: FrameSizeError, max_frame_size: int
) -> None:
    """The error names a real bad size at a frame boundary within what was fed."""
    assert exc.size < 0 or exc.size > max_frame_size
    at = consumed
    while True:  # complete frames of the failing chunk were not returned: walk over them
        assert at + SIZE_PREFIX <= fed
        size = int.from_bytes(view[at : at + SIZE_PREFIX], "big", signed=True)
        if size < 0 or size > max_frame_size:
            assert size == exc.size
            return
        at += SIZE_PREFIX + size


def random_stream(rnd: random.Random) -> bytearray:
    """Seed frames, some damaged, some raw noise, back to back."""
    requests, responses = request_seeds(), response_seeds()
    out = bytearray()
    if rnd.random() > 0.98:  # (not < 0.02: hypothesis's simplest draw, 0.0, stays a short stream)
        # Now and then 100 KiB of intact frames, so the decoder compacts its buffer (past 64 KiB).
        while len(out) < 100_000:
            out += rnd.choice(responses).frame
        return out
    for _ in range(rnd.randint(1, 6)):
        seed = rnd.choice(requests if rnd.random() < 0.5 else responses).frame
        roll = rnd.random()
        if roll < 0.6:
            out += seed
        elif roll < 0.9:
            out += mutate(seed, rnd)
        else:
            out += rnd.randbytes(rnd.randint(0, 12))
    return out


def one_case(rnd: random.Random) -> tuple[str, str]:
    """One fuzz case of a randomly chosen target: (target, how far the input got)."""
    roll = rnd.random()
    if roll < 0.35:
        other = rnd.choice(request_seeds()).frame
        return "request", request_target(mutate(rnd.choice(request_seeds()).frame, rnd, other))
    if roll < 0.7:
        seed = rnd.choice(response_seeds())
        other = rnd.choice(response_seeds()).frame
        # A response may be matched to any request the proxy tracked, right or wrong.
        api_key, version = seed.api_key, seed.api_version
        if rnd.random() < 0.1:
            api_key = rnd.choice(sorted(DECODED_RESPONSE_API_KEYS))
            version = rnd.randint(0, 20)
        return "response", response_target(mutate(seed.frame, rnd, other), api_key, version)
    if roll < 0.8:
        data = bytearray(rnd.randbytes(rnd.randint(0, 12)))
        if rnd.random() < 0.5:
            _bad_varint(rnd, data, b"")
        varint_target(data, rnd.randint(0, len(data)))
        return "varint", "checked"
    frames = stream_target(random_stream(rnd), rnd)
    return "stream", "frames" if frames else "no frame"
