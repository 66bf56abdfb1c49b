"""The hook through which capture (and anything else that watches traffic) sees a connection.

The relay calls an observer, when one is configured, when a connection opens and closes,
and with each batch of the connection core's events in the core's order: the frames it
received and sent on both sides (:class:`~corrfix.core.Received`, :class:`~corrfix.core.Sent`),
which client request went upstream under which id (:class:`~corrfix.core.Forwarded`), and
every repair. Calls are synchronous and must not block or keep references to the frames,
which the repair machine patches in place later: an observer copies what it needs and hands
it off (capture uses a bounded queue). An observer that also has ``begin_pass`` and
``end_pass`` (:class:`PassObserver`) is told where each of the relay engine's passes begins
and ends, and may keep some references until the end (see there).
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


class PassObserver(ConnectionObserver, Protocol):
    """An observer that gathers what the relay engine's pass over its ready sockets reports
    and handles it once at the pass's end (capture queues a pass's rows in one step).

    Between ``begin_pass`` and ``end_pass`` it may keep references to the frames of
    :class:`~corrfix.core.Received` events past their copied head (:data:`~corrfix.core.HEADER_COPY`
    bytes), which nothing changes, and to the frames of :class:`~corrfix.core.Sent` events to
    the client; the id in a request sent upstream is patched again by a re-send, so an
    observer copies at least the request's first 12 bytes at once."""

    def begin_pass(self) -> None: ...

    def end_pass(self) -> None: ...


class SerializedObserver:
    """An observer called one call at a time, from the relay engine's thread and from trio's.

    Capture gathers rows in scratch lists of its own, so two calls must not interleave; a
    lock per call costs far less than making every observer thread-safe. An inner
    :class:`PassObserver` is told where the engine's passes begin and end."""

    __slots__ = ("_begin", "_end", "_inner", "_lock", "gathers_passes")

    def __init__(self, inner: ConnectionObserver) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._begin = getattr(inner, "begin_pass", None)
        self._end = getattr(inner, "end_pass", None)
        self.gathers_passes = self._begin is not None and self._end is not None

    def begin_pass(self) -> None:
        if self._begin is not None:
            with self._lock:
                self._begin()

    def end_pass(self) -> None:
        if self._end is not None:
            with self._lock:
                self._end()

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
