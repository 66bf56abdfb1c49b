"""The vectorised matching against a plain per-row reading of its rules."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_audit.connections import PAIRS_SCHEMA, answers_in_order, match

frames = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.integers(0, 3), st.booleans()),
    max_size=40,
)


def _table(rows: list[tuple[str, bool, int, bool]]) -> pa.Table:
    n = len(rows)
    return pa.table(
        {
            "capture_id": ["cap"] * n,
            "connection_id": [r[0] for r in rows],
            "seq": list(range(n)),
            "direction": ["request" if r[1] else "response" for r in rows],
            "wall_ns": [1000 + i for i in range(n)],
            "mono_ns": [2000 + i for i in range(n)],
            "api_key": pa.array([r[2] for r in rows], pa.int16()),
            "api_version": pa.array([0] * n, pa.int16()),
            "client_correlation_id": pa.array([r[2] for r in rows], pa.int32()),
            "upstream_correlation_id": pa.array([None] * n, pa.int32()),
            "cid": pa.array([r[2] for r in rows], pa.int32()),
            "expects": pa.array([r[3] if r[1] else None for r in rows], pa.bool_()),
        }
    )


def _reference(rows: list[tuple[str, bool, int, bool]]) -> dict[int, dict]:
    """The rules, row by row (quadratic, obviously right)."""
    out: dict[int, dict] = {}
    answer: dict[int, int | None] = {}
    for i, (conn, is_req, cid, _) in enumerate(rows):
        same = [j for j in range(len(rows)) if rows[j][0] == conn and rows[j][2] == cid]
        if is_req:
            after = [j for j in same if j > i]
            answer[i] = after[0] if after and not rows[after[0]][1] else None
        else:
            before = [j for j in same if j < i and rows[j][1]]
            req = before[-1] if before else None
            nth = None if req is None else sum(1 for j in same if req < j <= i and not rows[j][1])
            out[i] = {"request_seq": req, "nth": nth}
    for i, (conn, is_req, _, expects) in enumerate(rows):
        if not is_req:
            continue
        later = [answer[j] for j in answer if j > i and rows[j][0] == conn and answer[j] is not None]
        first = min(later) if later else None
        skipped = expects and first is not None and (answer[i] is None or answer[i] > first)
        previous = [j for j in range(i) if rows[j][0] == conn and rows[j][1]]
        out[i] = {
            "answer_seq": answer[i],
            "skipped": skipped,
            "overtaken_seq": first if skipped else None,
            "previous_request_cid": rows[previous[-1]][2] if previous else None,
        }
    return out


@settings(max_examples=300, deadline=None)
@given(rows=frames)
def test_match_follows_the_rules(rows):
    got = match(_table(rows))
    assert got.schema == PAIRS_SCHEMA
    expected = _reference(rows)
    stray = {
        i
        for i, want in expected.items()
        if not rows[i][1]
        and (want["request_seq"] is None or want["nth"] > 1 or not rows[want["request_seq"]][3])
    }
    assert sorted(got.column("seq").to_pylist()) == [i for i, r in enumerate(rows) if r[1] or i in stray]
    for row in got.to_pylist():
        want = expected[row["seq"]]
        assert {key: row[key] for key in want} == want, row


PERTURBATIONS = [None, "swap", "drop", "twice", "reuse", "early", "unexpected"]

traffic = st.tuples(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.booleans(), st.integers(0, 2)), max_size=16),
    st.sampled_from(PERTURBATIONS),
    st.integers(0, 15),
)


def _in_order(requests: list[tuple[str, bool, int]]) -> list[tuple[str, bool, int, bool]]:
    """Requests with rising ids per connection, each answered in order (unless it expects
    none) after ``lag`` more of its connection's requests: pipelined, never overtaken."""
    rows: list[tuple[float, tuple[str, bool, int, bool]]] = []
    count: dict[str, int] = {}
    answered: dict[str, float] = {}
    for i, (conn, expects, lag) in enumerate(requests):
        cid = count.get(conn, 0)
        count[conn] = cid + 1
        rows.append((i, (conn, True, cid, expects)))
        if expects:
            answered[conn] = max(i + lag + 0.5, answered.get(conn, 0) + 0.01)
            rows.append((answered[conn], (conn, False, cid, False)))
    return [r for _, r in sorted(rows, key=lambda got: got[0])]


def _perturbed(rows: list[tuple[str, bool, int, bool]], how: str | None, at: int) -> list:
    answers = [i for i, r in enumerate(rows) if not r[1]]
    requests = [i for i, r in enumerate(rows) if r[1]]
    rows = list(rows)
    if how is None or not answers:
        return rows
    a = answers[at % len(answers)]
    r = requests[at % len(requests)]
    if how == "swap" and len(answers) > 1:
        b = answers[(at + 1) % len(answers)]
        rows[a], rows[b] = rows[b], rows[a]
    elif how == "drop":
        del rows[a]
    elif how == "twice":
        rows.insert(a + 1, rows[a])
    elif how == "reuse":  # a request and its answer take the id of the request before it
        conn, _, cid, _ = rows[r]
        earlier = [row[2] for row in rows[:r] if row[0] == conn and row[1]]
        if earlier:
            for i in range(r, len(rows)):
                if rows[i][0] == conn and rows[i][2] == cid:
                    rows[i] = (conn, rows[i][1], earlier[-1], rows[i][3])
    elif how == "early":  # an answer before its request
        rows.insert(0, rows.pop(a))
    elif how == "unexpected":  # an answer to a request that expects none
        rows[r] = (*rows[r][:3], False)
    return rows


@settings(max_examples=300, deadline=None)
@given(rows=frames)
def test_answers_in_order_only_when_match_finds_nothing_out_of_order(rows):
    if answers_in_order(_table(rows)):
        got = match(_table(rows))
        assert not any(got.column("skipped").to_pylist())
        assert set(got.column("direction").to_pylist()) <= {"request"}


@settings(max_examples=300, deadline=None)
@given(made=traffic)
def test_answers_in_order_on_pipelined_traffic(made):
    requests, how, at = made
    rows = _perturbed(_in_order(requests), how, at)
    got = match(_table(rows))
    out_of_order = any(got.column("skipped").to_pylist()) or "response" in got.column("direction").to_pylist()
    if how is None:
        assert answers_in_order(_table(rows))
    if answers_in_order(_table(rows)):
        assert not out_of_order
