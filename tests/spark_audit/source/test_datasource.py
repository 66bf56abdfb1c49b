"""The corrfix-capture Data Source and the binaryFile fallback read what the writer wrote."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.utils import PythonException

from corrfix.capture import read_capture
from corrfix.capture.format import CAPTURE_SCHEMA, VERSION_KEY
from corrfix.capture.pcap import CaptureRowWriter
from spark_audit import DATA_SOURCE_NAME
from spark_audit.source import CAPTURE_SPARK_SCHEMA, FrameTrim, RowFilter, load_capture, plan
from spark_audit.source._datasource import read_range

ROWS = 50


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    directory = tmp_path_factory.mktemp("capture")
    writer = CaptureRowWriter(directory, "ab" * 16, batch_rows=7)
    for i in range(ROWS):
        writer.write(
            dict(
                connection_id=f"c{i % 3}",
                seq=i,
                kind="frame",
                side="client",
                direction="request" if i % 2 else "response",
                wall_ns=1000 + i,
                mono_ns=i,
                api_key=i % 4,
                api_version=1,
                client_correlation_id=i,
                frame_length=16,
                frame=bytes(range(16)),
            )
        )
    writer.close()
    return directory


def sorted_rows(df):
    return sorted((r.asDict() for r in df.collect()), key=lambda r: r["seq"])


def test_reads_every_row_with_the_contract_schema(spark, capture):
    df = spark.read.format(DATA_SOURCE_NAME).load(str(capture))
    assert df.schema == CAPTURE_SPARK_SCHEMA
    assert sorted_rows(df) == read_capture(capture).to_pylist()


def test_splits_big_files_into_batch_ranges(spark, capture):
    ranges = plan(str(capture), split_bytes=1)
    assert len({r.path for r in ranges}) == 1 and len(ranges) >= ROWS // 7
    df = spark.read.format(DATA_SOURCE_NAME).option("split_bytes", "1").load(str(capture))
    assert df.rdd.getNumPartitions() == len(ranges)
    assert [r["seq"] for r in sorted_rows(df)] == list(range(ROWS))


def test_user_schema_selects_columns_and_options_filter_rows(spark, capture):
    df = load_capture(spark, str(capture), ["seq", "api_key"], RowFilter(api_keys=frozenset({1, 2})))
    assert df.columns == ["seq", "api_key"]
    assert [r["seq"] for r in sorted_rows(df)] == [i for i in range(ROWS) if i % 4 in (1, 2)]


def test_frame_trim_keeps_the_head_of_chosen_frames_only(spark, capture):
    trim = FrameTrim(api_keys=frozenset({1}), directions=frozenset({"request"}), max_bytes=5)
    rows = sorted_rows(load_capture(spark, str(capture), ["seq", "frame"], trim=trim))
    assert {r["seq"]: r["frame"] for r in rows if r["frame"] is not None} == {
        i: bytes(range(5)) for i in range(ROWS) if i % 4 == 1
    }


def test_binary_file_fallback_gives_the_same_rows(spark, capture):
    via_source = sorted_rows(load_capture(spark, str(capture), via="datasource"))
    via_binary = sorted_rows(load_capture(spark, str(capture), via="binaryfile"))
    assert via_binary == via_source and len(via_source) == ROWS


def test_a_newer_schema_version_is_refused(spark, tmp_path):
    schema = CAPTURE_SCHEMA.with_metadata({VERSION_KEY: b"99"})
    with (
        pa.OSFile(str(tmp_path / "capture-x-000001.arrows"), "wb") as sink,
        pa.ipc.new_stream(sink, schema) as w,
    ):
        w.write_batch(pa.RecordBatch.from_pylist([], schema=schema))
    with pytest.raises(PythonException, match="schema version 99"):
        spark.read.format(DATA_SOURCE_NAME).load(str(tmp_path)).collect()


def test_files_pruned_after_the_listing_or_the_plan_are_skipped(tmp_path):
    """An operator removes the oldest capture files (the capture never does) while an audit
    reads the directory: a file gone before the plan, or before its range is read, raised
    FileNotFoundError and failed the whole job. No Spark session: the plan and the ranges
    are plain functions."""
    for k in range(3):  # three captures, one file each, in name order
        writer = CaptureRowWriter(tmp_path, f"{k:02x}" * 16)
        for i in (2 * k, 2 * k + 1):
            writer.write(dict(connection_id="c1", seq=i, kind="open", wall_ns=i, mono_ns=i))
        writer.close()
    ranges = plan(str(tmp_path), split_bytes=1 << 20)
    assert len(ranges) == 3
    Path(ranges[0].path).unlink()
    assert plan(str(tmp_path), split_bytes=1 << 20) == ranges[1:]
    target = pa.schema([CAPTURE_SCHEMA.field("seq")])
    assert list(read_range(ranges[0], target, RowFilter())) == []
    seqs = [
        v for r in ranges[1:] for b in read_range(r, target, RowFilter()) for v in b.column(0).to_pylist()
    ]
    assert seqs == [2, 3, 4, 5]
