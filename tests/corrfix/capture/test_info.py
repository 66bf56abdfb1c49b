"""capture info: totals from the rows, lost rows from the sidecar, and the text report."""

from __future__ import annotations

import json
import shutil

from corrfix.capture import CaptureWriter, capture_info, render_info
from corrfix.core import RepairConfig
from protocol import ApiKey
from protocol.testing import request_frame
from tests.support.capture_shell import Shell, run_repair_scenario


def test_info_counts_connections_frames_repairs_and_time(tmp_path):
    writer = CaptureWriter(tmp_path, rotate_bytes=2000).start()  # several files
    run_repair_scenario(Shell(writer, config=RepairConfig(probe_after=1.0)))
    writer.flush(timeout=10)
    still_open = Shell(writer, connection="c2")
    still_open.open(client="127.0.0.1:50002")
    still_open.client_sends(request_frame(ApiKey.METADATA, 1, 1))
    writer.close()

    info = capture_info(tmp_path)
    assert info["files"] > 1 and info["rows"] == 32 + 4
    assert info["rows_lost"] == 0
    assert [(c["capture_id"], c["source"], c["rows"], c["finished"]) for c in info["captures"]] == [
        (writer.capture_id, "proxy", 36, True)
    ]
    assert info["first_wall_ns"] <= info["last_wall_ns"]
    conns = {c["connection_id"]: c for c in info["connections"]}
    assert conns["c1"]["client_address"] == "127.0.0.1:50001"
    assert conns["c1"]["upstream_address"] == "127.0.0.1:9092"
    assert conns["c1"]["close_reason"] == "client closed" and conns["c1"]["repairs"] == 7
    assert conns["c2"]["close_reason"] == "capture closed" and conns["c2"]["frames"] == 2
    frames = {(f["side"], f["direction"], f["api"]): f["frames"] for f in info["frames"]}
    assert frames == {
        ("client", "request", "Metadata"): 5,
        ("client", "request", "Produce"): 1,
        ("client", "response", "Metadata"): 4,
        ("upstream", "request", "Metadata"): 7,
        ("upstream", "request", "Produce"): 1,
        ("upstream", "request", "ApiVersions"): 1,
        ("upstream", "response", "Metadata"): 4,
        ("upstream", "response", "Produce"): 1,
        ("upstream", "response", "ApiVersions"): 1,
    }
    assert info["repairs"] == {
        "probe_found_loss": 1,
        "probe_sent": 1,
        "requeue": 2,
        "skip_detected": 2,
        "stale_drop": 1,
    }
    json.dumps(info)  # plain data

    text = render_info(info)
    assert "rows lost by the capture: 0" in text
    assert "127.0.0.1:50001" in text and "client closed" in text
    assert "Metadata (3)" in text and "requeue" in text


def test_info_reports_lost_rows_and_says_when_it_cannot_know(tmp_path):
    writer = CaptureWriter(tmp_path / "cap", queue_rows=3)  # never started: the queue overflows
    shell = Shell(writer)
    shell.open()
    shell.client_sends(*(request_frame(ApiKey.METADATA, i, i) for i in range(3)))
    writer.close()
    info = capture_info(tmp_path / "cap")
    assert (info["rows"], info["rows_lost"]) == (3, 5)
    assert "rows lost by the capture: 5" in render_info(info)

    only_rows = tmp_path / "copy"
    only_rows.mkdir()
    for file in writer.stats.files:
        shutil.copy(file, only_rows)
    info = capture_info(only_rows)
    assert info["rows_lost"] is None and info["captures"][0]["finished"] is None
    assert "unknown (no summary)" in render_info(info)


def test_info_of_an_empty_directory(tmp_path):
    info = capture_info(tmp_path)
    assert (info["files"], info["rows"], info["connections"], info["duration_seconds"]) == (0, 0, [], None)
    assert "connections: 0" in render_info(info)
