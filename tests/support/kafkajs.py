"""KafkaJS (Node) as a real client in the tests: install it once, run ``kafkajs/client.js``.

``require_kafkajs()`` installs the KafkaJS pinned in ``kafkajs/package-lock.json`` into
``kafkajs/node_modules`` with ``npm ci`` (once per test session, and only when what is there
is not already that version), then returns a :class:`KafkaJS` runner. When Node or npm is
missing, or the install fails (no registry offline), the calling test is skipped with the
reason, unless ``CORRFIX_REQUIRE_NODE=1`` (set by CI), which fails it instead.

Every run of the script is bounded by a timeout; a run past it is killed. The script prints
JSON lines: events (``hold``, ``disconnected``), handed to a callback as they come, then the
summary. KafkaJS's warnings and errors go to its stderr, kept on the result for failure
messages. Call the blocking methods from trio with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tests.support.tools import unavailable

KAFKAJS_DIR = Path(__file__).with_name("kafkajs")
SCRIPT = KAFKAJS_DIR / "client.js"
LOCKFILE = KAFKAJS_DIR / "package-lock.json"
REQUIRE_ENV = "CORRFIX_REQUIRE_NODE"
INSTALL_TIMEOUT = 300.0
DEFAULT_TIMEOUT = 30.0
KILL_MARGIN = 15.0
"""Seconds a run may take beyond the client's own timeout (Node's start, connect, disconnect)
before it is killed."""
GROUP_SESSION_TIMEOUT_MS = 6000
"""Short, because Tansu holds the first JoinGroup of a group for half the session timeout."""
_STDERR_TAIL = 4000


class KafkaJSError(RuntimeError):
    """The script failed, timed out, or printed no summary."""


@dataclass(frozen=True)
class KafkaJSRun:
    """One run of ``client.js``: its JSON summary and events, what it logged, how long it took."""

    summary: dict[str, Any]
    events: list[dict[str, Any]]
    stderr: str
    elapsed: float

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    @property
    def log(self) -> list[str]:
        """KafkaJS's log lines, warn level and up (e.g. "Response without match")."""
        return [line for line in self.stderr.splitlines() if line.strip()]


EventHandler = Callable[[dict[str, Any]], None]
"""Called with each event the script prints (``{"event": "hold", ...}``), in the calling
thread; the script waits for the handler of a ``hold`` event to return."""


