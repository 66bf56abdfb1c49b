"""The fallback reader: Spark's binaryFile source plus mapInArrow, for any path Spark can
open (hdfs://, s3a:// with Hadoop credentials) where pyarrow.fs cannot.

Each file arrives whole as one binary value (Spark caps a file at 2 GiB; capture files
rotate at 256 MiB by default), and is parsed with the same code as the Data Source.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from corrfix.capture.format import FILE_SUFFIX
from spark_audit.source._batches import FrameTrim, RowFilter, shape, stream_batches
from spark_audit.source._schema import arrow_schema


def read_binary_files(
    spark: SparkSession, path: str, schema: StructType, rows: RowFilter, trim: FrameTrim | None = None
) -> DataFrame:
    """Capture rows of every ``*.arrows`` file below ``path``, shaped like the Data Source's."""
    files = (
        spark.read.format("binaryFile")
        .option("pathGlobFilter", f"*{FILE_SUFFIX}")
        .option("recursiveFileLookup", "true")
        .load(path)
        .select("path", "content")
    )
    target = arrow_schema(schema)

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            names = batch.column("path")
            contents = batch.column("content")
            for i in range(batch.num_rows):
                buffer = contents[i].as_buffer()
                for rows_batch in stream_batches(pa.BufferReader(buffer), str(names[i])):
                    shaped = shape(rows_batch, target, rows, trim)
                    if shaped is not None:
                        yield shaped

    return files.mapInArrow(convert, schema)
