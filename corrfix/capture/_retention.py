"""``--capture-max-bytes``: the capture directory as a ring, oldest files removed first.

A sidecar that captures for weeks fills its disk, and on Kubernetes an ``emptyDir`` past its
``sizeLimit`` gets the whole pod evicted. Like tcpdump's ``-C``/``-W`` ring, the writer
removes the oldest capture files once the directory's files total more than the limit.

Any capture's files count and may go, oldest name first (names sort by capture start, then
file number), so captures left by earlier runs are removed before the running one's. The
newest file of a capture is kept unless its summary says the capture finished: it may be
the file another process (a ``--workers`` sibling) is writing, and removing a file being
written frees no space. Several writers pruning one directory at once may each remove a
file; one that is already gone is skipped.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from corrfix.capture.format import FILE_SUFFIX, SUMMARY_FORMAT, SUMMARY_SUFFIX

_CAPTURE_FILE = re.compile(r"^(capture-.+)-\d{6,}" + re.escape(FILE_SUFFIX) + "$")
"""A capture file's name; group 1 is its capture's stem, shared with the summary's name."""


@dataclass(frozen=True)
class Removed:
    """What one pruning removed: capture files, and the bytes they held; and the capture
    files left in the directory (what another writer removed is in neither)."""

    files: tuple[str, ...] = ()
    bytes: int = 0
    left: frozenset[str] = frozenset()


def prune(directory: Path, max_bytes: int) -> Removed:
    """Remove the oldest capture files in ``directory`` (not below it) until its capture files
    total at most ``max_bytes``, keeping the newest file of every capture not finished; the
    summary of a finished capture goes with its last file."""
    files: list[tuple[str, str, int]] = []  # name, stem, size, in name order
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return Removed()
    for entry in entries:
        match = _CAPTURE_FILE.match(entry.name)
        if match is None:
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                files.append((entry.name, match.group(1), entry.stat(follow_symlinks=False).st_size))
        except FileNotFoundError:
            continue
    total = sum(size for _, _, size in files)
    if total <= max_bytes:
        return Removed(left=frozenset(name for name, _, _ in files))
    newest = {stem: name for name, stem, _ in files}
    finished = {stem for stem in newest if _finished(directory / f"{stem}{SUMMARY_SUFFIX}")}
    left = {stem: 0 for stem in newest}
    for _, stem, _ in files:
        left[stem] += 1
    removed: list[str] = []
    taken: set[str] = set()  # by another writer, between the listing and the removing
    freed = 0
    for name, stem, size in files:
        if total <= max_bytes:
            break
        if newest[stem] == name and stem not in finished:
            continue
        try:
            (directory / name).unlink()
        except FileNotFoundError:  # another writer pruning the same directory took it
            taken.add(name)
        else:
            freed += size
            removed.append(name)
        total -= size
        left[stem] -= 1
        if not left[stem] and stem in finished:
            (directory / f"{stem}{SUMMARY_SUFFIX}").unlink(missing_ok=True)
    gone = set(removed) | taken
    return Removed(tuple(removed), freed, frozenset(name for name, _, _ in files if name not in gone))


def _finished(summary: Path) -> bool:
    """The capture's summary says it finished: none of its files is being written."""
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == SUMMARY_FORMAT and data.get("finished") is True
