"""Decoded bodies as a Spark DataFrame of facts: one mapInArrow pass over the few frames
that some check needs, on the side nearest the broker.

The broker side is what the broker received and sent: the upstream side of proxy captures
(corrfix's re-sends included), the only side of wire captures. Facts carry the frame's
place (capture, connection, seq, time) and the correlation id of that side, so requests
and answers join on (capture_id, connection_id, correlation_id).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from protocol import ApiKey
from spark_audit.decode._frame_decode import DECODED_KEYS, decode
from spark_audit.decode._produce_vectorised import decode_requests, decode_responses

FACT_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string(), nullable=False),
        pa.field("connection_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("direction", pa.string()),
        pa.field("api_key", pa.int16()),
        pa.field("api_version", pa.int16()),
        pa.field("correlation_id", pa.int32()),
        pa.field("fact", pa.string(), nullable=False),
        pa.field("group_id", pa.string()),
        pa.field("member_id", pa.string()),
        pa.field("generation_id", pa.int32()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("error_code", pa.int16()),
        pa.field("offset", pa.int64()),
        pa.field("leader_id", pa.int32()),
        pa.field("leader_epoch", pa.int32()),
        pa.field("producer_id", pa.int64()),
        pa.field("producer_epoch", pa.int16()),
        pa.field("base_sequence", pa.int32()),
        pa.field("record_count", pa.int32()),
        pa.field("crc", pa.int64()),
        pa.field("first_timestamp", pa.int64()),
        pa.field("batch_length", pa.int32()),
        pa.field("lineage_id", pa.int32()),
        pa.field("acks", pa.int16()),
        pa.field("transactional_id", pa.string()),
        pa.field("note", pa.string()),
        pa.field("isr_size", pa.int32()),
        pa.field("replica_size", pa.int32()),
        pa.field("cluster_id", pa.string()),
        pa.field("upstream_address", pa.string()),
        pa.field("require_stable", pa.bool_()),
    ]
)
"""One row per fact. ``fact`` is one of: produce_batch, produce_ack, leader, commit,
commit_ack, txn_commit, txn_abort, txn_end_ack, fetched_offset, group, generation, error,
cluster, undecodable (and, made by the per-connection pass, not decoded: connection); each
sets the columns that apply to it (see :mod:`._frame_decode`). A
``commit`` of a TxnOffsetCommit (``api_key`` 28) and the ``txn_commit`` or ``txn_abort``
of an EndTxn request carry the ``transactional_id``, ``producer_id`` and
``producer_epoch`` of their transaction. A ``produce_batch`` carries its v2 batch
header's ``first_timestamp`` and ``batch_length`` (the header's length field), which with
topic, partition, CRC and record count identify a batch without a producer id, and
``lineage_id``: on a proxy capture's upstream request, the client correlation id it
carries, which corrfix's re-sends of it share (null on wire captures: no lineage). A
``leader`` fact (a partition of a Metadata answer) carries ``isr_size`` and
``replica_size``, how many in-sync replicas and replicas the answer lists: fewer in sync
than replicas is an under-replicated partition (:func:`spark_audit.checks.isr_shrinks`),
and the answer's ``cluster_id`` (Metadata v2+; null before), which tells the partitions
of two clusters with topics of one name apart. A ``cluster`` fact is the ``cluster_id`` a
Metadata answer (v2+, with or without topics) or a DescribeCluster answer named, and a
``connection`` fact (one per connection, from the pass) its ``upstream_address`` and the
``cluster_id`` its answers named: the checks that compare connections keep clusters apart
by them (:mod:`spark_audit.checks._clusters`). An OffsetFetch's ``group`` fact carries its
``require_stable`` (v7+; false before): without it, the coordinator answers without the
offsets of a transaction whose commit marker has not reached it yet."""

FACT_SPARK_SCHEMA = from_arrow_schema(FACT_SCHEMA)
INPUT_COLUMNS = (
    "capture_id",
    "source",
    "connection_id",
    "seq",
    "kind",
    "side",
    "direction",
    "wall_ns",
    "api_key",
    "api_version",
    "client_correlation_id",
    "upstream_correlation_id",
    "frame_length",
    "frame",
)
"""The capture columns :func:`decode_facts` reads."""
_FRAME_PLACE = ["capture_id", "connection_id", "seq", "wall_ns", "direction", "api_key", "api_version"]
_PLACE = [*_FRAME_PLACE, "correlation_id", "lineage_id"]


def broker_side() -> Column:
    """Frames as the broker saw them: upstream in proxy captures, client in wire captures."""
    return F.when(F.col("source") == "proxy", F.col("side") == "upstream").otherwise(
        F.col("side") == "client"
    )


def broker_frames(frames: DataFrame, api_keys: frozenset[int] = DECODED_KEYS) -> DataFrame:
    """Broker-side frames of ``api_keys`` with a ``correlation_id`` of that side and the
    ``lineage_id`` of upstream requests (:data:`FACT_SCHEMA`)."""
    upstream = F.col("side") == "upstream"
    cid = F.when(upstream, F.col("upstream_correlation_id")).otherwise(F.col("client_correlation_id"))
    lineage = F.when(upstream & (F.col("direction") == "request"), F.col("client_correlation_id"))
    chosen = frames.filter(
        (F.col("kind") == "frame") & broker_side() & F.col("api_key").isin(*sorted(api_keys))
    )
    return chosen.select(
        *_FRAME_PLACE,
        cid.alias("correlation_id"),
        lineage.cast("int").alias("lineage_id"),
        "frame",
        "frame_length",
    )


def _fact_batch(place: pa.RecordBatch, fact: str, columns: dict[str, pa.Array]) -> pa.RecordBatch:
    """Facts of one kind: ``place`` gives the frame columns, ``columns`` some of the rest."""
    n = place.num_rows
    arrays = []
    for field in FACT_SCHEMA:
        if field.name == "fact":
            arrays.append(pa.repeat(pa.scalar(fact, pa.string()), n))
        elif field.name in columns:
            arrays.append(columns[field.name])
        elif field.name in place.schema.names:
            arrays.append(place.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=FACT_SCHEMA)


def _vector_facts(batch: pa.RecordBatch, among: np.ndarray | None) -> tuple[list[pa.RecordBatch], np.ndarray]:
    """Facts of the batch's Produce frames (of the rows ``among``, a mask, if given) of the
    common shape (:mod:`._produce_vectorised`, reading the frames in place), and which rows
    those were; the other rows are decoded one by one."""
    taken = np.zeros(batch.num_rows, dtype=bool)
    out: list[pa.RecordBatch] = []
    produce = pc.fill_null(pc.equal(batch.column("api_key"), ApiKey.PRODUCE), False)
    for direction in ("request", "response"):
        chosen = pc.and_(produce, pc.fill_null(pc.equal(batch.column("direction"), direction), False))
        mask = chosen.to_numpy(zero_copy_only=False)
        index = np.flatnonzero(mask if among is None else mask & among)
        if len(index) == 0:
            continue
        decode_shape = decode_requests if direction == "request" else decode_responses
        done = decode_shape(batch, index)
        if len(done.rows) == 0:
            continue
        taken[index[done.rows]] = True
        place = batch.select(_PLACE).take(pa.array(index[done.rows]))
        if direction == "request":
            out.append(_fact_batch(place, "produce_batch", done.columns))
            continue
        out.append(_fact_batch(place, "produce_ack", done.columns))
        failed = pc.not_equal(done.columns["error_code"], 0)
        if pc.any(failed).as_py():
            errors = {k: done.columns[k].filter(failed) for k in ("topic", "partition", "error_code")}
            out.append(_fact_batch(place.filter(failed), "error", errors))
    return out, taken


def decode_rows(batch: pa.RecordBatch, among: np.ndarray | None = None) -> Iterator[pa.RecordBatch]:
    """Facts of the frames of ``batch`` (:data:`INPUT_COLUMNS` as :func:`broker_frames` gives
    them), or only of its rows ``among`` (a mask): the Produce frames of the common shape are
    read where they are, so a caller need not copy the frames it chose."""
    if "lineage_id" not in batch.schema.names:  # frames of a capture side without lineage
        batch = batch.append_column("lineage_id", pa.nulls(batch.num_rows, pa.int32()))
    vectorised, taken = _vector_facts(batch, among)
    yield from vectorised
    left = ~taken if among is None else among & ~taken
    if not left.any():
        return
    rest = batch if left.all() else batch.filter(pa.array(left))
    rows: list[dict] = []
    places = rest.select(_PLACE).to_pylist()  # one conversion per batch, not per value
    lengths = rest.column("frame_length").to_pylist()
    for place, frame, length in zip(places, rest.column("frame").to_pylist(), lengths, strict=True):
        if frame is None or place["api_key"] is None:
            continue
        facts = decode(
            place["api_key"], place["api_version"], place["direction"], frame, length or len(frame)
        )
        rows.extend({**place, **fact} for fact in facts)
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=FACT_SCHEMA)


def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Facts of every frame in ``batches`` (the mapInArrow function of :func:`decode_facts`)."""
    for batch in batches:
        yield from decode_rows(batch)


def decode_facts(frames: DataFrame, api_keys: frozenset[int] = DECODED_KEYS) -> DataFrame:
    """Facts of every broker-side frame of ``api_keys`` (decoded in the executors)."""
    return broker_frames(frames, api_keys).mapInArrow(decode_batches, FACT_SPARK_SCHEMA)
