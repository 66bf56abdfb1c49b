"""The hook through which capture (and anything else that watches traffic) sees a connection.

The relay calls an observer, when one is configured, when a connection opens and closes,
and with each batch of the connection core's events in the core's order: the frames it
received and sent on both sides (:class:`~corrfix.core.Received`, :class:`~corrfix.core.Sent`),
which client request went upstream under which id (:class:`~corrfix.core.Forwarded`), and
every repair. Calls are synchronous and must not block or keep references to the frames,
which the repair machine patches in place later: an observer copies what it needs and hands
it off (capture uses a bounded queue).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from corrfix.core import Event


class ConnectionObserver(Protocol):
    @property
    def snaplen(self) -> int:
        """How many leading bytes of each received frame it needs (0: the header only)."""
        ...

    def connection_opened(self, connection: str, client: str, upstream: str) -> None: ...

    def events(self, connection: str, events: Sequence[Event]) -> None: ...

    def connection_closed(self, connection: str, reason: str) -> None: ...
