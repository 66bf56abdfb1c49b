"""Sends of batches without a producer id, summed per batch in each partition, give the
duplicate check exactly what the sends one by one give it."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from protocol import ApiKey
from spark_audit.checks import duplicate_batches, duplicates_of_sends
from spark_audit.connections import BATCH_SENDS_SCHEMA, FACT_COLUMNS, facts_pass, plain_batches, sum_sends
from spark_audit.connections._clusters import HOME, send_homes
from spark_audit.decode import FACT_SCHEMA, decode_batches
from tests.support.audit_builders import CAPTURE, produce_answer, produce_frame, records, with_crc

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
        "first_timestamp": st.sampled_from([None, 1_700_000_000_000, 1_700_000_000_001]),
        "batch_length": st.sampled_from([61, 62]),
        "lineage_id": st.sampled_from([None, None, 0, 1]),
        "acknowledged": st.sampled_from([None, True, False]),
    }
)


def _facts(drawn: list[dict]) -> pa.Table:
    rows = []
    for seq, d in enumerate(drawn):
        row = dict.fromkeys(FACTS.names)
        row.update(d)
        row.update(capture_id=CAPTURE, seq=seq, direction="request", api_key=ApiKey.PRODUCE, api_version=9)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=FACTS)


home = st.tuples(st.sampled_from([None, "a1:9092", "b1:9092"]), st.sampled_from([None, "A", "B"]))
"""A connection's upstream address and the cluster its answers named."""


def _connections(homes: list[tuple[str | None, str | None]]) -> pa.Table:
    """The ``connection`` facts of connections a, b and c, at ``homes``."""
    rows = []
    for connection, (address, cluster) in zip("abc", homes, strict=True):
        row = dict.fromkeys(FACTS.names)
        row.update(capture_id=CAPTURE, connection_id=connection, seq=0, wall_ns=0, fact="connection")
        rows.append({**row, "upstream_address": address, "cluster_id": cluster})
    return pa.Table.from_pylist(rows, schema=FACTS)


def _at_home(sends: pa.Table, connections: pa.Table) -> pa.Table:
    """``sends`` with their connections' homes, as the facts pass gives them to :func:`sum_sends`."""
    for name, column in zip(HOME, send_homes(sends, connections), strict=True):
        sends = sends.set_column(sends.schema.get_field_index(name), name, column)
    return sends


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking through Spark takes minutes
)
@given(
    drawn=st.lists(send, max_size=40),
    homes=st.lists(st.integers(0, 2), min_size=3, max_size=3),
    clusters=st.lists(home, min_size=3, max_size=3),
)
def test_summed_sends_find_the_same_duplicates(spark, drawn, homes, clusters):
    facts = _facts(drawn)
    connections = _connections(clusters)
    parts = []
    for k in range(3):
        home = {c: homes[i] for i, c in enumerate("abc")}  # connections are whole in a partition
        mine = facts.filter(pa.array([home[d["connection_id"]] == k for d in drawn], pa.bool_()))
        parts.append(sum_sends(_at_home(mine.filter(plain_batches(mine)), connections)))
    summed = pa.concat_tables(parts)
    assert summed.schema == BATCH_SENDS_SCHEMA
    assert sum(summed.column("sends").to_pylist()) == sum(plain_batches(facts).to_pylist())
    every = spark.createDataFrame(pa.concat_tables([facts, connections]).select(FACT_COLUMNS))
    want = duplicate_batches(every).collect()
    got = duplicates_of_sends(spark.createDataFrame(summed), every).collect()
    assert sorted(got) == sorted(want)


@settings(max_examples=200, deadline=None)
@given(drawn=st.lists(send, max_size=40), homes=st.lists(st.integers(0, 2), min_size=3, max_size=3))
def test_lineages_summed_over_partitions_are_each_batchs_distinct_lineages(drawn, homes):
    facts = _facts(drawn)
    plain = plain_batches(facts).to_pylist()
    key = ("topic", "partition", "crc", "record_count", "first_timestamp", "batch_length")
    want: dict[tuple, set] = {}
    for i, d in enumerate(drawn):
        if plain[i]:
            lineage = ("send", i) if d["lineage_id"] is None else (d["connection_id"], d["lineage_id"])
            want.setdefault(tuple(d[k] for k in key), set()).add(lineage)
    got: Counter[tuple] = Counter()
    for part in range(3):
        home = [homes["abc".index(d["connection_id"])] == part for d in drawn]
        mine = facts.filter(pa.array(home, pa.bool_()))
        for r in sum_sends(mine.filter(plain_batches(mine))).to_pylist():
            got[tuple(r[k] for k in key)] += r["lineages"]
    assert got == {batch: len(lineages) for batch, lineages in want.items()}


