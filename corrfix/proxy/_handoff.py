"""The relay engine's lock: its thread holds it almost always, and trio's thread still gets it.

The engine's thread holds the lock while it serves, and lets go of it only between passes,
taking it again at once. ``threading.Lock`` is not fair: by the time a thread waiting for it
has woken, the engine has it again. Under load, trio's thread then waited seconds in
``adopt`` (handing over a new connection) with its whole event loop stopped: no accepts, no
TLS connections, no metrics or health answers. 400 clients connecting at once were taken at
about 40 a second.

:class:`HandoffLock` counts the threads waiting for it. The owner calls
:meth:`~HandoffLock.yield_to_waiters` between passes: when someone waits, it lets go and
waits until a waiter has the lock, then queues for it again. Nothing changes while nobody
waits, which is nearly always: one attribute read per pass.
"""

from __future__ import annotations

import threading
from types import TracebackType

HANDOFF_WAIT = 0.05
"""Longest the owner waits for a waiter to take the lock it let go (a waiter always takes it
at once; this only bounds a surprise)."""


class HandoffLock:
    """A lock whose busy owner hands it over between its steps to whoever waits for it.

    Waiters take it with ``with lock:``; the owner holds it through :attr:`raw`, so that its
    own comings and goings are not counted as waiting."""

    __slots__ = ("_gate", "_taken", "_waiting", "raw")

    def __init__(self) -> None:
        self.raw = threading.Lock()
        self._gate = threading.Lock()
        self._taken = threading.Event()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Threads waiting to take the lock through ``with``."""
        return self._waiting

    def __enter__(self) -> None:
        with self._gate:
            self._waiting += 1
        try:
            self.raw.acquire()
        finally:
            with self._gate:
                self._waiting -= 1
        self._taken.set()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.raw.release()

    def yield_to_waiters(self) -> bool:
        """Called by the owner, holding :attr:`raw`: if anyone waits, let go until one of them
        has had the lock, then hold it again. Returns whether it let go."""
        if not self._waiting:
            return False
        self._taken.clear()
        self.raw.release()
        try:
            self._taken.wait(HANDOFF_WAIT)
        finally:
            self.raw.acquire()
        return True
