"""What ``corrfix proxy`` is told: its addresses, limits, timeouts and repair settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corrfix.core import Address, BrokerPorts, ConnectionConfig, RepairConfig
from corrfix.proxy._tls import TLS_RELOAD_INTERVAL, TlsConfig
from protocol import DEFAULT_MAX_FRAME_SIZE


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    listen: Address
    upstream: Address
    """The first bootstrap broker."""
    repair: RepairConfig = field(default_factory=RepairConfig)
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    connect_timeout: float = 10.0
    connect_retries: int = 2
    """Further upstream connect attempts after a refused or timed-out one, with backoff."""
    max_connections: int = 10_000
    """Client connections beyond this are closed at once, with a log line."""
    frame_timeout: float = 30.0
    """Close a client whose request frame stays incomplete this long (slowloris, a stall)."""
    close_linger: float = 5.0
    """After a client leaves, the proxy sends the broker everything it read and half-closes;
    this is how long it then waits for the broker to close its side before closing anyway."""
    idle_timeout: float = 600.0
    """Close a connection with nothing outstanding and no bytes either way for this long
    (Kafka brokers' connections.max.idle.ms is 10 minutes)."""
    max_send_buffer: int = 4 * 1024 * 1024
    """Bytes waiting to be sent to one side before the other side's reader pauses."""
    rewrite: bool = True
    """Rewrite broker addresses to per-broker proxy listeners and cap ApiVersions."""
    advertised_host: str | None = None
    """The host clients are told for every broker listener (default: the listen host)."""
    broker_ports: BrokerPorts = field(default_factory=BrokerPorts)
    broker_state: Path | None = None
    """Where the brokers learned are kept, so that the next start opens their listeners again."""
    reuse_port: bool = False
    """Share listen ports with sibling worker processes (SO_REUSEPORT)."""
    tls: TlsConfig | None = None
    """TLS with clients and/or brokers (None: plaintext both ways)."""
    tls_reload_interval: float = TLS_RELOAD_INTERVAL
    """How often the TLS files are looked at for a rotation (0: only at SIGHUP)."""
    engine: bool = True
    """Relay plaintext connections in the process's relay engine (one epoll set, one task);
    off: every connection gets tasks of its own, as TLS connections always do."""
    fallback_upstreams: tuple[Address, ...] = ()
    """The further bootstrap brokers, tried in turn when one cannot be reached (last, so that
    the fields before keep their places for positional use)."""

    @property
    def bootstrap(self) -> tuple[Address, ...]:
        """Every bootstrap broker, in the order given."""
        return (self.upstream, *self.fallback_upstreams)

    @property
    def connection(self) -> ConnectionConfig:
        """What each connection's core needs to know."""
        return ConnectionConfig(
            repair=self.repair,
            max_frame_size=self.max_frame_size,
            frame_timeout=self.frame_timeout,
            close_linger=self.close_linger,
            idle_timeout=self.idle_timeout,
            max_send_buffer=self.max_send_buffer,
        )
