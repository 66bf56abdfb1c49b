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
    absent = np.array([value is None for value in values], bool)
    sizes = np.array([len(e) for e in encoded], np.int64)
    lengths = sizes[codes]
    offsets = np.zeros(len(codes) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    widest = int(sizes.max(initial=0))
    runs = np.flatnonzero(codes[1:] != codes[:-1]) + 1 if len(codes) else codes
    if len(runs) < len(codes) // 32:  # long runs of one value (one connection's rows): repeated
        firsts = np.concatenate([[0], runs]) if len(codes) else runs
        counts = np.diff(np.append(firsts, len(codes)))
        data = np.frombuffer(
            b"".join(encoded[c] * n for c, n in zip(codes[firsts].tolist(), counts.tolist(), strict=True)),
            np.uint8,
        )
    else:  # every value padded to the widest, one row per string, the padding left out
        table = np.zeros((len(encoded), widest), np.uint8)
        for row, value in enumerate(encoded):
            table[row, : len(value)] = np.frombuffer(value, np.uint8)
        data = table[codes][np.arange(widest) < lengths[:, None]]
    validity, nulls = _validity(absent[codes], len(codes))
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(codes), buffers, null_count=nulls)


def binary(data: bytes, starts: _Ints) -> pa.Array:
    """The pieces of ``data`` that begin at ``starts`` (each ends where the next begins)."""
    offsets = np.append(starts, len(data)).astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _validity(null: _Mask | None, length: int) -> tuple[pa.Buffer | None, int]:
    if null is None or not null.any():
        return None, 0
    return pa.py_buffer(np.packbits(~null, bitorder="little")), int(np.count_nonzero(null))
