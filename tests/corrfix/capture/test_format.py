"""The reader's side of the versioning rule: columns added at the end are ignored."""

from __future__ import annotations

import pyarrow as pa

from corrfix.capture import read_capture
from corrfix.capture.format import CAPTURE_SCHEMA, FILE_SUFFIX, Source, schema_for


def test_columns_added_at_the_end_do_not_break_reading(tmp_path):
    schema = schema_for("abc", Source.PROXY)
    row = {name: None for name in CAPTURE_SCHEMA.names}
    row.update(capture_id="abc", source="proxy", connection_id="c1", seq=0, kind="open", wall_ns=1, mono_ns=1)
    batch = pa.RecordBatch.from_pylist([row], schema=schema)
    newer = batch.append_column(pa.field("added_later", pa.int32()), pa.array([7], pa.int32()))
    newer = newer.replace_schema_metadata(schema.metadata)
    for name, data in (("a", batch), ("b", newer)):
        with (
            pa.OSFile(str(tmp_path / f"{name}{FILE_SUFFIX}"), "wb") as sink,
            pa.ipc.new_stream(sink, data.schema) as w,
        ):
            w.write_batch(data)
    table = read_capture(tmp_path)
    assert table.schema.names == CAPTURE_SCHEMA.names and table.num_rows == 2
