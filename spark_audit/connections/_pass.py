"""One pass over whole connections: what the JVM gets instead of the capture's frames.

:func:`connection_pass` is a pure function of the Arrow rows of one or more whole
connections. It pairs each side with :func:`match` (numpy), reads Produce ``acks`` from
the frame heads (:func:`produce_acks`), and keeps only the rows some check reads:

- on the client side (and every connection of wire captures), every request with its
  answer (latency, id order and unanswered requests need them all) and every stray answer;
- on the upstream side of proxy captures, only the overtaken requests and the stray
  answers (an answer in order proves nothing more);
- the repair and close rows, as they are;
- one ``connection`` row per connection with its counts and time span.

That is about half a row per frame of a proxy capture, one at most of a wire capture, and
no answer that arrived in order ever becomes a JVM row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corrfix.capture.format import Source
from protocol import ApiKey
from spark_audit.connections._acks import UNKNOWN, produce_acks
from spark_audit.connections._batch_sends import BATCH, BATCH_SENDS_SCHEMA, FIRST, plain_batches, sum_sends
from spark_audit.connections._clusters import CLUSTER_FACT, OPENS_SCHEMA, connection_facts, send_homes
from spark_audit.connections._codes import NULL, combined, dense
from spark_audit.connections._matching import (
    CONNECTION_CODE,
    INPUT_COLUMNS,
    PAIRS_SCHEMA,
    answers_in_order,
    connection_codes,
    match,
)
from spark_audit.decode import DECODED_KEYS, FACT_SCHEMA, decode_batches, decode_rows

KEY = ["capture_id", "connection_id"]

HEADER_COLUMNS = (
    "capture_id",
    "source",
    "connection_id",
    "seq",
    "kind",
    "side",
    "direction",
    "wall_ns",
    "mono_ns",
    "api_key",
    "api_version",
    "client_correlation_id",
    "upstream_correlation_id",
    "event",
    "reason",
    "new_upstream_correlation_id",
)
"""Capture columns the pass reads, besides ``acks`` (or the ``frame`` to read it from)."""

_PASSED = ("side", "kind", "source", "event", "reason", "new_upstream_correlation_id")
_STATS = (
    pa.field("rows", pa.int64()),
    pa.field("frames", pa.int64()),
    pa.field("repairs", pa.int64()),
    pa.field("first_wall_ns", pa.int64()),
    pa.field("last_wall_ns", pa.int64()),
)

TRANSACTIONS_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string(), nullable=False),
        pa.field("connection_id", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("side", pa.string()),
        *[f.with_nullable(True) for f in PAIRS_SCHEMA if f.name not in KEY],
        pa.field("event", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("new_upstream_correlation_id", pa.int32()),
        *_STATS,
        pa.field("capture_gap", pa.string()),
    ]
)
"""What the pass yields. ``kind`` = ``frame``: a request with its answer, or a stray answer
(the :data:`PAIRS_SCHEMA` columns, ``side`` says which); ``repair`` and ``close``: the capture's
row (``seq``, ``wall_ns``, ids, ``event``, ``reason``); ``connection``: ``rows``, ``frames``,
``repairs``, ``first_wall_ns``, ``last_wall_ns`` of one connection. ``capture_gap``, on
wire captures only: the capture gap that explains an overtaken request or an answer to
no request (:func:`capture_gaps`)."""

FACTS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        *[f.with_nullable(True) for f in FACT_SCHEMA],
        pa.field("acknowledged", pa.bool_()),
        pa.field("rows", pa.int64()),
        *[f for f in BATCH_SENDS_SCHEMA if f.name not in FACT_SCHEMA.names],
    ]
)
"""The facts the pass yields, a table of its own (narrow rows cost less in the JVM).
``kind`` = ``fact``: one fact of a broker-side body (:data:`FACT_SCHEMA` columns; a
``produce_batch`` carries its answer as ``acknowledged``, so no ``produce_ack`` is kept);
``fact_count``: ``rows`` facts of kind ``fact`` decoded from the connection, before that
merge; ``batch_sends`` (only when the pass is asked to sum them): the sends of batches
without a producer id summed per batch (:data:`BATCH_SENDS_SCHEMA`), which then are not
``fact`` rows; ``sizes``: ``rows`` rows of kind ``fact`` of each ``fact`` per connection
(after the merge), and, with the sums, of kind ``batch_sends`` per partition (``fact`` =
``batch_sends``), so that the driver knows which checks have input without a Spark
aggregation."""

FACT_COLUMNS = [*FACT_SCHEMA.names, "acknowledged"]
"""The columns of a ``fact`` row of :data:`FACTS_SCHEMA` the checks read."""
_CALL = ["capture_id", "connection_id", "correlation_id", "topic", "partition"]
SEND_COLUMNS = (*BATCH, *FIRST, "lineage_id")
"""What :func:`sum_sends` reads of a send, besides ``acknowledged``."""

SIDES = (("upstream", "upstream_correlation_id"), ("client", "client_correlation_id"))


def with_acks(table: pa.Table) -> pa.Table:
    """``table`` with ``acks`` of its Produce requests (null elsewhere or unreadable) and
    without ``frame``; a table that has ``acks`` already is returned as it is."""
    if "acks" in table.column_names:
        return table
    n = table.num_rows
    acks = np.full(n, UNKNOWN, np.int64)
    if "frame" in table.column_names and n:
        frames = table.column("frame").combine_chunks()
        produce = pc.and_(
            pc.equal(table.column("api_key"), ApiKey.PRODUCE), pc.equal(table.column("direction"), "request")
        )
        rows = np.flatnonzero(pc.fill_null(produce, False).to_numpy(zero_copy_only=False))
        versions = table.column("api_version").to_numpy(zero_copy_only=False)[rows].astype(np.int64)
        acks[rows] = produce_acks(frames, rows, versions)
        table = table.drop_columns(["frame"])
    return table.append_column("acks", pa.array(acks, pa.int16(), mask=acks == UNKNOWN))


_MATCHED = [*(c for c in INPUT_COLUMNS if c not in ("cid", "expects")), "source", "acks", CONNECTION_CODE]
"""The columns a side's frames need for :func:`_match_input` (only these are filtered)."""


