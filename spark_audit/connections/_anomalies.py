"""Checks 1 and 2 per connection, inside the pass: the anomalies of whole connections'
transactions (:func:`~spark_audit.connections.connection_pass` output), so that Spark only
unions them instead of windowing and joining every request.

Each function returns exactly the rows, columns and types of its Spark reference in
:mod:`spark_audit.checks` (``upstream_skips``, ``upstream_strays``, ``client_view``), which
stay the definition the tests hold these to. Filtering is vectorised; Python only touches
the anomalies themselves and the repair and close rows, which are rare.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from protocol import ApiKey

_KEY = [pa.field("capture_id", pa.string()), pa.field("connection_id", pa.string())]

SKIP_SCHEMA = pa.schema(
    [
        *_KEY,
        pa.field("seq", pa.int64()),
        pa.field("wall_ns", pa.int64()),
        pa.field("api_key", pa.int16()),
        pa.field("client_correlation_id", pa.int32()),
        pa.field("upstream_correlation_id", pa.int32()),
        pa.field("probe", pa.bool_()),
        pa.field("overtaken_by", pa.int32()),
        pa.field("overtaken_by_api_key", pa.int16()),
        pa.field("overtaken_by_probe", pa.bool_()),
        pa.field("answered_late", pa.bool_()),
        pa.field("actions", pa.list_(pa.string())),
        pa.field("requeued_as", pa.int32()),
        pa.field("outcome", pa.string()),
    ]
)
"""An upstream send whose answer was overtaken, and what corrfix did (``upstream_skips``)."""

STRAY_SCHEMA = pa.schema(
    [
        *_KEY,
        pa.field("seq", pa.int64()),
        pa.field("wall_ns", pa.int64()),
        pa.field("api_key", pa.int16()),
        pa.field("upstream_correlation_id", pa.int32()),
        pa.field("client_correlation_id", pa.int32()),
        pa.field("kind", pa.string()),
        pa.field("dropped", pa.bool_()),
    ]
)
"""An upstream answer that matched no outstanding send (``upstream_strays``)."""

CLIENT_SCHEMA = pa.schema(
    [
        *_KEY,
        pa.field("seq", pa.int64()),
        pa.field("wall_ns", pa.int64()),
        pa.field("kind", pa.string()),
        pa.field("api_key", pa.int16()),
        pa.field("correlation_id", pa.int32()),
        pa.field("related_correlation_id", pa.int32()),
        pa.field("close_reason", pa.string()),
        pa.field("capture_gap", pa.string()),
    ]
)
"""A client-view violation (``client_view``)."""

WRAP_DROP = 1 << 30
"""A client id that dropped by at least this much wrapped (clients wrap at 2^31)."""
END_OF_CAPTURE_REASONS = ("capture closed", "capture_end")
"""Close reasons that mean the capture stopped, not the connection (proxy, wire)."""

Key = tuple[str, str]


def rows_where(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The rows of ``table`` where ``mask`` is true. When they are one run of rows, a slice
    of ``table``, not a copy: a side's requests usually are one run of the pass's rows."""
    mask = pc.fill_null(mask, False)
    count = pc.sum(mask).as_py() or 0
    if count == 0:
        return table.slice(0, 0)
    first = pc.index(mask, True).as_py()
    if count == table.num_rows or pc.sum(mask.slice(first, count)).as_py() == count:
        return table.slice(first, count)
    return table.filter(mask)


def side_rows(transactions: pa.Table, side: str, direction: str) -> pa.Table:
    """The ``frame`` rows of one side and direction (requests, or stray answers)."""
    t = transactions
    chosen = pc.and_(pc.equal(t.column("kind"), "frame"), pc.equal(t.column("side"), side))
    return rows_where(t, pc.and_(chosen, pc.equal(t.column("direction"), direction)))


