"""A broker that has fallen behind, on cue: freeze its process, thaw it when its peers are done.

A frozen (SIGSTOP) broker keeps its sockets: the kernel still accepts what clients send, up to
the socket buffers, and nothing is processed until it is thawed. :class:`LaggingBroker`
freezes the broker while a client sends its last requests and closes, and thaws it once
every peer connected to it (the client, or the proxy in front of it) has ended its stream
(half-closed or closed its socket). "The broker still had requests to process when the other
side left" is then a certainty rather than a race, with no sleeping: a peer that ends its
stream properly (a half-close) lets the broker answer and finish; one that closes outright
makes the broker's first answer meet a reset.

Linux only (``/proc``): :func:`can_freeze` says whether this machine can do it.
Always use :class:`LaggingBroker` as a context manager: a stopped process does not act on
SIGTERM, so a broker left frozen could not be stopped either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from types import TracebackType
from typing import Self

STATE_TIMEOUT = 5.0
"""How long a signal may take to show in the process state."""
PEERS_TIMEOUT = 3.0
"""How long :meth:`LaggingBroker.thaw_when_peers_done` waits before thawing regardless: less
than corrfix's ``close_linger`` (5 s), so a peer that cannot end its stream because the
frozen broker's buffers are full is not pushed past its own patience by the freeze."""
_POLL = 0.002
_TCP_ESTABLISHED = "01"


def can_freeze() -> bool:
    """Whether process states and TCP tables can be read here (Linux's /proc)."""
    return sys.platform.startswith("linux") and os.path.exists("/proc/net/tcp")


class ProcessFreezer:
    """``freeze()`` and ``thaw()`` one process by pid; each returns once the kernel shows it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.frozen = False

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.frozen = True
        self._wait_for_state(stopped=True)

    def thaw(self) -> None:
        if not self.frozen:
            return
        os.kill(self.pid, signal.SIGCONT)
        self.frozen = False
        self._wait_for_state(stopped=False)

    def _wait_for_state(self, *, stopped: bool) -> None:
        deadline = time.monotonic() + STATE_TIMEOUT
        while True:
            state = process_state(self.pid)
            if state is None or (state in "Tt") == stopped:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"process {self.pid} still in state {state!r} after {STATE_TIMEOUT:g}s")
            time.sleep(_POLL)


class LaggingBroker:
    """Freeze the broker (pid, listening on ``port``) with :meth:`freeze`; thaw it with
    :meth:`thaw_when_peers_done` once every peer has ended its stream to it (no peer socket
    connected to ``port`` is ESTABLISHED any more). Thawed on exit whatever happened.

    What a peer sends while the broker is frozen waits in socket buffers, so keep it well
    under a MiB: a peer that cannot hand its last bytes to its kernel cannot end its stream.
    """

    def __init__(self, pid: int, port: int) -> None:
        self.port = port
        self._freezer = ProcessFreezer(pid)
        self.still_open_at_thaw: list[int] = []
        """For each thaw, how many peers had not ended their stream (0: every peer was done)."""
        self.frozen_for: list[float] = []
        """For each thaw, seconds since the freeze."""
        self._frozen_at = 0.0

    def freeze(self) -> None:
        self._frozen_at = time.monotonic()
        self._freezer.freeze()

    def thaw_when_peers_done(self, timeout: float = PEERS_TIMEOUT) -> None:
        if not self._freezer.frozen:
            return
        try:
            self.still_open_at_thaw.append(wait_for_peers_to_end(self.port, timeout))
        finally:
            self._freezer.thaw()
            self.frozen_for.append(time.monotonic() - self._frozen_at)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(ProcessLookupError):  # it died: nothing to thaw
            self._freezer.thaw()


def wait_for_peers_to_end(port: int, timeout: float) -> int:
    """Wait until every connection to local ``port`` has been ended by its peer; return how
    many had not when ``timeout`` ran out (0 when all were ended in time)."""
    deadline = time.monotonic() + timeout
    while True:
        left = peers_still_sending(port)
        if left == 0 or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL)


def peers_still_sending(port: int) -> int:
    """Connections to ``port`` whose connecting end (the peer's socket, the one whose remote
    port is ``port``) is still ESTABLISHED: the peer has neither half-closed nor closed it.

    The peer's side is what counts: a frozen broker reads nothing, so a peer's FIN may wait
    behind its data in the peer's own send buffer, but its socket leaves ESTABLISHED at once.
    """
    suffix = f":{port:04X}"
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # rem_address is fields[2], st (the TCP state) fields[3].
            if len(fields) > 3 and fields[2].endswith(suffix) and fields[3] == _TCP_ESTABLISHED:
                count += 1
    return count


def process_state(pid: int) -> str | None:
    """The state letter from ``/proc/PID/stat`` (``T`` when stopped), or None without it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces; the state follows the last ")".
    return stat[stat.rindex(")") + 2]
