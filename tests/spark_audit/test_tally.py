"""Findings counted and ranked on the driver give what the Spark definition gives."""

from __future__ import annotations

import json

from spark_audit._job import FINDING_SCHEMA
from spark_audit._tally import finding_rows, tally_rows, tally_tables

SECOND = 1_000_000_000


def _finding(check, kind, severity, connection, wall_ns, n):
    return (check, kind, severity, "cap", connection, wall_ns, 0, f"{kind} {n}", json.dumps({"n": n}))


def _checks(spark):
    """Two checks' findings: every severity, null times and connections, two windows, and
    ties on time broken by connection and kind."""
    rows = {
        "client_view": [
            _finding("client_view", "stray_answer", "warning", "c2", 3 * SECOND, 1),
            _finding("client_view", "acks0_reply", "error", "c1", 12 * SECOND, 2),
            _finding("client_view", "stray_answer", "warning", None, 3 * SECOND, 3),
            _finding("client_view", "unanswered", "info", "c1", None, 4),
            _finding("client_view", "acks0_reply", "error", "c1", 2 * SECOND, 5),
            _finding("client_view", "acks0_reply", "warning", "c1", 3 * SECOND, 6),
        ],
        "produce": [
            _finding("produce", "appended_twice", "error", "p1", 25 * SECOND, 7),
            _finding("produce", "retried", "info", "p2", 1 * SECOND, 8),
        ],
    }
    return {name: spark.createDataFrame(found, FINDING_SCHEMA) for name, found in rows.items()}


def _spark_tally(checks, window_s, limit):
    counts, top = [], {}
    for df in tally_tables(checks, window_s, limit):
        for row in df.collect():
            if row["tag"] == "counts":
                counts.append(json.loads(row["json"]))
            else:
                top.setdefault(row["tag"], []).append((row["n"], json.loads(row["json"])))
    return counts, {tag: [f for _, f in sorted(got, key=lambda item: item[0])] for tag, got in top.items()}


def _key(count):
    return (count["_check"], count["kind"], count["severity"], count["window_start_ns"] or -1)


def test_the_driver_counts_and_ranks_as_spark_does(spark):
    checks = _checks(spark)
    for window_s, limit in ((10.0, 1000), (10.0, 3), (1.0, 1)):
        rows = [(r["tag"], r["json"]) for r in finding_rows(checks, window_s).collect()]
        counts, top = tally_rows(rows, limit)
        want_counts, want_top = _spark_tally(checks, window_s, limit)
        assert sorted(counts, key=_key) == sorted(want_counts, key=_key)
        assert top == want_top
        assert [f["summary"] for f in top["top:client_view"]][:3] == [
            "acks0_reply 5",
            "acks0_reply 2",
            "stray_answer 3",
        ][:limit]