def _side(table: pa.Table, side: str, id_column: str) -> pa.Table:
    chosen = pc.and_(
        pc.and_(pc.equal(table.column("kind"), "frame"), pc.equal(table.column("side"), side)),
        pc.is_valid(table.column(id_column)),
    )
    if side == "upstream":
        chosen = pc.and_(chosen, pc.equal(table.column("source"), "proxy"))
    frames = table.select(_MATCHED).filter(pc.fill_null(chosen, False))
    sources = pc.unique(frames.column("source")).to_pylist()
    parts = [TRANSACTIONS_SCHEMA.empty_table()]
    for source in sources:
        alone = len(sources) == 1 and source is not None  # then every frame is of this source
        one = _match_input(
            frames if alone else frames.filter(pc.equal(frames.column("source"), source)), id_column
        )
        if side == "upstream" and answers_in_order(one):  # the upstream check would read nothing
            continue
        pairs = match(one)
        if side == "upstream":  # only what the upstream check reads: overtaken sends, strays
            strays = pc.equal(pairs.column("direction"), "response")
            pairs = pairs.filter(pc.fill_null(pc.or_kleene(strays, pairs.column("skipped")), False))
        if source == "wire":
            pairs = pairs.append_column("capture_gap", capture_gaps(table, pairs))
        parts.append(_conform(pairs, side=side, kind="frame", source=source))
    return pa.concat_tables(parts)


GAP = r"(^|,)(gap_before|skipped_before|missing)=\d+"
"""Frame reasons by which a wire capture says bytes of that direction were lost before or
in the frame (docs/capture-format.md, wire captures)."""


def _keys(table: pa.Table) -> pa.Array:
    key = pc.binary_join_element_wise(table.column("capture_id"), table.column("connection_id"), "\x00")
    return key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key


def _codes(table: pa.Table, known: pa.Array) -> np.ndarray:
    """Each row's connection as its index in ``known`` (-1 if not there)."""
    return pc.fill_null(pc.index_in(_keys(table), value_set=known), -1).to_numpy().astype(np.int64)


