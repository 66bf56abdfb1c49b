"""The capture summary's JSON: every field, read back as written; finished files encoded once."""

from __future__ import annotations

import json

from corrfix.capture import CaptureSummary, read_summaries, write_summary
from corrfix.capture.pcap._provenance import WireCaptureSummary


def _summary() -> CaptureSummary:
    summary = CaptureSummary("a" * 32, "proxy", 1, updated_wall_ns=2, snaplen=0, rows_written=7)
    summary.rows_lost, summary.rows_lost_by_kind = 3, {"frame": 2, "close": 1}
    summary.files = ["f-000001.arrows", "f-000002.arrows"]
    summary.connections = {"f-000001.arrows": {"c1": 4, "c2": 1}, "f-000002.arrows": {"c2": 2}}
    return summary


def test_every_field_reads_back_as_written(tmp_path):
    summary = _summary()
    write_summary(tmp_path / "x.capture.json", summary)
    assert read_summaries(tmp_path) == [summary]
    document = json.loads((tmp_path / "x.capture.json").read_text())
    assert "_sealed" not in document and document["connections"] == summary.connections


def test_an_import_summary_keeps_its_own_fields(tmp_path):
    summary = WireCaptureSummary("w", "wire", 1, pcap_name="x.pcap", pcap_sha256="ab")
    document = json.loads(summary.to_json())
    assert (document["pcap_name"], document["pcap_sha256"], document["source"]) == ("x.pcap", "ab", "wire")


def test_a_sealed_file_is_encoded_once_and_the_newest_each_time():
    summary = _summary()
    summary.seal(["f-000001.arrows", "not-a-file.arrows"])
    summary.connections["f-000001.arrows"]["c1"] = 99  # cannot happen to a finished file: shows the reuse
    summary.connections["f-000002.arrows"]["c3"] = 5
    document = json.loads(summary.to_json())
    assert document["connections"] == {
        "f-000001.arrows": {"c1": 4, "c2": 1},
        "f-000002.arrows": {"c2": 2, "c3": 5},
    }
