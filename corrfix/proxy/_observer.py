"""The hook through which capture (and anything else that watches traffic) sees a connection.

The relay calls an observer, when one is configured, with every frame on both sides of
every connection and with every repair event. Calls are synchronous and must not block or
keep references to the frames, which the repair machine patches in place later: an
observer copies what it needs and hands it off (capture uses a bounded queue).
"""

from __future__ import annotations

from typing import Protocol

from corrfix.capture.format import Direction, Side
from corrfix.core import RepairEvent


class ConnectionObserver(Protocol):
    def connection_opened(self, connection: str, client: str, upstream: str) -> None: ...

    def frames(self, connection: str, side: Side, direction: Direction, frames: list[bytearray]) -> None:
        """Frames as they crossed ``side``: client ids on the client side, upstream ids upstream."""

    def repair(self, connection: str, event: RepairEvent) -> None: ...

    def connection_closed(self, connection: str, reason: str) -> None: ...
