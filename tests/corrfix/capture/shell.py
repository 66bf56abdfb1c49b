"""The relay's observer calls around a real RepairMachine, without sockets or trio.

:class:`Shell` reports to an observer exactly as ``ProxyConnection`` does: client
requests before the machine sees them, then the machine's actions in ``_observe`` order
(upstream sends, client deliveries, repair events). Time is explicit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corrfix.observer import ConnectionObserver, Direction, Side
from corrfix.repair import Actions, RepairConfig, RepairMachine


@dataclass
class Shell:
    observer: ConnectionObserver
    connection: str = "c1"
    config: RepairConfig = field(default_factory=RepairConfig)
    now: float = 0.0
    machine_options: dict[str, Any] = field(default_factory=dict)  # e.g. transform, local_answer

    def __post_init__(self) -> None:
        self.machine = RepairMachine(self.config, **self.machine_options)
        self.sent: list[bytes] = []  # what went upstream, in order
        self.delivered: list[bytes] = []  # what the client got, in order

    def open(self, client: str = "127.0.0.1:50001", upstream: str = "127.0.0.1:9092") -> None:
        self.observer.connection_opened(self.connection, client, upstream)

    def client_sends(self, *frames: bytes | bytearray) -> None:
        batch = [bytearray(f) for f in frames]
        self.observer.frames(self.connection, Side.CLIENT, Direction.REQUEST, batch)
        self._apply(self.machine.client_frames(batch, self.now))

    def broker_answers(self, *frames: bytes | bytearray) -> None:
        batch = [bytearray(f) for f in frames]
        self.observer.frames(self.connection, Side.UPSTREAM, Direction.RESPONSE, batch)
        self._apply(self.machine.upstream_frames(batch, self.now))

    def tick(self, now: float) -> None:
        self.now = now
        self._apply(self.machine.tick(now))

    def close(self, reason: str = "client closed") -> None:
        self.observer.connection_closed(self.connection, reason)

    def _apply(self, actions: Actions) -> None:
        if actions.to_upstream:
            self.observer.frames(self.connection, Side.UPSTREAM, Direction.REQUEST, actions.to_upstream)
        if actions.to_client:
            self.observer.frames(self.connection, Side.CLIENT, Direction.RESPONSE, actions.to_client)
        for event in actions.events:
            self.observer.repair(self.connection, event)
        # The relay copies into its send buffers before the next call into the machine.
        self.sent.extend(bytes(f) for f in actions.to_upstream)
        self.delivered.extend(bytes(f) for f in actions.to_client)
