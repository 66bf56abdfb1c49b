"""Small hand-built captures shared by the ordering and client-view check tests."""

from __future__ import annotations

import pytest

from tests.support.audit_builders import ACKS0, ACKS1, repair, req, resp, row, transactions_df, wire_rows


@pytest.fixture(scope="module")
def proxy_capture(spark):
    """c1: a lost Produce answer repaired by a re-send, a stray, an acks=0 reply and a probe;
    c2: a lost Metadata answer that corrfix did not repair, answered late."""
    c1 = [
        row("c1", 0, "open"),
        req("c1", 1, "client", 0, cid=10, frame=ACKS1, api_version=9),
        req("c1", 2, "upstream", 0, cid=10, uid=0, frame=ACKS1, api_version=9),
        req("c1", 3, "client", 3, cid=11),
        req("c1", 4, "upstream", 3, cid=11, uid=1),
        resp("c1", 5, "upstream", 3, cid=11, uid=1),
        repair("c1", 6, "skip_detected", 0, 10, api_key=0, attempt=1),
        req("c1", 7, "upstream", 0, cid=10, uid=2, frame=ACKS1, api_version=9),
        repair("c1", 8, "requeue", 0, 10, api_key=0, attempt=2, new_upstream_correlation_id=2),
        repair("c1", 9, "possible_duplicate", 2, 10, api_key=0, attempt=2),
        resp("c1", 10, "upstream", 0, cid=10, uid=2),
        resp("c1", 11, "client", 0, cid=10, uid=2),
        resp("c1", 12, "client", 3, cid=11, uid=1),
        resp("c1", 13, "upstream", None, uid=77),
        repair("c1", 14, "stale_drop", 77),
        req("c1", 15, "client", 0, cid=12, frame=ACKS0, api_version=9),
        req("c1", 16, "upstream", 0, cid=12, uid=3, frame=ACKS0, api_version=9),
        req("c1", 17, "upstream", 18, uid=4, api_version=0),
        repair("c1", 18, "probe_sent", 4, api_key=18),
        resp("c1", 19, "upstream", 0, cid=12, uid=3),
        repair("c1", 20, "stale_drop", 3, api_key=0),
        resp("c1", 21, "upstream", 18, uid=4, api_version=0),
        row("c1", 22, "close", reason="client closed"),
    ]
    c2 = [
        req("c2", 1, "upstream", 3, cid=5, uid=0),
        req("c2", 2, "upstream", 3, cid=6, uid=1),
        resp("c2", 3, "upstream", 3, cid=6, uid=1),
        resp("c2", 4, "upstream", 3, cid=5, uid=0),
    ]
    return transactions_df(spark, c1 + c2)


@pytest.fixture(scope="module")
def wire_capture(spark):
    return transactions_df(spark, wire_rows())
