"""Check 2, what the client saw, on small hand-built proxy and wire captures."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import client_view
from tests.support.audit_builders import CAPTURE, MS


def test_the_client_side_of_a_repaired_proxy_connection_is_clean(proxy_capture):
    assert client_view(proxy_capture).count() == 0


def test_client_view_of_a_wire_capture(wire_capture):
    def v(conn, seq, wall, kind, api, cid, related=None, reason=None):
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
