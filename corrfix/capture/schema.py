"""The capture format: one Arrow schema, versioned. docs/capture-format.md is the contract.

One row per event on a connection: a frame on either side, the connection opening or
closing, or a repair. Frame rows carry both correlation ids where the proxy knows them,
so an audit can follow a request from the client through every re-send to its answer.
"""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa

SCHEMA_VERSION = 1
VERSION_KEY = b"corrfix.capture.schema_version"
SOURCE_KEY = b"corrfix.capture.source"
CAPTURE_ID_KEY = b"corrfix.capture.id"
FILE_SUFFIX = ".arrows"


class RowKind(StrEnum):
    FRAME = "frame"
    OPEN = "open"
    CLOSE = "close"
    REPAIR = "repair"


class Source(StrEnum):
    PROXY = "proxy"  # written by corrfix proxy --capture-dir
    WIRE = "wire"  # imported from a tcpdump capture taken without corrfix


CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("connection_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("side", pa.string()),
        pa.field("direction", pa.string()),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("mono_ns", pa.int64(), nullable=False),
        pa.field("api_key", pa.int16()),
        pa.field("api_version", pa.int16()),
        pa.field("client_correlation_id", pa.int32()),
        pa.field("upstream_correlation_id", pa.int32()),
        pa.field("frame_length", pa.int32()),
        pa.field("frame", pa.binary()),
        pa.field("client_address", pa.string()),
        pa.field("upstream_address", pa.string()),
        pa.field("event", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("attempt", pa.int32()),
        pa.field("new_upstream_correlation_id", pa.int32()),
    ],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
"""Columns, in order. ``frame`` holds the frame bytes including the 4-byte size prefix,
truncated to the snap length; ``frame_length`` is the original length."""


def schema_for(capture_id: str, source: Source) -> pa.Schema:
    """The schema with this capture's file-level metadata."""
    metadata = dict(CAPTURE_SCHEMA.metadata or {})
    metadata[SOURCE_KEY] = source.value.encode()
    metadata[CAPTURE_ID_KEY] = capture_id.encode()
    return CAPTURE_SCHEMA.with_metadata(metadata)
