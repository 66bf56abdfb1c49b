"""Check 2, what the client saw, on small hand-built proxy and wire captures."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import client_view
from spark_audit.report import client_view_findings
from tests.support.audit_builders import CAPTURE, MS, req, resp, row, transactions_df


def test_the_client_side_of_a_repaired_proxy_connection_is_clean(proxy_capture):
    assert client_view(proxy_capture).count() == 0


def test_client_view_of_a_wire_capture(wire_capture):
    def v(conn, seq, wall, kind, api, cid, related=None, reason=None, gap=None):
        return Row(
            capture_id=CAPTURE,
            connection_id=conn,
            seq=seq,
            wall_ns=wall * MS,
            kind=kind,
            api_key=api,
            correlation_id=cid,
            related_correlation_id=related,
            close_reason=reason,
            capture_gap=gap,
        )

    expected = [
        v("w1", 1, 3, "out_of_order", 3, 1, 2),
        v("w1", 6, 6, "acks0_reply", 0, 3),
        v("w1", 7, 7, "orphan", None, 99),
        v("w1", 10, 10, "duplicate", 18, 4),
        v("w1", 11, 11, "id_not_increasing", 3, 4, 4),
        v("w1", 13, 15, "answer_missing", 1, 5, 6),
        v("w1", 16, 16, "unanswered_at_close", 3, 7, None, "fin"),
        v("w2", 5, 5, "unanswered_at_capture_end", 3, 1, None, "capture_end,response_gap=10"),
        v("w3", 1, 1, "unanswered_at_capture_end", 3, 9),
    ]
    assertDataFrameEqual(client_view(wire_capture), expected)


def test_findings_next_to_a_capture_gap_are_capture_gaps(spark):
    rows = [
        row("g1", 0, "open", reason="midstream"),
        resp("g1", 1, "client", 3, cid=40),  # its request came before the capture started
        req("g1", 2, "client", 3, cid=1),
        req("g1", 3, "client", 3, cid=2),
        resp("g1", 4, "client", 3, cid=2, reason="gap_before=300"),  # answer 1 may be in the gap
        req("g1", 5, "client", 3, cid=3, reason="skipped_before=20"),
        resp("g1", 6, "client", 3, cid=77, reason="unmatched"),  # its request may be in the gap
        req("g1", 7, "client", 3, cid=4),
        req("g1", 8, "client", 3, cid=5),
        resp("g1", 9, "client", 3, cid=5),  # answers 3 and 4 lost with no answer gap: faults
        row("g1", 10, "close", reason="fin"),
    ]
    found = client_view_findings(client_view(transactions_df(spark, [{**r, "source": "wire"} for r in rows])))
    got = {(r.kind, r.severity, r.summary.split("; ")[-1]) for r in found.collect()}
    gap = "a capture gap, not a fault: "
    assert got == {
        ("capture_gap", "info", gap + "the capture started in the middle of the connection"),
        ("capture_gap", "info", gap + "answer bytes lost: gap_before=300 before seq 4"),
        ("capture_gap", "info", gap + "request bytes lost: skipped_before=20 before seq 5"),
        ("answer_missing", "error", "Metadata id 3: never answered, though a later request (id 5) was"),
        ("answer_missing", "error", "Metadata id 4: never answered, though a later request (id 5) was"),
    }
