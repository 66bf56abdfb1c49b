"""structlog set-up: readable lines on a terminal, one JSON object per line for machines.

With ``--log-file`` the lines go to a file that :func:`reopen_log_file` opens anew (SIGHUP),
so logrotate can move the file away and corrfix goes on in a fresh one.
"""

from __future__ import annotations

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

    def _open(self) -> TextIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return self.path.open("a", encoding="utf-8", buffering=1)

    def write(self, text: str) -> int:
        with self._lock:
            return self._file.write(text)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def reopen(self) -> None:
        """Close the file and open ``path`` again (a new file if it was moved away)."""
        with self._lock:
            old, self._file = self._file, self._open()
        old.close()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set up: a
    process (or a test run) that replaces stderr keeps getting corrfix's lines."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
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
        logger_factory=structlog.PrintLoggerFactory(file=output),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def reopen_log_file() -> bool:
    """Re-open the ``--log-file``; False when logging to stderr."""
    if _log_file is None:
        return False
    _log_file.reopen()
    return True
