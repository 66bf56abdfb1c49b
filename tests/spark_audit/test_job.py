"""The whole job on a small capture: every check runs, and the report counts what each found."""

from __future__ import annotations

import json

import pytest

from spark_audit import CHECKS, AuditOptions, run_audit
from spark_audit.report import write_report
from tests.support.audit_builders import (
    CAPTURE,
    WIRE_CAPTURE,
    metadata_answer,
    offset_commit_frames,
    offset_fetch_frames,
    req,
    resp,
    row,
    write_capture,
)


def counts(report):
    return {
        name: {(c["kind"], c["severity"]): c["count"] for c in check["counts"]}
        for name, check in report["checks"].items()
    }


def test_every_check_runs_and_counts_its_findings(small_report):
    assert list(small_report["checks"]) == list(CHECKS)
    assert counts(small_report) == {
        "upstream_ordering": {},
        "client_view": {("acks0_reply", "error"): 1},
        "latency": {},
        "storms": {},
        "offsets": {},
        "produce": {("appended_twice", "error"): 1},
    }
    summary = small_report["summary"]
    assert (summary["findings"], summary["worst"]) == (2, "error")
    assert summary["by_severity"] == {"info": 0, "warning": 0, "error": 2}


def test_findings_name_their_connection_and_time(small_report):
    (acks0,) = small_report["checks"]["client_view"]["findings"]
    assert (acks0["capture_id"], acks0["connection_id"], acks0["wall_ns"]) == (WIRE_CAPTURE, "w1", 2_000_000)
    (twice,) = small_report["checks"]["produce"]["findings"]
    assert (twice["capture_id"], twice["connection_id"], twice["wall_ns"]) == (CAPTURE, "p1", 2_000_000)
    assert "sent 2 times, 2 acknowledged" in twice["summary"]
    assert sorted((t["check"], t["severity"], t["count"]) for t in small_report["timeline"]) == [
        ("client_view", "error", 1),
        ("produce", "error", 1),
    ]


def test_the_report_describes_the_input(small_report):
    captures = {c["capture_id"]: c for c in small_report["captures"]}
    assert {k: (c["source"], c["rows"], c["frames"]) for k, c in captures.items()} == {
        CAPTURE: ("proxy", 10, 8),
        WIRE_CAPTURE: ("wire", 4, 2),
    }
    # Only broker-side frames are decoded: the proxy's upstream side and the wire capture.
    assert small_report["decode"]["facts"] == {"produce_batch": 3, "produce_ack": 3}
    (produce,) = small_report["latency"]["by_api"]
    assert (produce["api_key"], produce["requests"], produce["p50_ms"]) == (0, 2, 3.0)


def test_unknown_checks_and_empty_directories_are_refused(spark, tmp_path):
    with pytest.raises(ValueError, match="unknown checks: nonsense"):
        run_audit(spark, AuditOptions(str(tmp_path), checks=("nonsense",)))
    with pytest.raises(FileNotFoundError, match="no capture files"):
        run_audit(spark, AuditOptions(str(tmp_path)))


def test_an_isr_shrink_in_metadata_answers_reaches_the_report(spark, tmp_path):
    # The job wires the shrinks into the report's table, findings, windows and page.
    # Two clients on the wire ask for metadata; both see t-0 with one of its three replicas
    # out of sync, then one sees it whole again.
    partitions = [(1, [1, 2, 3], [1, 2, 3]), (1, [1, 2, 3], [1, 3]), (1, [1, 2, 3], [1, 3])]
    rows = []
    for connection, seen in (("w1", partitions[:2]), ("w2", partitions[1:] + partitions[:1])):
        rows.append(row(connection, 0, "open", source="wire", reason="syn"))
        for n, replicas in enumerate(seen):
            cid, seq = n + 1, 1 + 2 * n
            answer = metadata_answer(cid, {0: replicas})
            at = 100 * seq + (50 if connection == "w2" else 0)
            rows.append(req(connection, seq, "client", 3, cid=cid, api_version=12, wall_ms=at))
            rows.append(
                resp(connection, seq + 1, "client", 3, cid=cid, api_version=12, frame=answer, wall_ms=at + 1)
            )
    write_capture(tmp_path, [{**r, "source": "wire", "capture_id": WIRE_CAPTURE} for r in rows])
    report = run_audit(spark, AuditOptions(str(tmp_path), checks=("storms",)))
    assert report["version"] == 7
    assert counts(report) == {"storms": {("isr_shrink", "info"): 1}}
    [shrink] = report["storms"]["isr_shrinks"]
    assert (shrink["min_isr"], shrink["replicas"], shrink["under_replicated_ms"]) == (2, 3, 400.0)
    [window] = report["storms"]["windows"]
    assert (window["category"], window["errors"], window["isr_shrinks"]) == ("isr_shrink", 0, 1)
    _, html = write_report(report, tmp_path / "report")
    assert "<th>ISR shrinks</th>" in html.read_text()


def _two_clusters_capture(directory, fetched_on: str) -> None:
    """A wire capture of a client of two clusters, each with a group g on topic t: its
    Metadata connection to each cluster (a1, b1) names it, and the group coordinator's
    connections to the same brokers do only OffsetCommit or OffsetFetch. The client commits
    offset 9 of g on A, then fetches g's offset on the connection ``fetched_on`` and finds none."""
    calls = {
        "ma": ("a1:9092", 3, 12, (b"", metadata_answer(1, {}, cluster="A"))),
        "mb": ("b1:9092", 3, 12, (b"", metadata_answer(1, {}, cluster="B"))),
        "ca": ("a1:9092", 8, 8, offset_commit_frames(1, 9)),
        fetched_on: (
            "a1:9092" if fetched_on.startswith("ca") else "b1:9092",
            9,
            7,
            offset_fetch_frames(1, -1),
        ),
    }
    rows = []
    for n, (connection, (address, api_key, version, (request, answer))) in enumerate(calls.items()):
        at = 100 * (n + 1)
        rows.append(
            row(connection, 0, "open", source="wire", reason="syn", wall_ms=at, upstream_address=address)
        )
        ask = {"frame": request, "frame_length": len(request)} if request else {}
        rows.append(req(connection, 1, "client", api_key, cid=1, api_version=version, wall_ms=at + 1, **ask))
        rows.append(
            resp(
                connection,
                2,
                "client",
                api_key,
                cid=1,
                api_version=version,
                wall_ms=at + 2,
                frame=answer,
                frame_length=len(answer),
            )
        )
    write_capture(directory, [{**r, "source": "wire", "capture_id": WIRE_CAPTURE} for r in rows])


def test_an_offset_committed_in_one_cluster_is_not_lost_in_the_other(spark, tmp_path):
    _two_clusters_capture(tmp_path, fetched_on="cb")
    report = run_audit(spark, AuditOptions(str(tmp_path), checks=("offsets",)))
    assert counts(report) == {"offsets": {}}


def test_a_connection_takes_the_cluster_its_broker_named_on_another(spark, tmp_path):
    _two_clusters_capture(tmp_path, fetched_on="ca2")
    report = run_audit(spark, AuditOptions(str(tmp_path), checks=("offsets",)))
    [lost] = report["checks"]["offsets"]["findings"]
    assert (lost["kind"], lost["connection_id"]) == ("committed_offset_lost", "ca2")
    assert json.loads(lost["details"])["cluster_id"] == "A"
