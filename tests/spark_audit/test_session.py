"""Which audits start local mode's JVM with its quick compiler only."""

from __future__ import annotations

from pathlib import Path

from spark_audit._session import moves_rows_through_jvm


def test_the_default_audit_of_a_local_capture_moves_few_rows(tmp_path: Path) -> None:
    assert not moves_rows_through_jvm(str(tmp_path), "auto", None)
    assert not moves_rows_through_jvm(str(tmp_path), "datasource", None)


def test_tables_and_the_binaryfile_fallback_move_a_row_per_frame(tmp_path: Path) -> None:
    assert moves_rows_through_jvm(str(tmp_path), "auto", str(tmp_path / "tables"))
    assert moves_rows_through_jvm(str(tmp_path), "binaryfile", None)
    assert moves_rows_through_jvm("nosuchscheme://bucket/capture", "auto", None)  # only Spark opens it
