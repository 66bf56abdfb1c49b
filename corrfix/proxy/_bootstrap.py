"""The bootstrap brokers of ``--upstream``: several, as a client's ``bootstrap.servers``.

A client given one broker cannot start while that broker is down; given the cluster's
list, it tries the next. Behind corrfix the client knows only the proxy, so the proxy takes
the list: a connection to the bootstrap listener tries the brokers in turn until one
accepts, and the next connection starts at the broker that last accepted, so a dead broker
costs its connect timeout once, not once per connection. Connections to a broker's own
listener go to that broker, as the cluster advertised it.
"""

from __future__ import annotations

from dataclasses import dataclass

from corrfix.core import Address


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """``HOST:PORT[,HOST:PORT...]``: the bootstrap brokers, in the order given, none twice."""

    addresses: tuple[Address, ...]

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("expected at least one HOST:PORT")
        if len(set(self.addresses)) != len(self.addresses):
            raise ValueError(f"a broker is named twice in {self}")

    @classmethod
    def parse(cls, text: str) -> Bootstrap:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
        return cls(tuple(Address.parse(part) for part in parts))

    def __str__(self) -> str:
        return ",".join(str(address) for address in self.addresses)


class BootstrapOrder:
    """The order a new bootstrap connection tries the brokers in: from the one that last
    accepted a connection, then on round the list. Used from trio's thread only."""

    def __init__(self, bootstrap: tuple[Address, ...]) -> None:
        self.bootstrap = bootstrap
        self._first = 0

    def candidates(self) -> tuple[Address, ...]:
        first = self._first
        return self.bootstrap[first:] + self.bootstrap[:first]

    def accepted(self, upstream: Address) -> None:
        """``upstream`` took a connection: the next ones try it first."""
        if upstream in self.bootstrap:
            self._first = self.bootstrap.index(upstream)
