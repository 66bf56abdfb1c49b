"""An observer wrapper that lets a trio test wait until every proxied connection has closed."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from corrfix.core import Event
from corrfix.proxy import ConnectionObserver


class Watch:
    """Passes every call on to ``inner`` and tracks which connections are open."""

    def __init__(self, inner: ConnectionObserver) -> None:
        self.inner = inner
        self.active: set[str] = set()
        self.opened = 0
        self._changed = trio.Event()

    @property
    def snaplen(self) -> int:
        return self.inner.snaplen

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        self.inner.connection_opened(connection, client, upstream)
        self.active.add(connection)
        self.opened += 1
        self._changed.set()

    def events(self, connection: str, events: Sequence[Event]) -> None:
        self.inner.events(connection, events)

    def connection_closed(self, connection: str, reason: str) -> None:
        self.inner.connection_closed(connection, reason)
        self.active.discard(connection)
        self._changed.set()

    def begin_pass(self) -> None:
        """Passed on when ``inner`` gathers the relay engine's passes (capture does)."""
        begin = getattr(self.inner, "begin_pass", None)
        if begin is not None:
            begin()

    def end_pass(self) -> None:
        end = getattr(self.inner, "end_pass", None)
        if end is not None:
            end()

    async def all_closed(self) -> None:
        """Return once at least one connection opened and none is open any more."""
        while self.opened == 0 or self.active:
            self._changed = trio.Event()
            await self._changed.wait()
