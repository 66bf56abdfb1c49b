"""An observer wrapper that lets a trio test wait until every proxied connection has closed."""

from __future__ import annotations

import trio

from corrfix.capture.format import Direction, Side
from corrfix.core import RepairEvent
from corrfix.proxy import ConnectionObserver


class Watch:
    """Passes every call on to ``inner`` and tracks which connections are open."""

    def __init__(self, inner: ConnectionObserver) -> None:
        self.inner = inner
        self.active: set[str] = set()
        self.opened = 0
        self._changed = trio.Event()

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        self.inner.connection_opened(connection, client, upstream)
        self.active.add(connection)
        self.opened += 1
        self._changed.set()

    def frames(self, connection: str, side: Side, direction: Direction, frames: list[bytearray]) -> None:
        self.inner.frames(connection, side, direction, frames)

    def repair(self, connection: str, event: RepairEvent) -> None:
        self.inner.repair(connection, event)

    def connection_closed(self, connection: str, reason: str) -> None:
        self.inner.connection_closed(connection, reason)
        self.active.discard(connection)
        self._changed.set()

    async def all_closed(self) -> None:
        """Return once at least one connection opened and none is open any more."""
        while self.opened == 0 or self.active:
            self._changed = trio.Event()
            await self._changed.wait()
