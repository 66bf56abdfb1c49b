"""The per-connection pass, without Spark: what it keeps of each side, the rows it passes
through and the counts, on arbitrary connections (the pairing itself is checked against
the rules in test_matching)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from corrfix.capture.format import CAPTURE_SCHEMA
from spark_audit.connections import (
    CONNECTION_CODE,
    INPUT_COLUMNS,
    TRANSACTIONS_SCHEMA,
    connection_pass,
    match,
    merge_acks,
)
from spark_audit.decode import FACT_SCHEMA
from tests.support.audit_builders import ACKS0, ACKS1, CAPTURE

events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # connection
        st.sampled_from(["frame", "frame", "frame", "repair", "close"]),
        st.sampled_from(["client", "upstream"]),
        st.booleans(),  # request
        st.integers(0, 3),  # correlation id
        st.sampled_from([None, ACKS0, ACKS1]),  # a Produce frame (acks 0 or 1), or another api
    ),
    max_size=40,
)


def _rows(drawn: list[tuple]) -> pa.Table:
    rows = []
    for seq, (conn, kind, side, is_request, cid, frame) in enumerate(drawn):
        row = dict.fromkeys(CAPTURE_SCHEMA.names)
        row.update(capture_id=CAPTURE, source="proxy", connection_id=conn, seq=seq, kind=kind)
        row.update(wall_ns=1000 + seq, mono_ns=seq)
        if kind == "frame":
            row.update(side=side, direction="request" if is_request else "response", api_version=9)
            row.update(api_key=0 if frame is not None else 3, frame=frame if is_request else None)
            row["client_correlation_id" if side == "client" else "upstream_correlation_id"] = cid
        elif kind == "repair":
            row.update(event="stale_drop", upstream_correlation_id=cid)
        else:
            row.update(reason="client closed")
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA)


def _side(table: pa.Table, side: str) -> pa.Table:
    """The reference: :func:`match` on one side's frames, expects from the frame's acks."""
    id_column = "client_correlation_id" if side == "client" else "upstream_correlation_id"
    frames = table.filter(
        pc.fill_null(pc.and_(pc.equal(table["kind"], "frame"), pc.equal(table["side"], side)), False)
    )
    expects = [
        None if d == "response" else f != ACKS0
        for d, f in zip(frames["direction"].to_pylist(), frames["frame"].to_pylist(), strict=True)
    ]
    columns = {c: frames[c] for c in INPUT_COLUMNS if c not in ("cid", "expects")}
    got = pa.table({**columns, "cid": frames[id_column], "expects": pa.array(expects, pa.bool_())})
    return match(got.select(INPUT_COLUMNS))


def _seqs(table: pa.Table, **where: str) -> list[int]:
    rows = table.to_pylist()
    return sorted(r["seq"] for r in rows if all(r[k] == v for k, v in where.items()))


@settings(max_examples=200, deadline=None)
@given(drawn=events)
def test_the_pass_keeps_what_the_checks_read(drawn):
    table = _rows(drawn)
    out = connection_pass(table)
    assert out.schema == TRANSACTIONS_SCHEMA
    client = _side(table, "client").to_pylist()
    assert _seqs(out, kind="frame", side="client") == sorted(r["seq"] for r in client)
    upstream = [
        r for r in _side(table, "upstream").to_pylist() if r["direction"] == "response" or r["skipped"]
    ]
    assert _seqs(out, kind="frame", side="upstream") == sorted(r["seq"] for r in upstream)
    by_seq = {r["seq"]: r for r in out.to_pylist() if r["kind"] == "frame"}
    for want in client + upstream:
        got = by_seq[want["seq"]]
        assert {k: got[k] for k in want} == want
    for kind in ("repair", "close"):
        assert _seqs(out, kind=kind) == [seq for seq, d in enumerate(drawn) if d[1] == kind]
    counts = {r["connection_id"]: r for r in out.to_pylist() if r["kind"] == "connection"}
    for conn in {d[0] for d in drawn}:
        mine = [(seq, d) for seq, d in enumerate(drawn) if d[0] == conn]
        assert (counts[conn]["rows"], counts[conn]["frames"], counts[conn]["repairs"]) == (
            len(mine),
            sum(d[1] == "frame" for _, d in mine),
            sum(d[1] == "repair" for _, d in mine),
        )
        assert (counts[conn]["first_wall_ns"], counts[conn]["last_wall_ns"]) == (
            1000 + mine[0][0],
            1000 + mine[-1][0],
        )
    assert set(counts) == {d[0] for d in drawn}


placed = st.lists(
    st.tuples(
        st.sampled_from(["c1", "c2"]),  # capture
        st.sampled_from(["a", "b"]),  # connection
        st.sampled_from(["proxy", "wire", "lab"]),  # source: the format's two, and any other
        st.sampled_from(["frame", "repair", "close"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(drawn=placed, coded=st.booleans(), codes=st.permutations(range(4)))
def test_connection_counts_are_per_capture_connection_and_source(drawn, coded, codes):
    """The counts are grouped by one integer key, from the read's connection codes (any
    integers, one per capture and connection) or coded here: either way per capture,
    connection and source, as grouping the strings would give them."""
    rows = []
    for seq, (capture, conn, source, kind) in enumerate(drawn):
        row = dict.fromkeys(CAPTURE_SCHEMA.names)
        row.update(
            capture_id=capture, connection_id=conn, source=source, seq=seq, kind=kind, wall_ns=50 - seq
        )
        if kind == "frame":
            row.update(
                side="client", direction="request", api_key=3, api_version=9, client_correlation_id=seq
            )
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA)
    if coded:
        keys = [("c1", "a"), ("c1", "b"), ("c2", "a"), ("c2", "b")]
        table = table.append_column(
            CONNECTION_CODE, pa.array([codes[keys.index((r[0], r[1]))] for r in drawn], pa.int64())
        )
    expected: dict[tuple, list[int]] = {}
    for seq, (capture, conn, source, kind) in enumerate(drawn):
        got = expected.setdefault((capture, conn, source), [0, 0, 0, 50 - seq, 50 - seq])
        got[0] += 1
        got[1] += kind == "frame"
        got[2] += kind == "repair"
        got[3], got[4] = min(got[3], 50 - seq), max(got[4], 50 - seq)
    out = [r for r in connection_pass(table).to_pylist() if r["kind"] == "connection"]
    names = ("rows", "frames", "repairs", "first_wall_ns", "last_wall_ns")
    assert {
        (r["capture_id"], r["connection_id"], r["source"]): [r[n] for n in names] for r in out
    } == expected
    assert len(out) == len(expected)


answers = st.lists(
    st.tuples(
        st.sampled_from(["produce_batch", "produce_batch", "produce_ack", "error"]),
        st.sampled_from([0, 0, 3]),  # api key
        st.sampled_from(["a", "b"]),  # connection
        st.sampled_from([0, 1, None]),  # correlation id
        st.sampled_from(["t", "u", None]),  # topic
        st.sampled_from([0, 1, None]),  # partition
        st.sampled_from([0, 6, None]),  # error code
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(drawn=answers)
def test_batches_get_their_answers_as_a_left_outer_join_gives_them(drawn):
    rows = []
    for seq, (fact, api_key, conn, cid, topic, partition, error) in enumerate(drawn):
        row = dict.fromkeys(FACT_SCHEMA.names)
        row.update(capture_id=CAPTURE, connection_id=conn, seq=seq, wall_ns=seq, fact=fact, api_key=api_key)
        row.update(correlation_id=cid, topic=topic, partition=partition, error_code=error)
        rows.append(row)
    facts = pa.Table.from_pylist(rows, schema=FACT_SCHEMA)
    call = ["capture_id", "connection_id", "correlation_id", "topic", "partition"]
    fact = facts.column("fact")
    batches = facts.filter(pc.and_(pc.equal(fact, "produce_batch"), pc.equal(facts.column("api_key"), 0)))
    acks = facts.filter(pc.equal(fact, "produce_ack"))
    acked = pa.table(
        {**{n: acks.column(n) for n in call}, "acknowledged": pc.equal(acks.column("error_code"), 0)}
    )
    joined = batches.join(acked, call, join_type="left outer", use_threads=False)
    others = facts.filter(pc.invert(pc.is_in(fact, value_set=pa.array(["produce_batch", "produce_ack"]))))
    want = others.to_pylist() + joined.select([*FACT_SCHEMA.names, "acknowledged"]).to_pylist()
    for row in want[: others.num_rows]:
        row["acknowledged"] = None
    got = merge_acks(facts)
    assert got.column_names == [*FACT_SCHEMA.names, "acknowledged"]
    assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, want))
