"""Requests paired with their answers on one side of whole connections, with numpy: the
pure core of the per-connection pass (no Spark; it runs inside the Data Source's ``read()``
and, for paths only Spark can open, inside a grouped Arrow call after one shuffle).

A broker answers one connection's requests in order, so per connection and correlation id
a response belongs to the latest request with that id before it, and a request's answer is
the first response with its id after it (and before the id's next request: ids wrap).
Rules:

- an answer belongs to the latest request with its id before it; ``nth`` counts the answers
  to that request so far (2 and more are duplicates);
- a request's answer is the next frame with its id, if that is an answer (the id's next
  request would otherwise come first: ids wrap);
- a request is *overtaken* (``skipped``) when it expects an answer and the earliest answer
  to any later request of its connection comes before its own (or it never gets one);
- ``previous_request_cid``: the id of the connection's previous request, for id order.

The rows are sorted by connection and seq once, then by correlation id (stable), and every
partner is found with cumulative maxima and minima instead of per-row Python. Only
requests and *stray* answers come out (no request, a second answer, or an answer to acks=0
Produce): an answer as expected is already on its request's row (``answer_*``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_audit.connections._codes import combined, dense, sort_order

INPUT_COLUMNS = [
    "capture_id",
    "connection_id",
    "seq",
    "direction",
    "wall_ns",
    "mono_ns",
    "api_key",
    "api_version",
    "client_correlation_id",
    "upstream_correlation_id",
    "cid",
    "expects",
]
"""The columns :func:`match` reads (its input may carry more, which it ignores)."""
CONNECTION_CODE = "connection_code"
"""An optional input column: each row's connection (capture and connection id) as an
integer, equal exactly where the connection is. The partition's read has it for free from
choosing its rows, so the pass need not hash the two string columns again."""

PAIRS_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string(), nullable=False),
        pa.field("connection_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("direction", pa.string()),
        pa.field("wall_ns", pa.int64()),
        pa.field("mono_ns", pa.int64()),
        pa.field("api_key", pa.int16()),
        pa.field("api_version", pa.int16()),
        pa.field("client_correlation_id", pa.int32()),
        pa.field("upstream_correlation_id", pa.int32()),
        pa.field("cid", pa.int32()),
        pa.field("expects", pa.bool_()),
        pa.field("request_seq", pa.int64()),
        pa.field("request_mono_ns", pa.int64()),
        pa.field("request_expects", pa.bool_()),
        pa.field("nth", pa.int64()),
        pa.field("answer_seq", pa.int64()),
        pa.field("answer_wall_ns", pa.int64()),
        pa.field("answer_mono_ns", pa.int64()),
        pa.field("skipped", pa.bool_()),
        pa.field("overtaken_seq", pa.int64()),
        pa.field("overtaken_wall_ns", pa.int64()),
        pa.field("overtaken_cid", pa.int32()),
        pa.field("overtaken_api_key", pa.int16()),
        pa.field("overtaken_client_correlation_id", pa.int32()),
        pa.field("previous_request_cid", pa.int32()),
    ]
)
"""One row per request and per stray answer, with its partners; ``request_*``/``nth`` on
answers, ``answer_*``, ``skipped``, ``overtaken_*`` and ``previous_request_cid`` on requests."""


def _ints(column: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    return pc.fill_null(column, fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _flags(column: pa.ChunkedArray | pa.Array, fill: bool) -> np.ndarray:
    return pc.fill_null(column, fill).to_numpy(zero_copy_only=False)


def connection_codes(table: pa.Table) -> np.ndarray:
    """Each row's connection as an integer: :data:`CONNECTION_CODE` if the table has it,
    else coded from ``capture_id`` and ``connection_id``."""
    if CONNECTION_CODE in table.column_names:
        return _ints(table.column(CONNECTION_CODE))
    return combined([dense(table.column("capture_id")), dense(table.column("connection_id"))])


def _in_seq_order(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The order of the rows by connection and seq, and in that order each row's connection
    as a number, whether it is a request, its id, and whether it expects an answer."""
    conn_ids = connection_codes(table)
    order = sort_order(conn_ids, _ints(table.column("seq")))
    is_req = _flags(pc.equal(table.column("direction"), "request"), False)[order]
    cid = _ints(table.column("cid"))[order]
    expects = _flags(table.column("expects"), True)[order]
    return order, conn_ids[order], is_req, cid, expects


def _pick(column: pa.ChunkedArray | pa.Array, index: np.ndarray, valid: np.ndarray) -> pa.Array:
    """``column[index]`` where ``valid``, else null."""
    return pc.take(column, pa.array(index, pa.int64(), mask=~valid))


def answers_in_order(table: pa.Table) -> bool:
    """Whether :func:`match` would find nothing out of order in ``table`` (its input): no
    overtaken request and no stray answer. True when, per connection in seq order, request
    ids never repeat (so no id is reused while in flight), and the answers' ids are exactly
    the ids of the requests that expect one, in the same order, each after its request.
    Cheaper than :func:`match` (one sort of the rows, no partners gathered), so the
    upstream side of a proxy capture, where only what is out of order is kept, pays for
    the full pairing only when something is."""
    n = table.num_rows
    if n == 0:
        return True
    _, conn, is_req, cid, expects = _in_seq_order(table)
    req_conn, req_cid = conn[is_req], cid[is_req]
    same = req_conn[1:] == req_conn[:-1]
    if (req_cid[1:][same] <= req_cid[:-1][same]).any():  # ids repeat or wrap: pair in full
        return False
    pos = np.arange(n, dtype=np.int64)
    asks, answers = is_req & expects, ~is_req
    if asks.sum() != answers.sum():
        return False
    return bool(
        (conn[asks] == conn[answers]).all()
        and (cid[asks] == cid[answers]).all()
        and (pos[asks] < pos[answers]).all()
    )


