"""The JSON sidecar of a capture: totals that rows cannot carry, above all the rows lost.

Rows dropped because the capture queue was full are, by definition, not in the Arrow
files; this small file next to them says how many there were. It is replaced atomically
(write, then rename), so a reader sees either the old or the new version.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from corrfix.capture.format import SCHEMA_VERSION, SUMMARY_FORMAT, SUMMARY_SUFFIX, summary_documents

__all__ = ["SUMMARY_FORMAT", "SUMMARY_SUFFIX", "CaptureSummary", "read_summaries", "write_summary"]


@dataclass
class CaptureSummary:
    capture_id: str
    source: str
    started_wall_ns: int
    updated_wall_ns: int = 0
    finished: bool = False
    snaplen: int | None = None
    rows_written: int = 0
    rows_lost: int = 0
    rows_lost_by_kind: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    connections: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per file name: rows per connection id, as written (the audit plans from it)."""
    schema_version: int = SCHEMA_VERSION
    format: str = SUMMARY_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def write_summary(path: Path, summary: CaptureSummary) -> None:
    """Replace ``path`` atomically with ``summary``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(summary.to_json(), encoding="utf-8")
    os.replace(tmp, path)


def read_summaries(path: Path) -> list[CaptureSummary]:
    """Every capture summary in a directory (or next to the file given), oldest name first."""
    directory = path if path.is_dir() else path.parent
    known = CaptureSummary.__dataclass_fields__
    return [
        CaptureSummary(**{k: v for k, v in data.items() if k in known})
        for data in summary_documents(directory)
    ]
