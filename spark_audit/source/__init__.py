"""Reading captures into Spark: the ``corrfix-capture`` Python Data Source, the binaryFile
fallback for paths only Spark can open, and the capture DataFrames the checks start from.

Both readers turn capture files into Arrow batches with the same code (``_batches``), and
yield exactly the Spark image of the capture contract (``_schema``).
"""

from __future__ import annotations

from ._batches import FrameTrim, RowFilter, check_version, stream_batches
from ._binaryfile import read_binary_files
from ._datasource import CaptureDataSource, FileRange, is_local, list_files, open_file, plan
from ._load import Via, load_capture, reachable_by_pyarrow, register
from ._schema import CAPTURE_SPARK_SCHEMA, arrow_schema, spark_schema

__all__ = [
    "CAPTURE_SPARK_SCHEMA",
    "CaptureDataSource",
    "FileRange",
    "FrameTrim",
    "RowFilter",
    "Via",
    "arrow_schema",
    "check_version",
    "is_local",
    "list_files",
    "load_capture",
    "open_file",
    "plan",
    "reachable_by_pyarrow",
    "read_binary_files",
    "register",
    "spark_schema",
    "stream_batches",
]
