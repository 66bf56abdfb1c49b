"""Each connection's upstream address and named cluster, as the pass folds them into one
``connection`` fact per connection, and the sends summed per batch and home."""

from __future__ import annotations

import pyarrow as pa

from corrfix.capture.format import CAPTURE_SCHEMA
from protocol import ApiKey
from spark_audit.connections import facts_pass
from spark_audit.connections._clusters import connection_facts, open_rows, send_homes
from spark_audit.decode import FACT_SCHEMA
from tests.support.audit_builders import fact, req, row

FACTS = pa.schema([f.with_nullable(True) for f in FACT_SCHEMA])


def _facts(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=FACTS)


def cluster(connection: str, seq: int, name: str) -> dict:
    """The ``cluster`` fact of a Metadata or DescribeCluster answer."""
    return {**fact(connection, seq, "cluster", direction="response", api_key=3, cid=seq), "cluster_id": name}


def sent(connection: str, seq: int, crc: int = 111) -> list[dict]:
    """A send of a batch without a producer id, acknowledged."""
    values = {"topic": "t", "partition": 0, "crc": crc, "producer_id": -1, "record_count": 1}
    values |= {"first_timestamp": 1, "batch_length": 61, "acks": 1}
    batch = fact(connection, seq, "produce_batch", direction="request", api_key=ApiKey.PRODUCE, cid=seq)
    answer = fact(connection, seq + 1, "produce_ack", direction="response", api_key=ApiKey.PRODUCE, cid=seq)
    return [{**batch, **values}, {**answer, "topic": "t", "partition": 0, "error_code": 0}]


def test_the_open_rows_give_each_connections_upstream_address():
    rows = [
        row("a", 0, "open", client_address="10.0.0.1:5000", upstream_address="a1:9092"),
        req("a", 1, "upstream", 3, cid=1, uid=1),
        row("b", 0, "open", client_address="10.0.0.1:5001", upstream_address="b1:9092"),
        row("c", 1, "close", reason="client closed"),  # c's open row was lost
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=CAPTURE_SCHEMA)
    assert open_rows(batch).select(["connection_id", "upstream_address"]).to_pylist() == [
        {"connection_id": "a", "upstream_address": "a1:9092"},
        {"connection_id": "b", "upstream_address": "b1:9092"},
    ]
    among = [False, False, True, True]
    assert open_rows(batch, pa.array(among).to_numpy(zero_copy_only=False)).column(
        "connection_id"
    ).to_pylist() == ["b"]


def test_a_connection_fact_names_the_one_cluster_its_answers_named():
    facts = _facts(
        [
            cluster("a", 1, "A"),
            cluster("a", 5, "A"),
            cluster("m", 1, "A"),
            cluster("m", 3, "B"),  # two clusters on one connection: it says nothing
            *sent("p", 7),  # a leader's connection: only Produce
        ]
    )
    opens = open_rows(
        pa.RecordBatch.from_pylist(
            [
                row("a", 0, "open", upstream_address="a1:9092"),
                row("q", 0, "open", upstream_address="a2:9092"),
            ],
            schema=CAPTURE_SCHEMA,
        )
    )
    got = connection_facts(facts, opens, facts).select(
        ["connection_id", "upstream_address", "cluster_id", "fact"]
    )
    assert sorted(got.to_pylist(), key=lambda r: r["connection_id"]) == [
        {"connection_id": "a", "upstream_address": "a1:9092", "cluster_id": "A", "fact": "connection"},
        {"connection_id": "m", "upstream_address": None, "cluster_id": None, "fact": "connection"},
        {"connection_id": "p", "upstream_address": None, "cluster_id": None, "fact": "connection"},
        {"connection_id": "q", "upstream_address": "a2:9092", "cluster_id": None, "fact": "connection"},
    ]


def test_the_facts_pass_folds_cluster_facts_into_connection_facts():
    facts = _facts([cluster("a", 1, "A"), cluster("a", 3, "A"), *sent("a", 5)])
    opens = open_rows(
        pa.RecordBatch.from_pylist([row("a", 0, "open", upstream_address="a1:9092")], schema=CAPTURE_SCHEMA)
    )
    out = facts_pass(facts, opens=opens).to_pylist()
    kept = [(r["fact"], r["upstream_address"], r["cluster_id"]) for r in out if r["kind"] == "fact"]
    assert sorted(kept, key=str) == [("connection", "a1:9092", "A"), ("produce_batch", None, None)]
    counted = {r["fact"]: r["rows"] for r in out if r["kind"] == "fact_count"}
    assert counted == {"cluster": 2, "produce_batch": 1, "produce_ack": 1}  # what was decoded


def test_one_batch_sent_to_two_clusters_is_summed_per_home():
    facts = _facts(
        [cluster("ma", 1, "A"), cluster("mb", 1, "B"), *sent("pa", 3), *sent("pb", 5), *sent("pb2", 7)]
    )
    opens = open_rows(
        pa.RecordBatch.from_pylist(
            [
                row(c, 0, "open", upstream_address=a)
                for c, a in (("pa", "a1:9092"), ("pb", "b1:9092"), ("pb2", "b1:9092"))
            ],
            schema=CAPTURE_SCHEMA,
        )
    )
    out = facts_pass(facts, sum_plain_sends=True, opens=opens).to_pylist()
    summed = [(r["upstream_address"], r["cluster_id"], r["sends"]) for r in out if r["kind"] == "batch_sends"]
    assert sorted(summed) == [("a1:9092", None, 1), ("b1:9092", None, 2)]


def test_each_send_gets_its_connections_home():
    connections = _facts(
        [
            {
                **fact(c, 0, "connection", direction=None, api_key=None, cid=None),
                "upstream_address": a,
                "cluster_id": n,
            }
            for c, a, n in (("a", "a1:9092", "A"), ("b", "b1:9092", None), ("c", "a1:9092", "A"))
        ]
    )
    sends = _facts([*sent("b", 1), *sent("a", 3), *sent("c", 5)]).filter(pa.array([True, False] * 3))
    address, named = send_homes(sends, connections)
    assert address.to_pylist() == ["b1:9092", "a1:9092", "a1:9092"]
    assert named.to_pylist() == [None, "A", "A"]
    assert address.indices.to_pylist()[1] == address.indices.to_pylist()[2]  # one home: one code
    one = connections.filter(pa.array([True, False, True]))
    address, named = send_homes(sends.filter(pa.array([False, True, True])), one)
    assert (address.to_pylist(), named.to_pylist()) == (["a1:9092"] * 2, ["A"] * 2)
