"""Columns as integer codes, so that the pass groups, orders and pairs rows in numpy: one
hash pass per column (Arrow's dictionary encoding) and one sort of integers, instead of
Arrow's multi-key sorts and hash joins over string columns, which cost several times more
on a partition's hundreds of thousands of facts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL = -1
"""The code of a null in :func:`dense`."""
_ROOM = 1 << 62
"""Mixed-radix codes stay below this, so that they fit an int64 with room to spare."""
_NARROW = 1 << 32
"""An integer column whose values span less than this is coded by subtraction."""


def _indices(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Dictionary indices (nulls :data:`NULL`) and the dictionary; chunks share one."""
    encoded = pc.dictionary_encode(column)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    if not chunks:
        return np.zeros(0, np.int64), pa.array([], column.type)
    parts = [pc.fill_null(chunk.indices, NULL).to_numpy(zero_copy_only=False) for chunk in chunks]
    return np.concatenate(parts).astype(np.int64, copy=False), chunks[-1].dictionary


def _offsets(column: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """An integer column's values less its least (nulls :data:`NULL`), when they span a
    narrow range: codes by arithmetic, no hashing. None for other columns."""
    if not pa.types.is_integer(column.type) or len(column) == column.null_count:
        return None
    low, high = (v.as_py() for v in pc.min_max(column).values())
    if high - low >= _NARROW:
        return None
    values = pc.fill_null(column, low).to_numpy(zero_copy_only=False).astype(np.int64) - low
    return (
        np.where(pc.is_valid(column).to_numpy(zero_copy_only=False), values, NULL)
        if column.null_count
        else values
    )


def dense(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value as an int: equal exactly where the values are; nulls :data:`NULL`."""
    offsets = _offsets(column)
    return _indices(column)[0] if offsets is None else offsets


def ordered(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value as an int in the values' ascending order, nulls first (0), equal exactly
    where the values are."""
    offsets = _offsets(column)
    if offsets is not None:
        return offsets + 1
    indices, dictionary = _indices(column)
    if len(dictionary) == 0:
        return np.zeros(len(indices), np.int64)
    ranks = pc.rank(dictionary, sort_keys="ascending").to_numpy().astype(np.int64)  # from 1
    return np.where(indices == NULL, 0, ranks[np.maximum(indices, 0)])


def combined(codes: list[np.ndarray], keep_order: bool = False) -> np.ndarray:
    """One int per distinct tuple of ``codes`` (each at least :data:`NULL`). With
    ``keep_order``, the ints are in the tuples' lexicographic order."""
    out = np.zeros(len(codes[0]) if codes else 0, np.int64)
    size = 1
    for code in codes:
        shifted = code + 1
        radix = int(shifted.max(initial=0)) + 1
        if size * radix >= _ROOM:  # make the codes so far dense again (0 .. distinct - 1), then go on
            if keep_order:
                _, out = np.unique(out, return_inverse=True)
            else:
                out = _indices(pa.array(out))[0]  # not dense(): subtraction codes could stay wide
            size = int(out.max(initial=0)) + 1
            if size * radix >= 1 << 63:  # past an int64 even now: distinct tuples would share a code
                raise OverflowError(f"{size} distinct tuples times a radix of {radix} do not fit an int64")
        out = out * radix + shifted
        size *= radix
    return out


def sort_order(*keys: np.ndarray) -> np.ndarray:
    """The stable order of rows by ``keys``, the first the most significant. Keys whose
    spans multiply to under an int64 are sorted as one (one stable sort, which runs of
    rows already in order make cheap), else by ``np.lexsort``."""
    if len(keys[0]) == 0:
        return np.zeros(0, np.int64)
    one = np.zeros(len(keys[0]), np.int64)
    size = 1
    for key in keys:
        low, high = int(key.min()), int(key.max())
        span = high - low + 1
        if size * span >= _ROOM:
            return np.lexsort(keys[::-1])
        one = one * span + (key - low)
        size *= span
    return np.argsort(one, kind="stable")
