"""The JSON sidecar of a capture: totals that rows cannot carry, above all the rows lost.

Rows dropped because the capture queue was full are, by definition, not in the Arrow
files; this small file next to them says how many there were. It is replaced atomically
(write, then rename), so a reader sees either the old or the new version.

The capture's writer rewrites it after every write, in the thread that holds the GIL
against the relay, and its connection index grows with files times connections. So it is
encoded by the ``json`` module's C encoder, and a finished file's part of the index, which
no longer changes, is encoded once (:meth:`CaptureSummary.seal`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from corrfix.capture.format import SCHEMA_VERSION, SUMMARY_FORMAT, SUMMARY_SUFFIX, summary_documents

__all__ = ["SUMMARY_FORMAT", "SUMMARY_SUFFIX", "CaptureSummary", "read_summaries", "write_summary"]

_encode = json.JSONEncoder(sort_keys=True).encode
"""Without ``indent``: with it, ``json`` falls back to its pure-Python encoder."""


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
    """The capture's files, in the order written; those removed under ``--capture-max-bytes``
    are left out."""
    files_removed: int = 0
    bytes_removed: int = 0
    """Capture files, of this capture or older ones in the directory, that this capture's
    writer removed under ``--capture-max-bytes``, and their bytes."""
    connections: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per file name: rows per connection id, as written (the audit plans from it)."""
    schema_version: int = SCHEMA_VERSION
    format: str = SUMMARY_FORMAT
    _sealed: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    """The JSON of finished files' connection counts, by file name."""

    def seal(self, names: Iterable[str]) -> None:
        """These files are finished: their counts no longer change, so their part of the
        index is encoded now and reused by every later :meth:`to_json`."""
        sealed = self._sealed
        for name in names:
            if name not in sealed and name in self.connections:
                sealed[name] = _encode(self.connections[name])

    def forget(self, names: Iterable[str]) -> None:
        """These files were removed: they leave the connection index."""
        for name in names:
            self.connections.pop(name, None)
            self._sealed.pop(name, None)

    def to_json(self) -> str:
        """One top-level field per line, in name order; nested values on their line."""
        names = sorted(f.name for f in fields(self) if not f.name.startswith("_"))
        return "{\n" + ",\n".join(f"  {_encode(name)}: {self._value_json(name)}" for name in names) + "\n}\n"

    def _value_json(self, name: str) -> str:
        return self._connections_json() if name == "connections" else _encode(getattr(self, name))

    def _connections_json(self) -> str:
        sealed = self._sealed
        return (
            "{"
            + ", ".join(
                f"{_encode(name)}: {sealed.get(name) or _encode(counts)}"
                for name, counts in sorted(self.connections.items())
            )
            + "}"
        )


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
