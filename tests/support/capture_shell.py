"""A connection core with a real RepairMachine, its events reported to an observer, without
sockets or trio.

:class:`Shell` feeds the core as the relay does and hands the observer each batch of the
core's events, so whatever it records is what the proxy would record. Time is explicit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corrfix.core import ConnectionConfig, ConnectionCore, RepairConfig, RepairMachine
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
        self.core = ConnectionCore(
            ConnectionConfig(repair=self.config), self.machine, self.now, record_frames=True
        )
        self.sent: list[bytes] = []  # what went upstream, in order
        self.delivered: list[bytes] = []  # what the client got, in order

    def open(self, client: str = "127.0.0.1:50001", upstream: str = "127.0.0.1:9092") -> None:
        self.observer.connection_opened(self.connection, client, upstream)

    def client_sends(self, *frames: bytes | bytearray) -> None:
        self.core.receive_client(b"".join(frames), self.now)
        self._carry_out()

    def broker_answers(self, *frames: bytes | bytearray) -> None:
        self.core.receive_upstream(b"".join(frames), self.now)
        self._carry_out()

    def tick(self, now: float) -> None:
        self.now = now
        self.core.tick(now)
        self._carry_out()

    def close(self, reason: str = "client closed") -> None:
        self.observer.connection_closed(self.connection, reason)

    def _carry_out(self) -> None:
        events = self.core.take_events()
        if events:
            self.observer.events(self.connection, events)
        self.sent += (bytes(frame) for frame in self.core.take_upstream())
        self.delivered += (bytes(frame) for frame in self.core.take_client())


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
