"""report.html: a summary table, findings per check with connection and time, the latency
chart, and a timeline of anomalies and storms. One self-contained file."""

from __future__ import annotations

from html import escape
from typing import Any

from spark_audit.report._names import api_name
from spark_audit.report._svg import latency_bars, p_time, timeline

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right}.error{color:#b00;font-weight:600}
.warning{color:#b60}.info{color:#357}details{margin:.3em 0}code{font-size:12px}
"""


def _cell(value: Any, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{escape('' if value is None else str(value))}</td>"


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(_cell(v, "n" if i in numeric else "") for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _time(ns: int | None) -> str:
    return p_time(ns) if ns is not None else ""


def _summary(report: dict[str, Any]) -> str:
    summary = report["summary"]
    rows = [
        [name, check["title"], *(summary["by_check"][name][s] for s in ("error", "warning", "info"))]
        for name, check in report["checks"].items()
    ]
    rows.append(["total", "", *(summary["by_severity"][s] for s in ("error", "warning", "info"))])
    captures = [
        [
            c["capture_id"],
            c["source"],
            c["connections"],
            c["frames"],
            c["repairs"],
            _time(c["first_wall_ns"]),
            _time(c["last_wall_ns"]),
        ]
        for c in report.get("captures", [])
    ]
    return (
        "<h2>Summary</h2>"
        + _table(["check", "what", "errors", "warnings", "info"], rows, {2, 3, 4})
        + "<h3>Captures</h3>"
        + _table(["capture", "source", "connections", "frames", "repairs", "from", "to"], captures, {2, 3, 4})
    )


def _findings(report: dict[str, Any]) -> str:
    parts = ["<h2>Findings</h2>"]
    for check in report["checks"].values():
        parts.append(f"<h3>{escape(check['title'])}</h3>")
        if not check["findings"]:
            parts.append("<p>Nothing found.</p>")
            continue
        counts = ", ".join(f"{c['kind']} ({c['severity']}): {c['count']}" for c in check["counts"])
        parts.append(f"<p>{escape(counts)}</p>")
        rows = []
        for f in check["findings"]:
            rows.append(
                "<tr>"
                + _cell(f["severity"], f["severity"])
                + _cell(f["kind"])
                + _cell(_time(f["wall_ns"]))
                + _cell(f"{f['capture_id'][:8]}/{f['connection_id']}" if f["connection_id"] else "")
                + _cell(f["summary"])
                + f"<td><details><summary>row</summary><code>{escape(f['details'])}</code></details></td>"
                + "</tr>"
            )
        head = "".join(
            f"<th>{h}</th>" for h in ("severity", "kind", "time (UTC)", "connection", "what", "details")
        )
        parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")
        if check.get("truncated"):
            parts.append(
                f"<p>Showing {len(check['findings'])} of {check['total']}; report.json has the counts.</p>"
            )
    return "".join(parts)


def _latency(report: dict[str, Any]) -> str:
    latency = report.get("latency")
    if not latency:
        return ""
    rows = [{**r, "api": api_name(r["api_key"])} for r in latency["by_api"]]
    table = _table(
        ["api", "requests", "p50 ms", "p99 ms", "max ms"],
        [[r["api"], r["requests"], *(_ms(r[key]) for key in ("p50_ms", "p99_ms", "max_ms"))] for r in rows],
        {1, 2, 3, 4},
    )
    return "<h2>Latency by api key (client side)</h2>" + latency_bars(rows) + table


def _storms(report: dict[str, Any]) -> str:
    storms = report.get("storms")
    if not storms:
        return ""
    windows = [
        [
            _time(w["window_start_ns"]),
            w["category"],
            w["errors"],
            w["leader_changes"],
            w["isr_shrinks"],
            w["connections"],
            ", ".join(w["error_names"]),
            "storm" if w["storm"] else "",
        ]
        for w in storms["windows"]
    ]
    groups = [
        [
            _time(g["window_start_ns"]),
            g["group_id"],
            g["joins"],
            g["syncs"],
            g["leaves"],
            ", ".join(map(str, g["generations"])),
            g["rebalance_errors"],
            "storm" if g["storm"] else "",
        ]
        for g in storms["rebalances"]
    ]
    return (
        "<h2>Error windows</h2>"
        + (
            _table(
                ["window", "category", "errors", "leader changes", "ISR shrinks", "connections", "codes", ""],
                windows,
                {2, 3, 4, 5},
            )
            if windows
            else "<p>No errors of the storm categories.</p>"
        )
        + "<h2>Rebalances per group</h2>"
        + (
            _table(
                ["window", "group", "JoinGroup", "SyncGroup", "LeaveGroup", "generations", "errors", ""],
                groups,
                {2, 3, 4, 6},
            )
            if groups
            else "<p>No group activity.</p>"
        )
    )


def _timeline(report: dict[str, Any]) -> str:
    points = report.get("timeline", [])
    captures = report.get("captures", [])
    if not captures:
        return ""
    start = min(c["first_wall_ns"] for c in captures)
    end = max(c["last_wall_ns"] for c in captures)
    return "<h2>Timeline of anomalies</h2>" + timeline(points, list(report["checks"]), start, end)


def render(report: dict[str, Any]) -> str:
    """The whole page."""
    title = f"corrfix audit of {report['input']}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>Spark {escape(report['spark']['version'])} on {escape(report['spark']['master'])}, "
        f"{report['elapsed_s']:.1f} s.</p>"
        + _summary(report)
        + _timeline(report)
        + _latency(report)
        + _storms(report)
        + _findings(report)
        + "</body></html>"
    )
