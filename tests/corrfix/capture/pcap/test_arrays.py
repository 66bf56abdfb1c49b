"""Arrow arrays built from buffers are the arrays ``pa.array`` builds, so files written from
either are the same byte for byte."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from corrfix.capture.pcap import _arrays as arrays

_CASES = st.one_of(
    st.tuples(st.just(pa.int16()), st.lists(st.one_of(st.none(), st.integers(-(2**15), 2**15 - 1)))),
    st.tuples(st.just(pa.int64()), st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))),
    st.tuples(
        st.just(pa.string()), st.lists(st.one_of(st.none(), st.sampled_from(["", "open", "frame", "é"])))
    ),
    st.tuples(st.just(pa.binary()), st.lists(st.one_of(st.none(), st.binary(max_size=20)))),
)


def _written(array: pa.Array) -> bytes:
    sink = pa.BufferOutputStream()
    batch = pa.RecordBatch.from_arrays([array], ["c"])
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch.take(pa.array(range(len(array)), pa.int64())))
    return sink.getvalue().to_pybytes()


@given(_CASES)
def test_values_are_what_pa_array_makes(case):
    type_, items = case
    made = arrays.values(items, type_)
    made.validate(full=True)
    assert made.to_pylist() == items and made.type == type_
    assert _written(made) == _written(pa.array(items, type_))
