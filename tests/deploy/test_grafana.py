"""deploy/grafana: every PromQL expression of the dashboard, evaluated by promtool against
the series of a live corrfix scrape, returns data; no panel names a metric that does not exist.

The scrape becomes promtool ``test rules`` input series (a counter grows from 0 to its
scraped value over 20 minutes, a gauge holds its value), and each panel expression ``E``
becomes the expression test ``clamp_max(count(E), 1) == 1``: it parses, its metrics exist
with the labels it selects, and it yields at least one series.
"""

from __future__ import annotations

import json
import re
import subprocess

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "corrfix-dashboard.json"
MINUTES = 20
# Grafana's variables, as Grafana would expand them for one time range and every instance.
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$instance": ".*"}
METRIC_NAME = re.compile(r"\bcorrfix_[a-z_]+\b")


def expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (f"{panel['title']} / {target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def expand(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr}"
    return expr


def input_series(scrape: str) -> list[dict[str, str]]:
    series = []
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            if family.type in ("counter", "histogram"):
                values = f"0+{sample.value / MINUTES!r}x{MINUTES}"
            else:
                values = f"{sample.value!r}x{MINUTES}"
            series.append({"series": f"{sample.name}{{{labels}}}", "values": values})
    return series


def test_every_dashboard_expression_returns_data_from_a_live_scrape(promtool, live_scrape, tmp_path):
    exprs = expressions()
    assert len(exprs) >= 12
    names = {
        sample.name for family in text_string_to_metric_families(live_scrape) for sample in family.samples
    }
    for title, expr in exprs:
        assert set(METRIC_NAME.findall(expr)) <= names, title
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "the dashboard against a live scrape",
                "interval": "1m",
                "input_series": input_series(live_scrape),
                "promql_expr_test": [
                    {
                        "expr": f"clamp_max(count({expand(expr)}), 1)",
                        "eval_time": f"{MINUTES}m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                    for _, expr in exprs
                ],
            }
        ],
    }
    file = tmp_path / "dashboard.test.yml"
    file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", file.name], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_misnamed_metric_would_fail(promtool, live_scrape, tmp_path):
    """The check above can fail: an expression on a metric corrfix does not export returns nothing."""
    tests = {
        "rule_files": [],
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series(live_scrape),
                "promql_expr_test": [
                    {
                        "expr": "clamp_max(count(rate(corrfix_request_total[5m])), 1)",
                        "eval_time": f"{MINUTES}m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                ],
            }
        ],
    }
    file = tmp_path / "misnamed.test.yml"
    file.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool, "test", "rules", file.name], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "FAILED" in result.stdout + result.stderr


def test_the_dashboard_is_importable_json_with_a_datasource_input():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
