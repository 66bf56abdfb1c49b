"""Inline SVG charts for the HTML report: no scripts, no network assets."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape

SERIES = (("p50_ms", "p50", "#4c78a8"), ("p99_ms", "p99", "#f58518"), ("max_ms", "max", "#e45756"))
SEVERITY_COLOURS = {"info": "#9ecae9", "warning": "#f2a541", "error": "#d62728"}
_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img">'


def p_time(ns: int) -> str:
    """UTC time with milliseconds, for people."""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _text(x: float, y: float, text: str, size: int = 10, anchor: str = "start") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">{escape(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}">{tip}</rect>'


def _line(x1: float, x2: float, y: float, colour: str) -> str:
    return f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}"/>'


def latency_bars(rows: list[dict], label: str = "api") -> str:
    """Grouped bars of p50, p99 and max per api key, on a log scale (ms)."""
    values = [r[key] for r in rows for key, _, _ in SERIES if r[key]]
    if not values:
        return "<p>No answered requests.</p>"
    top = math.log10(max(max(values), 0.001)) + 0.2
    bottom = math.log10(max(min(values), 0.001)) - 0.2
    group_w, bar_w, height, left, pad = 66, 18, 220, 56, 30
    width = left + group_w * len(rows) + 20
    base = pad + height

    def y(v: float) -> float:
        return pad + (top - math.log10(max(v, 0.001))) / (top - bottom) * height

    parts = [_SVG.format(w=width, h=base + 60)]
    for exponent in range(math.ceil(bottom), math.floor(top) + 1):
        parts += [
            _line(left, width, y(10**exponent), "#ddd"),
            _text(left - 4, y(10**exponent) + 4, f"{10**exponent:g} ms", anchor="end"),
        ]
    for i, row in enumerate(rows):
        x0 = left + i * group_w + 6
        name = str(row[label])
        for j, (key, short, colour) in enumerate(SERIES):
            value = row[key] or 0.0
            parts.append(
                _rect(
                    x0 + j * bar_w,
                    y(value),
                    bar_w - 2,
                    base - y(value),
                    colour,
                    f"{name} {short}: {value:.2f} ms",
                )
            )
        parts.append(_text(x0 + 27, base + 14, name, anchor="middle"))
    for j, (_, short, colour) in enumerate(SERIES):
        parts += [
            _rect(left + j * 60, base + 32, 10, 10, colour),
            _text(left + j * 60 + 14, base + 41, short, 11),
        ]
    parts.append("</svg>")
    return "".join(parts)


def timeline(points: list[dict], lanes: list[str], start_ns: int, end_ns: int) -> str:
    """One lane per check; a mark per (window, severity) sized by its count of findings."""
    points = [p for p in points if p["check"] in lanes]
    if not points or end_ns <= start_ns:
        return "<p>No findings with a time.</p>"
    width, lane_h, left, right = 900, 28, 130, 20
    height = lane_h * len(lanes) + 40

    def x(ns: int) -> float:
        return left + (min(max(ns, start_ns), end_ns) - start_ns) / (end_ns - start_ns) * (
            width - left - right
        )

    parts = [_SVG.format(w=width, h=height)]
    for i, lane in enumerate(lanes):
        parts += [
            _text(left - 6, 24 + i * lane_h, lane, 11, "end"),
            _line(left, width - right, 20 + i * lane_h, "#eee"),
        ]
    biggest = max(p["count"] for p in points)
    for p in sorted(points, key=lambda p: tuple(SEVERITY_COLOURS).index(p["severity"])):
        cy = 20 + lanes.index(p["check"]) * lane_h
        r = 3 + 8 * math.sqrt(p["count"] / biggest)
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(p.get("kinds", {}).items()))
        tip = escape(
            f"{p['check']}: {p['count']} {p['severity']} ({kinds}) at {p_time(p['window_start_ns'])}"
        )
        colour = SEVERITY_COLOURS[p["severity"]]
        parts.append(
            f'<circle cx="{x(p["window_start_ns"]):.1f}" cy="{cy}" r="{r:.1f}" fill="{colour}" '
            f'fill-opacity="0.8"><title>{tip}</title></circle>'
        )
    parts += [
        _text(left, height - 4, p_time(start_ns)),
        _text(width - right, height - 4, p_time(end_ns), anchor="end"),
    ]
    parts.append("</svg>")
    return "".join(parts)
