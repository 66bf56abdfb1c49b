"""Whole connections are dealt into partitions by rows, from a per-file index."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_audit.connections import assign

indexes = st.dictionaries(
    st.sampled_from(["f1", "f2", "f3"]),
    st.dictionaries(st.sampled_from([f"cap\x00c{i}" for i in range(12)]), st.integers(1, 1000), max_size=12),
    max_size=3,
)


@given(index=indexes, partitions=st.integers(1, 6))
def test_every_connection_lands_whole_in_one_partition_with_its_files(index, partitions):
    plan = assign(index, partitions)
    keys = [key for part in plan for key in part.connections]
    everything = {key for counts in index.values() for key in counts}
    assert sorted(keys) == sorted(everything)  # each once: whole connections
    assert len(plan) <= partitions and all(part.connections for part in plan)
    for part in plan:
        assert part.rows == sum(counts.get(key, 0) for counts in index.values() for key in part.connections)
        assert set(part.files) == {f for f, counts in index.items() if set(counts) & set(part.connections)}
    if plan:
        biggest = max(sum(c.get(k, 0) for c in index.values()) for k in everything)
        mean = sum(part.rows for part in plan) / len(plan)
        assert max(part.rows for part in plan) <= mean + biggest  # the greedy bound


def test_an_empty_index_plans_nothing():
    assert assign({}, 4) == []
