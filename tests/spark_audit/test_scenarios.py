"""The audit on captures of real traffic: corrfix with a lossy link, a consumer group's
life and death, and a tcpdump capture of kafka-python with acks=0 straight to Tansu."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from corrfix.capture import read_capture
from corrfix.chaos import ChaosRules
from corrfix.lab import workload
from protocol import ApiKey
from spark_audit import AuditOptions, run_audit
from spark_audit.checks import client_view, offset_losses, upstream_skips
from spark_audit.connections import load_transactions
from spark_audit.decode import decode_facts
from spark_audit.source import load_capture
from tests.support.audit_scenarios import (
    acks0_produce,
    group_life,
    lossy_produce,
    over_the_wire,
    through_corrfix,
)

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    return through_corrfix(
        tmp_path_factory.mktemp("lossy"), lossy_produce, ChaosRules(drop_every=10, apis={ApiKey.PRODUCE})
    )


@pytest.fixture(scope="module")
def lossy_report(spark, lossy):
    return run_audit(spark, AuditOptions(str(lossy.directory)))


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    return through_corrfix(tmp_path_factory.mktemp("groups"), group_life)


@pytest.fixture(scope="module")
def groups_report(spark, groups):
    return run_audit(spark, AuditOptions(str(groups.directory), checks=("storms", "offsets")))


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    return over_the_wire(tmp_path_factory.mktemp("wire"), acks0_produce)


def kinds(report, check):
    return Counter({c["kind"]: c["count"] for c in report["checks"][check]["counts"]})


def test_the_audit_finds_exactly_the_injected_skips_and_their_repairs(spark, lossy, lossy_report):
    dropped = lossy.relay.policy.totals().dropped
    assert dropped == 6
    skips = upstream_skips(load_transactions(spark, str(lossy.directory))).collect()
    assert len(skips) == dropped
    rows = read_capture(lossy.directory).to_pylist()
    requeues = {
        (r["connection_id"], r["upstream_correlation_id"]): r for r in rows if r["event"] == "requeue"
    }
    for skip in skips:
        requeue = requeues[(skip.connection_id, skip.upstream_correlation_id)]
        assert (skip.api_key, skip.outcome, skip.overtaken_by_probe) == (ApiKey.PRODUCE, "requeued", True)
        assert skip.requeued_as == requeue["new_upstream_correlation_id"]
        assert skip.client_correlation_id == requeue["client_correlation_id"]
        assert skip.actions == ["possible_duplicate", "probe_found_loss", "requeue", "skip_detected"]
    assert kinds(lossy_report, "upstream_ordering") == {"skip_requeued": dropped}


def test_through_corrfix_the_client_saw_nothing_wrong(lossy_report):
    assert lossy_report["summary"]["by_check"]["client_view"]["error"] == 0
    assert not kinds(lossy_report, "client_view") - Counter(
        {"unanswered_at_close": 99, "unanswered_at_capture_end": 99}
    )


def test_resent_produces_are_the_duplicates_the_topic_holds(lossy, lossy_report):
    duplicated = workload.duplicates(lossy.result["values"])
    assert len(duplicated) == 6
    assert kinds(lossy_report, "produce") == {"possible_duplicate": len(duplicated)}
    for finding in lossy_report["checks"]["produce"]["findings"]:
        details = json.loads(finding["details"])
        assert (details["sends"], details["acknowledged"], details["record_count"]) == (2, 1, 1)
        assert details["corrfix_resends"] == 1  # the lineage: the re-send carries the client's id


def test_latency_covers_every_api_the_clients_used(lossy_report):
    by_api = {r["api_key"]: r for r in lossy_report["latency"]["by_api"]}
    assert {0, 1, 3, 18} <= by_api.keys()
    assert by_api[ApiKey.PRODUCE]["requests"] == 60
    assert all(r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in by_api.values())


def test_consumer_group_joins_and_leaves_show_as_rebalances(groups, groups_report):
    group = groups.result["group"]
    windows = [r for r in groups_report["storms"]["rebalances"] if r["group_id"] == group]
    assert sum(r["joins"] for r in windows) >= 3  # three consumers, each joins at least once
    assert sum(r["leaves"] for r in windows) >= 2
    assert len({g for r in windows for g in r["generations"]}) >= 2  # the second member made a new one
    assert kinds(groups_report, "storms")["rebalance"] >= 1


def test_deleting_a_group_shows_as_committed_offset_loss(spark, groups, groups_report):
    result = groups.result
    facts = decode_facts(load_capture(spark, str(groups.directory)))
    losses = {(r.topic, r.partition): r for r in offset_losses(facts).collect()}
    assert {key: r.last_offset for key, r in losses.items()} == {
        (result["topic"], p): offset for p, offset in result["committed"].items()
    }
    assert all(r.group_id == result["group"] and r.deleted_wall_ns is not None for r in losses.values())
    assert all(v is None for v in result["after"].values())
    assert kinds(groups_report, "offsets") == {"committed_offset_lost": len(losses)}


def test_a_wire_capture_shows_the_replies_to_acks0(spark, wire):
    rows = read_capture(wire.directory).to_pylist()
    answers = sum(
        1
        for r in rows
        if r["kind"] == "frame" and r["direction"] == "response" and r["api_key"] == ApiKey.PRODUCE
    )
    assert answers > 1  # Tansu answered Produce requests that had acks=0
    violations = client_view(load_transactions(spark, str(wire.directory))).collect()
    assert Counter(v.kind for v in violations)["acks0_reply"] == answers
