"""Storm findings: distinct kinds for the two rebalance storms, and the capture they came from."""

from __future__ import annotations

from spark_audit.report import rebalance_findings, storm_findings

WINDOW = "window_start_ns long, category string, errors long, leader_changes long, connections long, "
WINDOW += "error_codes array<short>, capture_ids array<string>, storm boolean"
GROUP = "group_id string, window_start_ns long, joins long, syncs long, leaves long, heartbeats long, "
GROUP += "generations array<int>, members long, rebalance_errors long, capture_ids array<string>, "
GROUP += "storm boolean"


def test_error_storms_name_their_category_and_their_capture(spark):
    windows = spark.createDataFrame(
        [
            (0, "rebalance", 12, 0, 3, [27], ["cap"], True),
            (0, "leader_election", 9, 3, 2, [6], ["cap", "other"], True),
            (10, "isr_shrink", 1, 0, 1, [19], ["cap"], False),
        ],
        WINDOW,
    )
    got = {r.kind: r.capture_id for r in storm_findings(windows, 10).collect()}
    assert got == {"rebalance_error_storm": "cap", "leader_election_storm": None}


def test_a_rebalance_storm_counts_generations(spark):
    groups = spark.createDataFrame([("g", 0, 3, 3, 0, 0, [1, 2, 3], 2, 0, ["cap"], True)], GROUP)
    [finding] = rebalance_findings(groups, 10).collect()
    assert (finding.kind, finding.severity, finding.capture_id) == ("rebalance_storm", "warning", "cap")
