"""A point tests wait on until a condition over shared state holds, instead of polling it.

Whoever changes the state (an observer callback, a fake broker's accept) calls
:meth:`Changes.notify`; a waiter re-checks its condition after each notification and once
every task has run as far as it can, so a change finished by a task after it notified
(a connection count dropped after the observer heard of the close) is seen too.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing


class Changes:
    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        """Wake everyone waiting now; later waiters wait for the next change."""
        self._event.set()
        self._event = trio.Event()

    async def until(self, condition: Callable[[], bool], timeout: float) -> None:
        """Return once ``condition()`` holds; fail with :class:`trio.TooSlowError` after ``timeout``."""
        with trio.fail_after(timeout):
            while True:
                await trio.testing.wait_all_tasks_blocked()
                if condition():
                    return
                await self._event.wait()
