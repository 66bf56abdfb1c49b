"""The trio shell: sockets, listeners, TLS, drain, metrics, workers, configuration and logs.

It moves bytes and timers; what to do with them is decided by :mod:`corrfix.core`.
"""

from __future__ import annotations

from ._config import ProxyConfig
from ._config_file import ConfigError, defaults_from_toml
from ._connection import ProxyConnection, ProxyStats
from ._logs import configure_logging
from ._metrics import ProxyMetrics
from ._observer import ConnectionObserver
from ._server import ListenError, Proxy
from ._tls import TlsConfig, TlsError, add_tls_arguments, tls_config_from_args
from ._workers import run_workers

__all__ = [
    "ConfigError",
    "ConnectionObserver",
    "ListenError",
    "Proxy",
    "ProxyConfig",
    "ProxyConnection",
    "ProxyMetrics",
    "ProxyStats",
    "TlsConfig",
    "TlsError",
    "add_tls_arguments",
    "configure_logging",
    "defaults_from_toml",
    "run_workers",
    "tls_config_from_args",
]
