"""Capture files to Arrow batches of the shape Spark asked for: rows filtered, columns chosen.

Shared by the Python Data Source (local and pyarrow-reachable paths) and the binaryFile
fallback (any path Spark itself can read). Files are Arrow IPC streams that may still be
written to: reading stops at the last whole batch, as corrfix's own reader does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc

from corrfix.capture.format import SCHEMA_VERSION, VERSION_KEY, CaptureFormatError, whole_frames


def _is_in(batch: pa.RecordBatch, column: str, values: frozenset) -> pa.Array:
    """Where ``column`` is one of ``values`` (null counts as no)."""
    value_set = pa.array(sorted(values), batch.schema.field(column).type)
    return pc.fill_null(pc.is_in(batch.column(column), value_set=value_set), False)


def _all(masks: list[pa.Array]) -> pa.Array | None:
    mask = None
    for keep in masks:
        mask = keep if mask is None else pc.and_(mask, keep)
    return mask


def _names(options: dict[str, str], key: str) -> frozenset[str] | None:
    value = options.get(key)
    return frozenset(v.strip() for v in value.split(",") if v.strip()) if value else None


def _join(values: frozenset | None) -> str | None:
    return None if values is None else ",".join(str(v) for v in sorted(values))


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Rows to keep: each set restricts one column (None keeps all), and ``broker_side``
    keeps frames as the broker saw them (upstream in proxy captures, client in wire ones).
    Cheap to apply in Arrow before the rows cross to the JVM, which is what makes body
    decoding affordable."""

    kinds: frozenset[str] | None = None
    sides: frozenset[str] | None = None
    directions: frozenset[str] | None = None
    api_keys: frozenset[int] | None = None
    broker_side: bool = False

    @classmethod
    def from_options(cls, options: dict[str, str]) -> RowFilter:
        keys = _names(options, "api_keys")
        return cls(
            kinds=_names(options, "kinds"),
            sides=_names(options, "sides"),
            directions=_names(options, "directions"),
            api_keys=frozenset(int(k) for k in keys) if keys is not None else None,
            broker_side=options.get("broker_side", "false").lower() == "true",
        )

    def options(self) -> dict[str, str]:
        """The Data Source options that ask for this filter."""
        out = {
            key: joined
            for key, values in (
                ("kinds", self.kinds),
                ("sides", self.sides),
                ("directions", self.directions),
                ("api_keys", self.api_keys),
            )
            if (joined := _join(values)) is not None
        }
        if self.broker_side:
            out["broker_side"] = "true"
        return out

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        masks = [
            _is_in(batch, column, values)
            for column, values in (
                ("kind", self.kinds),
                ("side", self.sides),
                ("direction", self.directions),
                ("api_key", self.api_keys),
            )
            if values is not None
        ]
        if self.broker_side:
            proxy = pc.equal(batch.column("source"), "proxy")
            side = batch.column("side")
            masks.append(
                pc.fill_null(pc.if_else(proxy, pc.equal(side, "upstream"), pc.equal(side, "client")), False)
            )
        mask = _all(masks)
        return batch if mask is None else batch.filter(mask)


@dataclass(frozen=True, slots=True)
class FrameTrim:
    """Keep frame bytes only where a check reads them, and only their first ``max_bytes``:
    the header checks need the first bytes of Produce requests (acks), nothing else."""

    api_keys: frozenset[int] | None = None
    directions: frozenset[str] | None = None
    max_bytes: int | None = None

    @classmethod
    def from_options(cls, options: dict[str, str]) -> FrameTrim:
        keys = _names(options, "frame_api_keys")
        max_bytes = options.get("frame_bytes")
        return cls(
            api_keys=frozenset(int(k) for k in keys) if keys is not None else None,
            directions=_names(options, "frame_directions"),
            max_bytes=int(max_bytes) if max_bytes else None,
        )

    def options(self) -> dict[str, str]:
        """The Data Source options that ask for this trim."""
        out = {
            key: joined
            for key, values in (("frame_api_keys", self.api_keys), ("frame_directions", self.directions))
            if (joined := _join(values)) is not None
        }
        if self.max_bytes is not None:
            out["frame_bytes"] = str(self.max_bytes)
        return out

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if "frame" not in batch.schema.names or (
            self.api_keys is None and self.directions is None and self.max_bytes is None
        ):
            return batch
        frame = batch.column("frame")
        mask = _all(
            [
                _is_in(batch, column, values)
                for column, values in (("api_key", self.api_keys), ("direction", self.directions))
                if values is not None
            ]
        )
        if self.max_bytes is not None:
            frame = pc.binary_slice(frame, 0, self.max_bytes)
        if mask is not None:
            frame = pc.if_else(mask, frame, pa.nulls(len(frame), frame.type))
        index = batch.schema.get_field_index("frame")
        return batch.set_column(index, batch.schema.field(index), frame)


def check_version(schema: pa.Schema, name: str) -> None:
    """Refuse files of a newer schema version, as the contract requires."""
    version = (schema.metadata or {}).get(VERSION_KEY)
    if version is None:
        raise CaptureFormatError(f"{name} is not a corrfix capture (no schema version)")
    if int(version) > SCHEMA_VERSION:
        raise CaptureFormatError(
            f"{name} has capture schema version {int(version)}; the audit reads up to {SCHEMA_VERSION}"
        )


def stream_batches(source: pa.NativeFile | pa.Buffer, name: str) -> Iterator[pa.RecordBatch]:
    """Every whole batch of one IPC stream; a cut-off tail ends the stream quietly."""
    try:
        reader = pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        return  # nothing flushed yet
    check_version(reader.schema, name)
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError):
            return  # a batch only partly written


def shape(
    batch: pa.RecordBatch, target: pa.Schema, rows: RowFilter, trim: FrameTrim | None = None
) -> pa.RecordBatch | None:
    """Make frames whole (capture format 2 stores a forwarded frame once), filter rows, trim
    frames, then select and cast columns by name to exactly ``target``.

    Columns a newer writer appended are dropped; a column an older version did not have
    (``frame_seq`` in version 1) is filled with nulls."""
    if "frame" in target.names:  # frames whole before rows are filtered: a pair is in one batch
        batch = whole_frames(batch)
    batch = rows.apply(batch)
    if batch.num_rows == 0:
        return None
    if trim is not None and "frame" in target.names:
        batch = trim.apply(batch)
    names = batch.schema.names
    arrays = []
    for field in target:
        if field.name in names:
            column = batch.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)
