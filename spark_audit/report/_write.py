"""Write the report: report.json for machines, report.html for people, side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from spark_audit import SEVERITIES, severity_rank
from spark_audit.report._html import render

JSON_NAME = "report.json"
HTML_NAME = "report.html"


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Both files into ``out_dir`` (created); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / JSON_NAME, out_dir / HTML_NAME
    cleaned = _clean(report)
    json_path.write_text(json.dumps(cleaned, indent=2, sort_keys=False, default=str) + "\n")
    html_path.write_text(render(cleaned))
    return json_path, html_path


def exit_status(report: dict[str, Any], fail_on: str | None) -> int:
    """1 when some finding is at least as severe as ``fail_on``, else 0."""
    if fail_on is None:
        return 0
    counts = report["summary"]["by_severity"]
    floor = severity_rank(fail_on)
    return 1 if any(counts.get(s, 0) for s in SEVERITIES if severity_rank(s) >= floor) else 0