def _marks(table: pa.Table, direction: str, known: pa.Array) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Where the capture lost bytes of ``direction``: per connection (codes into ``known``),
    in seq order, with the reason that says so."""
    chosen = pc.and_(
        pc.and_(pc.equal(table.column("kind"), "frame"), pc.equal(table.column("direction"), direction)),
        pc.match_substring_regex(table.column("reason"), GAP),
    )
    rows = table.filter(pc.fill_null(chosen, False))
    codes, seqs = _codes(rows, known), rows.column("seq").to_numpy()
    order = np.lexsort((seqs, codes))
    reasons = rows.column("reason").to_pylist()
    return codes[order], seqs[order], [f"{reasons[i]} before seq {seqs[i]}" for i in order]


def capture_gaps(table: pa.Table, pairs: pa.Table) -> pa.Array:
    """For each pair of a wire capture, the capture gap that explains it, if one does
    (null otherwise):

    - an overtaken request, when answer bytes were lost after it and up to the answer that
      overtook it (its own answer may be in them);
    - an answer to no request, when request bytes were lost before it, or the capture
      started in the middle of the connection (its request may be in them)."""
    n = pairs.num_rows
    out: list[str | None] = [None] * n
    if n == 0:
        return pa.array(out, pa.string())
    known = pc.unique(_keys(pairs))
    keys = _codes(pairs, known)
    seq = pairs.column("seq").to_numpy()
    skipped = pc.fill_null(pairs.column("skipped"), False).to_numpy(zero_copy_only=False)
    overtaken = pc.fill_null(pairs.column("overtaken_seq"), -1).to_numpy()
    orphan = pc.and_(pc.equal(pairs.column("direction"), "response"), pc.is_null(pairs.column("request_seq")))
    orphan = pc.fill_null(orphan, False).to_numpy(zero_copy_only=False)
    opens = table.filter(pc.fill_null(pc.equal(table.column("kind"), "open"), False))
    midstream = {
        code
        for code, reason in zip(
            _codes(opens, known).tolist(), opens.column("reason").to_pylist(), strict=True
        )
        if reason and "midstream" in reason.split(",")
    }
    answer_keys, answer_seqs, answer_why = _marks(table, "response", known)
    ask_keys, ask_seqs, ask_why = _marks(table, "request", known)
    for i in np.flatnonzero(skipped | orphan):
        if skipped[i]:  # the first answer gap in (seq, overtaken seq]
            lo = np.searchsorted(answer_keys, keys[i], "left")
            hi = np.searchsorted(answer_keys, keys[i], "right")
            at = lo + np.searchsorted(answer_seqs[lo:hi], seq[i], "right")
            if at < hi and answer_seqs[at] <= overtaken[i]:
                out[i] = f"answer bytes lost: {answer_why[at]}"
        else:  # the last request gap before this answer
            lo = np.searchsorted(ask_keys, keys[i], "left")
            hi = np.searchsorted(ask_keys, keys[i], "right")
            at = lo + np.searchsorted(ask_seqs[lo:hi], seq[i], "left") - 1
            if at >= lo:
                out[i] = f"request bytes lost: {ask_why[at]}"
            elif keys[i] in midstream:
                out[i] = "the capture started in the middle of the connection"
    return pa.array(out, pa.string())


def _match_input(frames: pa.Table, id_column: str) -> pa.Table:
    """The columns :func:`match` reads: ``cid`` from ``id_column``, ``expects`` from acks."""
    n = frames.num_rows
    is_request = pc.fill_null(pc.equal(frames.column("direction"), "request"), False)
    no_answer = pc.and_(
        pc.equal(frames.column("api_key"), ApiKey.PRODUCE), pc.equal(frames.column("acks"), 0)
    )
    expects = pc.if_else(is_request, pc.invert(pc.fill_null(no_answer, False)), pa.nulls(n, pa.bool_()))
    made = {"cid": frames.column(id_column), "expects": expects}
    columns = {c: made[c] if c in made else frames.column(c) for c in INPUT_COLUMNS}
    if CONNECTION_CODE in frames.column_names:
        columns[CONNECTION_CODE] = frames.column(CONNECTION_CODE)
    return pa.table(columns)


def _conform(
    table: pa.Table, schema: pa.Schema = TRANSACTIONS_SCHEMA, /, **constants: str | None
) -> pa.Table:
    n = table.num_rows
    arrays = []
    for field in schema:
        if field.name in constants:
            arrays.append(pa.repeat(pa.scalar(constants[field.name], field.type), n))
        elif field.name in table.column_names:
            arrays.append(table.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _source_codes(source: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``source`` as an integer per row: the format's sources by comparison (no hashing),
    then any other value (or null) by its dictionary code after them."""
    other = len(Source)
    codes = np.full(len(source), other, np.int64)
    for code, name in enumerate(Source):
        codes[pc.fill_null(pc.equal(source, name.value), False).to_numpy(zero_copy_only=False)] = code
    others = codes == other
    if others.any():
        codes[others] = other + 1 + dense(pc.filter(source, pa.array(others)))  # a null: other
    return codes


