"""Sends of batches without a producer id, summed per batch in each partition, give the
duplicate check exactly what the sends one by one give it."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from protocol import ApiKey
from spark_audit.checks import attempts, duplicate_batches, duplicates_of_sends
from spark_audit.connections import BATCH_SENDS_SCHEMA, FACT_COLUMNS, facts_pass, plain_batches, sum_sends
from spark_audit.decode import FACT_SCHEMA
from tests.support.audit_builders import CAPTURE

FACTS = pa.schema([*FACT_SCHEMA, pa.field("acknowledged", pa.bool_())])

send = st.fixed_dictionaries(
    {
        "fact": st.sampled_from(["produce_batch", "produce_batch", "produce_batch", "error"]),
        "connection_id": st.sampled_from(["a", "b", "c"]),
        "correlation_id": st.integers(0, 3),
        "wall_ns": st.integers(0, 5),
        "topic": st.sampled_from(["t", "u"]),
        "partition": st.integers(0, 1),
        "crc": st.sampled_from([None, 1, 2, 3]),
        "producer_id": st.sampled_from([None, -1, -1, 7]),
        "transactional_id": st.sampled_from([None, None, "tx"]),
        "record_count": st.sampled_from([None, 1, 2, 5]),
        "acknowledged": st.sampled_from([None, True, False]),
        "partition_of_the_audit": st.integers(0, 2),
    }
)


def _facts(drawn: list[dict]) -> pa.Table:
    rows = []
    for seq, d in enumerate(drawn):
        row = dict.fromkeys(FACTS.names)
        row.update({k: v for k, v in d.items() if k != "partition_of_the_audit"})
        row.update(capture_id=CAPTURE, seq=seq, direction="request", api_key=ApiKey.PRODUCE, api_version=9)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=FACTS)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking through Spark takes minutes
)
@given(drawn=st.lists(send, max_size=40))
def test_summed_sends_find_the_same_duplicates(spark, drawn):
    facts = _facts(drawn)
    parts = []
    for k in range(3):
        mine = facts.filter(pa.array([d["partition_of_the_audit"] == k for d in drawn], pa.bool_()))
        parts.append(sum_sends(mine.filter(plain_batches(mine))))
    summed = pa.concat_tables(parts)
    assert summed.schema == BATCH_SENDS_SCHEMA
    assert sum(summed.column("sends").to_pylist()) == sum(plain_batches(facts).to_pylist())
    want = duplicate_batches(attempts(spark.createDataFrame(facts.select(FACT_COLUMNS)))).collect()
    got = duplicates_of_sends(spark.createDataFrame(summed)).collect()
    assert sorted(got) == sorted(want)


@settings(max_examples=100, deadline=None)
@given(drawn=st.lists(send, max_size=40))
def test_the_facts_pass_counts_the_rows_it_yields(drawn):
    out = facts_pass(_facts(drawn).drop_columns(["acknowledged"]), sum_plain_sends=True).to_pylist()
    sizes: Counter[str] = Counter()
    for r in out:
        if r["kind"] == "sizes":
            sizes[r["fact"]] += r["rows"]
    kept = Counter(r["fact"] for r in out if r["kind"] == "fact")
    assert sizes == {**kept, "batch_sends": sum(1 for r in out if r["kind"] == "batch_sends")}
    assert all(r["connection_id"] for r in out if r["kind"] == "sizes" and r["fact"] != "batch_sends")
