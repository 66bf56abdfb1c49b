"""Host and port of a listener or a broker, as the proxy and its configuration name them."""

from __future__ import annotations

from dataclasses import dataclass

LOOPBACK = "127.0.0.1"


def parse_host_port(text: str, *, default_host: str | None = None) -> tuple[str | None, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (host omitted: ``default_host``)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range in {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"write IPv6 addresses in brackets, e.g. [::1]:9092, not {text!r}")
    return (host or default_host), port


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        """Parse HOST:PORT, [IPv6]:PORT or :PORT (loopback)."""
        host, port = parse_host_port(text, default_host=LOOPBACK)
        return cls(host or LOOPBACK, port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
