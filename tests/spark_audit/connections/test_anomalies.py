"""Checks 1 and 2 and the latency numbers computed in the pass equal their Spark references
(:mod:`spark_audit.checks`) on arbitrary connections: proxy and wire, repairs of every kind,
probes, strays, closes of every kind and capture gaps."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import from_arrow_schema

from corrfix.capture.format import CAPTURE_SCHEMA
from spark_audit.checks import (
    client_pairs,
    client_view,
    latencies,
    latency_by_api,
    latency_by_window,
    slow_requests,
    upstream_skips,
    upstream_strays,
)
from spark_audit.connections import (
    CLIENT_SCHEMA,
    SKIP_SCHEMA,
    STRAY_SCHEMA,
    answered_requests,
    client_violations,
    connection_pass,
    merge_summaries,
    skipped_sends,
    slow_candidates,
    stray_answers,
    summaries,
)
from spark_audit.connections._anomalies import rows_where
from tests.support.audit_builders import ACKS0, ACKS1, repair, req, resp, row, transactions_df, wire_rows

EVENTS = ["skip_detected", "requeue", "probe_found_loss", "possible_duplicate", "give_up", "stale_drop"]
CLOSES = ["client closed", "capture closed", "fin", "capture_end,response_gap=10", "rst,response_skipped=3"]
GAPS = [None, None, None, "gap_before=10", "skipped_before=4", "missing=2", "unmatched"]

request = st.tuples(
    st.sampled_from(["client", "upstream"]),
    st.sampled_from([(0, ACKS1), (0, ACKS0), (3, None), (18, None), (None, None)]),
    st.sampled_from([None, 0, 0, 1, 2, 5]),  # the answer comes this many requests later, or never
    st.booleans(),  # a second answer
    st.booleans(),  # upstream: carries the client's id (else a probe's null)
    st.sampled_from(GAPS),  # on the request's row
    st.sampled_from(GAPS),  # on the answer's row
    st.integers(0, 30),  # ms it took
)
repair_event = st.tuples(st.sampled_from(EVENTS), st.integers(0, 7), st.sampled_from([None, 1, 2, 3, 4]))
connection = st.tuples(
    st.sampled_from(["proxy", "wire"]),
    st.booleans(),  # wire: the capture started midstream
    st.integers(0, 7),  # the first correlation id (ids wrap at 8 here)
    st.lists(request, max_size=12),
    st.lists(repair_event, max_size=8),
    st.sampled_from([*CLOSES, None, None]),
    st.booleans(),  # a stray answer to an id never sent
)


def _rows(connections: list[tuple]) -> list[dict[str, Any]]:
    """Requests in order, answered in or out of order, twice or never, on both sides."""
    rows: list[dict[str, Any]] = []
    for n, (source, midstream, first, requests, repairs, close, stray) in enumerate(connections):
        name = f"c{n}"
        slots: list[tuple[float, dict[str, Any]]] = []
        for i, (side, (api, body), delay, twice, with_cid, ask_gap, answer_gap, took) in enumerate(requests):
            side = "client" if source == "wire" else side
            cid = (first + i) % 8
            ids = {"cid": cid} if side == "client" else {"uid": cid, "cid": cid if with_cid else None}
            extra = {"frame": body, "api_version": 9} if body else {}
            slots.append((i, req(name, 0, side, api, reason=ask_gap, **ids, **extra)))
            if delay is not None:
                for k in range(2 if twice else 1):
                    answer = resp(name, 0, side, api, reason=answer_gap, **ids)
                    slots.append((i + delay + 0.5 + k + took / 100, answer))
        for event, at, new in repairs:
            made = repair(name, 0, event, (first + at) % 8, new_upstream_correlation_id=new)
            slots.append((at + 0.7, made))
        if stray:
            slots.append((len(requests) / 2, resp(name, 0, "client", 3, cid=99, uid=99)))
        ordered = [r for _, r in sorted(slots, key=lambda s: s[0])]
        if source == "wire":
            ordered.insert(0, row(name, 0, "open", reason="midstream" if midstream else "syn"))
        if close is not None:
            ordered.append(row(name, 0, "close", reason=close))
        for seq, made in enumerate(ordered):
            ns = 1_000_000 * (10 * seq + 7 * n)
            rows.append({**made, "seq": seq, "wall_ns": ns, "mono_ns": ns, "source": source})
    return rows


def _same(got: pa.Table, schema: pa.Schema, expected: list[Any]) -> None:
    def canonical(rows: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(r, sort_keys=True) for r in rows)

    assert got.schema == schema
    assert canonical(got.to_pylist()) == canonical([r.asDict(recursive=True) for r in expected])


@pytest.fixture(scope="module")
def check_schemas(spark):
    """The Spark references' column names and types."""
    tx = transactions_df(spark, [req("s", 1, "client", 3, cid=1)])
    return {
        "skip": upstream_skips(tx).schema,
        "stray": upstream_strays(tx).schema,
        "client": client_view(tx).schema,
    }


