"""The sans-IO connection core: everything decided per connection, fed bytes and ``now``.

No trio, no sockets, no metrics or logging: the shells (:mod:`corrfix.proxy`, and the
engine that services many sockets) move bytes and timers and act on what the core returns.
Imports nothing of ours but :mod:`protocol`.
"""

from __future__ import annotations

from ._address import LOOPBACK, Address, parse_host_port
from ._connection import (
    CLOSE_GRACE,
    DISCARD_LIMIT,
    FLUSH_TIMEOUT,
    ConnectionConfig,
    ConnectionCore,
)
from ._events import (
    HEADER_COPY,
    Answered,
    Closed,
    Event,
    FlowCounter,
    Forwarded,
    Notice,
    PeerSide,
    Received,
    Repaired,
    RepairEvent,
    RepairKind,
    Sent,
)
from ._latency import RetransmitTimer
from ._repair import (
    MAX_CORRELATION_ID,
    PROBE_CLIENT_ID,
    Actions,
    Phase,
    ProducePolicy,
    RepairConfig,
    RepairMachine,
)
from ._routing import BrokerPorts, ClusterRouter, RoutingError
from ._tls_hints import SILENT_UPSTREAM_HINT, tls_on_plaintext

__all__ = [
    "CLOSE_GRACE",
    "DISCARD_LIMIT",
    "FLUSH_TIMEOUT",
    "HEADER_COPY",
    "LOOPBACK",
    "MAX_CORRELATION_ID",
    "PROBE_CLIENT_ID",
    "SILENT_UPSTREAM_HINT",
    "Actions",
    "Address",
    "Answered",
    "BrokerPorts",
    "Closed",
    "ClusterRouter",
    "ConnectionConfig",
    "ConnectionCore",
    "Event",
    "FlowCounter",
    "Forwarded",
    "Notice",
    "PeerSide",
    "Phase",
    "ProducePolicy",
    "Received",
    "RepairConfig",
    "RepairEvent",
    "RepairKind",
    "RepairMachine",
    "Repaired",
    "RetransmitTimer",
    "RoutingError",
    "Sent",
    "parse_host_port",
    "tls_on_plaintext",
]
