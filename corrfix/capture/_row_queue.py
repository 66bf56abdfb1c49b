"""The bounded hand-off between the relay's thread and the capture writer thread.

``put`` never waits for the writer: it takes a lock held only for list appends, and when
the queue is at its row or byte bound the rows are dropped and counted instead. Counting
by kind goes into the capture summary; a warning is logged at most every 10 seconds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import structlog

from corrfix.capture._recorder import FRAME, KIND, Row

log = structlog.get_logger("corrfix.capture")

ROW_OVERHEAD = 256
"""Bytes a queued row is charged besides its frame copy, for the queue's byte budget."""
WARNING_INTERVAL = 10.0
"""At most one "rows lost" warning per this many seconds."""


def frame_size(row: Row) -> int:
    """Bytes of the row's frame copy (0 for rows without one)."""
    frame = row[FRAME]
    return len(frame) if isinstance(frame, bytes) else 0


class RowQueue:
    """Rows waiting for the writer thread, bounded by count and bytes; full means dropped."""

    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._wake_rows = max(1, max_rows // 4)
        self._wake_bytes = max(1, max_bytes // 4)
        self._lock = threading.Lock()
        self._rows: list[Row] = []
        self._bytes = 0
        self.closed = False
        self.accepted = 0
        self.lost = 0
        self.lost_by_kind: Counter[str] = Counter()
        self.wake = threading.Event()
        self._lost_since_warning = 0
        self._next_warning = 0.0

    def put(self, rows: list[Row]) -> None:
        dropped: list[Row] = []
        with self._lock:
            for row in rows:
                size = ROW_OVERHEAD + frame_size(row)
                if self.closed or len(self._rows) >= self.max_rows or self._bytes + size > self.max_bytes:
                    dropped.append(row)
                    continue
                self._rows.append(row)
                self._bytes += size
            self.accepted += len(rows) - len(dropped)
            if dropped:
                self._count_lost(dropped)
            wake = len(self._rows) >= self._wake_rows or self._bytes >= self._wake_bytes
        if wake and not self.wake.is_set():
            self.wake.set()
        if dropped:
            self._maybe_warn()

    def close(self) -> None:
        """From now on every row is dropped (and counted)."""
        with self._lock:
            self.closed = True

    def take(self) -> list[Row]:
        with self._lock:
            rows, self._rows, self._bytes = self._rows, [], 0
        return rows

    def count_lost(self, rows: list[Row]) -> None:
        """Rows that were queued but could not be written."""
        with self._lock:
            self._count_lost(rows)
        self._maybe_warn()

    def _count_lost(self, rows: list[Row]) -> None:
        self.lost += len(rows)
        self._lost_since_warning += len(rows)
        for row in rows:
            self.lost_by_kind[str(row[KIND])] += 1

    def _maybe_warn(self) -> None:
        now = time.monotonic()
        if now < self._next_warning:
            return
        with self._lock:
            lost, self._lost_since_warning = self._lost_since_warning, 0
            self._next_warning = now + WARNING_INTERVAL
            total = self.lost
        if lost:
            log.warning("capture rows lost", lost=lost, lost_total=total, queue_rows=self.max_rows)
