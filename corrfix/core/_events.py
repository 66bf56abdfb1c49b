"""What a connection's core tells its shell, as typed events (in the manner of h11's events).

The core decides; the shell carries out the bytes and timers and hands these events to its
sinks (metrics, logs, capture). Events are slotted; the rare ones are frozen too. The four
made per request or per batch (``Received``, ``Sent``, ``Forwarded``, ``Answered``) are not:
a frozen dataclass sets each field through ``object.__setattr__``, which made a
``Forwarded`` cost 0.51 µs against 0.13 µs. Sinks read events and never change them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol

from protocol import api_name


class RepairKind(StrEnum):
    """What the machine noticed or did; each becomes a log line, a metric and a capture row."""

    SKIP_DETECTED = "skip_detected"
    REQUEUE = "requeue"
    STALE_DROP = "stale_drop"
    PROBE_SENT = "probe_sent"
    PROBE_FOUND_LOSS = "probe_found_loss"
    POSSIBLE_DUPLICATE = "possible_duplicate"
    GIVE_UP = "give_up"
    CLIENT_COMPAT = "client_compat"
    """An answer rewritten for a client known to misread it (librdkafka before 2.2.0)."""


PeerSide = Literal["client", "upstream"]
"""Which TCP connection: client <-> proxy, or proxy <-> broker (capture's ``side``)."""

HEADER_COPY = 1024
"""Bytes of each received frame copied into :class:`Received` before the machine patches the
frame: more than the correlation id it patches, and enough for any header a real client sends."""


@dataclass(slots=True)
class Received:
    """Frames as they arrived on ``side`` (made only when the shell asked to record frames).

    ``heads`` are copies of each frame's first bytes (``HEADER_COPY``), made before the
    machine patches the frame. ``frames`` are the frames themselves, not copied: the machine
    changes a received frame only inside its head (the correlation id), and a rewritten
    answer is a new frame, so past its head a frame still holds the bytes that arrived. A
    consumer reads them during the call that hands it this event and copies what it keeps;
    a frame sent on in the same call is the same object in :class:`Sent`.
    """

    side: PeerSide
    heads: list[bytes]
    frames: list[bytearray]


@dataclass(slots=True)
class Sent:
    """Whole frames handed to the shell for ``side``, in order (recorded frames only). The
    machine may patch them later (a re-send gets a new id): a consumer copies what it keeps."""

    side: PeerSide
    frames: list[bytearray]


@dataclass(slots=True)
class Forwarded:
    """A client request went upstream under an id of the proxy's (acks=0 Produce included)."""

    client_correlation_id: int
    upstream_correlation_id: int
    api_key: int
    api_version: int


@dataclass(slots=True)
class Answered:
    """The broker answered a client request; ``seconds`` runs from the first send, re-sends included."""

    api_key: int
    client_correlation_id: int
    upstream_correlation_id: int
    seconds: float


class FlowCounter(Protocol):
    """Where a machine counts its requests and answers itself, when a shell wants the counts
    but no sink needs a :class:`Forwarded` or :class:`Answered` per request (metrics without
    capture): a count in a dict costs less than an event and a sink's loop over it."""

    requests: dict[int, int]
    """Client requests sent upstream, by api key (acks=0 Produce included)."""

    def answer(self, api_key: int, seconds: float) -> None:
        """A client request answered, ``seconds`` from its first send (as :class:`Answered`)."""


@dataclass(frozen=True, slots=True)
class Repaired:
    """A repair: what was noticed or done about a lost, stray or misread answer."""

    kind: RepairKind
    api_key: int | None = None
    client_correlation_id: int | None = None
    upstream_correlation_id: int | None = None
    new_upstream_correlation_id: int | None = None
    attempt: int | None = None
    reason: str = ""

    @property
    def api(self) -> str | None:
        return None if self.api_key is None else api_name(self.api_key)


RepairEvent = Repaired
"""The name capture and older code use for :class:`Repaired`."""


@dataclass(frozen=True, slots=True)
class Notice:
    """Something about the connection an operator should read in the log."""

    message: str
    level: Literal["info", "warning"] = "info"
    details: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is over; ``reason`` is the first cause the core saw."""

    reason: str


Event = Received | Sent | Forwarded | Answered | Repaired | Notice | Closed
