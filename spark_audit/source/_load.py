"""Capture DataFrames: through the Data Source where pyarrow can reach the path, else binaryFile."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.fs
from pyspark.sql import DataFrame, SparkSession

from corrfix.capture.format import CAPTURE_SCHEMA
from spark_audit import DATA_SOURCE_NAME
from spark_audit.source._batches import FrameTrim, RowFilter
from spark_audit.source._binaryfile import read_binary_files
from spark_audit.source._datasource import CaptureDataSource, is_local
from spark_audit.source._schema import spark_schema

Via = Literal["auto", "datasource", "binaryfile"]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("corrfix-capture")`` available in this session."""
    spark.dataSource.register(CaptureDataSource)


def reachable_by_pyarrow(path: str) -> bool:
    """Whether the Data Source can open ``path`` (local, or a filesystem pyarrow knows here)."""
    if is_local(path):
        return True
    try:
        pyarrow.fs.FileSystem.from_uri(path)
    except (pa.ArrowException, OSError, ValueError):
        return False
    return True


def load_capture(
    spark: SparkSession,
    path: str,
    columns: tuple[str, ...] | list[str] | None = None,
    rows: RowFilter | None = None,
    trim: FrameTrim | None = None,
    via: Via = "auto",
) -> DataFrame:
    """Capture rows under ``path`` with ``columns`` (default: all), filtered by ``rows``."""
    schema = spark_schema(list(columns) if columns is not None else list(CAPTURE_SCHEMA.names))
    rows = rows or RowFilter()
    if via == "binaryfile" or (via == "auto" and not reachable_by_pyarrow(path)):
        return read_binary_files(spark, path, schema, rows, trim)
    reader = spark.read.format(DATA_SOURCE_NAME).schema(schema)
    options = rows.options() | (trim.options() if trim is not None else {})
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)
