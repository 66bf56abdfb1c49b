"""Spark schemas derived from the capture contract, so the audit never drifts from it.

The capture's Arrow schema (corrfix.capture.format) is the source of truth; the Spark
schema here is its exact image, which the Python Data Source must yield batch for batch.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from corrfix.capture.format import CAPTURE_SCHEMA

CAPTURE_SPARK_SCHEMA: StructType = from_arrow_schema(CAPTURE_SCHEMA)
"""Every capture column, in contract order, with the contract's nullability."""


def spark_schema(columns: tuple[str, ...] | list[str]) -> StructType:
    """The capture schema restricted to ``columns`` (in the order given)."""
    by_name = {field.name: field for field in CAPTURE_SPARK_SCHEMA.fields}
    unknown = [name for name in columns if name not in by_name]
    if unknown:
        raise ValueError(f"not capture columns: {', '.join(unknown)}")
    return StructType([by_name[name] for name in columns])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for batches of ``schema`` (no metadata)."""
    return to_arrow_schema(schema, timezone="UTC")
