"""CPU time and resident memory of a process and its children, from /proc.

A proxy under test may be several processes (``corrfix proxy --workers 2`` is a supervisor
and two workers), so both figures are summed over the whole tree.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid``'s tree so far."""
    total = 0
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def rss_bytes(pid: int) -> int:
    """Resident memory (VmRSS) of ``pid``'s tree."""
    total = 0
    for member in tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
    return total


class CpuWindow:
    """CPU seconds a process tree used between ``mark("start")`` and ``mark("end")``."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.start = self.end = 0.0
        self.rss = 0

    def mark(self, which: str) -> None:
        if self.pid is None:
            return
        if which == "start":
            self.start = cpu_seconds(self.pid)
        else:
            self.end = cpu_seconds(self.pid)
            self.rss = rss_bytes(self.pid)

    @property
    def seconds(self) -> float:
        return self.end - self.start
