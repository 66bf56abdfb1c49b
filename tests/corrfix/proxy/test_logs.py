"""The log's outputs: a line they cannot take is dropped and counted, never raised into the
proxy (the relay engine's thread and the capture writer's log too)."""

from __future__ import annotations

import errno
import json

import structlog

from corrfix.proxy import _logs
from corrfix.proxy._logs import configure_logging, reopen_log_file
from tests.support.refusing_output import RefusingOutput


def test_a_log_file_on_a_full_disk_drops_its_lines_and_goes_on_once_it_can(tmp_path):
    path = tmp_path / "proxy.log"
    configure_logging(json=True, file=path)
    output = _logs._log_file
    assert output is not None
    try:
        output._file = RefusingOutput(OSError(errno.ENOSPC, "No space left on device"))  # type: ignore[assignment]
        structlog.get_logger("corrfix.test").info("lost", n=1)  # must not raise
        assert output.refused >= 1
        output.reopen()  # logrotate's SIGHUP, once there is room again
        structlog.get_logger("corrfix.test").info("kept", n=2)
    finally:
        output.close()
        _logs._log_file = None
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == ["kept"]


def test_a_log_file_that_cannot_be_opened_anew_is_logged_and_the_old_one_kept(tmp_path):
    """SIGHUP after a log rotation that left at the log's path something corrfix cannot open
    (a file it may not write, here a directory): the error stopped the proxy."""
    path = tmp_path / "proxy.log"
    configure_logging(json=True, file=path)
    output = _logs._log_file
    assert output is not None
    rotated = tmp_path / "proxy.log.1"
    try:
        path.rename(rotated)
        path.mkdir()
        assert reopen_log_file()  # must not raise
        structlog.get_logger("corrfix.test").info("kept")
    finally:
        output.close()
        _logs._log_file = None
    failed, kept = (json.loads(line) for line in rotated.read_text().splitlines())
    assert failed["event"] == "cannot re-open the log file, logging on to the one in use"
    assert failed["path"] == str(path) and "Is a directory" in failed["error"]
    assert kept["event"] == "kept"


def test_a_closed_stderr_drops_the_lines_and_the_caller_goes_on(monkeypatch):
    configure_logging(json=True)
    refusing = RefusingOutput(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    monkeypatch.setattr("sys.stderr", refusing)
    structlog.get_logger("corrfix.test").error("nobody reads this")  # must not raise


def test_a_line_logged_after_the_file_was_closed_is_dropped(tmp_path):
    configure_logging(json=True, file=tmp_path / "proxy.log")
    output = _logs._log_file
    assert output is not None
    output.close()
    try:
        structlog.get_logger("corrfix.test").info("after close")  # must not raise
        assert output.refused >= 1
    finally:
        _logs._log_file = None


class _Writes:
    """A stderr that keeps each write apart, as the kernel sees them."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_log_line_is_written_whole_with_its_newline(monkeypatch):
    """``--workers`` share one stderr: a line and its newline written apart let two workers'
    lines that came at once merge into one that no log reader can parse (both workers'
    "proxy listening" were lost that way). Each line is one write, newline included."""
    configure_logging(json=True)
    stderr = _Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    structlog.get_logger("corrfix.test").info("whole", n=1)
    structlog.get_logger("corrfix.test").info("whole", n=2)
    assert len(stderr.writes) == 2
    assert [json.loads(text)["n"] for text in stderr.writes] == [1, 2]
    assert all(text.endswith("\n") and text.count("\n") == 1 for text in stderr.writes)
