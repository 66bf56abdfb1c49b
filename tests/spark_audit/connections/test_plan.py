"""Whole connections are dealt into partitions by rows, from a per-file index."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corrfix.capture import CaptureWriter
from corrfix.capture.format import CaptureFormatError
from spark_audit.connections import assign, index_files, summary_index
from spark_audit.source import list_files

indexes = st.dictionaries(
    st.sampled_from(["f1", "f2", "f3"]),
    st.dictionaries(st.sampled_from([f"cap\x00c{i}" for i in range(12)]), st.integers(1, 1000), max_size=12),
    max_size=3,
)


@given(index=indexes, partitions=st.integers(1, 6))
def test_every_connection_lands_whole_in_one_partition_with_its_files(index, partitions):
    plan = assign(index, partitions)
    keys = [key for part in plan for key in part.connections]
    everything = {key for counts in index.values() for key in counts}
    assert sorted(keys) == sorted(everything)  # each once: whole connections
    assert len(plan) <= partitions and all(part.connections for part in plan)
    for part in plan:
        assert part.rows == sum(counts.get(key, 0) for counts in index.values() for key in part.connections)
        assert set(part.files) == {f for f, counts in index.items() if set(counts) & set(part.connections)}
    if plan:
        biggest = max(sum(c.get(k, 0) for c in index.values()) for k in everything)
        mean = sum(part.rows for part in plan) / len(plan)
        assert max(part.rows for part in plan) <= mean + biggest  # the greedy bound


@given(
    sizes=st.lists(st.lists(st.integers(1, 1000), min_size=1, max_size=8), min_size=1, max_size=8),
    partitions=st.integers(1, 6),
)
def test_connections_that_live_in_one_file_each_have_their_file_read_about_once(sizes, partitions):
    """Rotated files of short-lived connections: the partitions' files are runs in file order
    that meet at most at one file, not every file for every partition."""
    index = {f"f{i}": {f"cap\x00f{i}-c{j}": n for j, n in enumerate(row)} for i, row in enumerate(sizes)}
    plan = assign(index, partitions)
    assert sum(len(part.files) for part in plan) <= len(index) + len(plan) - 1


def test_an_empty_index_plans_nothing():
    assert assign({}, 4) == []


def test_the_writers_summary_indexes_each_file_as_the_files_hold_it(tmp_path):
    with CaptureWriter(tmp_path, rotate_bytes=1) as writer:  # one file per write
        for round_ in range(3):
            for n in range(4 if round_ else 2):
                writer.connection_opened(f"c{round_}-{n}", "127.0.0.1:1", "127.0.0.1:2")
                writer.connection_closed(f"c{round_}-{n}", "client closed")
            writer.flush()
    files = list_files(str(tmp_path))
    known = summary_index(str(tmp_path))
    assert len(files) == 3 and sorted(known) == sorted(Path(f).name for f in files)
    assert index_files(files, known) == index_files(files)
    assert sum(sum(counts.values()) for counts in known.values()) == 2 * (2 + 4 + 4)


def test_files_the_summary_does_not_index_are_read(tmp_path):
    with CaptureWriter(tmp_path) as writer:
        writer.connection_opened("c1", "127.0.0.1:1", "127.0.0.1:2")
    [file] = list_files(str(tmp_path))
    copy = tmp_path / Path(file).name.replace(".arrows", "-copy.arrows")
    shutil.copy(file, copy)
    assert sorted(summary_index(str(tmp_path))) == [Path(file).name]
    assert (
        index_files([file, str(copy)], summary_index(str(tmp_path)))[str(copy)] == index_files([file])[file]
    )


def test_rows_without_a_capture_id_are_refused_by_name(tmp_path):
    """The format requires both ids; a file that breaks that is named, not planned (a null
    key used to fail deep in the planner, comparing None with a string)."""
    with CaptureWriter(tmp_path) as writer:
        writer.connection_opened("c1", "127.0.0.1:1", "127.0.0.1:2")
    [file] = list_files(str(tmp_path))
    with pa.memory_map(file) as source:
        reader = pa.ipc.open_stream(source)
        table = reader.read_all()
    broken = tmp_path / Path(file).name.replace(".arrows", "-broken.arrows")
    nulls = pa.nulls(table.num_rows, pa.string())
    table = table.set_column(
        table.schema.get_field_index("capture_id"), table.schema.field("capture_id"), nulls
    )
    with pa.OSFile(str(broken), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    assert index_files([file])
    with pytest.raises(
        CaptureFormatError, match=f"{broken.name}: {table.num_rows} of {table.num_rows} rows .* no capture_id"
    ):
        index_files([str(broken)])
