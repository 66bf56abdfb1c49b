"""Readable names for api keys and error codes, as Spark expressions and for Python."""

from __future__ import annotations

from functools import cache

import kafka.errors
from pyspark.sql import Column
from pyspark.sql import functions as F

from protocol import api_name, every_request_schema

ERROR_NAMES_OVERRIDE = {6: "NOT_LEADER_OR_FOLLOWER"}  # kafka-python still says NOT_LEADER_FOR_PARTITION


@cache
def error_name(code: int) -> str:
    if code in ERROR_NAMES_OVERRIDE:
        return ERROR_NAMES_OVERRIDE[code]
    message = getattr(kafka.errors.for_code(code), "message", None)
    return message if isinstance(message, str) and message != "UNKNOWN" else f"error_{code}"


def api_name_column(api_key: Column) -> Column:
    """The api's name (``Produce``), ``api_N`` for unknown keys, ``?`` for null."""
    names = sorted((key, schema.name) for key, schema in every_request_schema().items())
    # Two array literals, not a literal per key: each literal is a call into the JVM.
    mapping = F.map_from_arrays(F.lit([k for k, _ in names]), F.lit([v for _, v in names]))
    return F.coalesce(
        F.element_at(mapping, api_key.cast("int")),
        F.when(api_key.isNotNull(), F.concat(F.lit("api_"), api_key.cast("string"))),
        F.lit("?"),
    )


__all__ = ["api_name", "api_name_column", "error_name"]
