"""Which pcap a wire capture came from: its content hash, its default id, its file names.

Importing the same pcap twice into one directory would hand the audit every frame twice,
so the summary of each import records the pcap's SHA-256, and a second import of the same
content is skipped with a message. The default capture id is derived from that hash, so
re-running an import is idempotent. File names carry the whole capture id (made safe for
a file name), never a prefix of it, so two imports with different ids never overwrite
each other.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from corrfix.capture import SUMMARY_SUFFIX, CaptureSummary, capture_stem

_CHUNK = 1 << 20
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass
class WireCaptureSummary(CaptureSummary):
    """The capture summary of an import: the proxy's fields, plus the pcap it came from."""

    pcap_name: str | None = None
    pcap_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class PriorImport:
    """An import already in the directory: its capture id, the pcap's hash, its files."""

    capture_id: str
    pcap_sha256: str | None
    summary: Path


class CaptureIdTakenError(ValueError):
    """The directory already holds a capture with this id, imported from other content."""


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's content, in hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def default_capture_id(sha256: str) -> str:
    """The capture id of an import without ``--capture-id``: the pcap's hash, 32 hex digits."""
    return sha256[:32]


def file_stem(capture_id: str, started_wall_ns: int) -> str:
    """``capture-<start>-<id>``: the whole id when it is file-name safe, else a safe part and its hash."""
    if _SAFE_ID.fullmatch(capture_id):
        safe = capture_id
    else:
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", capture_id)[:32].strip("_") or "id"
        safe = f"{readable}-{hashlib.sha256(capture_id.encode()).hexdigest()[:12]}"
    return capture_stem("", started_wall_ns) + safe


def prior_imports(directory: Path) -> list[PriorImport]:
    """Every capture summary in ``directory`` (imports and proxy captures alike)."""
    found: list[PriorImport] = []
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob(f"*{SUMMARY_SUFFIX}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("capture_id"), str):
            found.append(PriorImport(data["capture_id"], data.get("pcap_sha256"), path))
    return found


def check_prior(directory: Path, capture_id: str, sha256: str) -> PriorImport | None:
    """The earlier import of the same content, if any (the caller skips this one).

    Raises :class:`CaptureIdTakenError` when the id is already used for other content.
    """
    same_id = None
    for prior in prior_imports(directory):
        if prior.pcap_sha256 == sha256:
            return prior
        if prior.capture_id == capture_id:
            same_id = prior
    if same_id is not None:
        raise CaptureIdTakenError(
            f"{directory} already holds capture {capture_id} ({same_id.summary.name}), from other "
            "content; choose another --capture-id or output directory"
        )
    return None
