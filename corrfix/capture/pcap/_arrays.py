"""Arrow arrays made from numpy buffers, for the rows of whole connections.

``pa.array`` imports pandas on its first call in pyarrow 26 (a quarter of a second, more
than a whole clean import of 40,000 frames); ``pa.Array.from_buffers`` does not, and it
takes the numpy columns without converting them value by value.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _validity(null: _Mask | None, length: int) -> tuple[pa.Buffer | None, int]:
    if null is None or not null.any():
        return None, 0
    return pa.py_buffer(np.packbits(~null, bitorder="little")), int(np.count_nonzero(null))