def _stats(table: pa.Table) -> pa.Table:
    """Rows, frames, repairs and wall-clock span per connection and source, grouped by one
    integer key (:data:`CONNECTION_CODE` and the source): the strings are taken once per
    group, from its first row."""
    kind = table.column("kind")
    key = combined([connection_codes(table), _source_codes(table.column("source"))])
    counted = pa.table(
        {
            "key": key,
            "row": np.arange(table.num_rows, dtype=np.int64),
            "is_frame": pc.cast(pc.equal(kind, "frame"), pa.int64()),
            "is_repair": pc.cast(pc.equal(kind, "repair"), pa.int64()),
            "wall_ns": table.column("wall_ns"),
        }
    )
    grouped = counted.group_by(["key"], use_threads=False).aggregate(
        [
            ("row", "min"),
            ("wall_ns", "count"),
            ("is_frame", "sum"),
            ("is_repair", "sum"),
            ("wall_ns", "min"),
            ("wall_ns", "max"),
        ]
    )
    first = grouped.column("row_min")
    named = {name: table.column(name).take(first) for name in ("capture_id", "connection_id", "source")}
    renamed = pa.table(
        {
            **named,
            "rows": grouped.column("wall_ns_count"),
            "frames": grouped.column("is_frame_sum"),
            "repairs": grouped.column("is_repair_sum"),
            "first_wall_ns": grouped.column("wall_ns_min"),
            "last_wall_ns": grouped.column("wall_ns_max"),
        }
    )
    return _conform(renamed, kind="connection")


def connection_pass(table: pa.Table) -> pa.Table:
    """The transactions of ``table``: the rows of whole connections (:data:`HEADER_COLUMNS`
    plus ``acks`` or ``frame``, and optionally :data:`CONNECTION_CODE`), any number of
    them, in any order."""
    if table.num_rows == 0:
        return TRANSACTIONS_SCHEMA.empty_table()
    table = with_acks(table).combine_chunks()
    if CONNECTION_CODE not in table.column_names:
        table = table.append_column(CONNECTION_CODE, pa.array(connection_codes(table), pa.int64()))
    kind = table.column("kind")
    kept = table.filter(pc.is_in(kind, value_set=pa.array(["repair", "close"])))
    parts = [_side(table, side, id_column) for side, id_column in SIDES]
    parts.append(_conform(kept.select([c for c in kept.column_names if c in TRANSACTIONS_SCHEMA.names])))
    parts.append(_stats(table))
    return pa.concat_tables(parts)


def facts_pass(facts: pa.Table, sum_plain_sends: bool = False, opens: pa.Table | None = None) -> pa.Table:
    """The facts of whole connections' bodies (:func:`decode_table`), each Produce batch with
    its answer, one ``connection`` fact per connection (its upstream address from ``opens``,
    :func:`open_rows`, and the cluster its answers named, in place of their ``cluster``
    facts), and how many of each kind each connection's bodies gave; with
    ``sum_plain_sends``, the sends of batches without a producer id summed per batch and
    home (:func:`send_homes`). The batches are paired with their answers as rows, and only
    the rows that stay facts are gathered: the summed sends move only the columns the sums
    read."""
    counts = facts.group_by(["capture_id", "connection_id", "fact"], use_threads=False).aggregate(
        [([], "count_all")]
    )
    counted = counts.rename_columns({"count_all": "rows"})
    connections = connection_facts(facts, OPENS_SCHEMA.empty_table() if opens is None else opens, counted)
    batch_rows, answer_rows = answered_batches(facts)
    acknowledged = _acknowledged(facts, answer_rows)
    parts = [_conform(counted, FACTS_SCHEMA, kind="fact_count")]
    if sum_plain_sends:
        plain = plain_batches(facts).to_numpy(zero_copy_only=False)[batch_rows]
        sends = facts.select(list(SEND_COLUMNS)).take(pa.array(batch_rows[plain]))
        address, cluster = send_homes(sends, connections)
        sends = sends.append_column("upstream_address", address).append_column("cluster_id", cluster)
        summed = sum_sends(sends.append_column("acknowledged", acknowledged.filter(plain)))
        parts.append(_conform(summed, FACTS_SCHEMA, kind="batch_sends"))
        batch_rows, acknowledged = batch_rows[~plain], acknowledged.filter(~plain)
    merged = _with_answers(facts, batch_rows, acknowledged)
    merged = pa.concat_tables([merged, _conform(connections, merged.schema)])
    kept = merged.group_by(["capture_id", "connection_id", "fact"], use_threads=False).aggregate(
        [([], "count_all")]
    )
    parts.append(_conform(kept.rename_columns({"count_all": "rows"}), FACTS_SCHEMA, kind="sizes"))
    if sum_plain_sends:  # summed per partition, as the batch_sends rows themselves
        summed = pa.table({"fact": ["batch_sends"], "rows": pa.array([parts[-2].num_rows], pa.int64())})
        parts.append(_conform(summed, FACTS_SCHEMA, kind="sizes"))
    return pa.concat_tables([_conform(merged, FACTS_SCHEMA, kind="fact"), *parts])