@dataclass(frozen=True)
class KafkaJS:
    """Runs ``client.js`` with an installed KafkaJS; see the module docstring."""

    node: str
    node_version: str
    version: str
    """The KafkaJS version installed."""
    directory: Path = KAFKAJS_DIR

    def produce(
        self,
        bootstrap: str,
        topic: str,
        count: int,
        *,
        acks: int = -1,
        batch: int = 100,
        concurrency: int = 1,
        after_disconnect: Literal["exit", "linger"] = "exit",
        hold_after: int | None = None,
        on_event: EventHandler | None = None,
        prefix: str = "m-",
        start: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> KafkaJSRun:
        """One producer session: connect, send ``count`` values ``prefix + %06d`` (as
        ``corrfix.workload.make_value``), ``batch`` per ``send()`` with up to ``concurrency``
        sends awaited at a time, then ``producer.disconnect()`` at once.

        ``after_disconnect="exit"`` ends the process right then (a script's end: the kernel
        closes the sockets, and answers that arrive later meet a reset); ``"linger"`` keeps
        it alive, reading, until the broker has closed every connection (a process that lives
        on), for 10 s at most. ``hold_after=H`` pauses after the sends of the first H
        messages, once KafkaJS is connected to the partition leader: ``on_event`` gets the
        ``hold`` event, and the sending goes on when it returns. ``on_event`` also gets
        ``disconnected`` as soon as ``disconnect()`` returns.

        The summary has ``sent``, ``requests`` (send() calls, one Produce request each), and
        when lingering ``linger_ms`` and ``sockets_left_open``.
        """
        args = [
            *("--brokers", bootstrap, "--topic", topic, "--count", str(count), "--acks", str(acks)),
            *("--batch", str(batch), "--concurrency", str(concurrency)),
            *("--after-disconnect", after_disconnect, "--prefix", prefix, "--start", str(start)),
            *("--timeout-ms", str(int(timeout * 1000))),
        ]
        if hold_after is not None:
            args += ["--hold-after", str(hold_after)]
        return self.run("produce", args, timeout=timeout + KILL_MARGIN, on_event=on_event)

    def consume(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        expected: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS,
        values: bool = False,
    ) -> KafkaJSRun:
        """One consumer-group member: read from the group's offsets (earliest without any)
        until ``expected`` messages or ``timeout``, commit, leave. The summary has ``count``,
        ``unique``, ``duplicates``, ``stopped`` ("expected" or "timeout"), and with
        ``values=True`` the ``values`` read, as strings."""
        args = [
            *("--brokers", bootstrap, "--topic", topic, "--group", group, "--expected", str(expected)),
            *("--timeout-ms", str(int(timeout * 1000)), "--session-timeout-ms", str(session_timeout_ms)),
        ]
        if values:
            args.append("--values")
        return self.run("consume", args, timeout=timeout + KILL_MARGIN)

    def run(
        self, mode: str, args: Sequence[str], *, timeout: float, on_event: EventHandler | None = None
    ) -> KafkaJSRun:
        """Run ``client.js MODE ARGS…``, handing its events to ``on_event`` and answering
        ``hold``; kill it after ``timeout`` seconds. Raises KafkaJSError."""
        command = [self.node, str(SCRIPT), mode, *args]
        start = time.monotonic()
        events: list[dict[str, Any]] = []
        lines: list[str] = []
        with tempfile.TemporaryFile(mode="w+", prefix="kafkajs-", suffix=".log") as stderr:
            proc = subprocess.Popen(
                command,
                cwd=self.directory,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,  # a file: a chatty client cannot block on a full pipe
                text=True,
                env=_node_env(),
            )
            timed_out = threading.Event()

            def kill() -> None:
                timed_out.set()
                proc.kill()

            killer = threading.Timer(timeout, kill)
            killer.start()
            try:
                assert proc.stdin is not None and proc.stdout is not None
                for line in proc.stdout:
                    if not line.strip():
                        continue
                    lines.append(line)
                    event = _parse(line)
                    if event is None or "event" not in event:
                        continue
                    events.append(event)
                    if on_event is not None:
                        on_event(event)
                    if event["event"] == "hold":
                        with contextlib.suppress(OSError):  # it died: its output tells why
                            proc.stdin.write("go\n")
                            proc.stdin.flush()
                proc.wait()
            finally:
                killer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                with contextlib.suppress(OSError):
                    if proc.stdin is not None:
                        proc.stdin.close()
                if proc.stdout is not None:
                    proc.stdout.close()
            stderr.seek(0)
            log = stderr.read()
        elapsed = time.monotonic() - start
        summary = _parse(lines[-1]) if lines else None
        if timed_out.is_set():
            raise KafkaJSError(
                f"KafkaJS {mode} still running after {timeout:g}s, killed: {' '.join(command)}\n"
                f"stdout: {_tail(''.join(lines))}\nstderr: {_tail(log)}"
            )
        if proc.returncode != 0 or summary is None or "event" in summary:
            raise KafkaJSError(
                f"KafkaJS {mode} exited with {proc.returncode}: {' '.join(command)}\n"
                f"stdout: {_tail(''.join(lines))}\nstderr: {_tail(log)}"
            )
        return KafkaJSRun(summary, events, log, elapsed)


def _parse(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def require_kafkajs() -> KafkaJS:
    """The KafkaJS runner, installed on first use; skips (or, under CORRFIX_REQUIRE_NODE=1,
    fails) the calling test when it cannot be had. The outcome is kept for the session."""
    outcome = _install()
    if isinstance(outcome, KafkaJS):
        return outcome
    unavailable(outcome, REQUIRE_ENV)


def pinned_version() -> str:
    """The KafkaJS version ``package-lock.json`` pins."""
    lock = json.loads(LOCKFILE.read_text())
    return str(lock["packages"]["node_modules/kafkajs"]["version"])


def installed_version() -> str | None:
    """The KafkaJS version in ``node_modules``, or None when there is none."""
    try:
        package = json.loads((KAFKAJS_DIR / "node_modules" / "kafkajs" / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(package.get("version"))


@functools.cache
def _install() -> KafkaJS | str:
    """Install once per process; a KafkaJS runner, or why there is none."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if path is None)
        return f"KafkaJS tests need Node.js and npm: no {missing} on PATH (Debian: apt install nodejs npm)"
    try:
        node_version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"node does not run: {exc}"  # KafkaJS 2 needs Node >= 14; Debian 12 has 18
    wanted = pinned_version()
    # Other test sessions may share this tree: one installs at a time, the rest then find it done.
    with open(LOCKFILE, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if installed_version() != wanted:
                # --prefer-offline: what npm's cache holds is used without asking the registry.
                command = [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
                try:
                    done = subprocess.run(
                        command,
                        cwd=KAFKAJS_DIR,
                        stdin=subprocess.DEVNULL,
                        capture_output=True,
                        text=True,
                        timeout=INSTALL_TIMEOUT,
                        env=_npm_env(),
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    return f"`npm ci` in {KAFKAJS_DIR} did not finish in {INSTALL_TIMEOUT:g}s"
                except OSError as exc:
                    return f"`npm ci` in {KAFKAJS_DIR} could not run: {exc}"
                if done.returncode != 0:
                    why = " / ".join(done.stderr.strip().splitlines()[:3])
                    return f"`npm ci` in {KAFKAJS_DIR} failed ({done.returncode}): {why}"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    got = installed_version()
    if got != wanted:
        return f"`npm ci` left KafkaJS {got} in {KAFKAJS_DIR}/node_modules, not the pinned {wanted}"
    return KafkaJS(node=node, node_version=node_version, version=got)


def _node_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NODE_OPTIONS", None)  # a developer's --inspect or --require must not leak in
    env["KAFKAJS_NO_PARTITIONER_WARNING"] = "1"
    return env


def _npm_env() -> dict[str, str]:
    env = dict(os.environ)
    # Offline, fail in about a minute instead of npm's default retries of several minutes.
    env.update(
        {
            "npm_config_fetch_retries": "1",
            "npm_config_fetch_retry_mintimeout": "2000",
            "npm_config_fetch_retry_maxtimeout": "10000",
            "npm_config_fetch_timeout": "30000",
            "npm_config_update_notifier": "false",
        }
    )
    return env


def _tail(text: str | bytes | None, limit: int = _STDERR_TAIL) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text[-limit:]
