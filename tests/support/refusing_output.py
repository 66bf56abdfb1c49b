"""A file or pipe that refuses every write, as a full disk or a closed pipe does."""

from __future__ import annotations


class RefusingOutput:
    """Stands in for a log's file or for ``sys.stderr``: every write and flush raises ``error``."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error

    def close(self) -> None:
        pass
