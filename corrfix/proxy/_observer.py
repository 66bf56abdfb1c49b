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

import threading
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


class SerializedObserver:
    """An observer called one call at a time, from the relay engine's thread and from trio's.

    Capture gathers each call's rows in scratch lists of its own, so two calls must not
    interleave; a lock per call costs far less than making every observer thread-safe."""

    __slots__ = ("_inner", "_lock")

    def __init__(self, inner: ConnectionObserver) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    @property
    def snaplen(self) -> int:
        return self._inner.snaplen

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        with self._lock:
            self._inner.connection_opened(connection, client, upstream)

    def events(self, connection: str, events: Sequence[Event]) -> None:
        with self._lock:
            self._inner.events(connection, events)

    def connection_closed(self, connection: str, reason: str) -> None:
        with self._lock:
            self._inner.connection_closed(connection, reason)
