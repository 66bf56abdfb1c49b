"""``--capture-max-bytes``: the capture directory as a ring, oldest files removed first.

A sidecar that captures for weeks fills its disk, and on Kubernetes an ``emptyDir`` past its
``sizeLimit`` gets the whole pod evicted. Like tcpdump's ``-C``/``-W`` ring, the writer
removes the oldest capture files once the directory's files total more than the limit.

Any capture's files count and may go, oldest name first (names sort by capture start, then
file number), so captures left by earlier runs are removed before the running one's. The
newest file of a capture is kept while its writer may still be writing it: removing a file
being written frees no space. A writer holds a lock on ``.<stem>.lock`` for as long as it
runs (:func:`hold`); the kernel lets go of it when the process ends, however it ends. So the
newest file goes once the capture's summary says it finished, or once its lock file is
there but nobody holds it (the proxy crashed or was killed), and a capture that left no lock
file (an import, an older writer) keeps it. Several writers pruning one directory at once
may each remove a file; one that is already gone is skipped.

A capture that is over with no file left (a proxy that started and stopped with no traffic,
or crashed first) still has its summary and lock file. A crash loop or a rolling restart left
two such files per start, per worker, for ever: those go too, whatever files earlier runs
left (those stay while the directory is under the limit, and every restart is newer).
"""

from __future__ import annotations

import contextlib
import fcntl
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


def lock_path(directory: Path, stem: str) -> Path:
    return directory / f".{stem}.lock"


def hold(directory: Path, stem: str) -> int:
    """Take the capture's lock for as long as its writer runs; the descriptor to
    :func:`release`. Nobody else holds a new capture's lock, so this never waits."""
    fd = os.open(lock_path(directory, stem), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def release(directory: Path, stem: str, fd: int) -> None:
    """The writer has finished: its lock file goes (before the lock, so that no pruner
    takes the capture for a crashed one meanwhile)."""
    with contextlib.suppress(OSError):
        lock_path(directory, stem).unlink()
    os.close(fd)


def _abandoned(directory: Path, stem: str) -> bool:
    """The capture's lock file is there and nobody holds it: its writer ended without
    finishing (a crash, a kill), so none of its files is being written."""
    try:
        fd = os.open(lock_path(directory, stem), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: an import, or an older writer that may still run
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False  # held: the writer runs
    else:
        return True
    finally:
        os.close(fd)


def prune(directory: Path, max_bytes: int) -> Removed:
    """Remove the oldest capture files in ``directory`` (not below it) until its capture files
    total at most ``max_bytes``, keeping the newest file of every capture that may still be
    written; the summary (and lock file) of a capture that is over goes with its last file."""
    files: list[tuple[str, str, int]] = []  # name, stem, size, in name order
    summaries: list[str] = []  # stems
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return Removed()
    for entry in entries:
        match = _CAPTURE_FILE.match(entry.name)
        if match is None:
            if entry.name.startswith("capture-") and entry.name.endswith(SUMMARY_SUFFIX):
                summaries.append(entry.name[: -len(SUMMARY_SUFFIX)])
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                files.append((entry.name, match.group(1), entry.stat(follow_symlinks=False).st_size))
        except FileNotFoundError:
            continue
    _remove_empty_over(directory, summaries, {stem for _, stem, _ in files})
    total = sum(size for _, _, size in files)
    if total <= max_bytes:
        return Removed(left=frozenset(name for name, _, _ in files))
    newest = {stem: name for name, stem, _ in files}
    finished = {
        stem
        for stem in newest
        if _finished(directory / f"{stem}{SUMMARY_SUFFIX}") or _abandoned(directory, stem)
    }
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
            lock_path(directory, stem).unlink(missing_ok=True)
    gone = set(removed) | taken
    return Removed(tuple(removed), freed, frozenset(name for name, _, _ in files if name not in gone))


def _remove_empty_over(directory: Path, stems: list[str], with_files: set[str]) -> None:
    """Remove the summary and lock file of each capture that is over and has no file left.

    A capture with no file in the listing may have written its first one since and then
    died (a ``--workers`` sibling): over, it writes no more, so a file not there once it is
    known to be over never comes. One that is there keeps them: without its lock file, it
    would pass for an import's newest file and be kept for ever."""
    for stem in stems:
        if stem in with_files:
            continue
        if not (_finished(directory / f"{stem}{SUMMARY_SUFFIX}") or _abandoned(directory, stem)):
            continue
        if not _has_file(directory, stem):
            (directory / f"{stem}{SUMMARY_SUFFIX}").unlink(missing_ok=True)
            lock_path(directory, stem).unlink(missing_ok=True)


def _has_file(directory: Path, stem: str) -> bool:
    """Whether a capture file of ``stem`` is in ``directory`` now."""
    with os.scandir(directory) as entries:
        for entry in entries:
            match = _CAPTURE_FILE.match(entry.name)
            if match is not None and match.group(1) == stem:
                return True
    return False


def _finished(summary: Path) -> bool:
    """The capture's summary says it finished: none of its files is being written."""
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == SUMMARY_FORMAT and data.get("finished") is True
