"""Hypothesis strategies for whole kafka-python messages, derived from their JSON schemas.

Walking kafka-python's field tree (the same one it encodes with) yields every field of a
given version, tagged fields included, so each supported version of a response is
generated without a hand-written strategy per API.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
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

from protocol.testing import encode_uvarint

MAX_ITEMS = 2

# Hosts are what the rewrite touches, so they get the awkward cases: empty, unicode, long.
HOSTS = st.one_of(
    st.sampled_from(
        ["", "localhost", "127.0.0.1", "::1", "broker-1.kafka.svc.cluster.local", "ünïcødé-主机"]
    ),
    st.text(max_size=40),
)
INT_RANGES = {
    Int8: (-(2**7), 2**7 - 1),
    Int16: (-(2**15), 2**15 - 1),
    UnsignedInt16: (0, 2**16 - 1),
    Int32: (-(2**31), 2**31 - 1),
    Int64: (-(2**63), 2**63 - 1),
}


def _int(codec: type, name: str) -> st.SearchStrategy[int]:
    low, high = INT_RANGES[codec]
    ints = st.integers(low, high)
    if name == "error_code":  # mostly successes, so address entries are not all skipped
        return st.one_of(st.just(0), st.just(0), ints)
    return ints


def _simple(field: SimpleField) -> st.SearchStrategy[Any]:
    codec = field._type
    name = field.name
    if codec in INT_RANGES:
        return _int(codec, name)
    if codec is Boolean:
        return st.booleans()
    if codec is Float64:
        return st.floats(allow_nan=False)
    if codec is UuidCodec:
        return st.uuids()
    if isinstance(codec, String):
        return HOSTS if name == "host" else st.text(max_size=12)
    if codec is Bytes:
        return st.binary(max_size=24)
    if codec is BitField:  # a set of bit numbers; {31} alone is kafka-python's None
        return st.one_of(st.none(), st.sets(st.integers(0, 31), max_size=4).filter(lambda s: s != {31}))
    raise NotImplementedError(f"no strategy for {field!r}")  # pragma: no cover


def _nullable(field: BaseField, version: int, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values) if field.nullable_for_version_q(version) else values


_CACHE: dict[tuple[int, int], st.SearchStrategy[Any]] = {}


def field_values(field: BaseField, version: int) -> st.SearchStrategy[Any]:
    """Values of one field at one version, as kafka-python holds them after decoding."""
    key = (id(field), version)  # schema fields live as long as their classes
    if key not in _CACHE:
        _CACHE[key] = _field_values(field, version)
    return _CACHE[key]


def _field_values(field: BaseField, version: int) -> st.SearchStrategy[Any]:
    if isinstance(field, StructArrayField):
        items = struct_values(field.array_of, field.data_class, version)
        return _nullable(field, version, st.lists(items, max_size=MAX_ITEMS))
    if isinstance(field, ArrayField):
        return _nullable(field, version, st.lists(_simple(field.array_of), max_size=MAX_ITEMS))
    if isinstance(field, StructField):
        return _nullable(field, version, struct_values(field, field.data_class, version))
    if isinstance(field, SimpleField):
        return _nullable(field, version, _simple(field))
    raise NotImplementedError(f"no strategy for {field!r}")  # pragma: no cover


@st.composite
def _struct(draw: st.DrawFn, struct: StructField, data_class: type, version: int) -> Any:
    values: dict[str, Any] = {}
    for field in struct._fields:
        if not field.for_version_q(version):
            continue
        if field.tagged_field_q(version) and not draw(st.booleans()):
            continue  # a tagged field left out keeps its default
        values[field.name] = draw(field_values(field, version))
    return data_class(version=version, **values)


def struct_values(struct: StructField, data_class: type, version: int) -> st.SearchStrategy[Any]:
    return _struct(struct, data_class, version)


def messages(cls: type[ApiMessage], version: int) -> st.SearchStrategy[ApiMessage]:
    """A whole message of ``cls`` at ``version``, every field (tagged ones too) drawn."""
    return _struct(cls._struct, cls, version)


@st.composite
def tagged_section(draw: st.DrawFn) -> bytes:
    """A raw tagged-field section (ascending tags, opaque values), e.g. for a header v1."""
    tags = sorted(draw(st.sets(st.integers(0, 300), max_size=3)))
    out = bytearray(encode_uvarint(len(tags)))
    for tag in tags:
        value = draw(st.binary(max_size=8))
        out += encode_uvarint(tag) + encode_uvarint(len(value)) + value
    return bytes(out)