def test_the_pass_gives_the_references_columns(check_schemas):
    for name, schema in (("skip", SKIP_SCHEMA), ("stray", STRAY_SCHEMA), ("client", CLIENT_SCHEMA)):
        got = [(f.name, f.dataType.simpleString()) for f in check_schemas[name]]
        want = [(f.name, f.dataType.simpleString()) for f in from_arrow_schema(schema)]
        assert got == want


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking through Spark takes minutes
)
@given(connections=st.lists(connection, min_size=1, max_size=30))
def test_checks_in_the_pass_equal_the_spark_checks(spark, connections):
    rows = _rows(connections)
    table = connection_pass(pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA))
    tx = transactions_df(spark, rows).cache()
    _same(skipped_sends(table), SKIP_SCHEMA, upstream_skips(tx).collect())
    _same(stray_answers(table), STRAY_SCHEMA, upstream_strays(tx).collect())
    _same(client_violations(table), CLIENT_SCHEMA, client_view(tx).collect())

    lat = latencies(client_pairs(tx)).cache()
    by_api = latency_by_api(lat)
    got_api, got_window = merge_summaries(summaries(answered_requests(table), 10).to_pylist())
    assert got_api == [r.asDict() for r in by_api.orderBy("api_key").collect()]
    windows = latency_by_window(lat, 10).orderBy("window_start_ns", "api_key").collect()
    assert got_window == [r.asDict() for r in windows]
    for min_ms in (0.0, 5.0):
        candidates = spark.createDataFrame(slow_candidates(answered_requests(table), min_ms))
        merged = spark.createDataFrame(got_api, by_api.schema) if got_api else by_api
        want = slow_requests(lat, by_api, 2.0, min_ms).collect()
        assert sorted(slow_requests(candidates, merged, 2.0, min_ms).collect()) == sorted(want)
    tx.unpersist()
    lat.unpersist()


def test_a_hand_built_wire_capture_in_the_pass():
    table = connection_pass(pa.Table.from_pylist(wire_rows(), schema=CAPTURE_SCHEMA))
    kinds = sorted((r["connection_id"], r["seq"], r["kind"]) for r in client_violations(table).to_pylist())
    assert kinds == [
        ("w1", 1, "out_of_order"),
        ("w1", 6, "acks0_reply"),
        ("w1", 7, "orphan"),
        ("w1", 10, "duplicate"),
        ("w1", 11, "id_not_increasing"),
        ("w1", 13, "answer_missing"),
        ("w1", 16, "unanswered_at_close"),
        ("w2", 5, "unanswered_at_capture_end"),
        ("w3", 1, "unanswered_at_capture_end"),
    ]


@settings(max_examples=200, deadline=None)
@given(mask=st.lists(st.one_of(st.none(), st.booleans()), max_size=20), size=st.integers(1, 8))
def test_rows_where_gives_the_rows_a_filter_gives(mask, size):
    """Also when the rows are one run (then a slice) and when the chunks are uneven."""
    cuts = range(0, len(mask), size)
    numbers = pa.chunked_array([pa.array(range(i, min(i + size, len(mask)))) for i in cuts], pa.int64())
    chosen = pa.chunked_array([pa.array(mask[i : i + size], pa.bool_()) for i in cuts], pa.bool_())
    got = rows_where(pa.table({"n": numbers}), chosen)
    assert got.column("n").to_pylist() == [i for i, m in enumerate(mask) if m]