def match(table: pa.Table) -> pa.Table:
    """The requests and stray answers of ``table`` (whole connections, frames with an id),
    with their partners."""
    if table.num_rows == 0:
        return PAIRS_SCHEMA.empty_table()
    table = table.combine_chunks()
    by_seq, conn, is_req, cid, expects = _in_seq_order(table)  # the rows stay where they are:
    n = table.num_rows  # positions below are in seq order, by_seq maps them to rows
    pos = np.arange(n, dtype=np.int64)

    # Per connection and id, in seq order (the sort is stable, rows are already in seq order).
    by_id = sort_order(conn, cid)
    r_conn, r_cid, r_req = conn[by_id], cid[by_id], is_req[by_id]
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (r_conn[1:] != r_conn[:-1]) | (r_cid[1:] != r_cid[:-1])
    group_start = np.maximum.accumulate(np.where(new_group, pos, 0))
    last_req = np.maximum.accumulate(np.where(r_req, pos, -1))
    has_req = ~r_req & (last_req >= group_start)
    answers_so_far = np.cumsum(~r_req)
    nth_sorted = answers_so_far - answers_so_far[np.maximum(last_req, 0)]
    nxt = np.minimum(pos + 1, n - 1)
    answered = r_req & (pos + 1 < n) & ~new_group[nxt] & ~r_req[nxt]

    # Back to seq order: partners as positions in it.
    to_seq = by_id  # position in by-id order -> position in seq order
    request_of = np.full(n, -1, dtype=np.int64)
    request_of[to_seq[has_req]] = to_seq[last_req[has_req]]
    nth = np.zeros(n, dtype=np.int64)
    nth[to_seq[has_req]] = nth_sorted[has_req]
    answer_of = np.full(n, -1, dtype=np.int64)
    answer_of[to_seq[answered]] = to_seq[nxt[answered]]
    has_request, has_answer = request_of >= 0, answer_of >= 0

    # Earliest answer to a strictly later request of the same connection: a suffix minimum
    # of 2 * answer position; a request without answer counts 2 * (its connection's end) - 1,
    # which is above its own connection's answers and below every later connection's.
    conn_end = np.empty(n, dtype=np.int64)
    last_of_conn = np.ones(n, dtype=bool)
    last_of_conn[:-1] = conn[1:] != conn[:-1]
    ends = pos[last_of_conn] + 1
    conn_end[:] = np.repeat(ends, np.diff(np.concatenate(([0], ends))))
    key = np.where(is_req & has_answer, 2 * answer_of, 2 * conn_end - 1)
    suffix = np.minimum.accumulate(key[::-1])[::-1]
    later = np.full(n, -1, dtype=np.int64)
    later[:-1] = suffix[1:]
    first = np.where((later >= 0) & (later % 2 == 0) & ~last_of_conn, later // 2, -1)
    skipped = is_req & expects & (first >= 0) & (~has_answer | (answer_of > first))
    first_request = np.where(skipped, request_of[np.maximum(first, 0)], -1)
    skipped &= first_request >= 0

    # The connection's previous request.
    req_pos = pos[is_req]
    previous = np.full(n, -1, dtype=np.int64)
    if len(req_pos) > 1:
        same = conn[req_pos[1:]] == conn[req_pos[:-1]]
        previous[req_pos[1:][same]] = req_pos[:-1][same]

    # Only the rows kept (requests and stray answers) are gathered, in seq order.
    stray = ~has_request | (nth > 1) | ~expects[np.maximum(request_of, 0)]
    out = np.flatnonzero(is_req | stray)

    def pick(name: str, index: np.ndarray, valid: np.ndarray) -> pa.Array:
        """``name`` of the row at seq position ``index`` of each kept row where ``valid``."""
        return _pick(table.column(name), by_seq[np.maximum(index[out], 0)], valid[out])

    req_mask = pa.array(is_req[out])
    columns = {name: table.column(name).take(pa.array(by_seq[out])) for name in INPUT_COLUMNS}
    columns["expects"] = pc.if_else(req_mask, columns["expects"], pa.nulls(len(out), pa.bool_()))
    columns.update(
        request_seq=pick("seq", request_of, has_request),
        request_mono_ns=pick("mono_ns", request_of, has_request),
        request_expects=pick("expects", request_of, has_request),  # a request's own value
        nth=pa.array(nth[out], mask=~has_request[out]),
        answer_seq=pick("seq", answer_of, has_answer),
        answer_wall_ns=pick("wall_ns", answer_of, has_answer),
        answer_mono_ns=pick("mono_ns", answer_of, has_answer),
        skipped=pc.if_else(req_mask, pa.array(skipped[out]), pa.nulls(len(out), pa.bool_())),
        overtaken_seq=pick("seq", first, skipped),
        overtaken_wall_ns=pick("wall_ns", first, skipped),
        overtaken_cid=pick("cid", first_request, skipped),
        overtaken_api_key=pick("api_key", first_request, skipped),
        overtaken_client_correlation_id=pick("client_correlation_id", first_request, skipped),
        previous_request_cid=pick("cid", previous, previous >= 0),
    )
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in PAIRS_SCHEMA], schema=PAIRS_SCHEMA)
