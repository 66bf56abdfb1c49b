"""The relay's observer calls around a real RepairMachine, without sockets or trio.

:class:`Shell` reports to an observer exactly as ``ProxyConnection`` does: client
requests before the machine sees them, then the machine's actions in ``_observe`` order
(upstream sends, client deliveries, repair events). Time is explicit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corrfix.capture.format import Direction, Side
from corrfix.core import Actions, RepairConfig, RepairMachine
from corrfix.proxy import ConnectionObserver
from protocol import ApiKey
from protocol.testing import request_frame, response_frame
from tests.support.fake_broker import api_versions_answer


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
        for event in actions.repairs:
            self.observer.repair(self.connection, event)
        # The relay copies into its send buffers before the next call into the machine.
        self.sent.extend(bytes(f) for f in actions.to_upstream)
        self.delivered.extend(bytes(f) for f in actions.to_client)


def run_repair_scenario(shell: Shell) -> None:
    """A lost answer found by a later one, an answered acks=0 Produce, a loss found by a probe."""
    shell.open()
    shell.client_sends(*(request_frame(ApiKey.METADATA, 100 + i, i) for i in range(3)))  # upstream 0, 1, 2
    shell.broker_answers(response_frame(1, 1), response_frame(2, 2))  # 0 lost: re-sent as 3
    shell.broker_answers(response_frame(3, 0))
    shell.client_sends(request_frame(ApiKey.PRODUCE, 103, 3, acks=0))  # upstream 4
    shell.broker_answers(response_frame(4, 3))  # a stray reply to acks=0
    shell.client_sends(request_frame(ApiKey.METADATA, 104, 4))  # upstream 5, its answer lost
    shell.tick(10.0)  # probe: upstream 6
    shell.broker_answers(api_versions_answer(6))  # the probe overtakes 5: re-sent as 7
    shell.broker_answers(response_frame(7, 4))
    shell.close()