def _repairs(transactions: pa.Table) -> dict[tuple[str, str, int], tuple[list[str], int | None]]:
    """Repair events per (capture, connection, upstream id): sorted distinct events and the
    highest id it was re-sent as."""
    t = transactions
    rows = rows_where(
        t, pc.and_(pc.equal(t.column("kind"), "repair"), pc.is_valid(t.column("upstream_correlation_id")))
    )
    events: dict[tuple[str, str, int], set[str]] = {}
    requeued: dict[tuple[str, str, int], int | None] = {}
    for r in rows.select(
        ["capture_id", "connection_id", "upstream_correlation_id", "event", "new_upstream_correlation_id"]
    ).to_pylist():
        at = (r["capture_id"], r["connection_id"], r["upstream_correlation_id"])
        seen = events.setdefault(at, set())
        if r["event"] is not None:
            seen.add(r["event"])
        new, old = r["new_upstream_correlation_id"], requeued.get(at)
        requeued[at] = new if old is None else (old if new is None else max(old, new))
    return {at: (sorted(seen), requeued.get(at)) for at, seen in events.items()}


def _is_probe(api_key: int | None, client_cid: int | None) -> bool | None:
    """``api_key = ApiVersions AND client id IS NULL``, with SQL's nulls."""
    if client_cid is not None:
        return False
    return None if api_key is None else api_key == ApiKey.API_VERSIONS


def skipped_sends(transactions: pa.Table) -> pa.Table:
    """One row per upstream send whose answer was overtaken, with what corrfix did."""
    reqs = side_rows(transactions, "upstream", "request")
    skipped = rows_where(reqs, reqs.column("skipped"))
    if skipped.num_rows == 0:
        return SKIP_SCHEMA.empty_table()
    repairs = _repairs(transactions)
    out = []
    for r in skipped.to_pylist():
        key = (r["capture_id"], r["connection_id"])
        own_events, own_requeued = repairs.get((*key, r["cid"]), ([], None))
        by_events = repairs.get((*key, r["overtaken_cid"]), ([], None))[0]
        new_events = repairs.get((*key, own_requeued), ([], None))[0] if own_requeued is not None else []
        actions = sorted(
            set(own_events)
            | {e for e in by_events if e == "probe_found_loss"}
            | {e for e in new_events if e == "possible_duplicate"}
        )
        probe = _is_probe(r["api_key"], r["client_correlation_id"])
        outcome = (
            "requeued"
            if "requeue" in actions
            else "gave_up"
            if "give_up" in actions
            else "probe_lost"
            if probe
            else "unrepaired"
        )
        out.append(
            {
                "capture_id": key[0],
                "connection_id": key[1],
                "seq": r["seq"],
                "wall_ns": r["overtaken_wall_ns"],
                "api_key": r["api_key"],
                "client_correlation_id": r["client_correlation_id"],
                "upstream_correlation_id": r["cid"],
                "probe": probe,
                "overtaken_by": r["overtaken_cid"],
                "overtaken_by_api_key": r["overtaken_api_key"],
                "overtaken_by_probe": _is_probe(r["overtaken_api_key"], r["overtaken_client_correlation_id"]),
                "answered_late": r["answer_seq"] is not None,
                "actions": actions,
                "requeued_as": own_requeued,
                "outcome": outcome,
            }
        )
    return pa.Table.from_pylist(out, schema=SKIP_SCHEMA)


def _stray_kinds(strays: pa.Table) -> pa.Array:
    """``orphan``, ``duplicate`` or ``acks0_reply`` per answer of ``side_rows(..., "response")``
    (null: an answer as expected, which the pass does not keep anyway)."""
    request_seq, nth = strays.column("request_seq"), strays.column("nth")
    expects = strays.column("request_expects")
    acks0 = pc.if_else(pc.invert(pc.fill_null(expects, True)), "acks0_reply", pa.scalar(None, pa.string()))
    kind = pc.if_else(pc.fill_null(pc.greater(nth, 1), False), "duplicate", acks0)
    return pc.if_else(pc.is_null(request_seq), "orphan", kind)