def _broker_view(table: pa.Table | pa.RecordBatch, among: np.ndarray | None) -> tuple[pa.Table, np.ndarray]:
    """Every row of ``table`` with the columns the decode reads (:func:`broker_frames`), and
    which of them (of ``among``, a mask, if given) are frames whose bodies some check decodes."""
    side = table.column("side")
    upstream = pc.equal(side, "upstream")
    broker = pc.if_else(pc.equal(table.column("source"), "proxy"), upstream, pc.equal(side, "client"))
    keys = pa.array(sorted(DECODED_KEYS), pa.int16())
    chosen = pc.and_(
        pc.and_(pc.equal(table.column("kind"), "frame"), broker),
        pc.is_in(table.column("api_key"), value_set=keys),
    )
    chosen = pc.fill_null(chosen, False).to_numpy(zero_copy_only=False)
    if among is not None:
        chosen &= among
    correlation_id = pc.if_else(
        upstream, table.column("upstream_correlation_id"), table.column("client_correlation_id")
    )
    upstream_request = pc.and_(upstream, pc.equal(table.column("direction"), "request"))
    lineage = pc.if_else(upstream_request, table.column("client_correlation_id"), pa.scalar(None, pa.int32()))
    length = table.column("frame_length") if "frame_length" in table.column_names else None
    places = ["capture_id", "connection_id", "seq", "wall_ns", "direction", "api_key", "api_version"]
    lengths = length if length is not None else pc.cast(pc.binary_length(table.column("frame")), pa.int32())
    columns = {name: table.column(name) for name in places}
    view = pa.table(
        {
            **columns,
            "correlation_id": correlation_id,
            "lineage_id": pc.cast(lineage, pa.int32()),
            "frame": table.column("frame"),
            "frame_length": lengths,
        }
    )
    return view, chosen


def broker_frames(table: pa.Table | pa.RecordBatch, among: np.ndarray | None = None) -> pa.Table:
    """The rows (of ``among``, a mask, if given) whose bodies some check decodes: frames of
    :data:`DECODED_KEYS` as the broker saw them (upstream in proxy captures, client in wire
    captures), with ``correlation_id`` of that side, the ``lineage_id`` of upstream requests
    (the client id they carry, :data:`FACT_SCHEMA`), ``frame`` and ``frame_length``."""
    view, chosen = _broker_view(table, among)
    return view.filter(pa.array(chosen))


def decode_broker(batch: pa.RecordBatch, among: np.ndarray | None = None) -> pa.Table:
    """Facts of :func:`broker_frames` rows of ``batch``, decoded where they are: no frame
    is copied (vectorised Produce, the rest one by one)."""
    view, chosen = _broker_view(batch, among)
    if not chosen.any():
        return FACT_SCHEMA.empty_table()
    [whole] = view.combine_chunks().to_batches()
    batches = list(decode_rows(whole, chosen))
    return pa.Table.from_batches(batches, schema=FACT_SCHEMA) if batches else FACT_SCHEMA.empty_table()


def decode_table(frames: pa.Table) -> pa.Table:
    """Facts of :func:`broker_frames` rows (vectorised Produce, the rest one by one)."""
    if frames.num_rows == 0:
        return FACT_SCHEMA.empty_table()
    batches = list(decode_batches(iter(frames.to_batches())))
    return pa.Table.from_batches(batches, schema=FACT_SCHEMA) if batches else FACT_SCHEMA.empty_table()


