"""Integer codes of columns: equal exactly where the values are, in the values' order where
asked, one per distinct tuple of columns (also past the int64 room of their mixed radix)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_audit.connections._codes import combined, dense, ordered, sort_order

values = st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "b", "ab", "é"])), max_size=30)


def _chunked(drawn: list, cut: int) -> pa.ChunkedArray:
    cut = min(cut, len(drawn))
    return pa.chunked_array([pa.array(drawn[:cut], pa.string()), pa.array(drawn[cut:], pa.string())])


@settings(max_examples=200, deadline=None)
@given(drawn=values, cut=st.integers(0, 30))
def test_dense_and_ordered_codes_are_equal_where_the_values_are_and_keep_their_order(drawn, cut):
    column = _chunked(drawn, cut)
    for codes in (dense(column), ordered(column)):
        assert len(codes) == len(drawn)
        for i, a in enumerate(drawn):
            for j, b in enumerate(drawn):
                assert (codes[i] == codes[j]) == (a == b)
    rank = ordered(column)
    for i, a in enumerate(drawn):
        for j, b in enumerate(drawn):
            if a is None and b is not None:
                assert rank[i] < rank[j]  # nulls first
            if a is not None and b is not None and a.encode() < b.encode():
                assert rank[i] < rank[j]


rows = st.integers(1, 25).flatmap(
    lambda width: st.lists(
        st.lists(st.one_of(st.none(), st.integers(0, 9)), min_size=width, max_size=width),
        min_size=1,
        max_size=15,
    )
)


@settings(max_examples=200, deadline=None)
@given(drawn=rows)
@example(drawn=[[(i * 7 + k) % 10 for k in range(25)] for i in range(10)])  # 11^25: past an int64
def test_combined_codes_are_one_per_distinct_tuple_and_keep_its_order(drawn):
    columns = [pa.array([r[k] for r in drawn], pa.int64()) for k in range(len(drawn[0]))]
    for keep_order in (False, True):
        codes = combined([ordered(c) if keep_order else dense(c) for c in columns], keep_order=keep_order)
        for i, a in enumerate(drawn):
            for j, b in enumerate(drawn):
                assert (codes[i] == codes[j]) == (a == b)
                if keep_order:
                    none_first = [(v is not None, v or 0) for v in a], [(v is not None, v or 0) for v in b]
                    assert (codes[i] < codes[j]) == (none_first[0] < none_first[1])


def test_integers_far_apart_are_coded_by_their_dictionary_in_their_order():
    column = pa.chunked_array([pa.array([None, 2**40, -(2**40)]), pa.array([2**40, 5])], pa.int64())
    assert list(dense(column)) == [-1, 0, 1, 0, 2]
    assert list(ordered(column)) == [0, 3, 1, 3, 2]


@settings(max_examples=200, deadline=None)
@given(
    keys=st.integers(1, 4).flatmap(
        lambda width: st.lists(
            st.lists(st.sampled_from([-(2**40), -1, 0, 1, 2, 2**40]), min_size=width, max_size=width),
            max_size=20,
        )
    )
)
def test_sort_order_is_the_stable_lexicographic_order(keys):
    if not keys:
        assert len(sort_order(np.zeros(0, np.int64))) == 0
        return
    columns = [np.array([row[k] for row in keys], np.int64) for k in range(len(keys[0]))]
    assert list(sort_order(*columns)) == sorted(range(len(keys)), key=lambda i: keys[i])


def test_two_wide_integer_columns_keep_distinct_tuples_apart():
    """Each spans nearly 2**32, so their product passes the room left: the codes so far are
    made dense again before the second goes on (a review found subtraction codes kept wide
    there, and two tuples sharing a code)."""
    a = pa.array([2**32 - 1, 0, 0, 0], pa.int64())
    b = pa.array([2**32 - 1, 2**32 - 2, 0, None], pa.int64())
    for keep_order in (False, True):
        codes = combined([dense(a), dense(b)], keep_order=keep_order)
        assert len(set(codes.tolist())) == 4
