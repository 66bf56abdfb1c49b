"""Run ``corrfix`` commands as child processes, for the demo and the benchmarks.

A child process keeps the proxy off the GIL of the client workload that measures it, and
exercises the real command line. The child logs JSON to a file so the parent can read
its repair counts afterwards.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from corrfix._netutil import can_connect
from corrfix.core import LOOPBACK


class LaunchError(RuntimeError):
    """The child exited or never listened."""


class CorrfixProcess:
    """``python -m corrfix ARGS`` listening on ``port``; started and stopped in order."""

    def __init__(self, args: list[str], port: int, log_path: Path, *, start_timeout: float = 15.0) -> None:
        self.args = args
        self.port = port
        self.log_path = log_path
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "corrfix", *self.args, "--log-json"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.start_timeout
        while not can_connect(LOOPBACK, self.port, timeout=0.2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                command = " ".join(self.args)
                tail = self.output()[-2000:]
                raise LaunchError(f"corrfix {command} did not listen on {self.port}:\n{tail}")
            time.sleep(0.02)
        return self

    def stop(self, grace: float = 10.0) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def records(self) -> list[dict[str, Any]]:
        """The child's JSON log lines (non-JSON lines are skipped)."""
        records = []
        for line in self.output().splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
