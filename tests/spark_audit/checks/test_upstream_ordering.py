"""Check 1, upstream ordering, on small hand-built proxy captures."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from spark_audit.checks import upstream_skips, upstream_strays
from tests.support.audit_builders import ACKS1, CAPTURE, MS, repair, req, resp, transactions_df


def test_upstream_skips_say_what_was_lost_and_what_corrfix_did(proxy_capture):
    expected = [
        Row(
            capture_id=CAPTURE,
            connection_id="c1",
            seq=2,
            wall_ns=5 * MS,
            api_key=0,
            client_correlation_id=10,
            upstream_correlation_id=0,
            probe=False,
            overtaken_by=1,
            overtaken_by_api_key=3,
            overtaken_by_probe=False,
            answered_late=False,
            actions=["possible_duplicate", "requeue", "skip_detected"],
            requeued_as=2,
            outcome="requeued",
        ),
        Row(
            capture_id=CAPTURE,
            connection_id="c2",
            seq=1,
            wall_ns=3 * MS,
            api_key=3,
            client_correlation_id=5,
            upstream_correlation_id=0,
            probe=False,
            overtaken_by=1,
            overtaken_by_api_key=3,
            overtaken_by_probe=False,
            answered_late=True,
            actions=[],
            requeued_as=None,
            outcome="unrepaired",
        ),
    ]
    assertDataFrameEqual(upstream_skips(proxy_capture), expected)


def test_upstream_strays_and_whether_corrfix_dropped_them(proxy_capture):
    expected = [
        Row(
            capture_id=CAPTURE,
            connection_id="c1",
            seq=13,
            wall_ns=13 * MS,
            api_key=None,
            upstream_correlation_id=77,
            client_correlation_id=None,
            kind="orphan",
            dropped=True,
        ),
        Row(
            capture_id=CAPTURE,
            connection_id="c1",
            seq=19,
            wall_ns=19 * MS,
            api_key=0,
            upstream_correlation_id=3,
            client_correlation_id=12,
            kind="acks0_reply",
            dropped=True,
        ),
    ]
    assertDataFrameEqual(upstream_strays(proxy_capture), expected)


def test_a_probe_that_finds_a_loss_is_credited(spark):
    rows = [
        req("p", 1, "upstream", 0, cid=1, uid=0, frame=ACKS1, api_version=9),
        req("p", 2, "upstream", 18, uid=1, api_version=0),
        repair("p", 3, "probe_sent", 1, api_key=18),
        resp("p", 4, "upstream", 18, uid=1, api_version=0),
        repair("p", 5, "skip_detected", 0, 1, api_key=0),
        req("p", 6, "upstream", 0, cid=1, uid=2, frame=ACKS1, api_version=9),
        repair("p", 7, "requeue", 0, 1, api_key=0, new_upstream_correlation_id=2),
        repair("p", 8, "probe_found_loss", 1, api_key=18),
        resp("p", 9, "upstream", 0, cid=1, uid=2),
    ]
    got = upstream_skips(transactions_df(spark, rows)).select(
        "seq", "overtaken_by_probe", "actions", "outcome"
    )
    expected = [
        Row(
            seq=1,
            overtaken_by_probe=True,
            actions=["probe_found_loss", "requeue", "skip_detected"],
            outcome="requeued",
        )
    ]
    assertDataFrameEqual(got, expected)
