"""structlog set-up: readable lines on a terminal, one JSON object per line for machines.

With ``--log-file`` the lines go to a file that :func:`reopen_log_file` opens anew (SIGHUP),
so logrotate can move the file away and corrfix goes on in a fresh one.

A line the output cannot take (a full disk, a closed stderr) is dropped and counted, never
raised: every part of the proxy logs, from the relay engine's thread to the capture
writer's, and a log that fails must not fail what it reports on.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path
from typing import TextIO

import structlog


class ReopenableFile:
    """A text file appended to line by line, that can be re-opened by name at any time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = self._open()
        self.refused = 0
        """Writes the file refused (a full disk), whose text is lost: one per line."""

    def _open(self) -> TextIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return self.path.open("a", encoding="utf-8", buffering=1)

    def write(self, text: str) -> int:
        with self._lock:
            try:
                return self._file.write(text)
            except (OSError, ValueError):  # ValueError: a line logged after close()
                self.refused += 1
                return 0

    def flush(self) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._file.flush()

    def reopen(self) -> OSError | None:
        """Close the file and open ``path`` again (a new file if it was moved away); the error
        if it cannot be opened, and the lines go on to the file in use: a log rotation gone
        wrong (a new file corrfix may not write) must not stop the proxy at its SIGHUP."""
        with self._lock:
            try:
                old, self._file = self._file, self._open()
            except OSError as exc:
                return exc
        with contextlib.suppress(OSError):  # its last buffered line, on a full disk
            old.close()
        return None

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set up: a
    process (or a test run) that replaces stderr keeps getting corrfix's lines."""

    def __init__(self) -> None:
        self.refused = 0
        """Writes stderr refused (a closed pipe), whose text is lost."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (OSError, ValueError):
            self.refused += 1
            return 0

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


_log_file: ReopenableFile | None = None


def configure_logging(*, json: bool = False, level: str = "info", file: Path | None = None) -> None:
    """Route corrfix's structlog events to stderr (or ``file``) at ``level``."""
    global _log_file
    output: ReopenableFile | _Stderr = _Stderr()
    if file is not None:
        _log_file = output = ReopenableFile(file)
    renderer: structlog.typing.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=file is None and sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        # One write per line, its newline included: print() writes them apart, and two
        # --workers sharing stderr then merged lines that came at once into one no reader parses.
        logger_factory=structlog.WriteLoggerFactory(file=output),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def reopen_log_file() -> bool:
    """Re-open the ``--log-file``; False when logging to stderr."""
    if _log_file is None:
        return False
    error = _log_file.reopen()
    if error is not None:
        structlog.get_logger("corrfix.logs").error(
            "cannot re-open the log file, logging on to the one in use",
            path=str(_log_file.path),
            error=str(error),
        )
    return True
