"""Where one connection's output and events go: metrics, the log, the observer and the process counts.

Both relay paths (the per-connection tasks for TLS, the engine for plaintext) hand every
batch the core returned to :class:`ConnectionSinks`, so a connection is counted and logged
the same way whichever path relays it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from structlog.typing import FilteringBoundLogger

from corrfix.core import Address, Answered, Event, Forwarded, Notice, Repaired, RepairKind, RepairMachine
from corrfix.proxy._metrics import ProxyMetrics
from corrfix.proxy._observer import ConnectionObserver
from corrfix.proxy._throttle import LogThrottle

_LOUD_EVENTS = {
    RepairKind.SKIP_DETECTED,
    RepairKind.REQUEUE,
    RepairKind.PROBE_FOUND_LOSS,
    RepairKind.POSSIBLE_DUPLICATE,
    RepairKind.GIVE_UP,
}


@dataclass
class ProxyStats:
    """Process-wide counts; the metrics endpoint and the connection summaries read them."""

    connections_opened: int = 0
    connections_active: int = 0
    repairs: Counter[str] = field(default_factory=Counter)
    answering_upstreams: set[Address] = field(default_factory=set)
    """Brokers that answered on some connection: plaintext works there, so a close is no TLS hint."""
    repair_warnings: LogThrottle = field(default_factory=LogThrottle, repr=False, compare=False)
    """Repair warning lines, held to a rate per kind (every repair is still counted)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def repaired(self, kind: str) -> None:
        """Count a repair; the relay engine's thread and trio's both do."""
        with self._lock:
            self.repairs[kind] += 1


class ConnectionSinks:
    """One connection's metrics, log lines, observer calls and repair counts."""

    __slots__ = (
        "_machine",
        "_upstream_marked",
        "conn_id",
        "log",
        "metrics",
        "observer",
        "repairs",
        "stats",
        "upstream",
    )

    def __init__(
        self,
        conn_id: str,
        log: FilteringBoundLogger,
        stats: ProxyStats,
        upstream: Address,
        metrics: ProxyMetrics | None,
        observer: ConnectionObserver | None,
        machine: RepairMachine | None = None,
    ) -> None:
        self.conn_id = conn_id
        self.log = log
        self.stats = stats
        self.upstream = upstream
        self.metrics = metrics
        self.observer = observer
        self.repairs: Counter[str] = Counter()
        self._upstream_marked = False
        # The connection's machine, which counts its requests and answers into the tally of
        # the thread that feeds it (when no sink needs those as events).
        self._machine = machine

    def received_from_client(self, size: int) -> None:
        """Bytes the shell is about to hand the core, in the thread that will: the requests
        among them are counted into this thread's tally."""
        if self.metrics is not None:
            tally = self.metrics.tally()
            tally.client_request_bytes += size
            if self._machine is not None:
                self._machine.counter = tally

    def received_from_upstream(self, size: int) -> None:
        """As :meth:`received_from_client`, for the broker's answers."""
        if self.metrics is not None:
            tally = self.metrics.tally()
            tally.upstream_response_bytes += size
            if self._machine is not None:
                self._machine.counter = tally

    def output(self, to_upstream: list[bytearray], to_client: list[bytearray], events: list[Event]) -> None:
        """One batch the core handed over (its frames are sent by the caller)."""
        metrics = self.metrics
        if metrics is not None:
            tally = metrics.tally()
            if to_upstream:
                tally.upstream_request_bytes += sum(map(len, to_upstream))
            if to_client:
                tally.client_response_bytes += sum(map(len, to_client))
        if events:
            if self.observer is not None:
                self.observer.events(self.conn_id, events)
            self._consume(events)

    def upstream_answered(self) -> None:
        """The broker answered in plaintext: a later silent close by it is no TLS hint."""
        if not self._upstream_marked:
            self._upstream_marked = True
            self.stats.answering_upstreams.add(self.upstream)

    def _consume(self, events: Sequence[Event]) -> None:
        """Metrics and logs from the core's events, counted into this thread's tally."""
        metrics = self.metrics
        if metrics is None:  # only repairs and notices matter: one type check per event
            for event in events:
                if type(event) is Repaired:
                    self._record(event)
                elif type(event) is Notice:
                    self._notice(event)
            return
        tally = metrics.tally()
        requests = tally.requests
        for event in events:
            if isinstance(event, Forwarded):
                requests[event.api_key] = requests.get(event.api_key, 0) + 1
            elif isinstance(event, Answered):
                tally.answer(event.api_key, event.seconds)
            elif isinstance(event, Repaired):
                self._record(event)
            elif isinstance(event, Notice):
                self._notice(event)

    def _notice(self, event: Notice) -> None:
        if event.level == "warning":
            self.log.warning(event.message, **dict(event.details))
        else:
            self.log.info(event.message, **dict(event.details))

    def _record(self, event: Repaired) -> None:
        kind = event.kind.value
        self.repairs[kind] += 1
        self.stats.repaired(kind)
        if self.metrics is not None:
            self.metrics.repair(kind)
        loud = event.kind in _LOUD_EVENTS
        held = self.stats.repair_warnings.admit(kind) if loud else 0
        if held is None:  # counted above; the line is left out
            return
        fields = {
            "api": event.api,
            "client_correlation_id": event.client_correlation_id,
            "upstream_correlation_id": event.upstream_correlation_id,
            "new_upstream_correlation_id": event.new_upstream_correlation_id,
            "attempt": event.attempt,
            "reason": event.reason or None,
        }
        fields = {k: v for k, v in fields.items() if v is not None}
        if loud:
            if held:
                fields["suppressed"] = held  # lines of this kind left out since the last one
            self.log.warning(f"repair.{kind}", **fields)
        else:
            self.log.debug(f"repair.{kind}", **fields)
