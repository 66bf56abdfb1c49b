"""report.json and report.html from a report, and the exit status of --fail-on."""

from __future__ import annotations

import json
import math
import re

import pytest

from spark_audit.report import exit_status, write_report


@pytest.fixture(scope="module")
def written(small_report, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    report = {**small_report, "latency": {**small_report["latency"]}}
    report["latency"]["by_api"] = [{**r, "max_ms": math.inf} for r in report["latency"]["by_api"]]
    return write_report(report, out / "nested")


def test_json_is_strict_and_keeps_everything(small_report, written):
    json_path, _ = written
    text = json_path.read_text()
    loaded = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in report.json"))
    assert loaded["summary"] == small_report["summary"]
    assert loaded["latency"]["by_api"][0]["max_ms"] is None  # infinity has no JSON spelling


def test_html_has_the_summary_findings_charts_and_no_outside_resources(written):
    _, html_path = written
    html = html_path.read_text()
    for heading in ("Summary", "Timeline of anomalies", "Latency by api key", "Findings"):
        assert f">{heading}" in html
    assert html.count("<svg") == 2
    assert "acks0_reply" in html and "appended_twice" in html and "beefbeef/w1" in html
    assert not re.search(r"<script|(?:src|href)=", html)


@pytest.mark.parametrize(
    ("by_severity", "fail_on", "status"),
    [
        ({"info": 0, "warning": 0, "error": 1}, "error", 1),
        ({"info": 0, "warning": 2, "error": 0}, "error", 0),
        ({"info": 0, "warning": 2, "error": 0}, "warning", 1),
        ({"info": 3, "warning": 0, "error": 0}, "warning", 0),
        ({"info": 3, "warning": 0, "error": 0}, "info", 1),
        ({"info": 0, "warning": 0, "error": 5}, None, 0),
    ],
)
def test_fail_on_counts_findings_at_least_that_severe(by_severity, fail_on, status):
    assert exit_status({"summary": {"by_severity": by_severity}}, fail_on) == status