def _answer_kinds(facts: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Which rows are Produce batches, and which are Produce answers."""
    fact = facts.column("fact")
    batch = pc.and_(pc.equal(fact, "produce_batch"), pc.equal(facts.column("api_key"), ApiKey.PRODUCE))
    return (
        pc.fill_null(batch, False).to_numpy(zero_copy_only=False),
        pc.fill_null(pc.equal(fact, "produce_ack"), False).to_numpy(zero_copy_only=False),
    )


def answered_batches(facts: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``facts`` that are Produce batches, each once per answer to its call
    (same capture, connection, correlation id, topic and partition; a batch with a null in
    any of them has none), in their order, and those answers' rows (-1: none): the left
    outer join of the batches with the answers, as row numbers (integer codes, one sort of
    the answers and a binary search per batch)."""
    is_batch, is_answer = _answer_kinds(facts)
    batches, answers = np.flatnonzero(is_batch), np.flatnonzero(is_answer)
    if len(answers) == 0 or len(batches) == 0:
        return batches, np.full(len(batches), -1, np.int64)
    call = combined([dense(facts.column(name)) for name in _CALL])
    for name in _CALL:
        if facts.column(name).null_count:  # a null matches nothing
            call[pc.is_null(facts.column(name)).to_numpy(zero_copy_only=False)] = NULL
    batch_call, answer_call = call[batches], call[answers]
    by_call = np.argsort(answer_call, kind="stable")
    sorted_calls = answer_call[by_call]
    first = np.searchsorted(sorted_calls, batch_call, "left")
    count = np.where(batch_call == NULL, 0, np.searchsorted(sorted_calls, batch_call, "right") - first)
    if (count == 1).all():  # the usual case: one answer each
        return batches, answers[by_call[first]]
    times = np.maximum(count, 1)
    mine = np.repeat(np.arange(len(batches)), times)
    nth = np.arange(len(mine)) - np.repeat(np.cumsum(times) - times, times)
    at = by_call[np.minimum(first[mine] + nth, len(by_call) - 1)]
    return batches[mine], np.where(count[mine] > 0, answers[at], -1)


APPENDED_MAYBE = (7, 20)
"""Produce errors that leave the records in the leader's log: REQUEST_TIMED_OUT (the
replicas did not follow in time) and NOT_ENOUGH_REPLICAS_AFTER_APPEND (the ISR shrank
after the append). A client retries both, so such a send counts as unanswered: the broker
may keep it."""


def _acknowledged(facts: pa.Table, answer_rows: np.ndarray) -> pa.Array:
    """Whether each answer's error code was 0 (null where there is no answer, or where the
    error leaves the records appended: :data:`APPENDED_MAYBE`)."""
    codes = facts.column("error_code").take(pa.array(np.maximum(answer_rows, 0), mask=answer_rows < 0))
    maybe = pc.is_in(codes, value_set=pa.array(APPENDED_MAYBE, codes.type))
    out = pc.if_else(maybe, pa.scalar(None, pa.bool_()), pc.equal(codes, 0))
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _with_answers(facts: pa.Table, batch_rows: np.ndarray, acknowledged: pa.Array) -> pa.Table:
    """The facts other than Produce batches and answers and ``cluster`` facts (the pass folds
    those into its ``connection`` facts), then the batches at ``batch_rows`` with
    ``acknowledged`` (a ``produce_batch`` of another api key is neither)."""
    produce = pa.array(["produce_batch", "produce_ack", CLUSTER_FACT])
    others = facts.filter(pc.invert(pc.is_in(facts.column("fact"), value_set=produce)))
    others = others.append_column("acknowledged", pa.nulls(others.num_rows, pa.bool_()))
    batches = facts.take(pa.array(batch_rows)).append_column("acknowledged", acknowledged)
    return pa.concat_tables([others, batches.select(others.column_names)], promote_options="permissive")


def merge_acks(facts: pa.Table) -> pa.Table:
    """Facts with each Produce batch's answer on its row (``acknowledged``: its partition's
    error code was 0; null when no answer was captured or its error leaves the records
    appended, :data:`APPENDED_MAYBE`) and the answers left out: the join
    that pairs them is within one connection, so it happens here, not in Spark."""
    batch_rows, answer_rows = answered_batches(facts)
    return _with_answers(facts, batch_rows, _acknowledged(facts, answer_rows))
