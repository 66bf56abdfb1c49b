"""Arrow arrays made from numpy buffers, for the rows of whole connections.

``pa.array`` imports pandas on its first call in pyarrow 26 (a quarter of a second, more
than a whole clean import of 40,000 frames); ``pa.Array.from_buffers`` does not, and it
takes the numpy columns without converting them value by value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

_Ints = npt.NDArray[np.int64]
_Mask = npt.NDArray[np.bool_]


def integers(values: npt.NDArray[np.integer], type_: pa.DataType, null: _Mask | None = None) -> pa.Array:
    """``values`` as an Arrow integer array of ``type_``; null where ``null`` is set."""
    data = np.ascontiguousarray(values, dtype=type_.to_pandas_dtype())
    validity, nulls = _validity(null, len(data))
    return pa.Array.from_buffers(type_, len(data), [validity, pa.py_buffer(data)], null_count=nulls)


def indices(values: _Ints) -> pa.Array:
    """Row numbers for ``take``."""
    return integers(values, pa.int64())


def strings(values: Sequence[str | None], codes: _Ints) -> pa.Array:
    """``values[codes[i]]`` for each ``i``, as a string array (a None value is null)."""
    encoded = [b"" if value is None else value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    validity, nulls = _validity(np.array([value is None for value in values], bool), len(values))
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    distinct = pa.Array.from_buffers(pa.string(), len(values), buffers, null_count=nulls)
    return distinct.take(indices(codes))


def binary(data: bytes, starts: _Ints) -> pa.Array:
    """The pieces of ``data`` that begin at ``starts`` (each ends where the next begins)."""
    offsets = np.append(starts, len(data)).astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def values(items: Sequence[int | str | bytes | None], type_: pa.DataType) -> pa.Array:
    """Python values (ints, strings or bytes; None for null) as an Arrow array of ``type_``
    (an integer, string or binary type), as ``pa.array`` makes it, without loading pandas."""
    null = np.array([item is None for item in items], bool)
    if pa.types.is_integer(type_):
        return integers(np.array([0 if item is None else item for item in items], np.int64), type_, null=null)
    if pa.types.is_string(type_):
        codes: dict[str | None, int] = {}
        found = [codes.setdefault(cast(str | None, item), len(codes)) for item in items]
        return strings(list(codes), np.array(found, np.int64))
    if pa.types.is_binary(type_):
        pieces = [b"" if item is None else cast(bytes, item) for item in items]
        offsets = np.zeros(len(pieces) + 1, np.int32)
        np.cumsum([len(piece) for piece in pieces], out=offsets[1:])
        validity, nulls = _validity(null, len(pieces))
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(pieces))]
        return pa.Array.from_buffers(pa.binary(), len(pieces), buffers, null_count=nulls)
    raise TypeError(f"no conversion to {type_}")


def _validity(null: _Mask | None, length: int) -> tuple[pa.Buffer | None, int]:
    if null is None or not null.any():
        return None, 0
    return pa.py_buffer(np.packbits(~null, bitorder="little")), int(np.count_nonzero(null))