def test_a_send_without_lineage_and_a_lineage_numbered_as_its_stand_in_are_two_lineages():
    """A send without a lineage id is one of its own; one whose lineage id happens to be the
    number that stands in for none (0) is another. Counted as one, a batch appended twice
    (once by each) would not be a duplicate."""
    batch = {
        "fact": "produce_batch",
        "connection_id": "a",
        "correlation_id": 0,
        "wall_ns": 0,
        "topic": "t",
        "partition": 0,
        "crc": 2,
        "producer_id": -1,
        "record_count": 2,
        "batch_length": 61,
    }
    for drawn in ([{**batch, "lineage_id": None}, {**batch, "lineage_id": 0}],) * 2:
        (row,) = sum_sends(_facts(drawn)).to_pylist()
        assert (row["sends"], row["lineages"]) == (2, 2)
        drawn.reverse()


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


def _sends(table: pa.Table) -> list[tuple]:
    summed = sum_sends(table.filter(plain_batches(table)))
    names = ["crc", "first_timestamp", "sends", "acknowledged_sends", "unanswered_sends", "lineages"]
    return sorted(zip(*[summed.column(n).to_pylist() for n in names], strict=True))


def test_batches_that_share_only_a_crc_are_different_batches():
    same_crc = {"topic": "t", "partition": 0, "crc": 7, "producer_id": -1, "record_count": 1}
    drawn = [
        {
            **same_crc,
            "fact": "produce_batch",
            "connection_id": "a",
            "correlation_id": 1,
            "wall_ns": 1,
            "first_timestamp": 1_700_000_000_000,
            "batch_length": 61,
            "acknowledged": True,
        },
        {
            **same_crc,
            "fact": "produce_batch",
            "connection_id": "b",
            "correlation_id": 1,
            "wall_ns": 2,
            "first_timestamp": 1_700_000_000_007,
            "batch_length": 61,
            "acknowledged": True,
        },
    ]
    assert _sends(_facts(drawn)) == [(7, 1_700_000_000_000, 1, 1, 0, 1), (7, 1_700_000_000_007, 1, 1, 0, 1)]


def _frames(rows: list[tuple[str, int, int | None, str, bytes]]) -> pa.RecordBatch:
    """Broker-side frames (connection, correlation id, lineage id, direction, frame)."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "capture_id": CAPTURE,
                "connection_id": connection,
                "seq": seq,
                "wall_ns": seq * 1_000_000,
                "direction": direction,
                "api_key": ApiKey.PRODUCE,
                "api_version": 9,
                "correlation_id": cid,
                "lineage_id": lineage,
                "frame": frame,
                "frame_length": len(frame),
            }
            for seq, (connection, cid, lineage, direction, frame) in enumerate(rows)
        ]
    )


def _summed(batches: list[pa.RecordBatch]) -> list[tuple]:
    facts = pa.Table.from_batches(list(decode_batches(iter(batches))), schema=FACT_SCHEMA)
    out = facts_pass(facts, sum_plain_sends=True)
    sends = out.filter(pa.compute.equal(out.column("kind"), "batch_sends"))
    names = ["sends", "acknowledged_sends", "unanswered_sends", "lineages"]
    return [tuple(r[n] for n in names) for r in sends.select(names).to_pylist()]


BATCH = records(2)


def test_a_resend_by_corrfix_is_one_lineage():
    sent = produce_frame(1000, batch=BATCH)
    resent = produce_frame(1001, batch=BATCH)  # the same request, re-sent under a new upstream id
    rows = [
        ("a", 1000, 5, "request", sent),
        ("a", 1001, 5, "request", resent),
        ("a", 1000, None, "response", produce_answer(1000)),
        ("a", 1001, None, "response", produce_answer(1001)),
    ]
    assert _summed([_frames(rows)]) == [(2, 2, 0, 1)]


def test_a_retry_by_the_client_is_another_lineage_with_the_same_batch():
    first = [
        ("a", 1000, 5, "request", produce_frame(1000, batch=BATCH)),
        ("a", 1000, None, "response", produce_answer(1000)),
    ]
    retry = [
        ("b", 1000, 0, "request", produce_frame(1000, batch=BATCH)),
        ("b", 1000, None, "response", produce_answer(1000)),
    ]  # a new connection and a new client correlation id
    assert _summed([_frames(first + retry)]) == [(2, 2, 0, 2)]
    wire = [(c, cid, None, direction, frame) for c, cid, _, direction, frame in first + retry]
    assert _summed([_frames(wire)]) == [(2, 2, 0, 2)]  # no lineage: each send its own


def test_a_real_crc_collision_between_two_batches_is_no_duplicate():
    first = records(1, value=b"aaaa")
    crc = int.from_bytes(first[17:21], "big")
    other = records(1, value=b"zzzz", timestamp=1_700_000_000_005)
    other = with_crc(other, crc, other.index(b"zzzz"))  # other records, other time, one CRC
    assert other != first and other[17:21] == first[17:21]
    rows = [
        ("a", 1000, None, "request", produce_frame(1000, batch=first)),
        ("a", 1000, None, "response", produce_answer(1000)),
        ("b", 1000, None, "request", produce_frame(1000, batch=other)),
        ("b", 1000, None, "response", produce_answer(1000)),
    ]
    assert _summed([_frames(rows)]) == [(1, 1, 0, 1), (1, 1, 0, 1)]
