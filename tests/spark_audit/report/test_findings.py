"""Storm findings: distinct kinds for the two rebalance storms, the capture they came from,
and ISR shrinks."""

from __future__ import annotations

from spark_audit.report import isr_shrink_findings, rebalance_findings, storm_findings

WINDOW = "window_start_ns long, category string, errors long, leader_changes long, isr_shrinks long, "
WINDOW += "connections long, "
WINDOW += "error_codes array<short>, capture_ids array<string>, storm boolean"
GROUP = "group_id string, window_start_ns long, joins long, syncs long, leaves long, heartbeats long, "
GROUP += "generations array<int>, members long, rebalance_errors long, capture_ids array<string>, "
GROUP += "storm boolean"


def test_error_storms_name_their_category_and_their_capture(spark):
    windows = spark.createDataFrame(
        [
            (0, "rebalance", 12, 0, 0, 3, [27], ["cap"], True),
            (0, "leader_election", 9, 3, 0, 2, [6], ["cap", "other"], True),
            (10, "isr_shrink", 1, 0, 0, 1, [19], ["cap"], False),
        ],
        WINDOW,
    )
    got = {r.kind: r.capture_id for r in storm_findings(windows, 10).collect()}
    assert got == {"rebalance_error_storm": "cap", "leader_election_storm": None}


def test_a_rebalance_storm_counts_generations(spark):
    groups = spark.createDataFrame([("g", 0, 3, 3, 0, 0, [1, 2, 3], 2, 0, ["cap"], True)], GROUP)
    [finding] = rebalance_findings(groups, 10).collect()
    assert (finding.kind, finding.severity, finding.capture_id) == ("rebalance_storm", "warning", "cap")


def test_an_isr_shrink_storm_counts_its_shrinks(spark):
    windows = spark.createDataFrame([(0, "isr_shrink", 2, 0, 9, 1, [19], ["cap"], True)], WINDOW)
    [finding] = storm_findings(windows, 10).collect()
    assert finding.kind == "isr_shrink_storm"
    assert finding.summary.startswith("isr_shrink storm: 2 errors and 9 ISR shrinks in 10 s")


def test_an_isr_shrink_still_short_at_the_end_is_a_warning(spark):
    shrinks = spark.createDataFrame(
        [("t", 0, 10, 3, 1, 30, 40, 30.0), ("t", 1, 20, 3, 2, 50, None, 30.0)],
        "topic string, partition int, wall_ns long, replicas int, min_isr int, last_under_wall_ns long, "
        "expanded_wall_ns long, under_replicated_ms double",
    )
    got = {r.summary: (r.kind, r.severity, r.wall_ns) for r in isr_shrink_findings(shrinks).collect()}
    assert got == {
        "t-0 under-replicated: 1 of 3 replicas in sync at the fewest, for 30.0 ms, then back in sync": (
            "isr_shrink",
            "info",
            10,
        ),
        "t-1 under-replicated: 2 of 3 replicas in sync at the fewest, for at least 30.0 ms, "
        "still short at its last answer": ("isr_shrink", "warning", 20),
    }
