"""The report: check results as findings of one schema, then report.json for machines and
report.html (tables and inline SVG charts) for people, with readable api and error names.
"""

from __future__ import annotations

from ._findings import (
    client_view_findings,
    duplicate_findings,
    isr_shrink_findings,
    leader_change_findings,
    offset_loss_findings,
    rebalance_findings,
    sequence_findings,
    slow_findings,
    storm_findings,
    upstream_skip_findings,
    upstream_stray_findings,
)
from ._html import render
from ._names import api_name_column, error_name
from ._write import HTML_NAME, JSON_NAME, exit_status, write_report

__all__ = [
    "HTML_NAME",
    "JSON_NAME",
    "api_name_column",
    "client_view_findings",
    "duplicate_findings",
    "error_name",
    "exit_status",
    "isr_shrink_findings",
    "leader_change_findings",
    "offset_loss_findings",
    "rebalance_findings",
    "render",
    "sequence_findings",
    "slow_findings",
    "storm_findings",
    "upstream_skip_findings",
    "upstream_stray_findings",
    "write_report",
]
