"""``spark.read.format("corrfix-capture")``: a Python Data Source over capture directories.

Yields the capture's own Arrow batches (no per-row Python), one partition per file, or
per range of batches for files larger than ``split_bytes``. Options:

- ``path`` (``load(path)``): a directory or file; local, or any URI pyarrow.fs opens (s3://,
  gs://, hdfs:// with libhdfs). Paths only Spark can open go through :mod:`._binaryfile`.
- ``split_bytes`` (default 64 MiB): local files above this are split by batch ranges.
- ``kinds``, ``sides``, ``directions``, ``api_keys``: comma-separated row filters applied in
  Arrow before rows cross to the JVM (the decode step reads only the frames it needs).
- ``frame_api_keys``, ``frame_directions``, ``frame_bytes``: keep frame bytes only for
  these rows (others get null), cut to ``frame_bytes`` (the header checks read Produce acks).

A user-given schema (``.schema(...)``) selects capture columns by name: leaving out
``frame`` keeps the bytes on disk, which is this source's column pruning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from corrfix.capture.format import FILE_SUFFIX, capture_files
from spark_audit import DATA_SOURCE_NAME
from spark_audit.source._batches import FrameTrim, RowFilter, shape, stream_batches
from spark_audit.source._schema import CAPTURE_SPARK_SCHEMA, arrow_schema, spark_schema

DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class FileRange(InputPartition):
    """Batches ``[first, stop)`` of one file (``stop`` None: to the end)."""

    path: str
    first: int = 0
    stop: int | None = None


def is_local(path: str) -> bool:
    """A plain path or file:// URI (a Windows drive letter is not a scheme)."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or len(scheme) == 1


def _local(path: str) -> Path:
    return Path(urlparse(path).path if path.startswith("file:") else path)


def list_files(path: str) -> list[str]:
    """Capture files under ``path``, in name (= time) order."""
    if is_local(path):
        local = _local(path)
        if not local.exists():
            raise FileNotFoundError(f"no such capture directory or file: {path}")
        return [str(p) for p in capture_files(local)]
    fs, root = pyarrow.fs.FileSystem.from_uri(path)
    info = fs.get_file_info(root)
    if info.type == pyarrow.fs.FileType.File:
        return [path]
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    scheme = urlparse(path).scheme
    found = sorted(
        i.path for i in infos if i.type == pyarrow.fs.FileType.File and i.path.endswith(FILE_SUFFIX)
    )
    return [f"{scheme}://{p}" for p in found]


def open_file(path: str) -> pa.NativeFile:
    if is_local(path):
        return pa.memory_map(str(_local(path)))  # zero-copy: unread columns are never touched
    fs, inner = pyarrow.fs.FileSystem.from_uri(path)
    return fs.open_input_file(inner)


def plan(path: str, split_bytes: int) -> list[FileRange]:
    """One range per file, or several batch ranges of about ``split_bytes`` for big local files."""
    ranges: list[FileRange] = []
    for file in list_files(path):
        try:
            whole = not is_local(file) or _local(file).stat().st_size <= split_bytes
        except FileNotFoundError:  # pruned since the listing (the oldest files go first)
            continue
        if whole:
            ranges.append(FileRange(file))
            continue
        first, index, size = 0, 0, 0
        with open_file(file) as source:
            for index, batch in enumerate(stream_batches(source, file)):
                size += batch.nbytes
                if size >= split_bytes:
                    ranges.append(FileRange(file, first, index + 1))
                    first, size = index + 1, 0
        ranges.append(FileRange(file, first, None))
    return ranges


def read_range(
    part: FileRange, target: pa.Schema, rows: RowFilter, trim: FrameTrim | None = None
) -> Iterator[pa.RecordBatch]:
    """The shaped batches of one range; none if its file was pruned after the plan was made."""
    try:
        source = open_file(part.path)
    except FileNotFoundError:
        return
    with source:
        for index, batch in enumerate(stream_batches(source, part.path)):
            if index < part.first:
                continue
            if part.stop is not None and index >= part.stop:
                return
            shaped = shape(batch, target, rows, trim)
            if shaped is not None:
                yield shaped


class CaptureReader(DataSourceReader):
    """Plans file ranges on the driver; reads them on the executors."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        path = options.get("path") or options.get("paths")
        if not path:
            raise ValueError(f'{DATA_SOURCE_NAME}: give a capture directory: .load("DIR")')
        self.path = path
        self.split_bytes = int(options.get("split_bytes", DEFAULT_SPLIT_BYTES))
        self.rows = RowFilter.from_options(options)
        self.trim = FrameTrim.from_options(options)
        contract = spark_schema([field.name for field in schema.fields])
        for given, expected in zip(schema.fields, contract.fields, strict=True):
            if given.dataType != expected.dataType:
                raise ValueError(
                    f"{DATA_SOURCE_NAME}: column {given.name} is {expected.dataType.simpleString()}"
                )
        self.target = arrow_schema(schema)  # the nullability Spark was given, exactly

    def partitions(self) -> list[InputPartition]:
        return list(plan(self.path, self.split_bytes))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FileRange)
        return read_range(partition, self.target, self.rows, self.trim)


class CaptureDataSource(DataSource):
    """The ``corrfix-capture`` format; its schema is the capture contract's."""

    @classmethod
    def name(cls) -> str:
        return DATA_SOURCE_NAME

    def schema(self) -> StructType:
        return CAPTURE_SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return CaptureReader(dict(self.options), schema)
