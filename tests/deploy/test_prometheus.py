"""deploy/prometheus: the alert rules pass promtool's check and unit tests, name only metrics
that a live corrfix exports, and the live scrape passes ``promtool check metrics``."""

from __future__ import annotations

import re
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import DEPLOY

RULES = DEPLOY / "prometheus" / "corrfix-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "corrfix-alerts.test.yml"
METRIC_NAME = re.compile(r"\bcorrfix_[a-z_]+\b")
ALERTS = {
    "CorrfixCorrelationRepairsHigh",
    "CorrfixGaveUp",
    "CorrfixStaleAnswersDropped",
    "CorrfixProbeFoundLoss",
    "CorrfixCaptureRowsLost",
    "CorrfixUpstreamUnreachable",
    "CorrfixConnectionsNearLimit",
    "CorrfixRelayEngineSaturated",
    "CorrfixTlsReloadFailed",
}


def run(*command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120)


def sample_names(scrape: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(scrape) for sample in family.samples}


def test_promtool_checks_the_rules(promtool):
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_every_alert(promtool):
    result = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == ALERTS == set(re.findall(r"- alert: (\w+)", RULES.read_text()))


def test_the_rules_name_only_metrics_a_live_corrfix_exports(live_scrape):
    assert set(METRIC_NAME.findall(RULES.read_text())) <= sample_names(live_scrape)


def test_promtool_checks_a_live_scrape(promtool, live_scrape):
    result = run(promtool, "check", "metrics", stdin=live_scrape)
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
    names = sample_names(live_scrape)
    for expected in (
        "corrfix_requests_total",
        "corrfix_request_latency_seconds_bucket",
        "corrfix_repairs_total",
        "corrfix_upstream_up",
        "corrfix_ready",
        "corrfix_connections_max",
        "corrfix_capture_rows_written_total",
        "corrfix_capture_rows_lost_total",
    ):
        assert expected in names
    # Labels stay low-cardinality: api names, repair kinds, sides, configured upstreams, and
    # a TLS reload's result (loaded or failed).
    label_names = {
        label
        for family in text_string_to_metric_families(live_scrape)
        for sample in family.samples
        for label in sample.labels
    }
    assert label_names <= {"api", "kind", "side", "direction", "upstream", "le", "result"}