def stray_answers(transactions: pa.Table) -> pa.Table:
    """Upstream answers that match no outstanding send; ``dropped``: corrfix logged a
    ``stale_drop`` for the id."""
    answers = side_rows(transactions, "upstream", "response")
    answers = answers.append_column("stray", _stray_kinds(answers))
    strays = rows_where(answers, pc.is_valid(answers.column("stray")))
    if strays.num_rows == 0:
        return STRAY_SCHEMA.empty_table()
    t = transactions
    drops = rows_where(
        t, pc.and_(pc.equal(t.column("kind"), "repair"), pc.equal(t.column("event"), "stale_drop"))
    )
    dropped = set(
        zip(
            drops.column("capture_id").to_pylist(),
            drops.column("connection_id").to_pylist(),
            drops.column("upstream_correlation_id").to_pylist(),
            strict=True,
        )
    )
    out = [
        {
            "capture_id": r["capture_id"],
            "connection_id": r["connection_id"],
            "seq": r["seq"],
            "wall_ns": r["wall_ns"],
            "api_key": r["api_key"],
            "upstream_correlation_id": r["cid"],
            "client_correlation_id": r["client_correlation_id"],
            "kind": r["stray"],
            "dropped": (r["capture_id"], r["connection_id"], r["cid"]) in dropped,
        }
        for r in strays.to_pylist()
    ]
    return pa.Table.from_pylist(out, schema=STRAY_SCHEMA)


def _closes(transactions: pa.Table) -> dict[Key, list[tuple[str | None, int | None]]]:
    t = transactions
    closes = rows_where(t, pc.equal(t.column("kind"), "close"))
    out: dict[Key, list[tuple[str | None, int | None]]] = {}
    for r in closes.select(["capture_id", "connection_id", "reason", "wall_ns"]).to_pylist():
        out.setdefault((r["capture_id"], r["connection_id"]), []).append((r["reason"], r["wall_ns"]))
    return out


def _violation(r: dict[str, Any], **values: Any) -> dict[str, Any]:
    base = {
        "capture_id": r["capture_id"],
        "connection_id": r["connection_id"],
        "seq": r["seq"],
        "wall_ns": r["wall_ns"],
        "api_key": r["api_key"],
        "correlation_id": r["cid"],
        "related_correlation_id": None,
        "close_reason": None,
        "capture_gap": None,
    }
    return {**base, **values}


def client_violations(transactions: pa.Table) -> pa.Table:
    """Every client-view violation: ``out_of_order``, ``answer_missing``, ``orphan``,
    ``duplicate``, ``acks0_reply``, ``unanswered_at_close``, ``unanswered_at_capture_end``,
    ``id_not_increasing``."""
    reqs = side_rows(transactions, "client", "request")
    out: list[dict[str, Any]] = []
    for r in rows_where(reqs, reqs.column("skipped")).to_pylist():
        kind = "out_of_order" if r["answer_seq"] is not None else "answer_missing"
        out.append(
            _violation(
                r,
                wall_ns=r["overtaken_wall_ns"],
                kind=kind,
                related_correlation_id=r["overtaken_cid"],
                capture_gap=r["capture_gap"],
            )
        )
    answers = side_rows(transactions, "client", "response")
    answers = answers.append_column("stray", _stray_kinds(answers))
    for r in rows_where(answers, pc.is_valid(answers.column("stray"))).to_pylist():
        gap = r["capture_gap"] if r["stray"] == "orphan" else None
        out.append(_violation(r, kind=r["stray"], capture_gap=gap))
    owed = pc.and_(
        pc.and_(reqs.column("expects"), pc.is_null(reqs.column("answer_seq"))),
        pc.invert(reqs.column("skipped")),
    )
    owed_rows = rows_where(reqs, owed)
    if owed_rows.num_rows:
        closes = _closes(transactions)
        for r in owed_rows.to_pylist():
            for reason, wall_ns in closes.get((r["capture_id"], r["connection_id"]), [(None, None)]):
                at_end = wall_ns is None or (reason or "").split(",")[0] in END_OF_CAPTURE_REASONS
                kind = "unanswered_at_capture_end" if at_end else "unanswered_at_close"
                out.append(_violation(r, kind=kind, close_reason=reason))
    previous = pc.cast(reqs.column("previous_request_cid"), pa.int64())
    drop = pc.subtract(previous, pc.cast(reqs.column("cid"), pa.int64()))
    backwards = pc.and_(pc.greater_equal(drop, 0), pc.less(drop, WRAP_DROP))
    for r in rows_where(reqs, backwards).to_pylist():
        related = r["previous_request_cid"]
        out.append(_violation(r, kind="id_not_increasing", related_correlation_id=related))
    return pa.Table.from_pylist(out, schema=CLIENT_SCHEMA) if out else CLIENT_SCHEMA.empty_table()
