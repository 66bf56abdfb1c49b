"""The progress line: which step runs, and on a terminal the Spark tasks done so far.

On a terminal the line is redrawn in place from a display thread that reads Spark's status
tracker twice a second (a display refresh, not synchronisation: the steps never wait on
it). Elsewhere (CI logs, pipes) each step prints one line when it starts, and its time.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from pyspark import SparkContext

REFRESH_S = 0.5


class Progress:
    """``with progress.step("client view"): ...`` around each step of the audit."""

    def __init__(
        self, sc: SparkContext | None, total: int = 0, out: TextIO | None = None, quiet: bool = False
    ) -> None:
        self.sc = sc
        self.total = total
        self.out = out or sys.stderr
        self.quiet = quiet
        self.live = not quiet and sc is not None and self.out.isatty()
        self.started = time.monotonic()
        self._done = 0
        self._name = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        with self._lock:
            self._name = name
        began = time.monotonic()
        if not self.quiet and not self.live:
            print(f"[audit {self._done + 1}/{self.total}] {name} ...", file=self.out, flush=True)
        if self.live and self._thread is None:
            self._thread = threading.Thread(target=self._draw_loop, name="audit-progress", daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            self._done += 1
            if not self.quiet and not self.live:
                print(
                    f"[audit {self._done}/{self.total}] {name}: {time.monotonic() - began:.1f} s",
                    file=self.out,
                )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._draw(final=True)

    def _draw_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._draw()

    def _draw(self, final: bool = False) -> None:
        with self._lock:
            name = self._name
        elapsed = time.monotonic() - self.started
        tasks = "" if final else self._tasks()
        label = "done" if final else f"{min(self._done + 1, self.total)}/{self.total} {name}"
        line = f"\r[audit] {label}{tasks}  {elapsed:.0f} s"
        print(f"{line:<100}", end="\n" if final else "", file=self.out, flush=True)

    def _tasks(self) -> str:
        """Tasks done/total over the active stages, from Spark's status tracker."""
        if self.sc is None:
            return ""
        try:
            tracker = self.sc.statusTracker()
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
        except Exception:  # the context may be stopping; the line is cosmetic
            return ""
        return f": tasks {done}/{total}" if total else ""
