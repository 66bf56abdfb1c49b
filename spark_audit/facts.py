"""Decoded bodies as a Spark DataFrame of facts: one mapInArrow pass over the few frames
that some check needs, on the side nearest the broker.

The broker side is what the broker received and sent: the upstream side of proxy captures
(corrfix's re-sends included), the only side of wire captures. Facts carry the frame's
place (capture, connection, seq, time) and the correlation id of that side, so requests
and answers join on (capture_id, connection_id, correlation_id).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from .decode import DECODED_KEYS, decode

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
        pa.field("acks", pa.int16()),
        pa.field("transactional_id", pa.string()),
        pa.field("note", pa.string()),
    ]
)
"""One row per fact. ``fact`` is one of: produce_batch, produce_ack, leader, commit,
commit_ack, fetched_offset, group, generation, error, undecodable; each sets the columns
that apply to it (see :mod:`.decode`)."""

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
_PLACE = [*_FRAME_PLACE, "correlation_id"]


def broker_side() -> Column:
    """Frames as the broker saw them: upstream in proxy captures, client in wire captures."""
    return F.when(F.col("source") == "proxy", F.col("side") == "upstream").otherwise(
        F.col("side") == "client"
    )


def broker_frames(frames: DataFrame, api_keys: frozenset[int] = DECODED_KEYS) -> DataFrame:
    """Broker-side frames of ``api_keys`` with a ``correlation_id`` of that side."""
    cid = F.when(F.col("side") == "upstream", F.col("upstream_correlation_id")).otherwise(
        F.col("client_correlation_id")
    )
    chosen = frames.filter(
        (F.col("kind") == "frame") & broker_side() & F.col("api_key").isin(*sorted(api_keys))
    )
    return chosen.select(*_FRAME_PLACE, cid.alias("correlation_id"), "frame", "frame_length")


def _decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        rows: list[dict] = []
        places = batch.select(_PLACE).to_pylist()  # one conversion per batch, not per value
        lengths = batch.column("frame_length").to_pylist()
        for place, frame, length in zip(places, batch.column("frame").to_pylist(), lengths, strict=True):
            if frame is None or place["api_key"] is None:
                continue
            facts = decode(
                place["api_key"], place["api_version"], place["direction"], frame, length or len(frame)
            )
            rows.extend({**place, **fact} for fact in facts)
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=FACT_SCHEMA)


def decode_facts(frames: DataFrame, api_keys: frozenset[int] = DECODED_KEYS) -> DataFrame:
    """Facts of every broker-side frame of ``api_keys`` (decoded in the executors)."""
    return broker_frames(frames, api_keys).mapInArrow(_decode_batches, FACT_SPARK_SCHEMA)
